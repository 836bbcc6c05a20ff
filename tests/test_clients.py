"""Every answer right for every real client, on every replica (issue 12), over HTTP.

Two proxy apps (replicas) share one stand-in Kubernetes API and one stand-in oms; requests use
the shapes the real clients send (``shared/reference/oms-api.md`` §2, §5): the UI's
``POST /api/run`` without a RunStamp and its log-page polling, R's ``waitForRunCompleted``
status polling, python's ``create_model_run`` status/last polling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.clients.kube import KUBE
from proxy.follow.cache import pick
from proxy.follow.runinfo import run_info
from proxy.follow.store import Run
from proxy.follow.view import PRELUDE_KEY
from proxy.submit.handler import SUBMITTER
from standins.kube import Fault
from tests.test_lifecycle import (
    DIGEST,
    MODEL,
    MODEL_LINES,
    NS,
    Env,
    UiPoller,
    _scenario,
    env,
    known,
)

__all__ = ["env"]

Client = TestClient[web.Request, web.Application]
FIXED = dt.datetime(2026, 3, 4, 5, 6, 7, 890123)


def fix_clock(client: Client, moment: dt.datetime = FIXED) -> None:
    """Every submission on this replica happens at ``moment`` (the same milliseconds)."""
    submitter = client.server.app[SUBMITTER]
    assert submitter is not None
    submitter.clock = lambda: moment


async def post_ui_run(client: Client, run_name: str, **extra: Any) -> tuple[int, Any]:
    """The UI's POST /api/run (RunModel.vue): no RunStamp, MPI processes, a run name."""
    body = {
        "ModelName": MODEL,
        "ModelDigest": DIGEST,
        "Mpi": {"Np": 2, "IsNotOnRoot": False},
        "Template": "",
        "Opts": {"OpenM.RunName": run_name, "OpenM.SubValues": "1"},
        "Tables": [],
        **extra,
    }
    resp = await client.post("/api/run", json=body)
    if resp.status != 200:
        return resp.status, await resp.text()  # errors are plain text, as oms's
    return resp.status, await resp.json()


async def test_same_millisecond_submissions_on_two_replicas_get_distinct_stamps(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    config = env.config(max_concurrent_submissions=500)
    one, two = await env.proxy(config), await env.proxy(config)
    fix_clock(one)
    fix_clock(two)
    n = 150  # per replica
    results = await asyncio.gather(
        *(post_ui_run((one, two)[i % 2], f"run-{i:03d}") for i in range(2 * n))
    )
    assert [status for status, _ in results] == [200] * (2 * n), [
        doc for status, doc in results if status != 200
    ][:3]
    states = [doc for _, doc in results]
    stamps = [s["RunStamp"] for s in states]
    assert len(set(stamps)) == 2 * n
    assert all(s["RunStamp"] == s["SubmitStamp"] for s in states)  # a generated stamp is both
    jobs = env.kube.objects("mpijobs", NS)
    assert len(jobs) == 2 * n
    by_stamp = {j["metadata"]["annotations"]["openmpp.org/run-stamp"]: j for j in jobs}
    assert set(by_stamp) == set(stamps)
    submit_stamps = [j["metadata"]["annotations"]["openmpp.org/submit-stamp"] for j in jobs]
    assert len(set(submit_stamps)) == 2 * n
    # Every log page names the right run on both replicas, by either stamp.
    for i, state in enumerate(states):
        await known(one, state)
        name = by_stamp[state["RunStamp"]]["metadata"]["name"]
        for client in (one, two):
            url = f"/api/run/log/model/{DIGEST}/stamp/{state['SubmitStamp']}/start/0/count/0"
            page = await (await client.get(url)).json()
            assert (page["RunStamp"], page["RunName"]) == (state["RunStamp"], f"run-{i:03d}")
            assert f"MPIJob {name}:" in page["Lines"][0]


async def test_a_stamp_taken_on_another_replica_is_skipped_without_409(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    one, two = await env.proxy(), await env.proxy()
    fix_clock(one)
    fix_clock(two)
    first = await post_ui_run(one, "first")
    second = await post_ui_run(two, "second")  # the same clock: its first stamp is taken
    assert (first[0], second[0]) == (200, 200)
    assert first[1]["RunStamp"] != second[1]["RunStamp"]
    assert second[1]["RunStamp"] > first[1]["RunStamp"]  # at least 1 ms later


async def test_a_client_chosen_duplicate_stamp_still_gets_409(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    one, two = await env.proxy(), await env.proxy()
    status, state = await post_ui_run(one, "mine", RunStamp="my-stamp-1")
    assert (status, state["RunStamp"]) == (200, "my-stamp-1")
    assert state["SubmitStamp"] != "my-stamp-1"
    status, doc = await post_ui_run(two, "again", RunStamp="my-stamp-1")
    assert status == 409
    assert "my-stamp-1" in str(doc)


async def test_run_stamp_match_wins_over_another_runs_submit_stamp(env: Env) -> None:
    _scenario(env.kube, kind="suspended")
    one, two = await env.proxy(), await env.proxy()
    _, a = await post_ui_run(one, "a", RunStamp="chosen-a")
    # The client of run b chooses as RunStamp the SubmitStamp of run a.
    status, b = await post_ui_run(two, "b", RunStamp=a["SubmitStamp"])
    assert status == 200
    await known(one, a)
    await known(one, b)
    await known(two, a)
    for client in (one, two):
        url = f"/api/run/log/model/{DIGEST}/stamp/{a['SubmitStamp']}/start/0/count/0"
        page = await (await client.get(url)).json()
        assert page["RunName"] == "b"  # RunStamp match first
        url = f"/api/run/log/model/{DIGEST}/stamp/chosen-a/start/0/count/0"
        page = await (await client.get(url)).json()
        assert page["RunName"] == "a"


def _run(name: str, run_stamp: str, submit_stamp: str, created: str) -> Run:
    obj = {
        "metadata": {
            "name": name,
            "uid": name,
            "creationTimestamp": created,
            "annotations": {
                "openmpp.org/run-stamp": run_stamp,
                "openmpp.org/submit-stamp": submit_stamp,
            },
        }
    }
    info = run_info(obj)
    assert info is not None
    return Run(name=name, obj=obj, info=info)


def test_stamp_precedence_is_independent_of_order() -> None:
    s = "2026_03_04_05_06_07_890"
    by_submit_old = _run("ompp-b", "x1", s, "2026-03-04T05:06:00Z")
    by_submit_new = _run("ompp-a", "x2", s, "2026-03-04T05:06:09Z")
    by_run = _run("ompp-c", s, "y", "2026-03-04T05:06:09Z")
    same_time = _run("ompp-0", "x3", s, "2026-03-04T05:06:00Z")
    runs = [by_submit_old, by_submit_new, by_run, same_time]
    for order in (runs, runs[::-1], runs[1:] + runs[:1]):
        assert pick(s, order) is by_run
        assert pick(s, [r for r in order if r is not by_run]) is same_time  # earlier, then name
    by_submit_old.deleted_at = dt.datetime.now(dt.UTC)
    assert pick(s, [by_submit_old, by_submit_new]) is by_submit_new  # live before deleted


# --- python create_model_run: POST, then GET .../run/status/last every second ------------------


async def test_status_last_answers_our_run_when_oms_newest_row_is_an_older_run_of_ours(
    env: Env,
) -> None:
    _scenario(env.kube, kind="suspended")
    client = await env.proxy()
    _, older = await post_ui_run(client, "older")
    await known(client, older)
    env.oms.add_run(MODEL, older["RunStamp"], status="s")  # the older run completed in oms
    _, newer = await post_ui_run(client, "newer")
    await known(client, newer)
    last = await (await client.get(f"/api/model/{MODEL}/run/status/last")).json()
    assert (last["RunStamp"], last["Status"], last["Name"]) == (newer["RunStamp"], "i", "newer")
    # Once oms has the newer run, oms's row answers.
    env.oms.add_run(MODEL, newer["RunStamp"], status="p")
    last = await (await client.get(f"/api/model/{MODEL}/run/status/last")).json()
    assert (last["RunStamp"], last["Status"]) == (newer["RunStamp"], "p")
    # A later run oms started itself is newer than ours: oms answers.
    await asyncio.sleep(0.01)
    env.oms.add_run(MODEL, "zz-oms-own", status="p")
    last = await (await client.get(f"/api/model/{MODEL}/run/status/last")).json()
    assert last["RunStamp"] == "zz-oms-own"


# --- the first read after the end is final and whole ------------------------------------------


async def succeeded(env: Env, stamp: str) -> None:
    """Wait (on the stand-in API, not through the proxy) until the run's MPIJob Succeeded."""
    async with asyncio.timeout(10):
        while True:
            job = env.job({"RunStamp": stamp})
            conds = (job.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Succeeded" and c["status"] == "True" for c in conds):
                return
            await asyncio.sleep(0.02)


async def test_first_read_after_the_end_is_final_and_whole(env: Env) -> None:
    lines = [f"launcher line {i}" for i in range(10)]
    _scenario(env.kube, log_lines=lines, line_interval=0.01)
    config = env.config(follow={"settle_seconds": 2.0, "events_refresh_seconds": 5.0})
    client = await env.proxy(config)
    _, state = await post_ui_run(client, "nobody polls")
    await succeeded(env, state["RunStamp"])
    await asyncio.sleep(0.3)
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"
    page = await (await client.get(url)).json()
    assert page["IsFinal"] is True, page
    assert [x for x in page["Lines"] if not x.startswith("[oms-mpijob-proxy]")] == lines
    assert page["TotalSize"] == len(page["Lines"])


@pytest.mark.parametrize(
    "fault",
    [
        None,  # the recording is accepted
        Fault("PATCH", "mpijobs", status=403, times=3),  # a Role without patch (then fixed)
        Fault("PATCH", "mpijobs", status=409, times=2),  # someone else changed the MPIJob
        Fault("PATCH", "mpijobs", status=500, times=2),
        Fault("PATCH", "mpijobs", delay=1.5, times=1),  # slow
    ],
    ids=["accepted", "403", "409", "500", "slow"],
)
async def test_first_read_is_final_whatever_happens_to_the_recording(
    env: Env, fault: Fault | None
) -> None:
    lines = [f"launcher line {i}" for i in range(10)]
    _scenario(env.kube, log_lines=lines, line_interval=0.01)
    config = env.config(follow={"settle_seconds": 2.0, "events_refresh_seconds": 5.0})
    one, two = await env.proxy(config), await env.proxy(config)
    if fault is not None:
        env.kube.add_fault(fault)
    _, state = await post_ui_run(one, "nobody polls")
    await succeeded(env, state["RunStamp"])
    await asyncio.sleep(0.3)
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"
    first = await (await one.get(url)).json()
    assert first["IsFinal"] is True, first
    assert [x for x in first["Lines"] if not x.startswith("[oms-mpijob-proxy]")] == lines
    assert first["Lines"][-1].startswith("[oms-mpijob-proxy] launcher exit code 0")
    # The recording lands (retried in the background); then every replica answers the same.
    async with asyncio.timeout(10):
        while PRELUDE_KEY not in env.job(state)["metadata"]["annotations"]:
            again = await (await one.get(url)).json()
            assert again["Lines"] == first["Lines"]  # never stale, never shrinking
            await asyncio.sleep(0.1)
    for client in (one, two):
        assert (await (await client.get(url)).json())["Lines"] == first["Lines"]


# --- the jobs page (UI service-state page: GET /api/service/state every 1601 ms) ---------------


async def service_state(client: Client) -> Any:
    resp = await client.get("/api/service/state")
    assert resp.status == 200
    return await resp.json()


def listed(doc: Any, stamp: str) -> list[str]:
    """In which of the jobs page's lists the run with submit stamp ``stamp`` is."""
    return [
        k for k in ("Queue", "Active", "History") if any(j["SubmitStamp"] == stamp for j in doc[k])
    ]


async def test_jobs_page_shows_a_run_as_oms_shows_its_own(env: Env) -> None:
    _scenario(env.kube, line_interval=0.2, log_lines=[f"l{i}" for i in range(10)])
    one, two = await env.proxy(), await env.proxy()
    body = {
        "ModelDigest": DIGEST,
        "Mpi": {"Np": 4},
        "Threads": 2,
        "Opts": {"OpenM.RunName": "the run", "OpenM.SubValues": "4"},
    }
    state = await (await one.post("/api/run", json=body)).json()
    stamp = state["SubmitStamp"]
    await known(one, state)
    doc = await service_state(two)
    [job] = doc["Active"]
    assert job["SubmitStamp"] == stamp
    assert job["Opts"] == {"OpenM.RunName": "the run", "OpenM.SubValues": "4"}
    assert job["Template"] == "mpijob-template.yaml"
    assert job["Mpi"] == {"Np": 4, "IsNotOnRoot": False, "IsNotByJob": False}
    # 4 processes x 2 threads; memory: mpijob.memory_per_process (1Gi) per process, in GB
    assert job["Res"] == {
        "Cpu": 8,
        "Mem": 4,
        "ProcessCount": 4,
        "ThreadCount": 2,
        "ProcessMemMb": 1024,
        "ThreadMemMb": 0,
    }
    assert (doc["ActiveTotalRes"], doc["ActiveOwnRes"]) == ({"Cpu": 8, "Mem": 4},) * 2
    detail = await (await two.get(f"/api/service/job/active/{stamp}")).json()
    assert (detail["SubmitStamp"], detail["Opts"]["OpenM.RunName"]) == (stamp, "the run")
    assert detail["Lines"][0].startswith("[oms-mpijob-proxy]")
    # Nobody reads the run's pages: both replicas move it to History when its MPIJob ends.
    await succeeded(env, state["RunStamp"])
    async with asyncio.timeout(2):
        while True:
            docs = [await service_state(c) for c in (one, two)]
            if all(listed(d, stamp) == ["History"] for d in docs):
                break
            await asyncio.sleep(0.05)
    assert docs[0]["History"] == docs[1]["History"]
    [item] = docs[0]["History"]
    assert item == {
        "SubmitStamp": stamp,
        "ModelName": MODEL,
        "ModelDigest": DIGEST,
        "RunStamp": state["RunStamp"],
        "JobStatus": "success",
        "RunTitle": "the run",
    }
    assert docs[0]["ActiveTotalRes"] == {"Cpu": 0, "Mem": 0}
    for client in (one, two):
        detail = await (await client.get(f"/api/service/job/history/{stamp}")).json()
        assert detail["JobStatus"] == "success"
        assert [x for x in detail["Lines"] if not x.startswith("[")] == [f"l{i}" for i in range(10)]
        # and no longer as active: oms answers (its empty job state)
        active = await (await client.get(f"/api/service/job/active/{stamp}")).json()
        assert active.get("ModelName", "") == ""


async def test_a_stopped_run_is_listed_in_history(env: Env) -> None:
    _scenario(env.kube, line_interval=0.5)
    client = await env.proxy()
    _, state = await post_ui_run(client, "to stop")
    await known(client, state)
    resp = await client.put(f"/api/run/stop/model/{DIGEST}/stamp/{state['SubmitStamp']}")
    assert resp.status == 200
    async with asyncio.timeout(3):
        while True:
            if listed(await service_state(client), state["SubmitStamp"]) == ["History"]:
                break
            await asyncio.sleep(0.05)
    [item] = (await service_state(client))["History"]
    assert item["JobStatus"] == "kill"


async def test_a_run_queued_by_kueue_is_reported_queued_then_runs(env: Env) -> None:
    _scenario(env.kube, log_lines=["model output"], line_interval=0.01)
    config = env.config(start_deadline_seconds=1.0)
    config = dataclasses.replace(
        config, mpijob=dataclasses.replace(config.mpijob, queue_name="team-a")
    )
    one, two = await env.proxy(config), await env.proxy(config)
    _, state = await post_ui_run(one, "queued run")
    stamp = state["SubmitStamp"]
    await known(one, state)
    await asyncio.sleep(1.5)  # longer than the start deadline: queue time does not count
    for client in (one, two):
        doc = await service_state(client)
        assert listed(doc, stamp) == ["Queue"]
        assert doc["Queue"][0]["QueuePos"] == 1
        assert doc["QueueTotalRes"] == {"Cpu": 2, "Mem": 2}
        url = f"/api/run/log/model/{DIGEST}/stamp/{stamp}/start/0/count/0"
        page = await (await client.get(url)).json()
        assert page["IsFinal"] is False
        assert "waits for admission by Kueue (LocalQueue team-a)" in page["Lines"][1]
        status = await (await client.get(f"/api/model/{DIGEST}/run/{stamp}/status")).json()
        assert status["Status"] == "i"
    # Kueue admits it: suspend false; the run then proceeds as any other.
    kube = one.server.app[KUBE]
    assert kube is not None
    await kube.patch_mpijob(
        env.job(state)["metadata"]["name"], {"spec": {"runPolicy": {"suspend": False}}}
    )
    await succeeded(env, state["RunStamp"])
    page = await (await two.get(url)).json()
    assert page["IsFinal"] is True, page
    assert "model output" in page["Lines"]
    assert listed(await service_state(two), stamp) == ["History"]


async def test_a_start_deadline_verdict_under_kueue_is_not_undone_by_admission(env: Env) -> None:
    _scenario(env.kube, running_after=30.0)  # admitted, but the pods take long to start
    config = env.config(start_deadline_seconds=0.5)
    config = dataclasses.replace(
        config, mpijob=dataclasses.replace(config.mpijob, queue_name="team-a")
    )
    client = await env.proxy(config)
    _, state = await post_ui_run(client, "slow start")
    await known(client, state)
    name = env.job(state)["metadata"]["name"]
    kube = client.server.app[KUBE]
    assert kube is not None
    await kube.patch_mpijob(name, {"spec": {"runPolicy": {"suspend": False}}})
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"
    async with asyncio.timeout(5):
        while True:
            page = await (await client.get(url)).json()
            if page["IsFinal"]:
                break
            await asyncio.sleep(0.1)
    assert any("did not start within 0.5 s" in x for x in page["Lines"])
    # The verdict sticks: the MPIJob is deleted (Kueue would resume a suspended one).
    async with asyncio.timeout(5):
        while True:
            if all(j["metadata"]["name"] != name for j in env.kube.objects("mpijobs", NS)):
                break
            await asyncio.sleep(0.05)
    again = await (await client.get(url)).json()
    assert again["Lines"] == page["Lines"]
    status = await (await client.get(f"/api/model/{DIGEST}/run/{state['RunStamp']}/status")).json()
    assert status["Status"] == "e"


async def test_r_wait_for_run_completed_then_the_log_is_final_and_whole(env: Env) -> None:
    """openmpp/R omsCommon.R: POST with Opts["OpenM.RunStamp"] and a Template, then GET
    .../run/<stamp>/status every second until s/x/e, then read the log once."""
    lines = [f"launcher line {i}" for i in range(8)]
    _scenario(env.kube, log_lines=lines, line_interval=0.02)
    config = env.config(follow={"settle_seconds": 2.0, "events_refresh_seconds": 5.0})
    one, two = await env.proxy(config), await env.proxy(config)
    body = {
        "ModelDigest": DIGEST,
        "Mpi": {"Np": 2, "IsNotOnRoot": False},
        "Template": f"mpi.{MODEL}.template.txt",
        "Opts": {"OpenM.RunStamp": "r-run-1", "OpenM.RunName": "from R"},
    }
    resp = await one.post("/api/run", json=body)
    assert resp.status == 200
    state = await resp.json()
    assert (state["RunStamp"], state["SubmitStamp"] != "r-run-1") == ("r-run-1", True)
    clients = iter([one, two] * 1000)  # behind a round-robin balancer
    async with asyncio.timeout(15):
        while True:
            url = f"/api/model/{DIGEST}/run/{state['RunStamp']}/status"
            status = await (await next(clients).get(url)).json()
            if status["Status"] not in ("", "i", "p", "w"):
                break
            await asyncio.sleep(0.2)
    assert status["Status"] == "s"
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"
    page = await (await next(clients).get(url)).json()
    assert page["IsFinal"] is True
    assert [x for x in page["Lines"] if not x.startswith("[oms-mpijob-proxy]")] == lines


async def test_with_events_forbidden_the_first_read_after_the_end_is_still_final(env: Env) -> None:
    lines = [f"launcher line {i}" for i in range(5)]
    _scenario(env.kube, log_lines=lines, line_interval=0.01)
    env.kube.forbid("list", "events")
    client = await env.proxy()
    _, state = await post_ui_run(client, "no events")
    await succeeded(env, state["RunStamp"])
    await asyncio.sleep(0.3)
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"
    page = await (await client.get(url)).json()
    assert page["IsFinal"] is True, page["Lines"]
    assert [x for x in page["Lines"] if not x.startswith("[oms-mpijob-proxy]")] == lines


async def test_with_events_forbidden_a_polled_run_ends_final(env: Env) -> None:
    _scenario(env.kube, line_interval=0.05)
    env.kube.forbid("list", "events")
    client = await env.proxy()
    _, state = await post_ui_run(client, "no events, polled")
    poller = await UiPoller(client, state["RunStamp"]).run(within=10)
    assert poller.state["IsFinal"] is True
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}/start/0/count/0"
    page = await (await client.get(url)).json()
    assert page["IsFinal"] is True
    assert [x for x in page["Lines"] if not x.startswith("[oms-mpijob-proxy]")] == MODEL_LINES
