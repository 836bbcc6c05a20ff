"""The client's request body: streamed on with a pause limit, or read whole within a limit.

A stalled client would otherwise hold its connection, and one to oms, for ever: every read must
bring data within ``server.client_body_timeout_seconds``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from proxy.errors import PayloadTooLarge, RequestTimeout
from proxy.keys import CONFIG

# Bodies up to this size with a known Content-Length are read whole instead of streamed.
SMALL_BODY = 256 * 1024


def body_timeout(request: web.Request) -> float | None:
    """``server.client_body_timeout_seconds`` of the request's app (None: no limit)."""
    config = request.config_dict.get(CONFIG)
    return config.server.client_body_timeout_seconds if config is not None else None


def body_timed_out() -> RequestTimeout:
    """The error for a client that paused too long in its request body."""
    return RequestTimeout("Request body not received in time")


class BodyStream:
    """The client's body as it arrives; each read must bring data within ``timeout`` seconds.

    A stalled client would otherwise hold its connection and one to oms for ever.
    """

    def __init__(self, request: web.Request, timeout: float | None) -> None:
        self._content = request.content
        self._timeout = timeout

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self._content
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    # One piece as received: neither cut nor joined, so never copied here.
                    data, _ = await content.readchunk()
            except TimeoutError as e:
                raise body_timed_out() from e
            if data:
                yield data
            elif content.at_eof():  # (b"", True) only marks the end of an HTTP chunk
                return


def request_body(request: web.Request) -> tuple[BodyStream | None, int | None, bool]:
    """(body stream, content length, whether to read it whole first) for the upstream request."""
    length = request.content_length
    if length is not None:
        if length == 0:
            return None, 0, False
        if length <= SMALL_BODY:
            return None, length, True
        return BodyStream(request, body_timeout(request)), length, False
    if request.body_exists:  # chunked upload: stream it on, chunked
        return BodyStream(request, body_timeout(request)), None, False
    return None, None, False


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading them all.

    The whole body must arrive within ``server.client_body_timeout_seconds`` (408 otherwise).
    """
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"Request body too large: over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(body_timeout(request)):
            while True:
                data = await request.content.read(65536)
                if not data:
                    break
                size += len(data)
                if size > limit:
                    raise PayloadTooLarge(f"Request body too large: over {limit} bytes")
                chunks.append(data)
    except TimeoutError as e:
        raise body_timed_out() from e
    return b"".join(chunks)
