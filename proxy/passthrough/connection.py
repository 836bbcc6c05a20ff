"""One connection to oms: an ``asyncio.Protocol`` with the httptools parser, one exchange at once.

The pool that owns the connections, and the module's design, are in
:mod:`proxy.passthrough.client`. The errors of an exchange are defined here, where they arise.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import os
import typing
from collections.abc import AsyncGenerator, AsyncIterable, Iterable
from typing import Final

import httptools
from multidict import CIMultiDict

# Bodies in memory up to this size are sent in the same write as the head.
_COALESCE = 64 * 1024

# An answer body with a Content-Length past this size is taken from the socket as it comes,
# without llhttp (which would copy every byte once more): see _Conn.data_received.
_DIRECT_BODY = 64 * 1024

_LAST_CHUNK: Final = b"0\r\n\r\n"

_NO_HEADERS: CIMultiDict[str] = CIMultiDict()  # before an answer's head (never modified)


class UpstreamError(Exception):
    """A failed exchange with oms."""


class ConnectTimeout(UpstreamError, TimeoutError):
    """No connection to oms (or free slot in the pool) within the connect timeout."""


class ConnectFailed(UpstreamError):
    """The connection to oms could not be opened (refused, unreachable, TLS handshake)."""

    def __init__(self, error: OSError) -> None:
        self.os_error = error
        reason = error.strerror or (os.strerror(error.errno) if error.errno else str(error))
        if isinstance(error, ConnectionRefusedError) or error.errno == errno.ECONNREFUSED:
            reason = "connection refused"
        super().__init__(reason or type(error).__name__)


class ReadTimeout(UpstreamError, TimeoutError):
    """oms sent nothing (or read nothing of an upload) within the read timeout."""


class Broken(UpstreamError):
    """oms closed or reset the connection, or sent something that is not HTTP/1.1."""


class _Stray(Exception):
    """Raised inside a parser callback to stop parsing bytes that belong to no exchange."""


class Interim(typing.NamedTuple):
    """A 1xx answer that came before the final one: status, reason, header lines in order."""

    status: int
    reason: bytes
    headers: list[tuple[str, str]]


class Pool(typing.Protocol):
    """What a connection needs of its pool (:class:`proxy.passthrough.client.Upstream`)."""

    loop: asyncio.AbstractEventLoop
    high_water: int
    max_head_bytes: int
    max_headers: int
    read_timeout: float

    def discard(self, conn: _Conn) -> None:
        """Drop a pooled connection that oms closed or that received something unexpected."""

    def forget(self, conn: _Conn) -> None:
        """Account for a connection that is gone."""


class _Conn(asyncio.Protocol):
    """One connection to oms: the protocol callbacks, the parser, and one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._high = pool.high_water
        self._max_head = pool.max_head_bytes
        self._max_headers = pool.max_headers
        self._read_timeout = pool.read_timeout
        self._low = pool.high_water // 2
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._parser_spent = False  # fed part of a message only (direct body): make a new one
        self._direct_left = 0  # bytes of a Content-Length body still to come, past the parser
        self.closed = False
        self.in_pool = False
        self.counted = True  # holds a slot of the pool's connection count
        self.reused = False
        self.idle_since = 0.0
        self._write_paused = False
        self._read_paused = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0  # of the current wait (see _wait)
        self._timer: asyncio.TimerHandle | None = None
        self._begin(head_only=False)
        self.active = False

    def _begin(self, *, head_only: bool) -> None:
        """Fresh state for the next exchange."""
        self.active = True
        self.head_only = head_only
        self.status = 0
        self._reason = b""
        self._raw: list[tuple[str, str]] = []
        self.head_bytes = 0  # of the answer's head lines (and its interim answers') so far
        self._head_fed = 0  # bytes fed to the parser before the head was complete
        self.interim: list[Interim] = []  # 1xx answers to relay (not 100, never 101)
        self.raw_bytes = False  # a header value is not UTF-8 (held with surrogate escapes)
        self.headers: CIMultiDict[str] = _NO_HEADERS
        self.content_length: int | None = None
        self._interim = False
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.eof_body = False
        self.got_bytes = False
        self.body_sent = 0
        self.body_seen = 0
        self.reusable = True
        self.error: UpstreamError | None = None
        self._direct_left = 0
        if self._parser_spent:
            self._parser = httptools.HttpResponseParser(self)
            self._parser_spent = False

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses, hence no isinstance).
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.active:  # bytes on an idle connection belong to no request: drop it
            self.reusable = False
            self._pool.discard(self)
            return
        if self._direct_left:
            self._direct(data)
            return
        self.got_bytes = True
        head = not self.head_done
        if head:
            self._head_fed += len(data)
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            self.reusable = False
            if not self.complete:
                cause = e.__context__
                if isinstance(cause, UpstreamError):
                    self._fail(cause)
                else:
                    self._fail(Broken(f"a malformed answer ({type(e).__name__})"))
            elif self.transport is not None:
                self.transport.abort()  # stray bytes after a whole answer
            return
        if head and not self.head_done and self._head_fed > self._max_head:
            # Stop before the parser buffers more of a head that is too big anyway.
            self._fail(Broken(f"an answer head over {self._max_head} bytes"))
            return
        length = self.content_length
        if (
            self.head_done
            and not self.complete
            and length is not None
            and length - self.body_seen > _DIRECT_BODY
        ):
            # The rest of a long Content-Length body: counted, not parsed (and not copied).
            self._direct_left = length - self.body_seen
            self._parser_spent = True

    def _direct(self, data: bytes) -> None:
        """Bytes of a Content-Length body taken past the parser (see data_received)."""
        left = self._direct_left
        if len(data) > left:  # the body ends here, and something else follows it
            self.reusable = False
            data = data[:left]
        self._direct_left = left - len(data)
        self.on_body(data)
        if not self._direct_left:
            self.complete = True
            self._wake()
            if not self.reusable and self.transport is not None:
                self.transport.abort()

    def eof_received(self) -> bool | None:
        self._at_end(None)
        return None  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._at_end(exc)
        self._pool.forget(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake()

    # --- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete or not self.active:
            raise _Stray

    def on_status(self, status: bytes) -> None:
        self._reason += status
        self.head_bytes += len(status) + 15  # "HTTP/1.1 200 " and CRLF

    def on_header(self, name: bytes, value: bytes) -> None:
        # The limits are checked at the head's end: what one read brings is bounded before
        # (data_received), so only a head that came in one read can be over them here.
        self.head_bytes += len(name) + len(value)
        try:
            text = value.decode()
        except UnicodeDecodeError:  # bytes pass unchanged: see proxy.headers.encode_head
            text = value.decode("utf-8", "surrogateescape")
            self.raw_bytes = True
        self._raw.append((name.decode("latin-1"), text))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if len(self._raw) > self._max_headers:
            raise Broken(f"an answer with more than {self._max_headers} header lines")
        if self.head_bytes + 4 * len(self._raw) > self._max_head:  # ": " and CRLF per line
            raise Broken(f"an answer head over {self._max_head} bytes")
        if not 100 <= status <= 599:  # RFC 9110 §15: three digits, 100 to 599
            raise Broken(f"an answer with status {status:03d}, which is no HTTP status")
        if status < 200:
            if status == 101:
                raise Broken("a protocol switch (101), which the pass-through does not support")
            # An interim answer; the final one follows. 100 answers the Expect that the
            # proxy's own server handles: not relayed.
            self._interim = True
            if status != 100:
                self.interim.append(Interim(status, self._reason, self._raw))
            self._raw = []
            self._reason = b""
            return
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()  # known from the head on
        self.headers = headers = CIMultiDict(self._raw)
        length = headers.get("Content-Length")
        self.content_length = int(length) if length is not None else None
        if self.head_only:
            # Complete without a body. llhttp, not told this was HEAD, may now expect one:
            # the connection is never reused.
            self.complete = True
            self.reusable = False
        elif length is None and status not in (204, 304):
            codings = _transfer_codings(headers.getall("Transfer-Encoding", ()))
            if codings and codings != ["chunked"]:
                raise Broken(f"a transfer coding the pass-through cannot decode: {codings}")
            self.eof_body = not codings
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.complete:  # an answer to HEAD has no body whatever it announces
            return
        if self._interim:  # llhttp frames a body for 1xx codes it does not know (104-199)
            raise Broken("an interim (1xx) answer with a body")
        self.chunks.append(body)
        self.body_seen += len(body)
        self.buffered += len(body)
        if self.buffered >= self._high and not self._read_paused and not self.closed:
            self._read_paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if not self.complete:
            self.complete = True
            self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # --- internals --------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _at_end(self, exc: Exception | None) -> None:
        """The connection ended (EOF or closed): complete an EOF-delimited body, else fail."""
        if self.active and not self.complete and self.error is None:
            if self.head_done and self.eof_body and exc is None:
                self.complete = True
            elif self.head_done:
                self.error = Broken("connection closed in the middle of the answer")
            elif self.got_bytes:
                self.error = Broken("connection closed in the middle of the answer's head")
            else:
                self.error = Broken("connection closed without an answer")
        self.reusable = False
        self._wake()

    async def _wait(self) -> None:
        """Until the next event on this connection; ReadTimeout after the read timeout.

        One timer per connection serves all its waits: a wait only moves the deadline on,
        and the timer, when it fires early, sets itself again for the current deadline. That
        spares a timer handle per wait (created, cancelled, then dropped from the loop's heap).
        """
        waiter = self._waiter = self._loop.create_future()
        self._deadline = self._loop.time() + self._read_timeout
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_deadline(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self.closed:
            return  # no wait now: the next one sets the timer again
        if self._loop.time() >= self._deadline:
            waiter.set_exception(ReadTimeout("nothing received in time"))
        else:
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)

    def _take(self, n: int) -> bytes:
        chunks = self.chunks
        data = chunks.popleft()
        if len(data) > n:
            chunks.appendleft(data[n:])
            data = data[:n]
        elif chunks and len(data) + len(chunks[0]) <= n:
            parts = [data]
            size = len(data)
            while chunks and size + len(chunks[0]) <= n:
                part = chunks.popleft()
                parts.append(part)
                size += len(part)
            data = b"".join(parts)
        self.buffered -= len(data)
        if self._read_paused and self.buffered <= self._low:
            self._read_paused = False
            if not self.closed and self.transport is not None:
                self.transport.resume_reading()
        return data

    # --- one exchange -----------------------------------------------------------------------

    async def send(
        self,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None,
        length: int | None,
    ) -> None:
        """Write the request and wait for the answer's head."""
        transport = self.transport
        assert transport is not None
        if body is None or isinstance(body, bytes):
            if body and len(body) > _COALESCE:
                transport.write(head)
                transport.write(body)
            else:
                transport.write(head + body if body else head)
            self.body_sent = len(body) if body else 0
        else:
            await self._send_stream(transport, head, body, length)
        while not self.head_done:
            if self.error is not None:
                raise self.error
            if self.closed:  # pragma: no cover - connection_lost always sets error first
                raise Broken("connection closed without an answer")
            await self._wait()

    async def _send_stream(
        self,
        transport: asyncio.Transport,
        head: bytes,
        body: AsyncIterable[bytes],
        length: int | None,
    ) -> None:
        transport.write(head)
        complete = True
        try:
            async for data in body:
                if self.closed or self.head_done:  # oms answered (or left) before the end
                    complete = False
                    break
                if not data:
                    continue
                if length is None:
                    transport.write(b"%x\r\n%b\r\n" % (len(data), data))
                else:
                    transport.write(data)
                self.body_sent += len(data)
                while self._write_paused and not self.closed and not self.head_done:
                    await self._wait()
        finally:
            if isinstance(body, AsyncGenerator):
                await body.aclose()
        if not complete:
            self.reusable = False  # the rest of the body is not sent: the connection is spent
            return
        if length is None:
            transport.write(_LAST_CHUNK)
        elif self.body_sent != length:
            error = Broken("the request body ended before its announced length")
            self._fail(error)
            raise error

    async def read_chunk(self, n: int) -> bytes:
        """Up to ``n`` bytes of the answer's body; ``b""`` at its end."""
        while not self.chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            if self.closed:  # pragma: no cover - connection_lost always completes or fails
                raise Broken("connection closed in the middle of the answer")
            await self._wait()
        return self._take(n)


def _transfer_codings(values: Iterable[str]) -> list[str]:
    """The transfer codings of these Transfer-Encoding field lines, ``identity`` left out.

    The field lines form one list (RFC 9110 §5.3), which llhttp frames by: ``identity`` on one
    line and ``chunked`` on the next is a chunked body, not one ended by the close.
    """
    return [
        low
        for v in values
        for c in v.split(",")
        if (low := c.strip().lower()) and low != "identity"
    ]
