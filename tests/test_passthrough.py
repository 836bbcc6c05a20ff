"""Pass-through behaviour against the stand-in oms over real HTTP."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from yarl import URL

from standins.oms import FakeOms, pattern_sha256
from tests.conftest import ProxyFactory, make_config

Client = TestClient[web.Request, web.Application]


def _headers(doc: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in doc["headers"]:
        out.setdefault(k.lower(), []).append(v)
    return out


async def test_request_headers_reach_oms_with_forwarding_headers(proxy: Client) -> None:
    resp = await proxy.get(
        "/test/echo/x",
        headers={
            "Authorization": "Bearer secret-token",
            "Cookie": "jwt_token=abc",
            "X-Api-Key": "k-123",
            "X-Custom": "v",
            "X-Forwarded-For": "10.1.2.3",
            "Accept-Encoding": "gzip",
        },
    )
    assert resp.status == 200
    doc = await resp.json()
    h = _headers(doc)
    assert h["authorization"] == ["Bearer secret-token"]
    assert h["cookie"] == ["jwt_token=abc"]
    assert h["x-api-key"] == ["k-123"]
    assert h["x-custom"] == ["v"]
    assert h["accept-encoding"] == ["gzip"]
    assert h["x-forwarded-for"] == ["10.1.2.3, 127.0.0.1"]
    assert h["x-forwarded-proto"] == ["http"]
    assert h["x-forwarded-host"][0].startswith("127.0.0.1:")
    assert len(h["x-request-id"][0]) == 32
    assert "user-agent" not in h or h["user-agent"][0].startswith("Python/")  # client's own
    # The response headers come back, plus the request id.
    assert resp.headers["X-Echo"] == "1"
    assert resp.headers["Set-Cookie"].startswith("s=1")
    assert resp.headers["X-Request-ID"] == h["x-request-id"][0]


async def test_client_request_id_is_kept(proxy: Client) -> None:
    resp = await proxy.get("/test/echo", headers={"X-Request-ID": "abc-123"})
    assert _headers(await resp.json())["x-request-id"] == ["abc-123"]
    assert resp.headers["X-Request-ID"] == "abc-123"


async def test_hop_by_hop_headers_are_dropped(proxy: Client) -> None:
    resp = await proxy.get(
        "/test/echo",
        headers={
            "Connection": "keep-alive, X-Drop-Me",
            "X-Drop-Me": "1",
            "Keep-Alive": "timeout=5",
            "TE": "trailers",
            "Trailer": "X-T",
            "Upgrade": "websocket",
            "Proxy-Authorization": "Basic x",
            "Proxy-Foo": "bar",
        },
    )
    h = _headers(await resp.json())
    for name in (
        "x-drop-me",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-foo",
    ):
        assert name not in h, name
    assert h.get("connection", ["keep-alive"]) == ["keep-alive"]  # set by the proxy's own client


@pytest.mark.parametrize(
    "raw",
    [
        "/test/echo/a%2Fb/c%20d?x=1&y=%2F%3F&z=%E2%9C%93",
        "/test/echo/%7Euser/..%2F/x?q=a+b&q=c",
        "/test/echo/model/RiskPaths/run/2024_01_01_00_00_00_000?lang=EN",
        "/test/echo//double//slash",
    ],
)
async def test_path_and_query_encoding_preserved(proxy: Client, raw: str) -> None:
    base = str(proxy.make_url("")).rstrip("/")
    resp = await proxy.session.get(URL(base + raw, encoded=True))
    assert resp.status == 200
    assert (await resp.json())["raw_path"] == raw


@pytest.mark.parametrize("code", [200, 204, 304, 400, 404, 500])
async def test_status_codes_pass_through(proxy: Client, code: int) -> None:
    resp = await proxy.get(f"/test/status/{code}")
    assert resp.status == code
    body = await resp.read()
    if code in (204, 304):
        assert body == b""
        assert resp.headers["ETag"] == '"abc"'
    else:
        assert body == f"status {code}\n".encode()


async def test_head_has_no_body_but_keeps_length(proxy: Client) -> None:
    resp = await proxy.head("/test/download/1000")
    assert resp.status == 200
    assert resp.headers["Content-Length"] == "1000"
    assert await resp.read() == b""


async def test_no_decompression_and_encoding_kept(proxy: Client) -> None:
    resp = await proxy.get("/test/gzip", auto_decompress=False)
    raw = await resp.read()
    assert resp.headers["Content-Encoding"] == "gzip"
    assert int(resp.headers["Content-Length"]) == len(raw)
    assert gzip.decompress(raw) == b'{"compressed": true}'


async def test_chunked_response_streams(proxy: Client) -> None:
    size = 3 * 1024 * 1024 + 7
    resp = await proxy.get(f"/test/download/{size}?chunked=1")
    assert resp.headers.get("Transfer-Encoding") == "chunked"
    h = hashlib.sha256()
    async for chunk in resp.content.iter_chunked(65536):
        h.update(chunk)
    assert h.hexdigest() == pattern_sha256(size)


async def test_post_body_and_chunked_upload(proxy: Client) -> None:
    body = b"x" * 5000
    resp = await proxy.post("/test/echo", data=body)
    doc = await resp.json()
    assert doc["body_len"] == 5000
    assert _headers(doc)["content-length"] == ["5000"]

    async def gen() -> Any:
        for _ in range(10):
            yield b"y" * 100_000

    resp = await proxy.post("/test/upload", data=gen())
    doc = await resp.json()
    assert doc["body_len"] == 1_000_000
    assert doc["body_sha256"] == hashlib.sha256(b"y" * 1_000_000).hexdigest()


async def test_large_upload_and_download_intact(proxy: Client) -> None:
    size = 64 * 1024 * 1024 + 3
    resp = await proxy.get(f"/test/download/{size}")
    assert resp.headers["Content-Length"] == str(size)
    h = hashlib.sha256()
    async for chunk in resp.content.iter_chunked(1 << 18):
        h.update(chunk)
    assert h.hexdigest() == pattern_sha256(size)

    block = bytes(range(256)) * 4096

    async def gen() -> Any:
        for _ in range(64):
            yield block

    resp = await proxy.put(
        "/test/upload", data=gen(), headers={"Content-Length": str(64 * len(block))}
    )
    doc = await resp.json()
    assert doc["body_len"] == 64 * len(block)
    assert doc["body_sha256"] == hashlib.sha256(block * 64).hexdigest()


async def test_json_api_passes_through(proxy: Client, oms: FakeOms) -> None:
    resp = await proxy.get("/api/model/RiskPaths")
    assert resp.status == 200
    assert (await resp.json())["Model"]["Digest"] == oms.models[0].digest
    resp = await proxy.post("/api/run", data=b"{}", headers={"Content-Type": "text/plain"})
    assert resp.status == 415  # intercept=none: oms answers
    assert oms.run_posts == [b"{}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_oms_down_is_502(make_proxy: ProxyFactory) -> None:
    client = await make_proxy(make_config(f"http://127.0.0.1:{_free_port()}"))
    resp = await client.get("/api/service/config")
    assert resp.status == 502
    assert "oms is unreachable" in await resp.text()
    assert resp.headers["Content-Type"].startswith("text/plain")


async def test_oms_slow_is_504(oms: FakeOms, make_proxy: ProxyFactory) -> None:
    client = await make_proxy(make_config(oms.url, oms={"first_byte_timeout_seconds": 0.2}))
    resp = await client.get("/test/slow/2")
    assert resp.status == 504
    assert "did not answer in time" in await resp.text()


async def test_redirects_not_followed(aiohttp_server: Any, make_proxy: ProxyFactory) -> None:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("/elsewhere")

    app = web.Application()
    app.router.add_get("/r", redirect)
    server = await aiohttp_server(app)
    client = await make_proxy(make_config(str(server.make_url("")).rstrip("/")))
    resp = await client.get("/r", allow_redirects=False)
    assert resp.status == 302
    assert resp.headers["Location"] == "/elsewhere"


async def test_client_disconnect_aborts_upstream(
    aiohttp_server: Any, make_proxy: ProxyFactory
) -> None:
    """A client that leaves mid-download makes the proxy drop the oms connection too."""
    upstream_done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for _ in range(10_000):
                await resp.write(b"z" * 65536)
                await asyncio.sleep(0.001)
        except (ConnectionError, aiohttp.ClientConnectionResetError, asyncio.CancelledError):
            # The proxy closed its connection to us: the write fails or the handler is cancelled.
            upstream_done.set_result("aborted")
            raise
        upstream_done.set_result("completed")
        return resp

    app = web.Application()
    app.router.add_get("/endless", endless)
    server = await aiohttp_server(app)
    client = await make_proxy(make_config(str(server.make_url("")).rstrip("/")))
    resp = await client.get("/endless")
    await resp.content.read(65536)
    resp.close()  # the client goes away
    assert await asyncio.wait_for(upstream_done, 10) == "aborted"


async def test_health_endpoints(proxy: Client, make_proxy: ProxyFactory) -> None:
    resp = await proxy.get("/healthz")
    assert resp.status == 200
    resp = await proxy.get("/readyz")
    assert resp.status == 200
    assert (await resp.json())["checks"] == {"oms": "ok"}
    down = await make_proxy(make_config(f"http://127.0.0.1:{_free_port()}"))
    resp = await down.get("/readyz")
    assert resp.status == 503
    assert (await resp.json())["checks"]["oms"].startswith("unreachable")
