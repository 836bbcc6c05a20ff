"""Every answer right for every real client, on every replica (issue 12), over HTTP.

Two proxy apps (replicas) share one stand-in Kubernetes API and one stand-in oms; requests use
the shapes the real clients send (``shared/reference/oms-api.md`` §2, §5): the UI's
``POST /api/run`` without a RunStamp and its log-page polling, R's ``waitForRunCompleted``
status polling, python's ``create_model_run`` status/last polling.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.follow.cache import pick
from proxy.follow.runinfo import run_info
from proxy.follow.store import Run
from proxy.submit.handler import SUBMITTER
from tests.test_lifecycle import DIGEST, MODEL, NS, Env, _scenario, env, known

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
