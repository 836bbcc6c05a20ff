"""Launched runs followed like the OpenM++ UI does, over real HTTP.

The proxy is built by ``proxy.app.create_app`` with a kubeconfig pointing at the stand-in
Kubernetes API (simulated MPI operator), in front of the stand-in oms; runs are submitted with
``POST /api/run`` through the proxy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.config import Config
from proxy.follow.cache import RUN_CACHE
from proxy.follow.view import FINAL_MESSAGE_KEY, PREFIX, PRELUDE_KEY
from proxy.submit.handler import SUBMITTER
from standins.kube import DEFAULT_LOG_LINES, FakeKube, Scenario
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor, make_config
from tests.oms_shapes import PROGRESS_KEYS, RUN_STATE_KEYS

Client = TestClient[web.Request, web.Application]
NS = "default"
MODEL = "modelOne"
DIGEST = "_201208171604590148_"
TICK = 0.05  # the UI ticks every second; tests tick faster
# The run cache's timings (config group ``follow``), shortened for tests.
FOLLOW: dict[str, Any] = {
    "settle_seconds": 0.1,
    "events_refresh_seconds": 0.3,
    "sweep_seconds": 3600.0,  # tests call sweep() themselves
    "backoff_first_seconds": 0.05,
    "backoff_max_seconds": 0.2,
    "direct_cache_seconds": 0.2,
    "record_retry_seconds": 0.2,
}
MODEL_LINES = [f"model line {i:02d}" for i in range(24)]


@dataclasses.dataclass
class Env:
    oms: FakeOms
    kube: FakeKube
    kubeconfig: str
    aiohttp_client: Callable[..., Awaitable[Client]]

    def config(
        self, *, watch: bool = True, follow: dict[str, Any] | None = None, **runs: Any
    ) -> Config:
        return make_config(
            self.oms.url,
            runs={"intercept": "mpi", **runs},
            kubernetes={
                "kubeconfig": self.kubeconfig,
                "dry_run_on_start": False,
                "watch": watch,
                "retry_backoff_seconds": 0.01,
                "request_timeout_seconds": 3.0,
            },
            follow={**FOLLOW, **(follow or {})},
        )

    async def proxy(self, config: Config | None = None) -> Client:
        from proxy.app import create_app

        app = create_app(config or self.config())
        return await self.aiohttp_client(app)

    async def submit(self, client: Client, np: int = 2, run_name: str = "test run") -> Any:
        body = {"ModelDigest": DIGEST, "Mpi": {"Np": np}, "Opts": {"OpenM.RunName": run_name}}
        resp = await client.post("/api/run", json=body)
        assert resp.status == 200, await resp.text()
        return await resp.json()

    def job(self, state: Any) -> dict[str, Any]:
        jobs = [
            j
            for j in self.kube.objects("mpijobs", NS)
            if j["metadata"]["annotations"].get("openmpp.org/run-stamp") == state["RunStamp"]
        ]
        assert len(jobs) == 1
        return jobs[0]


@pytest.fixture
async def env(
    oms: FakeOms,
    fake_kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Env:
    path = await kubeconfig_for(fake_kube)
    return Env(oms, fake_kube, str(path), aiohttp_client)


# --- a UI-like poller (openmpp/UI src/pages/RunLog.vue) ----------------------------------------


def is_progress(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and all(k in item for k in PROGRESS_KEYS)
        and isinstance(item.get("Progress"), list)
    )


def is_state_log(page: Any) -> bool:
    keys = [*RUN_STATE_KEYS, "Offset", "Size", "TotalSize"]
    return (
        isinstance(page, dict) and all(k in page for k in keys) and isinstance(page["Lines"], list)
    )


class UiPoller:
    """Polls log pages and progress exactly as RunLog.vue computes them, one tick at a time."""

    def __init__(self, client: Client | Callable[[], Client], stamp: str, tick: float = TICK):
        self.client = client
        self.stamp = stamp
        self.tick = tick
        self.lines: list[str] = []
        self.state: dict[str, Any] = {}
        self.log_start, self.log_count = 0, 200
        self.log_done = False
        self.empty_log = self.empty_progress = 0
        self.refresh_count = 0
        self.progress: list[Any] = []
        self.pages: list[dict[str, Any]] = []

    def _client(self) -> Client:
        return self.client() if callable(self.client) else self.client

    async def _log(self) -> None:
        url = f"/api/run/log/model/{DIGEST}/stamp/{self.stamp}"
        url += f"/start/{self.log_start}/count/{self.log_count}"
        resp = await self._client().get(url)
        assert resp.status == 200, await resp.text()
        page = await resp.json()
        assert is_state_log(page), page
        if not (
            page["ModelDigest"]
            and page["UpdateDateTime"]
            and (page["RunStamp"] or page["SubmitStamp"])
        ):
            self.empty_log += 1
            assert self.empty_log <= 5, "the UI would pause: more than 5 empty log pages"
            return
        self.pages.append(page)
        self.state = {k: page[k] for k in RUN_STATE_KEYS}
        self.empty_log = 0
        n_start = len(self.lines) - page["Offset"]
        if n_start >= 0:
            n_len = page["Offset"] + page["Size"] - len(self.lines)
            for k in range(n_start, n_len):
                self.lines.append(page["Lines"][k] or "")
        if page["IsFinal"] and page["Offset"] + page["Size"] >= page["TotalSize"]:
            self.log_done = True
        else:
            self.log_start = len(self.lines)
            self.log_count = max(200, page["TotalSize"] - self.log_start)

    async def _progress(self) -> None:
        stamp = self.state.get("RunStamp") or self.stamp
        resp = await self._client().get(f"/api/model/{DIGEST}/run/{stamp}/status/list")
        assert resp.status == 200, await resp.text()
        items = await resp.json()
        if not isinstance(items, list) or (items and not is_progress(items[0])):
            items = []
        if not items:
            self.empty_progress += 1
            assert self.empty_progress <= 5, "the UI would pause: more than 5 empty progress lists"
            return
        self.empty_progress = 0
        self.progress = items

    def all_done(self) -> bool:
        valid = [p for p in self.progress if is_progress(p) and p.get("RunDigest")]
        return self.log_done and all(p["Status"] in ("s", "x", "e") for p in valid)

    async def step(self) -> None:
        self.refresh_count += 1
        if not self.log_done:
            await self._log()
        if self.log_done or self.refresh_count < 4 or self.refresh_count % 4 == 1:
            await self._progress()

    async def run(self, within: float = 8.0) -> UiPoller:
        async with asyncio.timeout(within):
            while not self.all_done():
                await self.step()
                await asyncio.sleep(self.tick)
        return self

    def model_lines(self) -> list[str]:
        return [x for x in self.lines if not x.startswith(PREFIX)]


async def known(client: Client, state: Any) -> None:
    """Wait until the proxy's cache has the run (its watch event may trail the POST answer)."""
    async with asyncio.timeout(2):
        while True:
            url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}"
            if (await (await client.get(url)).json())["Lines"]:
                return
            await asyncio.sleep(0.01)


def _scenario(kube: FakeKube, **kw: Any) -> None:
    kube.set_scenario(Scenario(**{"log_lines": MODEL_LINES, "line_interval": 0.03, **kw}))


# --- following runs ----------------------------------------------------------------------------


async def test_ui_poller_sees_every_line_once_then_final(env: Env) -> None:
    _scenario(env.kube)
    client = await env.proxy()
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.model_lines() == MODEL_LINES
    assert poller.state["IsFinal"] is True
    assert poller.state["RunName"] == "test run"
    assert poller.state["LogFileName"] == f"{MODEL}.{state['RunStamp']}.console.log"
    assert poller.lines[0].startswith(PREFIX)
    assert "submitted as MPIJob" in poller.lines[0]
    assert poller.lines[-2].endswith("completed")
    assert "exit code 0" in poller.lines[-1]
    assert [p["Status"] for p in poller.progress] == ["s"]
    # Every page answered was a correct slice of the final lines.
    final = poller.lines
    for page in poller.pages:
        assert page["Lines"] == final[page["Offset"] : page["Offset"] + page["Size"]]
    # The whole log, as the R package asks for it; the submit stamp finds the run too.
    resp = await client.get(
        f"/api/run/log/model/{MODEL}/stamp/{state['SubmitStamp']}/start/0/count/0"
    )
    whole = await resp.json()
    assert whole["Lines"] == final
    assert whole["TotalSize"] == len(final)
    assert whole["IsFinal"]
    # The prelude is recorded on the MPIJob.
    assert PRELUDE_KEY in env.job(state)["metadata"]["annotations"]
    # The launcher is a batch/v1 Job, as on a real cluster: its job-controller's Event shows.
    name = env.job(state)["metadata"]["name"]
    (created,) = [line for line in final if "SuccessfulCreate" in line]
    assert f"Normal SuccessfulCreate Job/{name}-launcher: Created pod: {name}-launcher-" in created


async def test_log_paging_follows_oms(env: Env) -> None:
    _scenario(env.kube, log_lines=["a", "b", "c"], line_interval=0.01)
    client = await env.proxy()
    state = await env.submit(client)
    await UiPoller(client, state["RunStamp"]).run()
    base = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}"
    lines = (await (await client.get(base)).json())["Lines"]
    total = len(lines)
    page = await (await client.get(f"{base}/start/{total - 2}/count/1")).json()
    assert (page["Offset"], page["Size"], page["Lines"]) == (total - 2, 1, [lines[-2]])
    beyond = await (await client.get(f"{base}/start/{total + 5}/count/7")).json()
    assert (beyond["Offset"], beyond["Size"], beyond["Lines"], beyond["TotalSize"]) == (
        total + 5,
        0,
        [],
        total,
    )
    negative = await (await client.get(f"{base}/start/-3/count/2")).json()
    assert (negative["Offset"], negative["Size"]) == (0, 2)
    query = await (await client.get(f"{base}/start/0/count/0?start=1&count=1")).json()
    assert (query["Offset"], query["Size"]) == (1, 1)
    for bad, text in (
        (f"{base}/start/x/count/1", f"Invalid value of start log start line {DIGEST}\n"),
        (f"{base}/start/1/count/1.5", f"Invalid value of log line count {DIGEST}\n"),
    ):
        resp = await client.get(bad)
        assert resp.status == 400
        assert resp.headers["Content-Type"].startswith("text/plain")
        assert await resp.text() == text


async def test_image_pull_backoff_ends_at_the_start_deadline(env: Env) -> None:
    _scenario(env.kube, kind="image-pull")
    client = await env.proxy(env.config(start_deadline_seconds=1.0))
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.state["IsFinal"] is True
    assert poller.model_lines() == []
    text = "\n".join(poller.lines)
    assert "run failed: it did not start within 1 s:" in text
    assert "ImagePullBackOff: Back-off pulling image" in text
    assert "Warning BackOff Pod/" in text  # the Events explained it while it waited
    assert [p["Status"] for p in poller.progress] == ["e"]
    job = env.job(state)
    final = json.loads(job["metadata"]["annotations"][FINAL_MESSAGE_KEY])
    assert final["reason"] == "StartDeadlineExceeded"
    assert job["spec"]["runPolicy"]["suspend"] is True  # it cannot start behind our back
    status = await (await client.get(f"/api/model/{DIGEST}/run/{state['RunStamp']}/status")).json()
    assert status["Status"] == "e"


async def test_unschedulable_run_ends_at_the_start_deadline(env: Env) -> None:
    _scenario(env.kube, kind="unschedulable")
    client = await env.proxy(env.config(start_deadline_seconds=1.0))
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.state["IsFinal"] is True
    assert "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu." in "\n".join(poller.lines)
    assert [p["Status"] for p in poller.progress] == ["e"]


async def test_failed_run_is_final_with_status_e(env: Env) -> None:
    _scenario(env.kube, kind="fail", exit_code=3)
    client = await env.proxy()
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.state["IsFinal"] is True
    assert poller.model_lines() == MODEL_LINES
    assert "run failed: BackoffLimitExceeded" in poller.lines[-2]
    assert poller.lines[-1] == f"{PREFIX}launcher exit code 3 (Error)"
    assert [p["Status"] for p in poller.progress] == ["e"]
    # The model wrote its run row and died without finishing it: oms still says "p".
    env.oms.add_run(MODEL, state["RunStamp"], status="p")
    base = f"/api/model/{DIGEST}/run/{state['RunStamp']}"
    items = await (await client.get(f"{base}/status/list")).json()
    assert [(i["Status"], bool(i["RunDigest"])) for i in items] == [("e", True)]
    assert (await (await client.get(f"{base}/status")).json())["Status"] == "e"


async def test_oms_status_wins_once_it_has_the_run(env: Env) -> None:
    _scenario(env.kube)
    client = await env.proxy()
    state = await env.submit(client)
    await UiPoller(client, state["RunStamp"]).run()
    row = env.oms.add_run(MODEL, state["RunStamp"], status="s")
    items = await (
        await client.get(f"/api/model/{DIGEST}/run/{state['RunStamp']}/status/list")
    ).json()
    assert items == [json.loads(json.dumps(row.pub()))]


async def test_stop_deletes_the_mpijob(env: Env) -> None:
    _scenario(env.kube, line_interval=0.2)
    client = await env.proxy()
    state = await env.submit(client)
    poller = UiPoller(client, state["RunStamp"])
    async with asyncio.timeout(5):
        while len(poller.model_lines()) < 2:
            await poller.step()
            await asyncio.sleep(TICK)
    name = env.job(state)["metadata"]["name"]
    resp = await client.put(f"/api/run/stop/model/{DIGEST}/stamp/{state['RunStamp']}")
    assert resp.status == 200
    assert await resp.read() == b""
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert resp.headers["Content-Location"] == f"/api/model/{DIGEST}/run/{state['RunStamp']}/true"
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None)
    await poller.run()
    assert poller.state["IsFinal"] is True
    assert poller.lines[-1].endswith(f"run stopped: MPIJob {name} deleted")
    assert 2 <= len(poller.model_lines()) < len(MODEL_LINES)
    assert [p["Status"] for p in poller.progress] == ["x"]
    deletes = [r for r in env.kube.requests if r.verb == "delete" and r.name == name]
    assert len(deletes) == 1
    assert deletes[0].query.get("propagationPolicy") == "Foreground"


async def test_stop_by_submit_stamp_of_a_queued_run(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    client = await env.proxy()
    state = await env.submit(client)
    await known(client, state)
    name = env.job(state)["metadata"]["name"]
    resp = await client.put(f"/api/run/stop/model/{MODEL}/stamp/{state['SubmitStamp']}")
    assert resp.status == 200
    assert (
        resp.headers["Content-Location"] == f"/api/model/{DIGEST}/run/{state['SubmitStamp']}/true"
    )
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.lines[-1].endswith("deleted")
    assert poller.model_lines() == []


async def test_unknown_stamps_pass_through_to_oms(env: Env) -> None:
    client = await env.proxy()
    stamp = "2020_01_01_00_00_00_000"
    paths = [
        ("GET", f"/api/run/log/model/{DIGEST}/stamp/{stamp}/start/0/count/200"),
        ("GET", f"/api/model/{DIGEST}/run/{stamp}/status"),
        ("GET", f"/api/model/{DIGEST}/run/{stamp}/status/list"),
        ("GET", f"/api/model/{DIGEST}/run/status/last"),
        ("PUT", f"/api/run/stop/model/{DIGEST}/stamp/{stamp}"),
        ("GET", f"/api/service/job/active/{stamp}"),
    ]
    for method, path in paths:
        before = len(env.oms.requests)
        resp = await client.request(method, path)
        assert (method, path) in [(m, p) for m, p, _ in env.oms.requests[before:]], path
        if method == "PUT":
            assert resp.headers["Content-Location"].endswith(f"/{stamp}/false")
    assert not [r for r in env.kube.requests if r.verb in ("get", "delete", "patch")]


async def test_a_run_of_another_model_is_not_ours(env: Env) -> None:
    _scenario(env.kube)
    client = await env.proxy()
    state = await env.submit(client)
    await known(client, state)
    before = len(env.oms.requests)
    resp = await client.get(f"/api/run/log/model/RiskPaths/stamp/{state['RunStamp']}")
    assert (await resp.json())["Lines"] == []  # oms's empty page
    assert len(env.oms.requests) == before + 1


async def test_two_replicas_answer_identical_pages(env: Env) -> None:
    _scenario(env.kube)
    one, two = await env.proxy(), await env.proxy()
    state = await env.submit(one)
    turn = iter(range(10**6))
    poller = await UiPoller(lambda: (one, two)[next(turn) % 2], state["RunStamp"]).run()
    assert poller.model_lines() == MODEL_LINES
    base = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"
    first = await (await one.get(base)).json()
    second = await (await two.get(base)).json()
    assert first == second
    assert first["Lines"] == poller.lines


async def test_restarting_the_proxy_mid_run_loses_nothing(env: Env) -> None:
    _scenario(env.kube, line_interval=0.1)
    client = await env.proxy()
    state = await env.submit(client)
    current = {"client": client}
    poller = UiPoller(lambda: current["client"], state["RunStamp"])
    async with asyncio.timeout(5):
        while len(poller.model_lines()) < 3:
            await poller.step()
            await asyncio.sleep(TICK)
    await client.close()  # the replica goes away mid-run ...
    current["client"] = await env.proxy()  # ... and a new one takes over
    await poller.run()
    assert poller.model_lines() == MODEL_LINES
    assert poller.state["IsFinal"] is True


async def test_kubernetes_requests_stay_under_one_per_second_per_running_job(env: Env) -> None:
    _scenario(env.kube, line_interval=0.1, log_lines=[f"l{i}" for i in range(35)])
    client = await env.proxy()
    state = await env.submit(client)
    pollers = [UiPoller(client, state["RunStamp"]) for _ in range(10)]
    first = pollers[0]
    async with asyncio.timeout(5):
        while not first.model_lines():
            await asyncio.gather(*(p.step() for p in pollers))
            await asyncio.sleep(TICK)
    loop = asyncio.get_running_loop()
    began, count = loop.time(), len(env.kube.requests)
    async with asyncio.timeout(10):
        while not first.log_done:
            await asyncio.gather(*(p.step() for p in pollers if not p.log_done))
            await asyncio.sleep(TICK)
    seconds = loop.time() - began
    made = env.kube.requests[count:]
    assert seconds > 1.5
    assert len(made) <= seconds + 1, [(r.method, r.path) for r in made]
    assert all(p.model_lines() == first.model_lines() for p in pollers)


async def test_watch_off_reads_directly(env: Env) -> None:
    _scenario(env.kube, log_lines=["x", "y"], line_interval=0.01)
    client = await env.proxy(env.config(watch=False))
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.model_lines() == ["x", "y"]
    assert not [r for r in env.kube.requests if r.verb == "watch"]


async def test_watch_relists_after_410_and_reconnects_after_a_lost_connection(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.follow.informer")
    _scenario(env.kube, log_lines=["x"], line_interval=0.01)
    env.kube.bookmark_interval = 1000.0  # no bookmark moves the watch's resourceVersion on
    from proxy.app import create_app

    app = create_app(env.config(follow={"watch_timeout_seconds": 1}))
    client = await env.aiohttp_client(app)
    first = await env.submit(client)
    await UiPoller(client, first["RunStamp"]).run()

    def lists() -> int:
        return sum(1 for r in env.kube.requests if r.verb == "list" and r.resource != "events")

    before = lists()
    env.kube.compact()  # the watches' resourceVersions are now too old: 410 on the next watch
    await env.kube.wait_until(lambda: lists() > before, within=3)
    assert any("expired (410)" in r.getMessage() for r in caplog.records)
    env.kube.down()  # connections drop: back off, reconnect, list again
    await asyncio.sleep(0.1)
    env.kube.up()
    second = await env.submit(client, run_name="after")
    poller = await UiPoller(client, second["RunStamp"]).run()
    assert poller.state["RunName"] == "after"
    assert poller.model_lines() == ["x"]


# --- other answers ------------------------------------------------------------------------------


async def test_status_last_answers_for_our_newer_run(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    client = await env.proxy()
    env.oms.add_run(MODEL, "2000_01_01_00_00_00_000", status="s")
    state = await env.submit(client)
    await known(client, state)
    last = await (await client.get(f"/api/model/{DIGEST}/run/status/last")).json()
    assert (last["RunStamp"], last["Status"]) == (state["RunStamp"], "i")
    row = env.oms.add_run(MODEL, state["RunStamp"], status="p")
    last = await (await client.get(f"/api/model/{MODEL}/run/status/last")).json()
    assert (last["RunStamp"], last["Status"], last["RunDigest"]) == (
        state["RunStamp"],
        "p",
        row.pub()["RunDigest"],
    )


async def test_jobs_page_shows_queued_runs(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    client = await env.proxy()
    state = await env.submit(client, np=3)
    await known(client, state)
    doc = await (await client.get("/api/service/state")).json()
    assert "IsJobControl" in doc
    assert doc["Active"] == []
    [job] = doc["Queue"]
    assert (job["SubmitStamp"], job["RunStamp"], job["ModelDigest"]) == (
        state["SubmitStamp"],
        state["RunStamp"],
        DIGEST,
    )
    assert job["IsMpi"] is True
    assert job["Mpi"]["Np"] == 3
    assert job["Res"]["ProcessCount"] == 3
    async with asyncio.timeout(3):
        while True:  # the Events show once their second has passed (and settled)
            url = f"/api/run/log/model/{DIGEST}/stamp/{state['SubmitStamp']}"
            item = await (await client.get(url)).json()
            if any("MPIJobSuspended" in x for x in item["Lines"]):
                break
            await asyncio.sleep(TICK)
    item = await (await client.get(f"/api/service/job/queue/{state['SubmitStamp']}")).json()
    assert item["JobStatus"] == ""
    assert (item["SubmitStamp"], item["QueuePos"]) == (state["SubmitStamp"], 1)
    assert item["RunStatus"][0]["Status"] == "i"


async def test_finished_runs_are_deleted_after_the_retention(env: Env) -> None:
    _scenario(env.kube, log_lines=["x"], line_interval=0.01)
    client = await env.proxy(env.config(finished_retention_seconds=0.0))
    state = await env.submit(client)
    await UiPoller(client, state["RunStamp"]).run()
    name = env.job(state)["metadata"]["name"]
    cache = client.app[RUN_CACHE]
    assert cache is not None
    await cache.sweep()
    assert env.kube.get_object("mpijobs", NS, name) is None
    # Pollers still get the final answer from the tombstone.
    page = await (await client.get(f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}")).json()
    assert page["IsFinal"] is True
    assert page["Lines"][-1].endswith("(Completed)")


async def test_default_log_lines_of_the_standin(env: Env) -> None:
    client = await env.proxy()
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.model_lines() == list(DEFAULT_LOG_LINES)


async def test_notify_created_makes_a_new_run_known_at_once(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    client = await env.proxy()
    state = await env.submit(client)
    job = env.job(state)
    stamp = "2031_01_01_00_00_00_000"
    job["metadata"]["name"] += "-x"
    job["metadata"]["uid"] = "another-uid"
    for where in ("labels", "annotations"):
        job["metadata"][where]["openmpp.org/run-stamp"] = stamp
    submitter = client.app[SUBMITTER]
    assert submitter is not None
    assert submitter.on_created is not None
    submitter.on_created(job)  # what the submit path does after a create
    cache = client.app[RUN_CACHE]
    assert cache is not None
    run = await cache.find(stamp, DIGEST)
    assert run is not None
    assert run.name == job["metadata"]["name"]


def test_only_events_of_our_runs_are_kept() -> None:
    """The namespace's other Events are not cached (memory and work do not grow with them)."""
    from proxy.follow.cache import _about_our_run

    runs = {"ompp-riskpaths-1a2b3c4d": object()}
    prefixes = tuple(f"{n}-" for n in runs)

    def event(name: str) -> dict[str, Any]:
        return {"involvedObject": {"name": name}}

    assert _about_our_run(event("ompp-riskpaths-1a2b3c4d"), runs, prefixes)
    assert _about_our_run(event("ompp-riskpaths-1a2b3c4d-worker-0"), runs, prefixes)
    assert _about_our_run(event("ompp-riskpaths-1a2b3c4d-launcher-x7k2p"), runs, prefixes)
    assert not _about_our_run(event("ompp-riskpaths-1a2b3c4"), runs, prefixes)
    assert not _about_our_run(event("someone-elses-pod"), runs, prefixes)
    assert not _about_our_run({}, runs, prefixes)
