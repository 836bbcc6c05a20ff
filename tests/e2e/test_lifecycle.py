"""Whole runs on the real control plane: kwok moves the pods, the real operator and controllers do
the rest; the UI's polling is played against ``serve`` processes."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bench import _common as c
from proxy import names
from proxy.clients.kube import KubeClient, load_api_client
from proxy.configload import config_from_dict
from proxy.follow.cache import SELECTOR
from proxy.follow.view import PREFIX, PRELUDE_KEY
from tests.e2e import cluster
from tests.e2e.cluster import ControlPlane
from tests.e2e.conftest import RETENTION_SECONDS, TEMPLATE, ProxyFactory
from tests.e2e.helpers import (
    RISKPATHS,
    condition,
    eventually,
    follow_log,
    get,
    job_of,
    lines_of,
    log_page,
    mpijobs,
    pods_of,
    submit,
    ui_request,
)


def model_log(tag: str, lines: int = 6) -> list[str]:
    """An OpenM++-like console log, unique to ``tag``."""
    return [
        f"2026-01-01 00:00:00.{i:03d} {tag} " + (
            "RiskPaths" if i == 0 else f"member=0 Simulation progress={100 * i // (lines - 1)}%"
        )
        for i in range(lines)
    ]  # fmt: skip


CRI_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def write_launcher_log(plane: ControlPlane, lines: list[str]) -> None:
    """What every launcher container 'prints': kwok serves this CRI log file as pods/log."""
    now = dt.datetime.now(dt.UTC)
    text = "".join(
        f"{(now + dt.timedelta(milliseconds=i)).strftime(CRI_TIME)} stdout F {line}\n"
        for i, line in enumerate(lines)
    )
    plane.launcher_log.write_text(text)


def template_with(plane: ControlPlane, name: str, **annotations: str) -> Path:
    """The shipped template with more launcher pod annotations (read by our kwok Stages)."""
    doc = yaml.safe_load(TEMPLATE.read_text())
    meta = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"]
    meta.setdefault("annotations", {}).update(annotations)
    path = plane.workdir / f"mpijob-template-{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def slow_proxy(control_plane: ControlPlane, start_proxy: ProxyFactory) -> c.Server:
    """A proxy whose launchers run 10 minutes (until stopped)."""
    template = template_with(control_plane, "slow", **{cluster.RUN_FOR_KEY: "600s"})
    return start_proxy("proxy-slow", template=template)


async def test_run_succeeds_with_real_pod_logs_and_is_deleted_by_retention(
    control_plane: ControlPlane, proxy: c.Server
) -> None:
    """Pending → Running → Succeeded, polled as the UI does: scheduling lines first, then the
    launcher's output through the real pods/log (kwok's kubelet API), then the verdict; IsFinal
    once the operator marked the MPIJob Succeeded; later retention deletes the MPIJob and the
    garbage collector its ConfigMap."""
    tag = f"ok-{uuid.uuid4().hex[:6]}"
    model = model_log(tag)
    write_launcher_log(control_plane, model)
    status, state, _ = await submit(proxy.url, ui_request())
    assert status == 200, state
    stamp = state["RunStamp"]
    name = job_of(control_plane, stamp)["metadata"]["name"]

    pages = await follow_log(proxy.url, stamp, within=120)
    shown = lines_of(pages)
    assert shown[0].startswith(PREFIX)
    assert f"submitted as MPIJob {name}" in shown[0]
    prelude = shown[: shown.index(model[0])]
    assert all(line.startswith(PREFIX) for line in prelude)
    assert any("Scheduled" in line for line in prelude), prelude  # the real scheduler's Events
    assert shown[len(prelude) : len(prelude) + len(model)] == model  # the real pods/log
    assert "run succeeded" in shown[-2], shown[-2:]
    assert shown[-1] == f"{PREFIX}launcher exit code 0 (Completed)"  # kwok's terminated state
    assert len(shown) == len(set(shown)), "a line was shown twice"
    assert any(model[0] in p["Lines"] and not p["IsFinal"] for p in pages), "never seen running"
    job = job_of(control_plane, stamp)
    assert (condition(job, "Succeeded") or {}).get("status") == "True"
    assert job["metadata"]["annotations"].get(PRELUDE_KEY)  # frozen on the MPIJob itself

    status, items = await get(proxy.url, f"/api/model/{RISKPATHS}/run/{stamp}/status/list")
    assert status == 200, items
    assert isinstance(items, list), items

    # retention: the finished MPIJob is deleted by the proxy, its ConfigMap by the real GC
    await eventually(
        "retention deletes the MPIJob",
        lambda: mpijobs(control_plane, **{names.RUN_STAMP_KEY: stamp}) == [],
        RETENTION_SECONDS + 60,
        interval=2,
    )
    await eventually(
        "GC deletes the run ConfigMap",
        lambda: control_plane.kubectl("get", "configmap", f"{name}-run", "-n",
                                      control_plane.namespace).returncode != 0,
        60,
    )  # fmt: skip
    final = await log_page(proxy.url, stamp)
    assert final["IsFinal"], final  # still answered (tombstone) after the deletion


async def test_pending_run_shows_why_it_waits(
    control_plane: ControlPlane, start_proxy: ProxyFactory
) -> None:
    """Worker pods no node can take (the template's nodeSelector matches none): while the run
    waits, its log pages show the real scheduler's reason and stay not final."""
    doc = yaml.safe_load(TEMPLATE.read_text())
    for role in ("Launcher", "Worker"):
        doc["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["nodeSelector"] = {
            "e2e.openmpp.org/pool": "none"
        }
    template = control_plane.workdir / "mpijob-template-unschedulable.yaml"
    template.write_text(yaml.safe_dump(doc, sort_keys=False))
    server = start_proxy("proxy-unschedulable", template=template)
    status, state, _ = await submit(server.url, ui_request())
    assert status == 200, state
    stamp = state["RunStamp"]

    async def waiting_reason() -> Any:
        page = await log_page(server.url, stamp)
        found = [line for line in page["Lines"] if "FailedScheduling" in line]
        return (page, found) if found else None

    page, found = await eventually("a FailedScheduling line", waiting_reason, 60, interval=1)
    assert not page["IsFinal"], page
    assert "didn't match Pod's node affinity/selector" in found[0], found
    assert page["Lines"][0].startswith(PREFIX)
    status, items = await get(server.url, f"/api/model/{RISKPATHS}/run/{stamp}/status/list")
    assert status == 200, items
    assert items[-1]["Status"] == "i", items  # waiting, as oms says of a queued run
    async with (
        aiohttp.ClientSession() as session,
        session.put(f"{server.url}/api/run/stop/model/{RISKPATHS}/stamp/{stamp}") as resp,
    ):
        assert resp.status == 200


async def test_failed_run_is_final_with_the_launchers_exit_code(
    control_plane: ControlPlane, start_proxy: ProxyFactory, failing_template: Path
) -> None:
    """kwok fails the launcher (exit code 3): the Job fails (backoffLimit 0), the operator marks
    the MPIJob Failed, the log ends with why, the progress says 'e'."""
    server = start_proxy("proxy-failing", template=failing_template)
    write_launcher_log(control_plane, model_log("failing", 3))
    status, state, _ = await submit(server.url, ui_request())
    assert status == 200, state
    stamp = state["RunStamp"]
    pages = await follow_log(server.url, stamp, within=120)
    shown = lines_of(pages)
    job = job_of(control_plane, stamp)
    assert (condition(job, "Failed") or {}).get("status") == "True", job.get("status")
    verdict = [line for line in shown if "run failed" in line or "exit code" in line]
    assert verdict, shown
    assert any("exit code 3" in line for line in shown), shown
    status, items = await get(server.url, f"/api/model/{RISKPATHS}/run/{stamp}/status/list")
    assert status == 200, items
    assert items, items
    assert items[-1]["Status"] == "e", items


async def test_stop_deletes_mpijob_pods_and_configmap_through_the_real_gc(
    control_plane: ControlPlane, slow_proxy: c.Server
) -> None:
    """The UI's stop: PUT /api/run/stop/model/<digest>/stamp/<stamp> → 200; the foreground
    delete takes the launcher Job, the worker pods, the operator's and our ConfigMaps."""
    write_launcher_log(control_plane, model_log("stopped"))
    status, state, _ = await submit(slow_proxy.url, ui_request())
    assert status == 200, state
    stamp = state["RunStamp"]
    name = job_of(control_plane, stamp)["metadata"]["name"]
    ns = control_plane.namespace
    await eventually(
        "launcher running",
        lambda: any(
            p["metadata"]["name"].startswith(f"{name}-launcher")
            and p.get("status", {}).get("phase") == "Running"
            for p in pods_of(control_plane, name)
        ),
        90,
    )
    async with (
        aiohttp.ClientSession() as session,
        session.put(f"{slow_proxy.url}/api/run/stop/model/{RISKPATHS}/stamp/{stamp}") as resp,
    ):
        assert resp.status == 200
        assert await resp.read() == b""
        assert resp.headers["Content-Location"].endswith(f"/{stamp}/true")

    def all_gone() -> bool:
        left = {
            "mpijob": mpijobs(control_plane, **{names.RUN_STAMP_KEY: stamp}),
            "pods": pods_of(control_plane, name),
            "job": control_plane.kubectl("get", "job", f"{name}-launcher", "-n", ns).returncode
            == 0,
            "configmaps": [
                cm
                for cm in (f"{name}-run", f"{name}-config")
                if control_plane.kubectl("get", "configmap", cm, "-n", ns).returncode == 0
            ],
        }
        assert not any(left.values()), left
        return True

    await eventually("everything of the run deleted", all_gone, 90, interval=1)
    shown = lines_of(await follow_log(slow_proxy.url, stamp, within=30))  # the UI goes on polling
    assert any("run stopped" in line for line in shown), shown


async def test_two_replicas_race_for_the_prelude_one_gets_409(
    control_plane: ControlPlane, start_proxy: ProxyFactory, slow_proxy: c.Server
) -> None:
    """Two ``serve`` replicas polled at the same moment both freeze the prelude with a
    resourceVersion-preconditioned patch; the real API server answers one of them 409, it
    re-reads, and both replicas answer the same lines."""
    other = start_proxy(
        "proxy-slow-replica", template=control_plane.workdir / "mpijob-template-slow.yaml"
    )
    write_launcher_log(control_plane, model_log("replicas"))
    seen_409, runs = False, 0
    while not seen_409 and runs < 3:
        runs += 1
        status, state, _ = await submit(slow_proxy.url, ui_request())
        assert status == 200, state
        stamp = state["RunStamp"]
        name = job_of(control_plane, stamp)["metadata"]["name"]
        await eventually(
            "launcher running",
            lambda name=name: any(  # type: ignore[misc]
                p["metadata"]["name"].startswith(f"{name}-launcher")
                and p.get("status", {}).get("phase") == "Running"
                for p in pods_of(control_plane, name)
            ),
            90,
        )
        await asyncio.sleep(3)  # past the Events' settle time: the prelude can be frozen now
        for _ in range(10):
            pages = await asyncio.gather(
                log_page(slow_proxy.url, stamp), log_page(other.url, stamp)
            )
            if PRELUDE_KEY in job_of(control_plane, stamp)["metadata"].get("annotations", {}):
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(1)
        pages = await asyncio.gather(log_page(slow_proxy.url, stamp), log_page(other.url, stamp))
        assert pages[0]["Lines"] == pages[1]["Lines"], pages
        patches = [
            e
            for e in control_plane.audit_events()
            if e.get("verb") == "patch"
            and e.get("objectRef", {}).get("name") == name
            and e.get("objectRef", {}).get("resource") == "mpijobs"
        ]
        codes = sorted(e["responseStatus"]["code"] for e in patches)
        assert 200 in codes, codes
        seen_409 = 409 in codes
        async with (
            aiohttp.ClientSession() as session,
            session.put(f"{slow_proxy.url}/api/run/stop/model/{RISKPATHS}/stamp/{stamp}"),
        ):
            pass
    assert seen_409, f"no 409 in {runs} runs"


# The watches of this test's ``serve`` end after 8 s instead of 300 s (``follow`` config), so
# that a watch is resumed from its resourceVersion within the test.
SHORT_WATCH = {"watch_timeout_seconds": 8}


async def test_watch_410_after_compaction_relists_without_losing_lines(
    control_plane: ControlPlane, start_proxy: ProxyFactory
) -> None:
    """Mid-run, etcd is compacted past the proxy's last resourceVersion; when its watch (on an
    API server replica whose watches etcd serves) ends and is resumed from there, the real
    410 Gone comes back, the proxy re-lists, and the UI's log neither loses nor repeats a line."""
    kubeconfig = cluster.write_kubeconfig(
        control_plane.workdir / "uncached.kubeconfig",
        control_plane.uncached_apiserver(),
        control_plane.pki / "ca.crt",
        token=control_plane.token(cluster.SERVICE_ACCOUNT),
    )
    template = template_with(control_plane, "watch", **{cluster.RUN_FOR_KEY: "30s"})
    server = start_proxy(
        "proxy-uncached", kubeconfig=kubeconfig, template=template, follow=SHORT_WATCH
    )
    model = model_log("watch", 8)
    write_launcher_log(control_plane, model)
    status, state, _ = await submit(server.url, ui_request())
    assert status == 200, state
    stamp = state["RunStamp"]
    name = job_of(control_plane, stamp)["metadata"]["name"]
    follower = asyncio.create_task(follow_log(server.url, stamp, within=150))
    try:
        await eventually(
            "launcher running",
            lambda: any(
                p["metadata"]["name"].startswith(f"{name}-launcher")
                and p.get("status", {}).get("phase") == "Running"
                for p in pods_of(control_plane, name)
            ),
            90,
        )
        # once the prelude is recorded on the MPIJob (the proxy's own patch), nothing changes
        # the MPIJob or its pods until the launcher ends: the run is quiet
        await eventually(
            "prelude recorded",
            lambda: PRELUDE_KEY in job_of(control_plane, stamp)["metadata"].get("annotations", {}),
            30,
        )
        await asyncio.sleep(1)
        # compact etcd past the proxy's resourceVersion until its watch resumes from there
        # (other runs of the namespace may move it on in between: compact again, after a write)
        expired = "watch of MPIJobs expired (410): listing again"
        compactions = 0
        for _ in range(60):
            touch = f"e2e/touch={uuid.uuid4().hex}"
            control_plane.kubectl_ok(
                "annotate",
                "--overwrite",
                "pvc",
                "openmpp-models",
                "-n",
                control_plane.namespace,
                touch,
            )
            control_plane.compact_etcd()
            compactions += 1
            if expired in server.log.read_text():
                break
            await asyncio.sleep(0.5)
        assert expired in server.log.read_text(), f"no 410 after {compactions} compactions"
        pages = await follower
    finally:
        follower.cancel()
    shown = lines_of(pages)
    model_part = [s for s in shown if not s.startswith(PREFIX)]
    assert model_part == model, shown
    assert len(shown) == len(set(shown)), shown
    assert "run succeeded" in shown[-2], shown[-2:]


async def test_real_watch_sends_bookmarks_to_our_client(control_plane: ControlPlane) -> None:
    """The proxy's own watch call (KubeClient.watch_pods, allowWatchBookmarks) gets the real
    API server's BOOKMARK events, with a newer resourceVersion: the informer keeps its place."""
    kubeconfig = control_plane.kubeconfig_for(
        cluster.SERVICE_ACCOUNT, control_plane.workdir / "bookmarks.kubeconfig"
    )
    config = config_from_dict(
        {"kubernetes": {"namespace": control_plane.namespace, "kubeconfig": str(kubeconfig)}},
        "<e2e>",
    )
    kube = KubeClient(await load_api_client(str(kubeconfig)), config)
    try:
        _, rv = await kube.list_pods_rv(SELECTOR)
        # a pod that is not ours (the watch's selector leaves it out) moves the cluster on:
        # only a bookmark can tell the watch about the newer resourceVersion
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"e2e-probe-{uuid.uuid4().hex[:6]}",
                "namespace": control_plane.namespace,
            },
            "spec": {"containers": [{"name": "probe", "image": "probe"}]},
        }
        control_plane.kubectl_ok("create", "-f", "-", input=json.dumps(probe))
        seen = [item async for item in kube.watch_pods(SELECTOR, rv, 5)]
    finally:
        await kube.close()
        control_plane.kubectl(
            "delete",
            "pod",
            "-n",
            control_plane.namespace,
            probe["metadata"]["name"],
            "--wait=false",
        )
    bookmarks = [obj for change, obj in seen if change == "BOOKMARK"]
    assert bookmarks, [change for change, _ in seen]
    assert int(bookmarks[-1]["metadata"]["resourceVersion"]) > int(rv)
    watches = [
        e
        for e in control_plane.audit_events()
        if e.get("verb") == "watch"
        and e.get("objectRef", {}).get("resource") in ("pods", "mpijobs")
    ]
    assert watches
    assert all("allowwatchbookmarks=true" in e["requestURI"].lower() for e in watches)


async def test_a_run_deleted_by_hand_is_archived_and_read_after_by_a_new_proxy(
    control_plane: ControlPlane, slow_proxy: c.Server, start_proxy: ProxyFactory
) -> None:
    """``kubectl delete mpijob`` on a running job: the real API server holds it (our finalizer)
    while the proxy reads the log and archives the run; then the real GC deletes the rest, and a
    proxy that never saw the run serves the same lines and status ``x`` from the run record."""
    write_launcher_log(control_plane, model_log("by-hand"))
    status, state, _ = await submit(slow_proxy.url, ui_request())
    assert status == 200, state
    stamp = state["RunStamp"]
    name = job_of(control_plane, stamp)["metadata"]["name"]
    ns = control_plane.namespace
    assert names.RUN_RECORD_FINALIZER in job_of(control_plane, stamp)["metadata"]["finalizers"]

    async def model_lines_shown() -> bool:
        page = await log_page(slow_proxy.url, stamp)
        return any("by-hand" in line for line in page["Lines"])

    await eventually("the model's lines are served", model_lines_shown, 90)
    control_plane.kubectl_ok("delete", "mpijob", name, "-n", ns, "--wait=false")

    def all_gone() -> bool:
        left = mpijobs(control_plane, **{names.RUN_STAMP_KEY: stamp}) + pods_of(control_plane, name)
        assert not left, [o["metadata"]["name"] for o in left]
        return True

    await eventually("the MPIJob and its pods deleted after the archive", all_gone, 90, interval=1)
    record = control_plane.get_json("configmap", f"{name}-record", "-n", ns)
    assert "ownerReferences" not in record["metadata"]
    shown = lines_of(await follow_log(slow_proxy.url, stamp, within=30))
    assert shown[-1].endswith(f"run stopped: MPIJob {name} deleted"), shown
    assert any("by-hand" in line for line in shown)

    fresh = start_proxy("proxy-after-delete")
    pages = await follow_log(fresh.url, stamp, within=30)
    assert lines_of(pages) == shown
    status_code, items = await get(fresh.url, f"/api/model/{RISKPATHS}/run/{stamp}/status/list")
    assert status_code == 200
    assert [i["Status"] for i in items] == ["x"]
