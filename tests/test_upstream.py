"""The pass-through's HTTP/1.1 client (proxy.passthrough.client) against scripted loopback servers.

Each test plays oms with raw bytes, so framing, reuse, retries, timeouts and flow control are
checked exactly, including what a well-behaved aiohttp server would never send.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from proxy.app import create_app, server_options
from proxy.passthrough.client import (
    Broken,
    ConnectFailed,
    ConnectTimeout,
    ReadTimeout,
    Response,
    Upstream,
)
from standins.oms import FakeOms
from tests.conftest import make_config

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Raw:
    """A loopback server running ``handler(reader, writer, n)`` for its n-th connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self, **kwargs: object) -> Raw:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        n = self.connections
        self.connections += 1
        # Ends normally even when cancelled at the end of a test: asyncio's stream server logs
        # the exception of a handler task that ends cancelled.
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
            await self.handler(reader, writer, n)
        self.closed += 1
        writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: its head (without the blank line) and its body (de-chunked)."""
    head = (await reader.readuntil(b"\r\n\r\n"))[:-4]
    lower = head.lower()
    body = b""
    if b"\r\ncontent-length:" in lower:
        n = int(lower.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
        body = await reader.readexactly(n)
    elif b"\r\ntransfer-encoding: chunked" in lower:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    return head, body


RawFactory = Callable[..., Awaitable[Raw]]
PoolFactory = Callable[..., Upstream]


@pytest.fixture
async def raw() -> AsyncIterator[RawFactory]:
    servers: list[Raw] = []

    async def start(handler: Handler, **kwargs: object) -> Raw:
        server = await Raw(handler).start(**kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def pool() -> AsyncIterator[PoolFactory]:
    made: list[Upstream] = []

    def make(url: str, **kwargs: object) -> Upstream:
        options: dict[str, object] = {"connect_timeout": 2.0, "read_timeout": 2.0, **kwargs}
        upstream = Upstream(url, **options)  # type: ignore[arg-type]
        made.append(upstream)
        return upstream

    yield make
    for upstream in made:
        await upstream.close()


async def get(upstream: Upstream, path: str = "/", method: str = "GET") -> tuple[Response, bytes]:
    resp = await upstream.request(method, path, [("X-Test", "1")])
    try:
        body = await resp.read()
    finally:
        resp.release()
    return resp, body


async def keep_answering(answer: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(answer)
            await writer.drain()

    return handler


# --- framing ------------------------------------------------------------------------------------


async def test_content_length_answers_reuse_one_connection(
    raw: RawFactory, pool: PoolFactory
) -> None:
    server = await raw(await keep_answering(OK))
    upstream = pool(server.url)
    for _ in range(3):
        resp, body = await get(upstream)
        assert (resp.status, resp.reason, body, resp.content_length) == (200, "OK", b"ok", 2)
    assert server.connections == 1
    assert upstream.idle_connections == 1


async def test_chunked_answer_is_dechunked_and_the_connection_reused(
    raw: RawFactory, pool: PoolFactory
) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url)
    for _ in range(2):
        resp, body = await get(upstream)
        assert body == b"hello world"
        assert resp.content_length is None
        assert resp.headers["Transfer-Encoding"] == "chunked"
    assert server.connections == 1


@pytest.mark.parametrize("status", [204, 304])
async def test_no_body_statuses(raw: RawFactory, pool: PoolFactory, status: int) -> None:
    answer = b'HTTP/1.1 %d X\r\nETag: "a"\r\n\r\n' % status
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url)
    for _ in range(2):
        resp, body = await get(upstream)
        assert (resp.status, body, resp.headers["ETag"]) == (status, b"", '"a"')
    assert server.connections == 1


async def test_head_answer_ends_with_its_head_and_is_not_reused(
    raw: RawFactory, pool: PoolFactory
) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url)
    for _ in range(2):
        resp, body = await get(upstream, method="HEAD")
        assert (resp.status, resp.content_length, body) == (200, 1000, b"")
    assert server.connections == 2  # llhttp was not told it was HEAD: never reused


async def test_interim_answers_are_skipped(raw: RawFactory, pool: PoolFactory) -> None:
    answer = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + OK
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url)
    resp, body = await get(upstream)
    assert (resp.status, body, "Link" in resp.headers) == (200, b"ok", False)
    resp, body = await get(upstream)
    assert body == b"ok"
    assert server.connections == 1


async def test_http10_answer_is_read_to_eof(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        for _ in range(3):
            writer.write(b"x" * 1000)
            await writer.drain()
            await asyncio.sleep(0.01)

    server = await raw(handler)
    upstream = pool(server.url)
    for _ in range(2):
        resp, body = await get(upstream)
        assert (resp.status, resp.content_length, body) == (200, None, b"x" * 3000)
    assert server.connections == 2


async def test_connection_close_answer_is_not_reused(raw: RawFactory, pool: PoolFactory) -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url)
    for _ in range(2):
        assert (await get(upstream))[1] == b"ok"
    assert server.connections == 2
    assert upstream.idle_connections == 0


async def test_truncated_body_is_broken(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")

    server = await raw(handler)
    upstream = pool(server.url)
    resp = await upstream.request("GET", "/", [])
    try:
        with pytest.raises(Broken):
            await resp.read()
    finally:
        resp.release()
    assert upstream.open_connections == 0


async def test_bytes_past_the_answer_spoil_the_connection(
    raw: RawFactory, pool: PoolFactory
) -> None:
    server = await raw(await keep_answering(OK + b"HTTP/1.1 200 OK\r\n"))
    upstream = pool(server.url)
    for _ in range(2):
        assert (await get(upstream))[1] == b"ok"
    assert server.connections == 2


async def test_malformed_answer_is_broken(raw: RawFactory, pool: PoolFactory) -> None:
    server = await raw(await keep_answering(b"HTTP/1.1 200 OK\r\nX-A: a\rX-B: b\r\n\r\n"))
    upstream = pool(server.url)
    with pytest.raises(Broken, match="malformed"):
        await upstream.request("GET", "/", [])


async def test_headers_keep_their_order_case_and_repeats(
    raw: RawFactory, pool: PoolFactory
) -> None:
    answer = (
        b"HTTP/1.1 200 Fine\r\nset-cookie: a=1\r\nX-Mixed-CASE: v\r\nSet-Cookie: b=2\r\n"
        b"X-Utf8: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n"
    )
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url)
    resp, _ = await get(upstream)
    assert resp.reason == "Fine"
    assert list(resp.headers.items()) == [
        ("set-cookie", "a=1"),
        ("X-Mixed-CASE", "v"),
        ("Set-Cookie", "b=2"),
        ("X-Utf8", "café"),
        ("Content-Length", "0"),
    ]


async def test_request_head_is_sent_as_given(raw: RawFactory, pool: PoolFactory) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head, body = await read_request(reader)
        heads.append(head + b"|" + body)
        writer.write(OK)

    server = await raw(handler)
    upstream = pool(server.url)
    headers = [("b-First", "1"), ("Cookie", "x=1"), ("Cookie", "y=2"), ("X-Utf8", "café")]
    headers.append(("Content-Length", "3"))
    resp = await upstream.request("POST", "/a%2Fb?q=1", headers, b"abc", length=3)
    resp.release()
    host = server.url.removeprefix("http://").encode()
    assert heads == [
        b"POST /a%2Fb?q=1 HTTP/1.1\r\nHost: " + host + b"\r\nb-First: 1\r\nCookie: x=1\r\n"
        b"Cookie: y=2\r\nX-Utf8: caf\xc3\xa9\r\nContent-Length: 3|abc"
    ]


@pytest.mark.parametrize(
    ("target", "headers"),
    [("/x\r\nX-Evil: 1", []), ("/x", [("X-A", "a\r\nX-Evil: 1")]), ("/x", [("X-A", "a\nb")])],
)
async def test_line_breaks_in_the_head_are_refused(
    pool: PoolFactory, target: str, headers: list[tuple[str, str]]
) -> None:
    upstream = pool("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="line break"):
        await upstream.request("GET", target, headers)


# --- request bodies -----------------------------------------------------------------------------


async def test_streamed_bodies_keep_their_framing(raw: RawFactory, pool: PoolFactory) -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(OK)

    async def body() -> AsyncIterator[bytes]:
        for i in range(5):
            yield bytes([65 + i]) * 100_000

    expected = b"".join(bytes([65 + i]) * 100_000 for i in range(5))
    server = await raw(handler)
    upstream = pool(server.url, chunk=65536)
    resp = await upstream.request("PUT", "/u", [], body())
    resp.release()
    resp = await upstream.request(
        "PUT", "/u", [("Content-Length", "500000")], body(), length=500_000
    )
    resp.release()
    [(head1, body1), (head2, body2)] = seen
    assert b"Transfer-Encoding: chunked" in head1
    assert b"Content-Length: 500000" in head2
    assert b"Transfer-Encoding" not in head2
    assert body1 == body2 == expected
    assert server.connections == 1


async def test_a_short_streamed_body_breaks_the_request(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await reader.read()

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"

    server = await raw(handler)
    upstream = pool(server.url)
    with pytest.raises(Broken, match="ended before"):
        await upstream.request("PUT", "/", [("Content-Length", "10")], body(), length=10)
    assert upstream.open_connections == 0


async def test_an_early_answer_stops_the_upload(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 413 Too Large\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbig!"
        )
        await writer.drain()
        await reader.read(1 << 20)

    sent = 0
    finished = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent, finished
        try:
            for _ in range(1000):
                sent += 1
                yield b"z" * 65536
                await asyncio.sleep(0.005)
        finally:
            finished = True

    server = await raw(handler)
    upstream = pool(server.url)
    resp = await upstream.request("PUT", "/", [], body())
    try:
        assert (resp.status, await resp.read()) == (413, b"big!")
    finally:
        resp.release()
    assert sent < 1000
    assert finished  # the body generator was closed, not left for the garbage collector


async def test_a_stalled_upload_reader_times_out(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await asyncio.sleep(30)  # never reads

    async def body() -> AsyncIterator[bytes]:
        for _ in range(10_000):
            yield b"s" * 65536

    server = await raw(handler)
    upstream = pool(server.url, read_timeout=0.3)
    with pytest.raises(ReadTimeout):
        await upstream.request("PUT", "/", [], body())


# --- reuse, retries, limits ---------------------------------------------------------------------


def closes_on_second_request(extra_connections_answer: bool = True) -> Handler:
    """Answers the first request, then closes when the second arrives; later connections answer."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the reuse: no answer, just gone
            return
        while extra_connections_answer:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()

    return handler


async def test_a_get_on_a_connection_closed_at_reuse_is_retried_once(
    raw: RawFactory, pool: PoolFactory
) -> None:
    server = await raw(closes_on_second_request())
    upstream = pool(server.url)
    assert (await get(upstream))[1] == b"ok"
    assert (await get(upstream))[1] == b"ok"
    assert server.connections == 2


async def test_a_post_with_a_body_is_not_retried(raw: RawFactory, pool: PoolFactory) -> None:
    server = await raw(closes_on_second_request())
    upstream = pool(server.url)
    assert (await get(upstream))[1] == b"ok"
    with pytest.raises(Broken, match="without an answer"):
        await upstream.request("POST", "/", [("Content-Length", "2")], b"{}", length=2)
    assert server.connections == 1


async def test_a_post_without_a_body_is_not_retried(raw: RawFactory, pool: PoolFactory) -> None:
    server = await raw(closes_on_second_request())
    upstream = pool(server.url)
    assert (await get(upstream))[1] == b"ok"
    with pytest.raises(Broken):
        await upstream.request("POST", "/", [])
    assert server.connections == 1


async def test_the_retry_happens_once(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # then every request: dropped

    server = await raw(handler)
    upstream = pool(server.url)
    assert (await get(upstream))[1] == b"ok"
    with pytest.raises(Broken):
        await get(upstream)
    assert server.connections == 2


async def test_a_pooled_connection_closed_by_oms_is_dropped_before_reuse(
    raw: RawFactory, pool: PoolFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()  # then closes (keep-alive announced, but gone)

    server = await raw(handler)
    upstream = pool(server.url)
    assert (await get(upstream))[1] == b"ok"
    for _ in range(100):
        if upstream.idle_connections == 0:
            break
        await asyncio.sleep(0.01)
    assert upstream.idle_connections == 0
    assert (await upstream.request("POST", "/", [("Content-Length", "0")], b"")).status == 200


async def test_max_connections_queues_then_times_out(raw: RawFactory, pool: PoolFactory) -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            await release.wait()
            writer.write(OK)
            await writer.drain()

    server = await raw(handler)
    upstream = pool(server.url, max_connections=1, connect_timeout=0.3)
    first = asyncio.create_task(get(upstream))
    await asyncio.sleep(0.05)
    with pytest.raises(ConnectTimeout):
        await get(upstream)
    second = asyncio.create_task(get(upstream))
    await asyncio.sleep(0.05)
    release.set()
    assert [body for _, body in await asyncio.gather(first, second)] == [b"ok", b"ok"]
    assert server.connections == 1
    assert upstream.open_connections == 1


async def test_max_connections_frees_a_slot_when_a_connection_closes(
    raw: RawFactory, pool: PoolFactory
) -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url, max_connections=2)
    results = await asyncio.gather(*(get(upstream) for _ in range(10)))
    assert [body for _, body in results] == [b"ok"] * 10
    assert server.connections == 10
    assert upstream.open_connections == 0


async def test_idle_connections_are_closed_after_max_idle(
    raw: RawFactory, pool: PoolFactory
) -> None:
    server = await raw(await keep_answering(OK))
    upstream = pool(server.url, max_idle_seconds=0.1)
    await asyncio.gather(get(upstream), get(upstream))
    assert upstream.idle_connections == 2
    await asyncio.sleep(0.4)
    assert (upstream.idle_connections, upstream.open_connections) == (0, 0)
    assert server.closed == 2


# --- failures -----------------------------------------------------------------------------------


async def test_refused_is_connect_failed(pool: PoolFactory) -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    upstream = pool(f"http://127.0.0.1:{port}")
    with pytest.raises(ConnectFailed, match="refused"):
        await upstream.request("GET", "/", [])
    assert upstream.open_connections == 0


async def test_silence_is_a_read_timeout(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    server = await raw(handler)
    upstream = pool(server.url, read_timeout=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ReadTimeout):
        await upstream.request("GET", "/", [])
    assert 0.15 < loop.time() - started < 1.5
    assert upstream.open_connections == 0


async def test_a_stalled_body_is_a_read_timeout(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nsome")
        await asyncio.sleep(30)

    server = await raw(handler)
    upstream = pool(server.url, read_timeout=0.2)
    resp = await upstream.request("GET", "/", [])
    try:
        assert await resp.read_chunk(1000) == b"some"
        with pytest.raises(ReadTimeout):
            await resp.read_chunk(1000)
    finally:
        resp.release()


async def test_switching_protocols_is_refused(raw: RawFactory, pool: PoolFactory) -> None:
    answer = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
    )
    server = await raw(await keep_answering(answer))
    upstream = pool(server.url)
    with pytest.raises(Broken, match="101"):
        await upstream.request("GET", "/", [])


# --- flow control and the end -------------------------------------------------------------------


async def test_a_download_not_read_stops_reading_the_socket(
    raw: RawFactory, pool: PoolFactory
) -> None:
    size = 16 << 20
    block = bytes(range(256)) * 256

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // len(block)):
            writer.write(block)
            await writer.drain()

    server = await raw(handler)
    upstream = pool(server.url, chunk=65536)
    resp = await upstream.request("GET", "/", [])
    try:
        await asyncio.sleep(0.3)  # the server writes as fast as it can; nobody reads
        conn = resp._conn
        assert conn is not None
        assert conn.buffered <= 65536 + 256 * 1024  # high water + one socket read
        digest = hashlib.sha256()
        total = 0
        while data := await resp.read_chunk(65536):
            assert len(data) <= 65536
            digest.update(data)
            total += len(data)
    finally:
        resp.release()
    assert total == size
    assert digest.hexdigest() == hashlib.sha256(block * (size // len(block))).hexdigest()
    assert upstream.idle_connections == 1


@pytest.mark.parametrize("stray", [b"", b"HTTP/1.1 200 OK\r\n"])
async def test_a_long_body_is_taken_past_the_parser_then_the_next_answer_parsed(
    raw: RawFactory, pool: PoolFactory, stray: bytes
) -> None:
    big = bytes(range(256)) * 2048  # 512 KiB: past the parser after the first read

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            head, _ = await read_request(reader)
            if head.startswith(b"GET /big "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
                writer.write(big[:1000])
                await writer.drain()
                await asyncio.sleep(0.02)  # the rest in later reads
                writer.write(big[1000:] + stray)
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                )
            await writer.drain()

    server = await raw(handler)
    upstream = pool(server.url, chunk=65536)
    for _ in range(2):
        _, body = await get(upstream, "/big")
        assert body == big
        _, body = await get(upstream, "/small")
        assert body == b"ok"
    assert server.connections == (1 if not stray else 3)


async def test_close_closes_idle_and_busy_connections(raw: RawFactory, pool: PoolFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            head, _ = await read_request(reader)
            if head.startswith(b"GET /busy "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            else:
                writer.write(OK)
            await writer.drain()

    server = await raw(handler)
    upstream = pool(server.url)
    busy = await upstream.request("GET", "/busy", [])  # its body never comes
    await get(upstream)  # on a second connection, then idle
    assert (upstream.open_connections, upstream.idle_connections) == (2, 1)
    await upstream.close()
    with pytest.raises(Broken):
        await busy.read()
    busy.release()
    assert upstream.open_connections == 0
    for _ in range(100):
        if server.closed == server.connections == 2:
            break
        await asyncio.sleep(0.01)
    assert server.closed == server.connections == 2
    with pytest.raises(Broken, match="closed"):
        await upstream.request("GET", "/", [])


# --- TLS ----------------------------------------------------------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    try:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=DNS:localhost",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"openssl cannot make a test certificate: {e}")
    return cert, key


async def test_https_verifies_and_reuses(
    raw: RawFactory, pool: PoolFactory, tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server = await raw(await keep_answering(OK), ssl=server_ctx)
    port = server.url.rsplit(":", 1)[1]
    trusting = ssl.create_default_context(cafile=str(cert))
    upstream = pool(f"https://localhost:{port}", ssl_context=trusting)
    for _ in range(2):
        assert (await get(upstream))[1] == b"ok"
    assert server.connections == 1
    untrusting = pool(f"https://localhost:{port}", ssl_context=ssl.create_default_context())
    with pytest.raises(ConnectFailed):
        await untrusting.request("GET", "/", [])


# --- uvloop (the default loop of `serve`) -------------------------------------------------------


def test_the_same_on_uvloop() -> None:
    """Reuse, chunked answers, flow control both ways and close, on uvloop's transports."""
    uvloop = pytest.importorskip("uvloop")
    size = 4 << 20
    block = bytes(range(256)) * 256

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            head, body = await read_request(reader)
            if head.startswith(b"GET /big "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                for _ in range(size // len(block)):
                    writer.write(block)
                    await writer.drain()
            elif head.startswith(b"PUT "):
                digest = hashlib.sha256(body).hexdigest().encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n" + digest)
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                )
            await writer.drain()

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(size // len(block)):
            yield block

    async def scenario() -> None:
        server = await Raw(handler).start()
        upstream = Upstream(server.url, connect_timeout=2, read_timeout=5, chunk=65536)
        try:
            for _ in range(3):
                assert (await get(upstream))[1] == b"ok"
            resp = await upstream.request("GET", "/big", [])
            try:
                await asyncio.sleep(0.2)
                assert resp._conn is not None
                assert resp._conn.buffered <= 65536 + 256 * 1024
                total = 0
                while data := await resp.read_chunk(65536):
                    total += len(data)
                assert total == size
            finally:
                resp.release()
            resp = await upstream.request("PUT", "/up", [], upload())
            try:
                expected = hashlib.sha256(block * (size // len(block))).hexdigest()
                assert (await resp.read()).decode() == expected
            finally:
                resp.release()
            assert server.connections == 1
        finally:
            await upstream.close()
            await server.stop()

    uvloop.run(scenario())


# --- through the proxy --------------------------------------------------------------------------


async def test_a_chunked_upload_of_many_small_chunks_arrives_whole(oms: FakeOms) -> None:
    """HTTP chunk boundaries (readchunk's ``(b"", True)``) neither end nor cut the body."""
    config = make_config(oms.url)
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server(**server_options(config))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        pieces = [bytes([97 + i % 26]) * (1 + i * 37 % 5000) for i in range(400)]
        writer.write(b"PUT /test/upload HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            if len(piece) % 7 == 0:
                await writer.drain()
                await asyncio.sleep(0)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        doc = json.loads(await reader.readexactly(length))
        whole = b"".join(pieces)
        assert doc["body_len"] == len(whole)
        assert doc["body_sha256"] == hashlib.sha256(whole).hexdigest()
        writer.close()
        await writer.wait_closed()
    finally:
        await server.close()
