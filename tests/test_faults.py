"""Faults of the Kubernetes API and of oms, alone, in bursts, and a SIGTERM in the middle.

The property checked throughout: a submission ends either with 200 and exactly one MPIJob
(with its ConfigMap when it needs one) or with an error and no MPIJob, never two; no client
waits past the configured deadlines; and the proxy works again once the fault is gone.

A create whose outcome the proxy cannot know (no answer in time, connection lost, 5xx) is
answered as failed and watched for in the background (``runs.Submitter._remove_late``): if it
lands late it is deleted, so "ends with" means once those background checks are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy import names
from proxy.app import create_app, server_options
from proxy.config import Config
from proxy.submit.handler import SUBMITTER
from standins.kube import FakeKube, Fault, Scenario
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor, ProxyTestServer, make_config

Client = TestClient[web.Request, web.Application]
UI_MPI = json.loads((Path(__file__).parent / "requests" / "ui-mpi.json").read_text())
NS = "default"
REPO = Path(__file__).resolve().parents[1]
MARGIN = 1.0  # seconds allowed past a configured deadline on a busy 2-core machine


def run_body(i: int, notes: bool = False) -> dict[str, Any]:
    """An MPI run request with its own run stamp (so its own MPIJob name); notes need a
    ConfigMap."""
    body = copy.deepcopy(UI_MPI)
    body["Opts"]["OpenM.RunStamp"] = f"2030_01_01_00_00_00_{i:03d}"
    body["Opts"]["OpenM.RunName"] = f"run {i}"
    if notes:
        body["RunNotes"] = [{"LangCode": "EN", "Note": f"notes of run {i}"}]
    return body


def jobs_by_stamp(kube: FakeKube) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for job in kube.objects("mpijobs", NS):
        stamp = job["metadata"]["annotations"][names.RUN_STAMP_KEY]
        assert stamp not in out, f"two MPIJobs for run stamp {stamp}"
        out[stamp] = job
    return out


def configmap_names(kube: FakeKube) -> set[str]:
    return {cm["metadata"]["name"] for cm in kube.objects("configmaps", NS)}


def check_outcomes(kube: FakeKube, outcomes: dict[int, int | str], notes: set[int]) -> None:
    """200 ⇔ exactly one MPIJob, with the ConfigMap it mounts (runs in ``notes`` must have
    one); otherwise no MPIJob."""
    jobs = jobs_by_stamp(kube)
    configmaps = configmap_names(kube)
    for i, outcome in outcomes.items():
        stamp = run_body(i)["Opts"]["OpenM.RunStamp"]
        if outcome == 200:
            assert stamp in jobs, f"run {i}: 200 without an MPIJob"
            launcher = jobs[stamp]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
            wanted = {v["configMap"]["name"] for v in launcher["volumes"] if "configMap" in v}
            assert wanted <= configmaps, f"run {i}: MPIJob without its ConfigMap"
            assert wanted or i not in notes, f"run {i}: notes but no ConfigMap"
        else:
            assert stamp not in jobs, f"run {i}: answered {outcome} but its MPIJob exists"
    assert len(jobs) == sum(o == 200 for o in outcomes.values())


async def settle(client: Client, within: float = 8.0) -> None:
    """Wait until the background removals of late creates are done."""
    submitter = client.app[SUBMITTER]
    assert submitter is not None
    async with asyncio.timeout(within):
        while submitter._late:  # noqa: ASYNC110 - the proxy has no event for this
            await asyncio.sleep(0.05)


@pytest.fixture
def served(aiohttp_client: Any) -> Any:
    """``await served(config)``: a client of the proxy served with the options ``serve`` uses
    (TestServer ignores options given to its constructor, so the server is started here)."""

    async def go(config: Config) -> Client:
        server = ProxyTestServer(create_app(config), host="127.0.0.1")
        await server.start_server(**server_options(config))
        client: Client = await aiohttp_client(server)
        return client

    return go


@pytest.fixture
async def kube_proxy(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, served: Any
) -> Any:
    """``await kube_proxy(**sections)``: the proxy intercepting MPI runs, served as ``serve``
    serves it."""
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    kubeconfig = str(await kubeconfig_for(fake_kube))

    async def go(**sections: dict[str, Any]) -> Client:
        kubernetes = {
            "kubeconfig": kubeconfig,
            "dry_run_on_start": False,
            "watch": False,
            "retry_backoff_seconds": 0.05,
            "request_timeout_seconds": 1.0,
            **sections.pop("kubernetes", {}),
        }
        runs = {"intercept": "mpi", **sections.pop("runs", {})}
        config = make_config(oms.url, runs=runs, kubernetes=kubernetes, **sections)
        client: Client = await served(config)
        return client

    return go


async def timed_post(client: Client, body: Any) -> tuple[int, str, dict[str, str], float]:
    started = time.monotonic()
    resp = await client.post("/api/run", json=body)
    text = await resp.text()
    return resp.status, text, dict(resp.headers), time.monotonic() - started


# --- Kubernetes faults, one submission at a time ------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "notes"),
    [
        ([Fault("POST", "mpijobs", status=500, times=2)], False),
        ([Fault("POST", "mpijobs", status=503, times=1)], False),
        ([Fault("POST", "mpijobs", status=504, times=1)], False),
        ([Fault("POST", "mpijobs", drop_after=True, times=3)], True),
        ([Fault("POST", "configmaps", status=500, times=2)], True),
        ([Fault("POST", "configmaps", drop_before=True, times=1)], True),
        ([Fault("POST", "configmaps", drop_after=True, times=1)], True),
        (
            [
                Fault("POST", "mpijobs", drop_after=True),
                Fault("GET", "mpijobs", status=500),
                Fault("POST", "configmaps", drop_after=True),
            ],
            True,
        ),
    ],
    ids=[
        "mpijob-500x2",
        "mpijob-503",
        "mpijob-504",
        "mpijob-dropped-after-x3",
        "configmap-500x2",
        "configmap-dropped-before",
        "configmap-dropped-after",
        "everything-once",
    ],
)
async def test_transient_faults_end_in_exactly_one_mpijob(
    kube_proxy: Any, fake_kube: FakeKube, faults: list[Fault], notes: bool
) -> None:
    client = await kube_proxy()
    for fault in faults:
        fake_kube.add_fault(fault)
    status, text, _, elapsed = await timed_post(client, run_body(1, notes))
    assert status == 200, text
    assert elapsed < 1.0 + MARGIN
    check_outcomes(fake_kube, {1: 200}, {1} if notes else set())


async def test_retry_after_is_honoured_within_the_deadline(
    kube_proxy: Any, fake_kube: FakeKube
) -> None:
    client = await kube_proxy(kubernetes={"request_timeout_seconds": 3.0})
    fake_kube.add_fault(Fault("POST", "mpijobs", status=429, retry_after=1))
    status, text, _, elapsed = await timed_post(client, run_body(1))
    assert status == 200, text
    assert 0.9 <= elapsed < 3.0 + MARGIN
    check_outcomes(fake_kube, {1: 200}, set())


async def test_retry_after_past_the_deadline_is_503_at_once(
    kube_proxy: Any, fake_kube: FakeKube
) -> None:
    client = await kube_proxy()
    fake_kube.add_fault(Fault("POST", "mpijobs", status=429, retry_after=30))
    status, text, headers, elapsed = await timed_post(client, run_body(1))
    assert status == 503, text
    assert headers["Retry-After"] == "30"
    assert elapsed < 0.5 + MARGIN  # not held until the deadline for a known outcome
    check_outcomes(fake_kube, {1: 503}, set())
    assert (await timed_post(client, run_body(2)))[0] == 200


@pytest.mark.parametrize(
    ("faults", "statuses", "calls"),
    [
        ([Fault("POST", "mpijobs", status=500, times=100)], (502, 504), 1),
        ([Fault("POST", "mpijobs", status=503, times=100)], (503, 504), 1),
        ([Fault("POST", "mpijobs", drop_before=True, times=100)], (503, 504), 1),
        # Answered too late: the create is applied after the proxy gave up (as an API server
        # does with a request whose client left); the background check removes it.
        ([Fault("POST", "mpijobs", delay=1.0)], (504,), 1),
        # Created but the answer lost, and the retry's 409 cannot be checked: the MPIJob may
        # be this request's; it is removed once the API answers again.
        (
            [
                Fault("POST", "mpijobs", drop_after=True),
                Fault("GET", "mpijobs", status=500, times=1000),
            ],
            (502, 504),
            1,
        ),
        # The ConfigMap cannot be created, nor the half-created MPIJob deleted: two calls, each
        # within the deadline; the background check deletes the MPIJob once the API recovers.
        (
            [
                Fault("POST", "configmaps", status=500, times=1000),
                Fault("DELETE", "mpijobs", status=503, times=1000),
            ],
            (502, 504),
            2,
        ),
    ],
    ids=[
        "500",
        "503",
        "dropped",
        "late",
        "answer-lost-then-get-fails",
        "configmap-and-delete-fail",
    ],
)
async def test_lasting_faults_end_in_an_error_in_time_and_no_mpijob(
    kube_proxy: Any,
    fake_kube: FakeKube,
    faults: list[Fault],
    statuses: tuple[int, ...],
    calls: int,
) -> None:
    timeout = 0.5
    client = await kube_proxy(kubernetes={"retries": 20, "request_timeout_seconds": timeout})
    for fault in faults:
        fake_kube.add_fault(fault)
    status, text, _, elapsed = await timed_post(client, run_body(1, notes=True))
    assert status in statuses, text
    assert elapsed < calls * timeout + MARGIN
    assert len(text) < 2000
    fake_kube._faults.clear()  # the fault clears
    if any(f.delay for f in faults):  # the late create lands (then the proxy removes it)
        await fake_kube.wait_until(lambda: bool(fake_kube.objects("mpijobs", NS)), within=2.0)
    await settle(client)  # a create that was still on its way has landed, and is gone
    check_outcomes(fake_kube, {1: status}, {1})
    # The proxy works again by itself.
    again, text, _, _ = await timed_post(client, run_body(2, notes=True))
    assert again == 200, text
    check_outcomes(fake_kube, {1: status, 2: 200}, {1, 2})


async def test_api_down_for_a_while_then_up(kube_proxy: Any, fake_kube: FakeKube) -> None:
    client = await kube_proxy(
        kubernetes={"retries": 3, "retry_backoff_seconds": 0.1, "request_timeout_seconds": 2.0}
    )
    fake_kube.down()
    status, _, headers, elapsed = await timed_post(client, run_body(1))
    assert status == 503
    assert "Retry-After" in headers
    assert elapsed < 2.0 + MARGIN
    # Down while a submission is being retried (at 0, 0.1, 0.3 and 0.7 s), then up.
    pending = asyncio.create_task(timed_post(client, run_body(2)))
    await asyncio.sleep(0.2)
    fake_kube.up()
    status2, text2, _, elapsed2 = await pending
    assert status2 == 200, text2
    assert elapsed2 < 2.0 + MARGIN
    check_outcomes(fake_kube, {1: status, 2: 200}, set())  # a dropped request is not applied


# --- oms faults ---------------------------------------------------------------------------------


async def test_oms_dropping_or_slow_during_a_submission(
    kube_proxy: Any, fake_kube: FakeKube, oms: FakeOms
) -> None:
    client = await kube_proxy(oms={"first_byte_timeout_seconds": 0.3, "model_cache_seconds": 0.0})
    oms.drop = True
    status, text, _, elapsed = await timed_post(client, run_body(1))
    assert status == 502, text
    assert elapsed < MARGIN
    oms.drop, oms.delay = False, 1.0
    status, text, _, elapsed = await timed_post(client, run_body(2))
    assert status == 504, text
    assert elapsed < 0.3 + MARGIN
    oms.delay = 0.0
    status, text, _, _ = await timed_post(client, run_body(3))
    assert status == 200, text
    check_outcomes(fake_kube, {1: 502, 2: 504, 3: 200}, set())


async def test_oms_faults_on_the_pass_through(oms: FakeOms, served: Any) -> None:
    client: Client = await served(make_config(oms.url, oms={"first_byte_timeout_seconds": 0.3}))
    # Reset mid-stream: the headers are gone, so the client sees a cut body, never a short
    # "complete" one.
    resp = await client.get("/test/reset/1000000")
    assert resp.status == 200
    assert resp.headers["Content-Length"] == "1000000"
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    # Dropped without an answer.
    oms.drop = True
    started = time.monotonic()
    resp = await client.get("/test/small")
    assert resp.status == 502
    assert time.monotonic() - started < MARGIN
    # Slow.
    oms.drop, oms.delay = False, 1.0
    started = time.monotonic()
    resp = await client.get("/test/small")
    assert resp.status == 504
    assert time.monotonic() - started < 0.3 + MARGIN
    # Recovered.
    oms.delay = 0.0
    resp = await client.get("/test/small")
    assert resp.status == 200
    assert (await resp.json())["ok"] is True


# --- bursts -------------------------------------------------------------------------------------


async def test_burst_under_faults_one_mpijob_per_200(kube_proxy: Any, fake_kube: FakeKube) -> None:
    client = await kube_proxy(
        runs={"max_concurrent_submissions": 24},
        kubernetes={"request_timeout_seconds": 1.5, "retries": 3},
    )
    for fault in (
        Fault("POST", "mpijobs", status=500, times=5),
        Fault("POST", "mpijobs", drop_after=True, times=3),
        Fault("POST", "mpijobs", drop_before=True, times=3),
        Fault("POST", "mpijobs", status=429, retry_after=1, times=2),
        Fault("POST", "mpijobs", delay=0.2, times=10),
        Fault("GET", "mpijobs", status=503, times=2),
        Fault("POST", "configmaps", status=500, times=2),
        Fault("POST", "configmaps", drop_after=True, times=2),
    ):
        fake_kube.add_fault(fault)
    notes = {i for i in range(30) if i % 3 == 0}
    results = await asyncio.gather(
        *(timed_post(client, run_body(i, i in notes)) for i in range(30))
    )
    outcomes: dict[int, int | str] = {i: r[0] for i, r in enumerate(results)}
    for status, text, _, elapsed in results:
        assert status in (200, 429, 502, 503, 504), text
        assert elapsed < 1.5 + MARGIN
    assert sum(s == 200 for s in outcomes.values()) >= 15
    await settle(client)
    await asyncio.sleep(0.1)
    check_outcomes(fake_kube, outcomes, notes)


# --- SIGTERM during a burst, on the real process ------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@dataclasses.dataclass
class ProxyProcess:
    """``python -m proxy serve`` started by :func:`proxy_process`."""

    proc: asyncio.subprocess.Process
    url: str
    stderr: Path

    def log(self) -> str:
        return self.stderr.read_text(encoding="utf-8", errors="replace")


@contextlib.asynccontextmanager
async def proxy_process(
    tmp_path: Path, config: dict[str, Any], log_level: str = "INFO"
) -> AsyncIterator[ProxyProcess]:
    """Run the proxy as its own process with ``config`` (YAML keys); stderr goes to a file."""
    port = free_port()
    config = copy.deepcopy(config)
    config.setdefault("server", {}).update({"host": "127.0.0.1", "port": port})
    config.setdefault("logging", {})["level"] = log_level
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    stderr = tmp_path / "proxy.stderr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--config",
            str(path),
            cwd=REPO,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )
    running = ProxyProcess(proc, f"http://127.0.0.1:{port}", stderr)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):  # up to ~10 s for the interpreter and imports
                if proc.returncode is not None:
                    raise AssertionError(f"the proxy exited at start:\n{running.log()}")
                try:
                    async with session.get(running.url + "/healthz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"the proxy did not start:\n{running.log()}")
        yield running
    finally:
        if proc.returncode is None:
            proc.kill()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await proc.wait()


async def test_sigterm_during_a_burst_leaves_nothing_half_done(
    tmp_path: Path, oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor
) -> None:
    grace = 3.0
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    config = {
        "oms": {"url": oms.url},
        "mpijob": {"template": str(Config().template_path())},
        "server": {"shutdown_grace_seconds": grace},
        "runs": {"intercept": "mpi"},
        "kubernetes": {
            "kubeconfig": str(await kubeconfig_for(fake_kube)),
            "dry_run_on_start": False,
            "watch": False,
            "request_timeout_seconds": 5.0,
        },
    }
    # Every create takes a while: the first wave is in the middle of it at SIGTERM.
    fake_kube.add_fault(Fault("POST", "mpijobs", delay=0.5, times=1000))
    fake_kube.add_fault(Fault("POST", "configmaps", delay=0.3, times=1000))
    notes = {i for i in range(30) if i % 2 == 0}
    async with proxy_process(tmp_path, config) as proxy:
        connector = aiohttp.TCPConnector(force_close=True)  # one connection per request
        async with aiohttp.ClientSession(connector=connector) as session:

            async def submit(i: int) -> int | str:
                try:
                    async with session.post(
                        proxy.url + "/api/run",
                        json=run_body(i, i in notes),
                        timeout=aiohttp.ClientTimeout(total=grace + 5),
                    ) as resp:
                        await resp.read()
                        return resp.status
                except (aiohttp.ClientError, OSError) as e:
                    return type(e).__name__

            first = [asyncio.create_task(submit(i)) for i in range(20)]
            await fake_kube.wait_until(
                lambda: (
                    sum(r.resource == "mpijobs" and r.method == "POST" for r in fake_kube.requests)
                    >= 20
                ),
                within=5.0,
            )
            proxy.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.2)
            late = [asyncio.create_task(submit(i)) for i in range(20, 30)]
            outcomes = dict(enumerate(await asyncio.gather(*first, *late)))
        async with asyncio.timeout(grace + 5):
            code = await proxy.proc.wait()
        exited_after = time.monotonic() - signalled
        log = proxy.log()
    assert code == 0, log
    assert exited_after < grace + 2.0, log
    assert "Traceback" not in log, log
    # The ones in flight finished within the grace period; the late ones found no listener.
    assert all(outcomes[i] == 200 for i in range(20)), outcomes
    assert all(outcomes[i] != 200 for i in range(20, 30)), outcomes
    check_outcomes(fake_kube, outcomes, notes)
