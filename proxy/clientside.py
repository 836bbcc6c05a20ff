"""The client side: aiohttp's HTTP/1.1 server, with what RFC 9110/9112 asks of a reverse proxy.

aiohttp's server (its ``RequestHandler`` and llhttp-based request parser) serves every client
connection. Where it answers worse than the RFCs (and nginx), :class:`ClientConnection`, one per
client connection, corrects it; everything else is aiohttp's:

- Requests that arrived whole before a malformed byte of the same read are answered first, then
  the 400 (aiohttp answers only the 400). After a request that ends the connection
  (``Connection: close``, HTTP/1.0 without keep-alive) what follows is not read (RFC 9112 §9.6;
  aiohttp answers 400 "Data after Connection: close" instead of the request).
- Error answers always have an ``HTTP/1.1`` status line (RFC 9110 §6.2; aiohttp repeats the
  request's version or says ``HTTP/1.0``).
- A request line over ``server.max_request_line_bytes`` is 414, a header line over
  ``server.max_header_bytes`` or more than ``server.max_headers`` of them 431 (RFC 9110
  §15.5.15, RFC 6585 §5; aiohttp: 400); HTTP/2 and later in a request line are 505, HTTP/0.9
  (no version) 400; a higher 1.x minor version is served as HTTP/1.1. A well-formed method that
  llhttp does not know, and CONNECT (this is no forward proxy), are 501 (RFC 9110 §9.1).
- A transfer coding other than ``chunked`` is 501, ``chunked`` twice or not last is 400, and so
  is Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1, §6.3; aiohttp decodes the chunks
  and passes the rest on as if it were plain).
- A request with ``Upgrade`` is served as a plain one (the pass-through never switches
  protocols; Upgrade is hop-by-hop). aiohttp's parser, after such a request with a body, drops
  the rest of its read: requests pipelined behind it were never answered. They are parsed
  again here, or, when their start cannot be told, the connection is closed after the answer so
  that the client retries them (RFC 9112 §9.3.2).

This leans on aiohttp internals (``RequestHandler._parser``, ``_ErrInfo``, the request parser's
constructor, ``StreamResponse._write_headers``); ``tests/test_http_conformance.py`` exercises
every one of them byte for byte, so an aiohttp upgrade that changes them fails there.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.http import HttpRequestParser
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, HttpProcessingError, LineTooLong
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import MAX_MSG_QUEUE_SIZE, RequestHandler, _ErrInfo

from proxy.passthrough import headers as hdr

# A request line of HTTP/2 or later (refused with 505, not 400).
_LATER_VERSION = re.compile(rb"[!-~]+ [!-~]+ HTTP/[2-9]\.[0-9]\r?\n")

# A request line that starts with a well-formed method token (RFC 9110 §9.1, §5.6.2).
_TOKEN_METHOD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ ")

_Message = tuple[Any, StreamReader]  # (RawRequestMessage | _ErrInfo, payload)
_Fed = tuple[Sequence[_Message], bool, bytes]


class _Http11Error(web.Response):
    """An error answer whose status line says HTTP/1.1 whatever the request said."""

    async def _write_headers(self) -> None:
        request = self._req
        assert request is not None
        assert request.transport is not None
        status_line = f"HTTP/1.1 {self.status} {self.reason}"
        request.transport.write(hdr.encode_head(status_line, self.headers.items()))


def _error(status: int, exc: HttpProcessingError) -> _Message:
    return (_ErrInfo(status=status, exc=exc, message=exc.message), EMPTY_PAYLOAD)


def _is_request_line(data: bytes, line: bytes) -> bool:
    """Whether the over-long ``line`` (its first bytes) is a request target, not a header line."""
    at = data.find(line[:64]) if line else -1
    if at < 0:
        return False
    start = data.rfind(b"\n", 0, at) + 1
    before = data[start:at]
    return before.endswith(b" ") and b":" not in before


def _transfer_codings(message: Any) -> list[str]:
    values = message.headers.getall("Transfer-Encoding", ())
    return [c.strip().lower() for v in values for c in v.split(",") if c.strip()]


class _GuardedParser:
    """aiohttp's request parser, with the corrections listed in the module's docstring."""

    def __init__(self, conn: ClientConnection, inner: HttpRequestParser) -> None:
        self._conn = conn
        self._inner = inner
        self._idle = True  # at a message boundary: the next read starts a request
        self._done = False  # an error answer is queued: nothing more is parsed
        # Requests given out and not yet taken up: at aiohttp's queue limit its parser keeps
        # the rest of a read for later, so the read did not end at a boundary.
        self._queued = 0

    def __getattr__(self, name: str) -> Any:  # feed_eof, set_upgraded ...
        return getattr(self._inner, name)

    def message_consumed(self) -> None:
        self._queued = max(0, self._queued - 1)
        self._inner.message_consumed()

    def feed_data(self, data: bytes) -> _Fed:
        if self._done:
            return (), False, b""
        idle = self._idle
        try:
            messages, upgraded, tail = self._inner.feed_data(data)
        except HttpProcessingError as exc:
            self._idle = False
            self._done = True
            return self._failed(data, exc, idle), False, b""
        if not messages:
            if data:
                self._idle = False
            return messages, upgraded, tail
        self._queued += len(messages)
        out = self._checked(messages)
        last = out[-1][0]
        if isinstance(last, _ErrInfo):
            self._done = True
            return out, False, b""
        if not upgraded and last.upgrade and not last.should_close:
            # aiohttp's parser stopped after this request and dropped the rest of ``data``.
            rest = self._after_upgrade(data, last, idle, len(messages))
            if rest is None:
                out = [*out[:-1], (last._replace(should_close=True), out[-1][1])]
            elif rest:
                self._idle = True  # ``rest`` starts right after that request
                more, upgraded, tail = self.feed_data(rest)
                return [*out, *more], upgraded, tail
        # A request begins only once the one before is whole: the last one tells for all.
        self._idle = (
            self._queued < MAX_MSG_QUEUE_SIZE and data.endswith(b"\r\n\r\n") and out[-1][1].is_eof()
        )
        return out, upgraded, tail

    def _checked(self, messages: Sequence[_Message]) -> Sequence[_Message]:
        """The messages up to the first one refused (which becomes its error answer)."""
        for message, _ in messages:  # the usual case, kept cheap: nothing to change
            version = message.version
            if (
                message.chunked
                or message.method == "CONNECT"
                or (version != HttpVersion11 and version != HttpVersion10)
            ):
                break
        else:
            return messages
        out: list[_Message] = []
        for message, payload in messages:
            refused = self._refusal(message)
            if refused is not None:
                out.append(refused)
                break
            if message.version > HttpVersion11 and message.version.major == 1:
                message = message._replace(version=HttpVersion11)
            out.append((message, payload))
        return out

    def _refusal(self, message: Any) -> _Message | None:
        version = message.version
        if version.major >= 2:
            return _error(505, BadHttpMessage(f"HTTP/{version.major} is not supported here"))
        if version < HttpVersion10:
            return _error(400, BadHttpMessage("HTTP/1.0 or HTTP/1.1 expected"))
        if message.method == "CONNECT":
            return _error(501, BadHttpMessage("CONNECT is not served: this is no forward proxy"))
        # Transfer-Encoding without chunked last is refused by llhttp itself.
        codings = _transfer_codings(message) if message.chunked else []
        if codings and version == HttpVersion10:  # RFC 9112 §6.1: faulty framing
            return _error(400, BadHttpMessage("Transfer-Encoding in an HTTP/1.0 request"))
        if codings and codings != ["chunked"]:
            if codings[-1] != "chunked" or codings.count("chunked") > 1:
                return _error(400, BadHttpMessage("chunked must be the last transfer coding"))
            return _error(501, BadHttpMessage(f"Transfer coding not supported: {codings[0]}"))
        return None

    def _after_upgrade(self, data: bytes, message: Any, idle: bool, count: int) -> bytes | None:
        """What followed an Upgrade request in ``data``; None when its end cannot be told."""
        if not idle or count != 1 or message.chunked:
            return None
        skip = len(data) - len(data.lstrip(b"\r\n"))  # empty lines before a request line
        head_end = data.find(b"\r\n\r\n", skip)
        if head_end < 0:
            return None
        length = message.headers.get("Content-Length", "0")
        if not length.isdigit():
            return None
        end = head_end + 4 + int(length)
        return data[end:] if end <= len(data) else None

    def _failed(self, data: bytes, exc: HttpProcessingError, idle: bool) -> list[_Message]:
        """The requests whole before the error (when the read began one), then its answer."""
        good, at = self._whole_before_error(data) if idle else ([], 0)
        if good:
            last = good[-1][0]
            if isinstance(last, _ErrInfo) or last.should_close:
                return good  # the connection ends after that request: what follows is not read
        line = data.rfind(b"\n", 0, at) + 1  # the line the error is in
        return [*good, _error(self._status(exc, data[line:]), exc)]

    def _status(self, exc: HttpProcessingError, data: bytes) -> int:
        if isinstance(exc, LineTooLong):
            return 414 if _is_request_line(data, _as_bytes(exc.args[0])) else 431
        if exc.message == "Too many headers received":
            return 431
        if isinstance(exc, BadHttpMethod) and _TOKEN_METHOD.match(data.lstrip(b"\r\n")):
            return 501  # a well-formed method llhttp does not know (RFC 9110 §9.1)
        if "Invalid HTTP version" in exc.message and _LATER_VERSION.match(data.lstrip(b"\r\n")):
            return 505  # llhttp knows no 3.0 and later; 2.0 parses, and is refused in _refusal
        return 400

    def _whole_before_error(self, data: bytes) -> tuple[list[_Message], int]:
        """The whole requests at the start of ``data``, parsed again, and where the error is."""
        lo, hi = 0, len(data)  # a prefix of lo bytes parses, one of hi bytes fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                self._conn.new_parser().feed_data(data[:mid])
            except HttpProcessingError:
                hi = mid
            else:
                lo = mid
        if lo == 0:
            return [], 0
        messages, _, _ = self._conn.new_parser().feed_data(data[:lo])
        whole = []
        for message, payload in messages:
            if not payload.is_eof():
                break  # cut by the error: not served
            whole.append((message, payload))
        return list(self._checked(whole)), lo


def _as_bytes(line: object) -> bytes:
    if isinstance(line, bytes | bytearray):
        return bytes(line).removesuffix(b"...")
    return str(line).encode("utf-8", "surrogateescape").removesuffix(b"...")


class ClientConnection(RequestHandler):
    """One client connection (see the module's docstring for what differs from aiohttp's)."""

    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._parser_args = (
            kwargs["loop"],
            kwargs.get("read_bufsize", 2**16),
            {
                "max_line_size": kwargs.get("max_line_size", 8190),
                "max_field_size": kwargs.get("max_field_size", 8190),
                "max_headers": kwargs.get("max_headers", 128),
                "payload_exception": web.RequestPayloadError,
                "auto_decompress": kwargs.get("auto_decompress", True),
            },
        )
        inner = self._parser
        assert isinstance(inner, HttpRequestParser)
        self._parser = _GuardedParser(self, inner)  # type: ignore[assignment]

    def new_parser(self) -> HttpRequestParser:
        """A parser like the connection's own (to parse a read again)."""
        loop, limit, options = self._parser_args
        return HttpRequestParser(self, loop, limit, **options)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        answer = super().handle_error(request, status, exc, message)
        assert isinstance(answer, web.Response)
        out = _Http11Error(status=answer.status, body=answer.body, headers=answer.headers)
        out.force_close()
        return out


class ProxyServer(web.Server):
    """aiohttp's low-level server, making a :class:`ClientConnection` per connection."""

    def __call__(self) -> RequestHandler:
        return ClientConnection(self, loop=self._loop, **self._kwargs)


class ProxyRunner(web.AppRunner):
    """An ``AppRunner`` serving its app through :class:`ProxyServer`."""

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        return ProxyServer(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **base._kwargs,
        )
