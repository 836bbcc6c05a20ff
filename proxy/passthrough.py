"""Streaming pass-through of any request to oms.

Bodies stream in both directions in ``server.read_chunk_bytes`` pieces, so memory per exchange is
bounded whatever the size of an upload or download. Small bodies with a known length are read in
one piece, which saves the per-chunk overhead on the JSON API. No redirect following, no
decompression: the bytes, Content-Encoding and Content-Length oms sends reach the client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from yarl import URL

from proxy import headers as hdr
from proxy.errors import UpstreamTimeout, UpstreamUnavailable

_LOGGER = logging.getLogger(__name__)

# Bodies up to this size with a known Content-Length are read whole instead of streamed.
SMALL_BODY = 256 * 1024

REQUEST_ID_KEY: web.RequestKey[str] = web.RequestKey("request_id", str)


def request_id(request: web.Request) -> str:
    """The request's id (set by the request-id middleware)."""
    rid: str = request.get(REQUEST_ID_KEY, "")
    return rid


def upstream_url(base: str, request: web.BaseRequest) -> URL:
    """oms URL for this request, with the path and query exactly as the client encoded them.

    ``base`` is oms's URL without a trailing slash. ``raw_path`` is the request target as sent;
    an absolute-form target (``http://elsewhere/x``) is reduced to its path so the proxy only
    ever talks to the configured oms.
    """
    raw = request.raw_path
    if not raw.startswith("/"):
        raw = "/" + URL(raw).raw_path_qs.lstrip("/")
    return URL(base + raw, encoded=True)


async def _body_chunks(request: web.BaseRequest, chunk: int) -> AsyncIterator[bytes]:
    content = request.content
    while True:
        data = await content.read(chunk)
        if not data:
            return
        yield data


def _request_body(
    request: web.BaseRequest, chunk: int
) -> tuple[bytes | AsyncIterator[bytes] | None, int | None, bool]:
    """(body, content length, whether it must be read first) for the upstream request."""
    length = request.content_length
    if length is not None:
        if length == 0:
            return None, 0, False
        if length <= SMALL_BODY:
            return None, length, True
        return _body_chunks(request, chunk), length, False
    if request.body_exists:  # chunked upload: stream it on, chunked
        return _body_chunks(request, chunk), None, False
    return None, None, False


async def forward(
    request: web.Request,
    session: aiohttp.ClientSession,
    base: str,
    chunk: int,
    *,
    body: bytes | None = None,
) -> web.StreamResponse:
    """Send ``request`` to oms and stream oms's answer back.

    ``body`` replaces the request body when the caller has already read it (it is then sent
    byte-for-byte as read).
    """
    if body is not None:
        data: bytes | AsyncIterator[bytes] | None = body
        length: int | None = len(body)
    else:
        data, length, read_first = _request_body(request, chunk)
        if read_first:
            data = await request.read()
    out_headers = hdr.upstream_request_headers(
        request.headers,
        peer=request.remote,
        scheme=request.scheme,
        host=request.host,
        request_id=request_id(request),
        content_length=length,
    )
    url = upstream_url(base, request)
    try:
        upstream = await session.request(
            request.method,
            url,
            headers=out_headers,
            data=data,
            allow_redirects=False,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )
    except TimeoutError as e:
        raise UpstreamTimeout("oms did not answer in time") from e
    except aiohttp.ClientConnectorError as e:
        raise UpstreamUnavailable(f"oms is unreachable: {e.os_error.strerror or e}") from e
    except aiohttp.ClientPayloadError as e:
        raise UpstreamUnavailable("the request body could not be sent to oms") from e
    except (aiohttp.ClientError, OSError) as e:
        raise UpstreamUnavailable(f"oms broke the exchange: {type(e).__name__}") from e

    try:
        return await _relay(request, upstream, chunk)
    finally:
        upstream.release()


async def _relay(
    request: web.Request, upstream: aiohttp.ClientResponse, chunk: int
) -> web.StreamResponse:
    resp_headers = hdr.downstream_response_headers(upstream.headers)
    if hdr.REQUEST_ID not in resp_headers:
        resp_headers[hdr.REQUEST_ID] = request_id(request)
    no_body = hdr.has_no_body(request.method, upstream.status)
    length = upstream.content_length

    if not no_body and length is not None and length <= SMALL_BODY:
        try:
            payload = await upstream.read()
        except TimeoutError as e:
            raise UpstreamTimeout("oms stopped sending in time") from e
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamUnavailable(f"oms broke the exchange: {type(e).__name__}") from e
        resp_headers.popall("Content-Length", None)
        return web.Response(
            status=upstream.status, reason=upstream.reason, headers=resp_headers, body=payload
        )

    response = web.StreamResponse(
        status=upstream.status, reason=upstream.reason, headers=resp_headers
    )
    if no_body:
        # Keep oms's Content-Length for HEAD; aiohttp sends no body for HEAD/204/304.
        await response.prepare(request)
        await response.write_eof()
        return response
    if length is not None:
        response.content_length = length
    else:
        response.enable_chunked_encoding()
    await response.prepare(request)
    read = upstream.content.read
    while True:
        try:
            data = await read(chunk)
        except (TimeoutError, aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as e:
            # Headers are gone already: the only honest signal left is a cut connection.
            _LOGGER.warning(
                "stream from oms broken (%s): %s %s", type(e).__name__, request.method, request.path
            )
            return _abort(request, upstream, response)
        if not data:
            break
        try:
            await response.write(data)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            _LOGGER.info("client left mid-stream: %s %s", request.method, request.path)
            return _abort(request, upstream, response)
    await response.write_eof()
    return response


def _abort(
    request: web.Request, upstream: aiohttp.ClientResponse, response: web.StreamResponse
) -> web.StreamResponse:
    """Drop both connections of a broken stream; neither goes back to a pool."""
    upstream.close()
    if request.transport is not None:
        request.transport.close()
    return response
