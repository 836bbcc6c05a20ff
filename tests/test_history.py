"""The run history over HTTP: a finished run's log and outcome outlive its MPIJob and the proxy.

Runs are followed as the OpenM++ UI follows them (the poller of ``tests/test_lifecycle.py``,
which keeps every page it was served); then their MPIJob is deleted (by hand, as ``kubectl
delete`` does, by stop, or by retention), the proxy is restarted (a new app on the same stand-in
API), and every page is asked for again with the UI's exact request shapes
(``shared/reference/oms-api.md`` §2).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from proxy.follow.archive import (
    CONFIGMAP_LIMIT,
    MAX_RECORD_BYTES,
    SELECTOR,
    RunRecord,
    cap_lines,
    decode,
    entry_of,
    expired,
    fit,
    record_name,
)
from proxy.follow.cache import RUN_CACHE
from proxy.follow.view import PREFIX
from proxy.names import RUN_RECORD_FINALIZER
from standins.kube import FakeKube
from tests.test_lifecycle import (
    DIGEST,
    MODEL,
    MODEL_LINES,
    NS,
    TICK,
    Client,
    Env,
    UiPoller,
    _scenario,
    env,
)

__all__ = ["env"]


def records(kube: FakeKube) -> dict[str, dict[str, Any]]:
    """The run-record ConfigMaps in the stand-in, by name."""
    out = {}
    for cm in kube.objects("configmaps", NS):
        labels = cm["metadata"].get("labels") or {}
        wanted = dict(part.split("=") for part in SELECTOR.split(","))
        if all(labels.get(k) == v for k, v in wanted.items()):
            out[cm["metadata"]["name"]] = cm
    return out


async def delete_by_hand(api: Any, name: str) -> None:
    """``kubectl delete mpijob <name>`` (background propagation)."""
    await k8s.CustomObjectsApi(api).delete_namespaced_custom_object(
        "kubeflow.org", "v2beta1", NS, "mpijobs", name, propagation_policy="Background"
    )


async def ui_reads_old_run(client: Client, stamp: str) -> tuple[dict[str, Any], list[str]]:
    """The UI's run-log page for an old run: the first page, then the rest (oms-api.md §2)."""
    base = f"/api/run/log/model/{DIGEST}/stamp/{stamp}"
    first = await (await client.get(f"{base}/start/0/count/0")).json()
    lines = list(first["Lines"])
    n = len(lines)
    rest = await (await client.get(f"{base}/start/{n}/count/{max(200, first['TotalSize'])}")).json()
    lines += rest["Lines"]
    assert rest["Offset"] == n
    status = await (await client.get(f"/api/model/{DIGEST}/run/{stamp}/status/list")).json()
    return {"first": first, "rest": rest, "status": status}, lines


async def assert_same_as_served(
    client: Client,
    poller: UiPoller,
    status: str,
    final: list[str] | None = None,
    pages: list[dict[str, Any]] | None = None,
) -> None:
    """Every page the poller was served while the run ran is served again, line for line.

    ``final``/``pages``: the whole final log and the pages to compare, when they are not all
    the poller collected (a run that waits shows its Events as they come, and an Event listed
    late may land before one shown earlier: the frozen prelude is the reference then).
    """
    stamp = poller.stamp
    base = f"/api/run/log/model/{DIGEST}/stamp/{stamp}"
    final = poller.lines if final is None else final
    for page in poller.pages if pages is None else pages:
        again = await (
            await client.get(f"{base}/start/{page['Offset']}/count/{max(page['Size'], 1)}")
        ).json()
        assert again["Lines"][: page["Size"]] == page["Lines"]
        assert again["Offset"] == page["Offset"]
    whole = await (await client.get(base)).json()
    assert whole["Lines"] == final
    assert whole["IsFinal"] is True
    assert whole["TotalSize"] == len(final)
    assert whole["LogFileName"] == f"{MODEL}.{stamp}.console.log"
    answers, lines = await ui_reads_old_run(client, stamp)
    assert lines == final
    assert answers["first"]["IsFinal"] is True
    assert [i["Status"] for i in answers["status"]] == [status]
    one = await (await client.get(f"/api/model/{DIGEST}/run/{stamp}/status")).json()
    assert one["Status"] == status
    last = await (await client.get(f"/api/model/{DIGEST}/run/status/last")).json()
    assert (last["RunStamp"], last["Status"]) == (stamp, status)


async def follow(env: Env, client: Client, kind: str) -> tuple[UiPoller, str, dict[str, Any]]:
    """Submit a run and follow it to its end like the UI; returns (poller, MPIJob name, state)."""
    if kind == "stopped":
        _scenario(env.kube, line_interval=0.2)
    elif kind == "failed":
        _scenario(env.kube, kind="fail", exit_code=3)
    else:
        _scenario(env.kube)
    state = await env.submit(client)
    name = env.job(state)["metadata"]["name"]
    poller = UiPoller(client, state["RunStamp"])
    if kind == "stopped":
        async with asyncio.timeout(5):
            while len(poller.model_lines()) < 2:
                await poller.step()
                await asyncio.sleep(TICK)
        stop = f"/api/run/stop/model/{DIGEST}/stamp/{state['RunStamp']}"
        assert (await client.put(stop)).status == 200
    await poller.run()
    return poller, name, state


@pytest.mark.parametrize("kind", ["succeeded", "failed", "stopped"])
async def test_a_run_outlives_its_mpijob_and_a_proxy_restart(
    env: Env, kube_api: Any, kind: str
) -> None:
    status = {"succeeded": "s", "failed": "e", "stopped": "x"}[kind]
    client = await env.proxy()
    poller, name, state = await follow(env, client, kind)
    stamp = state["RunStamp"]
    if kind == "failed":
        # The model wrote its run row and died before its final status: oms says "p" for ever.
        env.oms.add_run(MODEL, stamp, status="p")
    await env.kube.wait_until(lambda: record_name(name) in records(env.kube))
    if kind != "stopped":
        job = env.kube.get_object("mpijobs", NS, name)
        assert job is not None
        assert RUN_RECORD_FINALIZER in job["metadata"]["finalizers"]
        await delete_by_hand(kube_api, name)
    # The finalizer is released once the run is archived; then the MPIJob and its pods go.
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None)
    assert not [p for p in env.kube.objects("pods", NS) if p["metadata"]["name"].startswith(name)]
    await assert_same_as_served(client, poller, status)
    if kind == "stopped":
        assert poller.lines[-1].endswith(f"run stopped: MPIJob {name} deleted")
        assert 2 <= len(poller.model_lines()) < len(MODEL_LINES)
    else:
        assert poller.model_lines() == MODEL_LINES
    await client.close()

    # A restarted proxy has never seen the run: it answers from the run record alone.
    restarted = await env.proxy()
    await assert_same_as_served(restarted, poller, status)
    cache = restarted.app[RUN_CACHE]
    assert cache is not None
    assert cache.history is not None
    await env.kube.wait_until(lambda: cache.synced and cache.history._synced)  # type: ignore[union-attr]
    calls = len(env.kube.requests)
    await assert_same_as_served(restarted, poller, status)
    # Served from memory: no Kubernetes request per poll (watches may be renewed, nothing else).
    assert {r.verb for r in env.kube.requests[calls:]} <= {"watch"}
    record = decode(entry_of(records(env.kube)[record_name(name)]).blob)  # type: ignore[union-attr]
    assert record.status == status
    assert record.reason
    assert record.reason in poller.lines[-1] + poller.lines[-2]
    assert (record.run_name, record.mpi_np, record.lines_not_kept) == ("test run", 2, 0)


async def test_a_run_that_never_started_is_final_e_after_its_mpijob(
    env: Env, kube_api: Any
) -> None:
    """Image pull back-off until the start deadline: no model line, status e, for good."""
    _scenario(env.kube, kind="image-pull")
    client = await env.proxy(env.config(start_deadline_seconds=1.0))
    state = await env.submit(client)
    name = env.job(state)["metadata"]["name"]
    poller = await UiPoller(client, state["RunStamp"]).run()
    assert poller.model_lines() == []
    url = f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}"
    final = (await (await client.get(url)).json())["Lines"]  # the frozen prelude, the verdict
    await env.kube.wait_until(lambda: record_name(name) in records(env.kube))
    await delete_by_hand(kube_api, name)
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None)
    await client.close()
    restarted = await env.proxy(env.config(start_deadline_seconds=1.0, watch=False))
    finals = [p for p in poller.pages if p["IsFinal"]]
    await assert_same_as_served(restarted, poller, "e", final, finals)  # watch off: direct lists
    assert "did not start within 1 s" in "\n".join(final)


async def test_a_running_job_deleted_by_hand_is_read_archived_then_released(
    env: Env, kube_api: Any
) -> None:
    _scenario(env.kube, line_interval=0.2)
    client = await env.proxy()
    state = await env.submit(client)
    name = env.job(state)["metadata"]["name"]
    poller = UiPoller(client, state["RunStamp"])
    async with asyncio.timeout(5):
        while len(poller.model_lines()) < 2:
            await poller.step()
            await asyncio.sleep(TICK)
    await delete_by_hand(kube_api, name)  # kubectl delete: the pods stay while it is held
    await poller.run()
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None)
    assert poller.lines[-1].endswith(f"run stopped: MPIJob {name} deleted")
    assert "could not be read to its end" in poller.lines[-2]
    assert 2 <= len(poller.model_lines()) < len(MODEL_LINES)
    await client.close()
    await assert_same_as_served(await env.proxy(), poller, "x")


async def test_a_record_is_written_once_whoever_sees_the_end(env: Env, kube_api: Any) -> None:
    """Two replicas behind one load balancer: one record, and both serve the same lines."""
    first, second = await env.proxy(), await env.proxy()
    poller, name, state = await follow(env, first, "succeeded")
    await env.kube.wait_until(lambda: record_name(name) in records(env.kube))
    other = UiPoller(second, state["RunStamp"])
    await other.run()
    assert other.lines == poller.lines
    creates = [
        r
        for r in env.kube.requests
        if r.resource == "configmaps" and r.verb == "create" and r.name.endswith("-record")
    ]
    assert len(records(env.kube)) == 1
    assert len(creates) <= 2
    await delete_by_hand(kube_api, name)
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None)
    for replica in (first, second):
        await assert_same_as_served(replica, poller, "s")


async def test_the_record_exists_before_retention_deletes_the_mpijob(env: Env) -> None:
    client = await env.proxy(env.config(finished_retention_seconds=0.0))
    _scenario(env.kube, log_lines=["x", "y"], line_interval=0.01)
    state = await env.submit(client)
    name = env.job(state)["metadata"]["name"]
    cache = client.app[RUN_CACHE]
    assert cache is not None
    async with asyncio.timeout(5):  # nobody polls: the sweep reads, archives, then deletes
        while env.kube.get_object("mpijobs", NS, name) is not None:
            await cache.sweep()
            await asyncio.sleep(TICK)
    assert record_name(name) in records(env.kube)
    page = await (await client.get(f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}")).json()
    assert page["IsFinal"] is True
    assert [x for x in page["Lines"] if not x.startswith(PREFIX)] == ["x", "y"]


async def test_retention_and_caps_expire_records_with_metrics(env: Env, kube_api: Any) -> None:
    client = await env.proxy(env.config())
    stamps, jobs = [], []
    for _ in range(3):
        _poller, name, state = await follow(env, client, "succeeded")
        stamps.append(state["RunStamp"])
        jobs.append(name)
    await env.kube.wait_until(lambda: len(records(env.kube)) == 3)
    cache = client.app[RUN_CACHE]
    assert cache is not None
    assert cache.history is not None
    history = cache.history
    await env.kube.wait_until(lambda: len(history.finished_runs()) == 3)
    history.settings = type(history.settings)(max_runs=1)
    assert await history.sweep() == 0  # a record whose MPIJob exists is not expired
    for name in jobs:
        await delete_by_hand(kube_api, name)
    await env.kube.wait_until(lambda: not env.kube.objects("mpijobs", NS))
    async with asyncio.timeout(3):  # the proxy's watch shows the deletions
        while True:
            if not any(cache._exists(n) for n in jobs):
                break
            await asyncio.sleep(TICK)
    history.settings = type(history.settings)(max_runs=2)
    assert await history.sweep() == 1
    assert len(records(env.kube)) == 2
    assert history.get(stamps[0]) is None  # the oldest went first
    assert history.get(stamps[2]) is not None
    history.settings = type(history.settings)(retention_days=1e-9)
    assert await history.sweep() == 2
    assert records(env.kube) == {}
    text = await (await client.get("/metrics")).text()
    assert "omsproxy_run_records 0.0" in text
    assert 'omsproxy_run_records_total{outcome="archived"} 3.0' in text
    assert 'omsproxy_run_records_total{outcome="expired"} 3.0' in text
    # An expired run is oms's again: a (restarted) proxy passes its stamp through.
    await client.close()
    client = await env.proxy(env.config())
    page = await (await client.get(f"/api/run/log/model/{DIGEST}/stamp/{stamps[0]}")).json()
    assert page["Lines"] == []


async def test_a_long_log_is_capped_with_one_marker_line(env: Env) -> None:
    lines = [f"model line {i:05d} " + "x" * 80 for i in range(400)]
    _scenario(env.kube, log_lines=lines, line_interval=0.001)
    client = await env.proxy(env.config())
    client.app[RUN_CACHE].history.settings = type(  # type: ignore[union-attr]
        client.app[RUN_CACHE].history.settings  # type: ignore[union-attr]
    )(max_log_bytes=8192)
    state = await env.submit(client)
    poller = await UiPoller(client, state["RunStamp"]).run(within=15)
    assert poller.model_lines() == lines  # while the MPIJob exists: everything
    name = env.job(state)["metadata"]["name"]
    await env.kube.wait_until(lambda: record_name(name) in records(env.kube))
    cm = records(env.kube)[record_name(name)]
    record = decode(base64.b64decode(cm["binaryData"]["record.json.gz"]))
    assert sum(len(x) + 1 for x in record.lines) <= 8192
    marker = [x for x in record.lines if "are not kept in the run history" in x]
    assert len(marker) == 1
    assert record.lines_not_kept > 0
    kept = [x for x in record.lines if not x.startswith(PREFIX)]
    assert kept[0] == lines[0]
    assert kept[-1] == lines[-1]
    assert record.lines[0] == poller.lines[0]  # the submission line
    assert record.lines[-2:] == tuple(poller.lines[-2:])  # the reason and the exit code
    text = await (await client.get("/metrics")).text()
    assert 'omsproxy_run_records_total{outcome="truncated"} 1.0' in text


# --- the record itself (pure) ---------------------------------------------------------------


def _record(lines: list[str]) -> Any:
    from datetime import UTC, datetime

    from proxy.follow.archive import RunRecord

    t = datetime(2026, 1, 1, tzinfo=UTC)
    return RunRecord(
        "job",
        "uid",
        MODEL,
        DIGEST,
        "2026_01_01_00_00_00_000",
        "2026_01_01_00_00_00_000",
        "",
        "succeeded",
        "s",
        "run succeeded",
        t,
        t,
        t,
        t,
        t,
        2,
        2,
        1,
        1,
        False,
        1,
        tuple(lines),
    )


def test_an_incompressible_log_still_fits_one_configmap() -> None:
    lines = [os.urandom(300).hex() for _ in range(20_000)]  # 12 MB that gzip cannot shrink much
    full = [f"{PREFIX}first", *lines, f"{PREFIX}2026-01-01 00:00:01 run succeeded: MPIJob x done"]
    view = _record(full).view()
    record, blob = fit(view, view.updated, 64 << 20)
    assert len(blob) <= MAX_RECORD_BYTES < CONFIGMAP_LIMIT
    assert record.lines[0] == full[0]
    assert record.lines[-1] == full[-1]
    assert record.lines_not_kept > 0
    assert decode(blob) == record
    assert json.loads(gzip.decompress(blob))["schema"] == 1


def test_cap_keeps_everything_under_the_budget() -> None:
    lines = ["a", "b", "c", f"{PREFIX}x run failed: y"]
    assert cap_lines(lines, 1000, 3) == (tuple(lines), 0)


def test_expiry_order_and_retention() -> None:
    from datetime import UTC, datetime, timedelta

    from proxy.follow.archive import RecordEntry

    now = datetime(2026, 6, 1, tzinfo=UTC)

    def entry(name: str, days_ago: float, size: int) -> RecordEntry:
        at = now - timedelta(days=days_ago)
        return RecordEntry(name, name, MODEL, DIGEST, name, name, at, "s", at, b"x" * size, "1")

    entries = [entry("a", 100, 10), entry("b", 5, 10), entry("c", 1, 10), entry("d", 0, 10)]
    assert [
        e.name for e in expired(entries, now, retention_days=90, max_runs=9, max_total_bytes=99)
    ] == ["a"]
    assert [
        e.name for e in expired(entries, now, retention_days=0, max_runs=2, max_total_bytes=99)
    ] == ["a", "b"]
    assert [
        e.name for e in expired(entries, now, retention_days=0, max_runs=9, max_total_bytes=25)
    ] == ["a", "b"]


def test_a_record_round_trips_through_its_configmap() -> None:
    from proxy.follow.archive import configmap_of, encode

    record = _record(["one", "two"])
    cm = configmap_of(record, encode(record))
    assert "ownerReferences" not in cm["metadata"]  # it must outlive the MPIJob
    assert cm["immutable"] is True
    entry = entry_of(cm)
    assert entry is not None
    assert decode(entry.blob) == record
    assert isinstance(record, RunRecord)


async def test_a_failing_archive_is_retried_and_a_refused_one_lets_the_mpijob_go(
    env: Env, kube_api: Any
) -> None:
    from standins.kube import Fault

    client = await env.proxy()
    _scenario(env.kube, log_lines=["a", "b"], line_interval=0.01)
    state = await env.submit(client)
    name = env.job(state)["metadata"]["name"]
    # The API fails the record's create (retried, the next attempt lands).
    env.kube.add_fault(Fault("POST", "configmaps", status=503, times=8))
    await UiPoller(client, state["RunStamp"]).run()
    await delete_by_hand(kube_api, name)
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None, 10)
    assert record_name(name) in records(env.kube)  # it waited for the record

    state = await env.submit(client)
    name = env.job(state)["metadata"]["name"]
    env.kube.add_fault(Fault("POST", "configmaps", status=422, times=1))
    poller = await UiPoller(client, state["RunStamp"]).run()
    await delete_by_hand(kube_api, name)
    # Refused as invalid: it will not change on a retry, so the MPIJob is not held for ever.
    await env.kube.wait_until(lambda: env.kube.get_object("mpijobs", NS, name) is None)
    assert record_name(name) not in records(env.kube)
    text = await (await client.get("/metrics")).text()
    assert 'omsproxy_run_records_total{outcome="failed"}' in text
    page = await (await client.get(f"/api/run/log/model/{DIGEST}/stamp/{state['RunStamp']}")).json()
    assert page["Lines"] == poller.lines  # this replica still has it (its tombstone)
