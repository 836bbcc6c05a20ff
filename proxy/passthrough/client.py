"""A pooled HTTP/1.1 client for the pass-through to oms, and for nothing else.

Why not aiohttp's ``ClientSession``: it is general (cookies, redirects, auth, tracing, proxies,
decompression, timeouts of five kinds) and each request pays for that generality: about 106 µs
of CPU per small request in a profile, two thirds of the proxy's whole budget. The pass-through
needs little of it: one origin, bytes in and bytes out, a few timeouts. The model lookups,
``/readyz`` and the Kubernetes client keep using aiohttp; only :func:`proxy.passthrough.forward`
uses this module.

Parser: ``httptools`` (llhttp, the parser of Node.js, as used by uvicorn). aiohttp also ships a
C response parser, but ``aiohttp._http_parser.HttpResponseParser`` is internal: its constructor
has changed between minor releases and it feeds aiohttp's own ``StreamReader`` and protocol
classes, so using it would tie this module to aiohttp's internals. httptools has a small, stable,
typed, callback API, is kept up to date with llhttp, and is strict by default (no bare LF, no
obs-fold, Content-Length and Transfer-Encoding together refused). What llhttp does not do here is
done by this module: it is not told the request method, so a HEAD answer is complete at the end
of its head; and httptools has no "end of input", so a body delimited by the end of the
connection (no Content-Length, not chunked: HTTP/1.0 style) is complete when oms closes cleanly.

An exchange, on one :class:`_Conn` (an ``asyncio.Protocol``):

- the request head is written in one piece, with a body that is already in memory; a streamed
  body follows chunk by chunk (as it came: with its Content-Length, or chunked), waiting for the
  transport to drain when its buffer is full, so an upload never piles up in memory. If oms
  answers (or closes) before the body is all sent, sending stops and the answer is read.
- the answer's body is queued as llhttp delivers it (de-chunked: the proxy re-chunks it, the
  payload is identical); the rest of a long Content-Length body, once its first bytes are
  parsed, is queued as read from the socket, only counted (llhttp would copy it once more).
  Past ``chunk`` bytes queued, the socket stops being read until the consumer catches up,
  so a download never piles up either. Nothing is decompressed.
- header names and values are passed with their exact bytes (values decoded as UTF-8, with
  surrogate escapes for bytes that are not, which :func:`proxy.headers.encode_head` writes
  back as they came), in their order, repeated ones included.
- the head is bounded (``max_head_bytes``, ``max_headers``) and framed as RFC 9112 says:
  Transfer-Encoding is one list over all its field lines and only ``chunked`` is decoded; a status
  outside 100-599, a 1xx with a body or a 101 fail the exchange; other 1xx answers (but 100,
  which answers an Expect the proxy's own server handles) are kept for the caller to relay
  (:attr:`Response.interim`).

Connections are kept alive and reused, most recently used first, only when the previous exchange
ended cleanly: the whole answer received, keep-alive on both sides, nothing unexpected received
(an answer received whole but not all read by the caller leaves nothing on the wire). A
pooled connection that receives anything, or is closed by oms, is dropped at once; one idle past
``max_idle_seconds`` is closed. ``max_connections`` bounds the connections open at once (0: no
bound); a request waits for one within the connect timeout.

Errors are :class:`UpstreamError` subclasses: :class:`ConnectTimeout` (no connection within
``connect_timeout``), :class:`ConnectFailed` (refused, unreachable, TLS failure),
:class:`ReadTimeout` (oms silent for ``read_timeout`` while an answer is awaited, or not
reading an upload for that long), :class:`Broken` (closed, reset or malformed mid-exchange). A
kept-alive connection that oms closes just as it is reused (no byte of an answer received) is
retried once, on a new connection, for a request with no body and an idempotent method (RFC 9110
§9.2.2): nothing else can be sent twice safely.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import AsyncIterable, Iterable
from typing import Final
from urllib.parse import urlsplit

from proxy.passthrough.connection import (
    Broken,
    ConnectFailed,
    ConnectTimeout,
    Interim,
    ReadTimeout,
    UpstreamError,
    _Conn,
)

# Methods that may be sent twice (RFC 9110 §9.2.2).
_IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

__all__ = [
    "Broken",
    "ConnectFailed",
    "ConnectTimeout",
    "Interim",
    "ReadTimeout",
    "Response",
    "Upstream",
    "UpstreamError",
]


class Response:
    """The head of oms's answer; the body is read with :meth:`read` or :meth:`read_chunk`.

    :meth:`release` must be called when done with it (``finally``): the connection goes back to
    the pool if the answer was read whole and cleanly, else it is closed.
    """

    __slots__ = (
        "_conn",
        "_pool",
        "content_length",
        "headers",
        "interim",
        "raw_bytes",
        "reason",
        "status",
    )

    def __init__(self, conn: _Conn, pool: Upstream) -> None:
        self._conn: _Conn | None = conn
        self._pool = pool
        self.status = conn.status
        self.reason = conn._reason.decode("utf-8", "surrogateescape")
        self.headers = conn.headers
        self.content_length = conn.content_length
        self.interim = conn.interim  # 1xx answers before this one (mostly empty)
        self.raw_bytes = conn.raw_bytes  # a header value that is not UTF-8 (surrogate escapes)

    async def read_chunk(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body, as they come; ``b""`` once it is all read."""
        conn = self._conn
        if conn is None:
            raise Broken("the answer was released")
        return await conn.read_chunk(n)

    async def read(self) -> bytes:
        """The whole body (for answers known to be small)."""
        conn = self._conn
        if conn is None:
            raise Broken("the answer was released")
        if conn.complete and len(conn.chunks) <= 1:  # the usual small answer: already here
            return conn._take(1 << 62) if conn.chunks else b""
        parts = []
        while data := await conn.read_chunk(1 << 62):
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: reuse the connection if the exchange ended cleanly."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn)

    def close(self) -> None:
        """Abandon the answer: the connection is closed, never reused."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.reusable = False
            self._pool.release(conn)


class Upstream:
    """Pooled HTTP/1.1 connections to one origin (oms), for the pass-through.

    ``chunk`` is the size of the body reads, and the most of an answer's body queued (past it,
    the socket is not read until the queue is half empty); ``ssl_context`` the TLS settings
    for an https ``url`` (default: the system's CAs, hostname checked). An answer whose head
    (interim answers included) is over ``max_head_bytes``, or has more than ``max_headers``
    header lines, fails as :class:`Broken` as soon as that shows, before more of it is held.
    Create it inside the running event loop; :meth:`close` it at the end.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int = 0,
        max_idle_seconds: float = 15.0,
        chunk: int = 256 * 1024,
        max_head_bytes: int = 65536,
        max_headers: int = 100,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        tls = parts.scheme == "https"
        default_port = 443 if tls else 80
        self.host = parts.hostname
        self.port = parts.port or default_port
        netloc = parts.netloc.rpartition("@")[2]
        if parts.port == default_port:
            netloc = netloc.rsplit(":", 1)[0]
        self.host_header = netloc
        self._ssl: ssl.SSLContext | None = None
        if tls:
            self._ssl = ssl_context or ssl.create_default_context()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.max_idle_seconds = max_idle_seconds
        self.high_water = chunk
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self.loop = asyncio.get_running_loop()
        self._idle: list[_Conn] = []  # oldest first
        self._conns: set[_Conn] = set()
        self._count = 0  # connections open or opening (a slot each)
        self._waiters: collections.deque[asyncio.Future[_Conn | None]] = collections.deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    # --- the request ------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | AsyncIterable[bytes] | None = None,
        *,
        length: int | None = None,
    ) -> Response:
        """Send one request; return the answer's head once it has arrived.

        ``target`` is the request target as sent on the wire (origin form, already encoded).
        ``headers`` go out as given, after ``Host``; they carry the body's ``Content-Length``
        when there is one. A streamed ``body`` with ``length`` None is sent chunked (and
        ``Transfer-Encoding: chunked`` is added); with a ``length`` it must bring exactly that
        many bytes.
        """
        chunked = body is not None and not isinstance(body, bytes) and length is None
        head = self._head(method, target, headers, chunked)
        fresh = False
        while True:
            conn = await self._acquire(fresh=fresh)
            conn._begin(head_only=method == "HEAD")
            try:
                await conn.send(head, body, length)
            except Broken:
                conn.reusable = False
                self.release(conn)
                if (
                    not fresh
                    and conn.reused
                    and not conn.got_bytes
                    and conn.body_sent == 0
                    and not body
                    and method in _IDEMPOTENT
                ):
                    fresh = True  # oms closed a kept-alive connection as it was reused
                    continue
                raise
            except BaseException:
                conn.reusable = False
                self.release(conn)
                raise
            return Response(conn, self)

    def _head(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], chunked: bool
    ) -> bytes:
        lines = [f"{name}: {value}\r\n" for name, value in headers]
        if chunked:
            lines.append("Transfer-Encoding: chunked\r\n")
        text = f"{method} {target} HTTP/1.1\r\nHost: {self.host_header}\r\n{''.join(lines)}\r\n"
        # Every line ends in CRLF; any other CR or LF would split a line (header injection).
        breaks = len(lines) + 3
        if text.count("\n") != breaks or text.count("\r") != breaks:
            raise ValueError("line break in a request line or header")
        return text.encode("utf-8", "surrogateescape")

    # --- the pool ---------------------------------------------------------------------------

    async def _acquire(self, *, fresh: bool) -> _Conn:
        if self._closed:
            raise Broken("the connection pool is closed")
        if not fresh:
            idle = self._idle
            while idle:
                conn = idle.pop()
                conn.in_pool = False
                if not conn.closed and conn.reusable:
                    conn.reused = True
                    return conn
                self.discard(conn)
        deadline = self.loop.time() + self.connect_timeout
        limit = self.max_connections
        if limit and self._count >= limit:
            handed = await self._wait_for_slot(deadline)
            if handed is not None:
                if not fresh:
                    return handed
                handed.counted = False  # a kept-alive one will not do: take over its slot
                self.discard(handed)
        else:
            self._count += 1
        return await self._connect(deadline)

    async def _wait_for_slot(self, deadline: float) -> _Conn | None:
        """A released connection, or None: a slot to open a new one (already counted)."""
        waiter: asyncio.Future[_Conn | None] = self.loop.create_future()
        self._waiters.append(waiter)
        timer = self.loop.call_at(deadline, _expire_slot, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                got = waiter.result()
                if got is not None:
                    self.release(got)
                else:
                    self._free_slot()
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    async def _connect(self, deadline: float) -> _Conn:
        """A new connection, holding the slot the caller counted for it."""
        conn = _Conn(self)  # owns the slot from here: forget() frees it, once
        try:
            async with asyncio.timeout_at(deadline):
                await self.loop.create_connection(
                    lambda: conn,
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except BaseException as e:
            self.discard(conn)
            if isinstance(e, TimeoutError):
                raise ConnectTimeout("no connection in time") from e
            if isinstance(e, OSError):
                raise ConnectFailed(e) from e
            raise
        self._conns.add(conn)
        if self._closed:
            self.discard(conn)
            raise Broken("the connection pool is closed")
        return conn

    def release(self, conn: _Conn) -> None:
        """End of an exchange: back to the pool (or to a waiter) if clean, else closed."""
        conn.active = False
        if not (conn.complete and conn.keep_alive and conn.reusable) or conn.closed:
            self.discard(conn)
            return
        if conn.chunks:  # the answer arrived whole but was not all read: nothing is on the wire
            conn.chunks.clear()
            conn.buffered = 0
        if conn._read_paused and conn.transport is not None:
            conn._read_paused = False
            conn.transport.resume_reading()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                conn.reused = True
                waiter.set_result(conn)
                return
        if self._closed:
            self.discard(conn)
            return
        conn.in_pool = True
        conn.idle_since = self.loop.time()
        self._idle.append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.max_idle_seconds, self._sweep)

    def discard(self, conn: _Conn) -> None:
        """Close ``conn`` at once (nothing is flushed) and free its slot."""
        if conn.in_pool:
            conn.in_pool = False
            with contextlib.suppress(ValueError):
                self._idle.remove(conn)
        conn.active = False
        if conn.transport is not None and not conn.closed:
            conn.transport.abort()
        self.forget(conn)

    def forget(self, conn: _Conn) -> None:
        """``conn`` is closed or closing: it no longer counts against the limit."""
        if conn.closed:
            self._conns.discard(conn)
        if conn.in_pool:
            conn.in_pool = False
            with contextlib.suppress(ValueError):
                self._idle.remove(conn)
        if conn.counted:
            conn.counted = False
            self._free_slot()

    def _free_slot(self) -> None:
        """A slot is free: give it to the first waiter, else count it out."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the waiter now holds this slot
                return
        self._count -= 1

    def _sweep(self) -> None:
        """Close the connections idle for ``max_idle_seconds``; run again while any is idle."""
        self._sweeper = None
        now = self.loop.time()
        idle = self._idle
        while idle and now - idle[0].idle_since >= self.max_idle_seconds:
            self.discard(idle[0])
        if idle:
            wait = idle[0].idle_since + self.max_idle_seconds - now
            self._sweeper = self.loop.call_later(max(wait, 0.01), self._sweep)

    @property
    def open_connections(self) -> int:
        """Connections open or being opened (idle ones included)."""
        return self._count

    @property
    def idle_connections(self) -> int:
        """Connections waiting in the pool."""
        return len(self._idle)

    async def close(self) -> None:
        """Close every connection, idle or busy; pending and later requests fail."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(Broken("the connection pool is closed"))
        for conn in list(self._conns):
            self.discard(conn)
        for _ in range(100):  # connection_lost comes on the next turns of the loop
            if not self._conns:
                break
            await asyncio.sleep(0)


def _expire_slot(waiter: asyncio.Future[_Conn | None]) -> None:
    if not waiter.done():
        waiter.set_exception(ConnectTimeout("no free connection in time"))
