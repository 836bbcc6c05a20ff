"""Protocol abuse over real sockets: oversized and slow bodies, slow headers, header injection,
request targets that name another host, and more submissions at once than allowed.

The proxy is served with :func:`proxy.app.server_options`, as ``serve`` runs it, so aiohttp's
server timeouts are the configured ones. Raw requests go through asyncio streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.app import LINGER_SECONDS, create_app, server_options
from proxy.config import Config
from proxy.submit.handler import SUBMITTER
from standins.kube import FakeKube, Fault
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor, ProxyTestServer, make_config

UI_MPI = json.loads((Path(__file__).parent / "requests" / "ui-mpi.json").read_text())
NS = "default"

Serve = Callable[[Config], Awaitable[TestServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve the proxy for a Config with the serving stack and options ``serve`` uses."""
    servers: list[TestServer] = []

    async def go(config: Config) -> TestServer:
        server = ProxyTestServer(create_app(config), host="127.0.0.1")
        await server.start_server(**server_options(config))
        servers.append(server)
        return server

    yield go
    for server in servers:
        await server.close()


async def _kube_config(
    oms: FakeOms, kube: FakeKube, kubeconfig_for: KubeconfigFor, **sections: dict[str, Any]
) -> Config:
    kubernetes = {
        "kubeconfig": str(await kubeconfig_for(kube)),
        "dry_run_on_start": False,
        "watch": False,
        "retry_backoff_seconds": 0.01,
        "request_timeout_seconds": 3.0,
    }
    kubernetes.update(sections.pop("kubernetes", {}))
    runs = {"intercept": "mpi", **sections.pop("runs", {})}
    return make_config(oms.url, runs=runs, kubernetes=kubernetes, **sections)


class Raw:
    """One raw TCP connection to a server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, server: TestServer) -> Raw:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self, within: float = 2.0) -> tuple[int, dict[str, str]]:
        """Status and headers (lower-case names) of the next answer."""
        async with asyncio.timeout(within):
            raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        return status, headers

    async def closed_within(self, seconds: float) -> bool:
        """Whether the server closes the connection within ``seconds`` (reading what comes)."""
        try:
            async with asyncio.timeout(seconds):
                for _ in range(10_000):
                    if not await self.reader.read(65536):
                        return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return False

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def _run_posts(oms: FakeOms) -> list[str]:
    return [path for method, path, _ in oms.requests if method == "POST"]


# --- oversized bodies -------------------------------------------------------------------------


async def test_declared_oversized_run_body_is_413_without_reading_it(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, serve: Serve
) -> None:
    server = await serve(await _kube_config(oms, fake_kube, kubeconfig_for))
    raw = await Raw.open(server)
    started = time.monotonic()
    await raw.send(
        b"POST /api/run HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        b"Content-Length: 104857600\r\n\r\n" + b'{"x": "' + b"a" * 65536
    )
    status, headers = await raw.head(within=1.0)
    assert status == 413
    assert time.monotonic() - started < 1.0
    assert headers.get("connection", "").lower() == "close"
    # The rest of the 100 MB is never awaited: the connection ends after a short linger.
    assert await raw.closed_within(LINGER_SECONDS + 1.5)
    await raw.close()
    assert fake_kube.objects("mpijobs", NS) == []
    assert _run_posts(oms) == []


async def test_chunked_run_body_over_the_limit_is_413_once_the_limit_is_passed(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, serve: Serve
) -> None:
    config = await _kube_config(oms, fake_kube, kubeconfig_for, runs={"max_body_bytes": 4096})
    server = await serve(config)
    raw = await Raw.open(server)
    await raw.send(
        b"POST /api/run HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"a" * 1024
    for _ in range(5):  # 5 KiB > 4 KiB; the end of the body never comes
        await raw.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    status, headers = await raw.head(within=1.0)
    assert status == 413
    assert headers.get("connection", "").lower() == "close"
    await raw.close()
    assert fake_kube.objects("mpijobs", NS) == []


# --- slow clients -----------------------------------------------------------------------------


async def test_slowloris_headers_are_cut_at_the_header_timeout(oms: FakeOms, serve: Serve) -> None:
    server = await serve(make_config(oms.url, server={"client_header_timeout_seconds": 0.5}))
    raw = await Raw.open(server)
    started = time.monotonic()
    await raw.send(b"GET /test/echo HTTP/1.1\r\nHost: proxy\r\n")
    closed_at = None
    for i in range(40):  # one header line every 0.1 s: never a complete head
        try:
            await raw.send(b"X-Slow-%d: 1\r\n" % i)
        except ConnectionError:
            closed_at = time.monotonic()
            break
        if raw.reader.at_eof() or await raw.closed_within(0.1):
            closed_at = time.monotonic()
            break
    await raw.close()
    assert closed_at is not None, "the proxy kept waiting for the headers"
    assert closed_at - started < 0.5 + 1.0
    assert oms.requests == []


async def test_idle_and_kept_alive_connections_are_closed_at_the_header_timeout(
    oms: FakeOms, serve: Serve
) -> None:
    server = await serve(make_config(oms.url, server={"client_header_timeout_seconds": 0.4}))
    idle = await Raw.open(server)
    kept = await Raw.open(server)
    await kept.send(b"GET /test/small HTTP/1.1\r\nHost: proxy\r\n\r\n")
    status, headers = await kept.head()
    assert status == 200
    await kept.reader.readexactly(int(headers["content-length"]))
    started = time.monotonic()
    await kept.send(b"GET /test/small HTTP/1.1\r\n")  # the next request never completes
    assert await idle.closed_within(1.5)
    assert await kept.closed_within(1.5)
    assert time.monotonic() - started < 1.5
    await idle.close()
    await kept.close()


@pytest.mark.parametrize(
    ("head", "sent"),
    [
        # streamed to oms (over 256 KiB), stalls after 300 KB
        (b"PUT /test/upload HTTP/1.1\r\nHost: p\r\nContent-Length: 1000000\r\n\r\n", 300_000),
        # small: read whole before forwarding, stalls after 10 bytes
        (b"PUT /test/upload HTTP/1.1\r\nHost: p\r\nContent-Length: 1000\r\n\r\n", 10),
        # chunked, stalls inside the first chunk
        (b"PUT /test/upload HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n", 10),
    ],
)
async def test_stalled_upload_is_408_at_the_body_timeout(
    oms: FakeOms, serve: Serve, head: bytes, sent: int
) -> None:
    server = await serve(make_config(oms.url, server={"client_body_timeout_seconds": 0.4}))
    raw = await Raw.open(server)
    started = time.monotonic()
    await raw.send(head + b"u" * sent)
    status, headers = await raw.head(within=2.0)
    assert status == 408
    assert time.monotonic() - started < 0.4 + 1.0
    assert headers.get("connection", "").lower() == "close"
    if sent == 300_000:  # (the same close for the others: one wait of a linger is enough)
        assert await raw.closed_within(LINGER_SECONDS + 1.5)
    await raw.close()
    # The proxy recovers: the next upload goes through.
    async with (
        aiohttp.ClientSession() as session,
        session.put(server.make_url("/test/upload"), data=b"v" * 5000) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["body_len"] == 5000


async def test_run_body_dribbled_past_the_body_timeout_is_408(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, serve: Serve
) -> None:
    """A POST /api/run body must arrive whole within the body timeout, even if it never pauses
    for long."""
    config = await _kube_config(
        oms, fake_kube, kubeconfig_for, server={"client_body_timeout_seconds": 0.5}
    )
    server = await serve(config)
    raw = await Raw.open(server)
    body = json.dumps(UI_MPI).encode()
    await raw.send(
        b"POST /api/run HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    started = time.monotonic()
    status = None
    for i in range(30):  # a byte every 0.1 s: 3 s in all, well under the body's length
        await raw.send(body[i : i + 1])
        try:
            status, _ = await raw.head(within=0.1)
            break
        except TimeoutError:
            continue
    await raw.close()
    assert status == 408
    assert time.monotonic() - started < 0.5 + 1.0
    assert fake_kube.objects("mpijobs", NS) == []


# --- header injection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /test/echo HTTP/1.1\r\nHost: p\r\nX-A: a\rX-Injected: b\r\n\r\n",
        b"GET /test/echo HTTP/1.1\r\nHost: p\r\nX-A: a\nX-Injected: b\r\n\r\n",
        b"GET /test/echo HTTP/1.1\r\nHost: p\r\nX-A: a\r\n X-Injected: b\r\n\r\n",
        b"GET /test/echo HTTP/1.1\r\nHost: p\r\nX-A: a\x00X-Injected: b\r\n\r\n",
        b"GET /test/echo HTTP/1.1\r\nHost: p\r\nX-A : a\r\n\r\n",
        b"GET /test/echo\rX-Injected: b HTTP/1.1\r\nHost: p\r\n\r\n",
        b"GET /test/echo\r\nX-Injected: b HTTP/1.1\r\nHost: p\r\n\r\n",
        b"GET /test/echo HTTP/1.1\r\nHost: p\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST /test/echo HTTP/1.1\r\nHost: p\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /test/echo HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
        b"0\r\n\r\n",
    ],
    ids=[
        "bare-CR",
        "bare-LF",
        "obs-fold",
        "NUL",
        "space-before-colon",
        "CR-in-target",
        "HTTP/0.9-line-then-headers",
        "two-content-lengths",
        "content-length-and-chunked",
        "chunked-not-last",
    ],
)
async def test_header_injection_is_400_and_never_forwarded(
    oms: FakeOms, serve: Serve, request_bytes: bytes
) -> None:
    server = await serve(make_config(oms.url))
    raw = await Raw.open(server)
    await raw.send(request_bytes)
    status, _ = await raw.head()
    assert status == 400
    assert await raw.closed_within(1.0)
    await raw.close()
    assert oms.requests == []


async def test_encoded_crlf_in_the_path_stays_encoded(oms: FakeOms, serve: Serve) -> None:
    server = await serve(make_config(oms.url))
    raw = await Raw.open(server)
    await raw.send(b"GET /test/echo/a%0d%0aX-Injected:%20yes HTTP/1.1\r\nHost: p\r\n\r\n")
    status, _ = await raw.head()
    await raw.close()
    assert status == 404  # oms's answer: its routes do not match a decoded line break
    [(method, path, headers)] = oms.requests
    assert (method, path) == ("GET", "/test/echo/a%0d%0aX-Injected:%20yes")
    assert "x-injected" not in {k.lower() for k in headers}


# --- request targets naming another host --------------------------------------------------------


@pytest.fixture
async def evil(aiohttp_server: Any) -> tuple[TestServer, list[str]]:
    """Another server on loopback that records anything it is asked."""
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.raw_path}")
        return web.Response(text="evil\n")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    server: TestServer = await aiohttp_server(app)
    return server, seen


async def test_absolute_form_and_authority_paths_only_reach_oms(
    oms: FakeOms, serve: Serve, evil: tuple[TestServer, list[str]]
) -> None:
    evil_server, seen = evil
    there = f"127.0.0.1:{evil_server.port}"
    server = await serve(make_config(oms.url))
    oms_host = oms.url.removeprefix("http://")
    # request target -> the path oms must see (None: the proxy answers itself)
    targets = {
        f"http://{there}/test/echo/abs": "/test/echo/abs",
        f"http://{there}/test/echo/q?x=http://{there}/": f"/test/echo/q?x=http://{there}/",
        f"//{there}/test/echo/x": f"//{there}/test/echo/x",
        f"http://{there}//{there}/test/echo": f"//{there}/test/echo",
        f"http://user@{there}/test/echo/u": "/test/echo/u",
        f"http://{there}/api/run": "/api/run",  # intercept none: oms's
        there: None,  # CONNECT's authority form
        "*": None,
    }
    for target, oms_path in targets.items():
        method = {there: "CONNECT", "*": "OPTIONS"}.get(target, "POST")
        raw = await Raw.open(server)
        await raw.send(
            f"{method} {target} HTTP/1.1\r\nHost: {there}\r\nX-Forwarded-Host: {there}\r\n"
            "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}".encode()
        )
        status, headers = await raw.head()
        body = await raw.reader.readexactly(int(headers.get("content-length", "0")))
        await raw.close()
        assert body != b"evil\n", target
        before = len(oms.requests) - (oms_path is not None)
        assert [p for _, p, _ in oms.requests[before:]] == ([oms_path] if oms_path else []), target
        if oms_path is not None:
            assert oms.requests[-1][2]["Host"] == oms_host
        else:
            assert status in (400, 404, 405, 501), target  # CONNECT: 501 (proxy.clientside)
    assert seen == []


# --- too many submissions at once -------------------------------------------------------------


async def test_submissions_over_the_limit_get_429_while_others_are_held(
    oms: FakeOms,
    fake_kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    serve: Serve,
    aiohttp_client: Any,
) -> None:
    config = await _kube_config(
        oms, fake_kube, kubeconfig_for, runs={"max_concurrent_submissions": 2}
    )
    client = await aiohttp_client(await serve(config))
    fake_kube.add_fault(Fault("POST", "mpijobs", delay=1.0, times=2))

    async def submit() -> tuple[int, str, float]:
        started = time.monotonic()
        resp = await client.post("/api/run", json=UI_MPI)
        return resp.status, resp.headers.get("Retry-After", ""), time.monotonic() - started

    held = [asyncio.create_task(submit()) for _ in range(2)]
    await fake_kube.wait_until(
        lambda: (
            sum(r.method == "POST" and r.resource == "mpijobs" for r in fake_kube.requests) == 2
        ),
        within=3.0,
    )
    assert client.app[SUBMITTER].in_flight == 2
    refused = await asyncio.gather(*(submit() for _ in range(6)))
    for status, retry_after, elapsed in refused:
        assert status == 429
        assert int(retry_after) >= 1
        assert elapsed < 0.5  # answered at once, not queued behind the held ones
    assert not any(t.done() for t in held)
    assert [s for s, _, _ in await asyncio.gather(*held)] == [200, 200]
    assert len(fake_kube.objects("mpijobs", NS)) == 2
    # The slots are free again.
    assert client.app[SUBMITTER].in_flight == 0
    assert (await submit())[0] == 200
    assert len(fake_kube.objects("mpijobs", NS)) == 3
