"""Streaming pass-through of any request to oms.

Bodies stream in both directions, so memory per exchange is bounded whatever the size of an
upload or download: oms's answer in ``server.read_chunk_bytes`` pieces, the client's body in the
pieces aiohttp's server received it in (never cut or joined here: that would copy every byte
once more). Small bodies with a known length are read in
one piece, which saves the per-chunk overhead on the JSON API. No redirect following, no
decompression: the bytes, Content-Encoding and Content-Length oms sends reach the client.
"""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import HttpVersion11, web
from multidict import CIMultiDict
from yarl import URL

from proxy.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from proxy.keys import CONFIG, METRICS, request_id
from proxy.passthrough import headers as hdr
from proxy.passthrough.body import SMALL_BODY, body_timed_out, body_timeout, request_body
from proxy.passthrough.client import ConnectFailed, Response, Upstream, UpstreamError

_LOGGER = logging.getLogger(__name__)

UPSTREAM: web.AppKey[Upstream] = web.AppKey("upstream", Upstream)
"""The pass-through's own pooled client to oms (passthrough.client), used by :func:`forward`."""


def upstream_target(request: web.BaseRequest) -> str:
    """The request target for oms: the path and query exactly as the client encoded them.

    An absolute-form target (``http://elsewhere/x``) is reduced to its path so the proxy only
    ever talks to the configured oms; a fragment is not sent.
    """
    raw = request.raw_path
    if not raw.startswith("/"):
        path = URL(raw).raw_path_qs
        return path if path.startswith("/") else "/" + path  # "//x" stays "//x", as sent
    if "#" in raw:
        raw = raw.partition("#")[0]
    return raw


def upstream_url(base: str, request: web.BaseRequest) -> URL:
    """oms's URL for this request: ``base`` (oms's URL without a trailing slash) + the target."""
    return URL(base + upstream_target(request), encoded=True)


def oms_request_headers(request: web.Request, content_length: int | None) -> CIMultiDict[str]:
    """The headers a request from this client carries to oms (headers.upstream_request_headers)."""
    return hdr.upstream_request_headers(
        request.headers,
        peer=request.remote,
        scheme=request.scheme,
        host=request.host,
        request_id=request_id(request),
        content_length=content_length,
    )


async def forward(request: web.Request, *, body: bytes | None = None) -> web.StreamResponse:
    """Send ``request`` to oms and stream oms's answer back.

    ``body`` replaces the request body when the caller has already read it (it is then sent
    byte-for-byte as read). The exchange goes over the app's pass-through client
    (:class:`proxy.passthrough.client.Upstream`, ``keys.UPSTREAM``); answers are relayed in
    ``server.read_chunk_bytes`` pieces.
    """
    upstream = request.app[UPSTREAM]
    chunk = request.app[CONFIG].server.read_chunk_bytes
    data: bytes | AsyncIterator[bytes] | None
    length: int | None
    if body is not None:
        data, length = body, len(body)
    else:
        stream, length, read_first = request_body(request)
        data = stream.chunks() if stream is not None else None
        if read_first:
            try:
                async with asyncio.timeout(body_timeout(request)):
                    data = await request.read()
            except TimeoutError as e:
                raise body_timed_out() from e
    out_headers = oms_request_headers(request, length)
    started = time.perf_counter()
    try:
        answer = await upstream.request(
            request.method, upstream_target(request), out_headers.items(), data, length=length
        )
    except UpstreamError as e:
        raise _upstream_error(e) from e
    except (aiohttp.ClientError, OSError) as e:  # from reading the client's body
        raise UpstreamUnavailable("the request body could not be sent to oms") from e
    request.app[METRICS].oms_duration.observe(time.perf_counter() - started)

    try:
        return await _relay(request, answer, chunk)
    finally:
        answer.release()


def _upstream_error(e: UpstreamError) -> ProxyError:
    """The project error for a failed request to oms."""
    if isinstance(e, TimeoutError):
        return UpstreamTimeout("oms did not answer in time")
    if isinstance(e, ConnectFailed):
        return UpstreamUnavailable(f"oms is unreachable: {e}")
    return UpstreamUnavailable(f"oms broke the exchange: {e}")


class _RawHead:
    """Mixin for answers with header bytes that are not UTF-8: the head is written as is."""

    async def _write_headers(self) -> None:
        response = typing.cast(web.StreamResponse, self)
        request = response._req
        assert request is not None
        assert request.transport is not None
        version = request.version
        status = f"HTTP/{version.major}.{version.minor} {response.status} {response.reason}"
        request.transport.write(hdr.encode_head(status, response.headers.items()))


class _RawHeadResponse(_RawHead, web.Response):
    pass


class _RawHeadStreamResponse(_RawHead, web.StreamResponse):
    pass


def _relay_interim(request: web.Request, upstream: Response) -> None:
    """oms's 1xx answers (102, 103, ...) go to the client first, if it speaks HTTP/1.1.

    RFC 9110 §15.2: a proxy forwards 1xx answers, and never sends one to an HTTP/1.0 client.
    """
    if request.version < HttpVersion11 or request.transport is None:
        return
    out = b"".join(
        hdr.encode_head(
            f"HTTP/1.1 {i.status} {i.reason.decode('utf-8', 'surrogateescape')}",
            hdr.downstream_response_headers(CIMultiDict(i.headers)).items(),
        )
        for i in upstream.interim
    )
    request.transport.write(out)


async def _relay(request: web.Request, upstream: Response, chunk: int) -> web.StreamResponse:
    resp_headers = hdr.downstream_response_headers(upstream.headers)
    if hdr.REQUEST_ID not in resp_headers:
        resp_headers[hdr.REQUEST_ID] = request_id(request)
    no_body = hdr.has_no_body(request.method, upstream.status)
    length = upstream.content_length
    if upstream.interim:
        _relay_interim(request, upstream)
    raw = upstream.raw_bytes

    if not no_body and length is not None and length <= SMALL_BODY:
        try:
            payload = await upstream.read()
        except TimeoutError as e:
            raise UpstreamTimeout("oms stopped sending in time") from e
        except UpstreamError as e:
            raise UpstreamUnavailable(f"oms broke the exchange: {e}") from e
        upstream.release()  # the connection can serve another request while this one is sent
        resp_headers.popall("Content-Length", None)
        return (_RawHeadResponse if raw else web.Response)(
            status=upstream.status, reason=upstream.reason, headers=resp_headers, body=payload
        )

    response = (_RawHeadStreamResponse if raw else web.StreamResponse)(
        status=upstream.status, reason=upstream.reason, headers=resp_headers
    )
    if no_body:
        # Keep oms's Content-Length for HEAD; aiohttp sends no body for HEAD/204/304.
        await response.prepare(request)
        await response.write_eof()
        return response
    if length is not None:
        response.content_length = length
    elif request.version >= HttpVersion11:
        response.enable_chunked_encoding()
    else:
        # An HTTP/1.0 client knows no chunked coding: the body ends when the connection does
        # (RFC 9112 §6.3), as nginx does it. aiohttp leaves the connection open when the client
        # asked for keep-alive, hence the explicit close.
        response.force_close()
    await response.prepare(request)
    read = upstream.read_chunk
    while True:
        try:
            data = await read(chunk)
        except UpstreamError as e:
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
    request: web.Request, upstream: Response, response: web.StreamResponse
) -> web.StreamResponse:
    """Drop both connections of a broken stream; neither goes back to a pool."""
    upstream.close()
    if request.transport is not None:
        request.transport.close()
    return response
