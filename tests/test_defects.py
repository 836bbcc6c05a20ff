"""Realistic defects that a mutation pass found no test for, each checked on the wire.

- the response side ignoring header names that oms lists in its ``Connection`` header;
- the stale-connection retry sending a request that has a body (a streamed PUT would reach oms
  with an EMPTY body and a 200: data loss);
- the annotation patch without its ``resourceVersion`` precondition;
- the MPIJob create without ``fieldValidation=Strict``;
and second, independent tests of three defects that only one test caught: quota → 429, the
Kubernetes API's 429 retried, and the shared launcher-log cache.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from proxy.clients.kube import classify_api_exception
from proxy.errors import KubeQuotaExceeded, error_response
from standins.kube import FakeKube, Fault
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor, ProxyFactory, make_config
from tests.test_lifecycle import DIGEST, Client, Env, UiPoller, _scenario
from tests.test_upstream import OK, Raw, read_request

RawFactory = Callable[..., Awaitable[Raw]]


@pytest.fixture
async def raw() -> AsyncIterator[RawFactory]:
    servers: list[Raw] = []

    async def start(handler: Any) -> Raw:
        server = await Raw(handler).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def env(
    oms: FakeOms,
    fake_kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Env:
    return Env(oms, fake_kube, str(await kubeconfig_for(fake_kube)), aiohttp_client)


# --- pass-through ---------------------------------------------------------------------------


async def test_headers_named_in_oms_connection_header_do_not_reach_the_client(
    raw: RawFactory, make_proxy: ProxyFactory
) -> None:
    """RFC 9110 7.6.1: a header oms names in ``Connection`` is for this hop only."""

    async def oms(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Oms-Hop\r\nX-Oms-Hop: secret\r\n"
                b"X-Kept: yes\r\nContent-Length: 2\r\n\r\nok"
            )
            await writer.drain()

    server = await raw(oms)
    client = await make_proxy(make_config(server.url))
    resp = await client.get("/api/service/config")
    assert resp.status == 200
    assert await resp.text() == "ok"
    assert "X-Oms-Hop" not in resp.headers
    assert resp.headers["X-Kept"] == "yes"


async def test_a_streamed_put_on_a_connection_oms_closed_is_not_resent_empty(
    raw: RawFactory, make_proxy: ProxyFactory
) -> None:
    """oms closes its kept-alive connection as the proxy reuses it for a streamed upload.

    The upload has begun (its head is out, its first piece not yet read from the client): it
    cannot be sent again, so the client gets an error and oms never sees it, least of all with
    an empty body.
    """
    received: list[tuple[bytes, bytes]] = []

    async def oms(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 0:
            await read_request(reader)  # the GET that makes the connection a kept-alive one
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the PUT's head: close without an answer
            return
        while True:
            received.append(await read_request(reader))
            writer.write(OK)
            await writer.drain()

    server = await raw(oms)
    client = await make_proxy(make_config(server.url))
    assert (await client.get("/api/model")).status == 200

    # A raw client: the upload's head goes out at once, its first piece only after oms closed.
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(
        b"PUT /api/upload/model/m/up.csv HTTP/1.1\r\nHost: proxy\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.write(b"9\r\npart one;\r\n8\r\npart two\r\n0\r\n\r\n")
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    assert status_line.split()[1] in (b"502", b"504"), status_line
    assert [body for head, body in received if head.startswith(b"PUT")] == [], "no empty PUT"


async def test_a_bodyless_put_is_still_sent_again_on_a_fresh_connection(
    raw: RawFactory, make_proxy: ProxyFactory
) -> None:
    """The retry itself stays: a PUT with no body (stop a run) is idempotent and complete."""
    received: list[bytes] = []

    async def oms(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
            return
        while True:
            head, _ = await read_request(reader)
            received.append(head.split(b"\r\n")[0])
            writer.write(OK)
            await writer.drain()

    server = await raw(oms)
    client = await make_proxy(make_config(server.url))
    assert (await client.get("/api/model")).status == 200
    resp = await client.put("/api/run/stop/model/m/stamp/s")
    assert resp.status == 200
    assert received == [b"PUT /api/run/stop/model/m/stamp/s HTTP/1.1"]


# --- the Kubernetes side --------------------------------------------------------------------


async def test_the_mpijob_create_asks_for_strict_field_validation(env: Env) -> None:
    """An unknown field must be refused (422), never silently dropped by the API server."""
    _scenario(env.kube, kind="suspended")
    client = await env.proxy()
    await env.submit(client)
    creates = [r for r in env.kube.requests if r.verb == "create" and r.resource == "mpijobs"]
    assert creates
    assert all(r.query.get("fieldValidation") == "Strict" for r in creates)
    configmaps = [r for r in env.kube.requests if r.verb == "create" and r.resource == "configmaps"]
    assert all(r.query.get("fieldValidation") == "Strict" for r in configmaps)


async def test_annotations_are_recorded_only_on_the_version_that_was_read(env: Env) -> None:
    """The prelude/final record is a conditional patch: a job changed meanwhile is re-read."""
    _scenario(env.kube, log_lines=["x"], line_interval=0.01)
    client = await env.proxy()
    state = await env.submit(client)
    await UiPoller(client, state["RunStamp"]).run()
    patches = [r for r in env.kube.requests if r.verb == "patch" and r.resource == "mpijobs"]
    assert patches, "the frozen prelude is recorded on the MPIJob"
    for patch in patches:
        body = patch.body if isinstance(patch.body, dict) else json.loads(patch.body)
        assert body["metadata"]["resourceVersion"], "unconditional patch"


async def test_a_stale_annotation_patch_is_refused_and_the_job_read_again(env: Env) -> None:
    """The API answers 409 Conflict to a patch on an older resourceVersion: look again, then
    record on the current version; the annotations end up written once, not overwritten."""
    _scenario(env.kube, log_lines=["x"], line_interval=0.01)
    env.kube.add_fault(Fault("PATCH", "mpijobs", status=409, times=1))
    client = await env.proxy()
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.state["IsFinal"] is True
    gets = [r for r in env.kube.requests if r.verb == "get" and r.resource == "mpijobs"]
    assert gets, "after the 409 the MPIJob is read again"
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}"
    async with asyncio.timeout(3):  # a later poll records it, on the version read again
        while "openmpp.org/prelude" not in env.job(state)["metadata"]["annotations"]:
            assert (await client.get(url)).status == 200
            await asyncio.sleep(0.05)
    patches = [r for r in env.kube.requests if r.verb == "patch" and r.resource == "mpijobs"]
    assert len(patches) >= 2


def test_quota_exhausted_is_a_429_with_retry_after() -> None:
    """The API server's quota refusal (a 403 Status naming the quota) answers 429, not 502."""
    from kubernetes_asyncio.client.exceptions import ApiException

    e = ApiException(status=403, reason="Forbidden")
    e.body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "Forbidden",
            "code": 403,
            "message": 'mpijobs.kubeflow.org "ompp-x" is forbidden: exceeded quota: '
            "compute, requested: count/mpijobs.kubeflow.org=1, used: 10, limited: 10",
        }
    ).encode()
    err = classify_api_exception(e, "create MPIJob ompp-x")
    assert isinstance(err, KubeQuotaExceeded)
    answer = error_response(err)
    assert answer.status == 429
    assert int(answer.headers["Retry-After"]) >= 1
    assert "quota" in (answer.text or "")


async def test_kubernetes_429_on_create_is_retried_and_the_run_starts(env: Env) -> None:
    """Two 429s (with Retry-After) then the API accepts: the client sees one 200, one MPIJob."""
    _scenario(env.kube, kind="suspended")
    env.kube.add_fault(Fault("POST", "mpijobs", status=429, times=2, retry_after=0.1))
    client = await env.proxy()
    state = await env.submit(client)
    assert state["RunStamp"]
    posts = [r for r in env.kube.requests if r.verb == "create" and r.resource == "mpijobs"]
    assert len(posts) == 3
    assert len(env.kube.objects("mpijobs", "default")) == 1


async def test_pollers_share_one_launcher_log_read_per_log_cache_period(
    oms: FakeOms,
    fake_kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> None:
    """Ten UI tabs on one running run: the log is read about once per period, not per poll."""
    _scenario(fake_kube, log_lines=[f"line {i}" for i in range(200)], line_interval=0.01)
    env = Env(oms, fake_kube, str(await kubeconfig_for(fake_kube)), aiohttp_client)
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={
            "kubeconfig": env.kubeconfig,
            "dry_run_on_start": False,
            "log_cache_seconds": 0.5,
        },
    )
    client = await env.proxy(config)
    state = await env.submit(client)
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"

    async def tab() -> int:
        polls = 0
        async with aiohttp.ClientSession() as _:
            loop = asyncio.get_running_loop()
            end = loop.time() + 1.5
            while loop.time() < end:
                resp = await client.get(url)
                assert resp.status == 200
                await resp.json()
                polls += 1
                await asyncio.sleep(0.02)
        return polls

    polls = sum(await asyncio.gather(*(tab() for _ in range(10))))
    reads = [r for r in fake_kube.requests if r.resource == "pods" and r.subresource == "log"]
    assert polls > 200
    assert 1 <= len(reads) <= 1 + 1.5 / 0.5 + 2, f"{len(reads)} log reads for {polls} polls"
