"""Queueing with the real Kueue: a ClusterQueue with room for exactly one run, two runs submitted
with the UI's request; the second waits (suspended, its Workload not admitted, shown as queued)
until the first ends, then Kueue admits it and it runs to the end."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
import yaml

from bench import _common as c
from proxy.submit.render import format_cpu, parse_quantity
from tests.e2e import cluster, kueue
from tests.e2e.cluster import ControlPlane
from tests.e2e.conftest import ProxyFactory
from tests.e2e.helpers import (
    condition,
    eventually,
    follow_log,
    get,
    job_of,
    lines_of,
    log_page,
    pods_of,
    submit,
    ui_request,
)
from tests.e2e.test_lifecycle import template_with

LOCAL_QUEUE = "openmpp-runs"
CLUSTER_QUEUE = "openmpp-one-run"
FLAVOR = "e2e-default"
RUN_FOR = "40s"  # each launcher runs this long (kwok): long enough to look at the waiting run
START_DEADLINE = 30.0  # shorter than the second run waits in the queue: queue time is not counted


@pytest.fixture(scope="session")
def kueue_process(control_plane: ControlPlane) -> Iterator[c.Server]:
    """Kueue, started only when this module runs (its CRDs and webhooks with it)."""
    missing = kueue.missing()
    if missing:
        pytest.fail(f"Kueue not built ({', '.join(missing)}): run e2e/build.sh (make e2e)")
    began = time.monotonic()
    proc = kueue.start(control_plane)
    print(f"Kueue ready in {time.monotonic() - began:.1f} s")  # noqa: T201 - shown with -s
    yield proc
    proc.stop(grace=10)


def run_cpu(control_plane: ControlPlane, proxy_name: str) -> Fraction:
    """The CPU an MPIJob of the UI's request asks for in all (launcher + workers), from the
    proxy's own ``render`` command with that proxy's config file."""
    request = control_plane.workdir / "ui-request.json"
    request.write_text(json.dumps(ui_request()))
    config = control_plane.workdir / "proxies" / f"{proxy_name}.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "render", "--config", str(config), str(request)],
        capture_output=True, text=True, timeout=60, cwd=cluster.REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    mpijob = next(d for d in yaml.safe_load_all(done.stdout) if d and d.get("kind") == "MPIJob")
    total = Fraction(0)
    for spec in mpijob["spec"]["mpiReplicaSpecs"].values():
        for container in spec["template"]["spec"]["containers"]:
            cpu = container.get("resources", {}).get("requests", {}).get("cpu", "0")
            total += int(spec.get("replicas", 1)) * parse_quantity(cpu)
    return total


def queues(cpu: Fraction, namespace: str) -> list[dict[str, Any]]:
    """ResourceFlavor, ClusterQueue (CPU for exactly one run; memory plenty), LocalQueue."""
    return [
        {"apiVersion": kueue.API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {
            "apiVersion": kueue.API,
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": format_cpu(cpu)},
                                    {"name": "memory", "nominalQuota": "1Ti"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": kueue.API,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    ]


def stamp_time(value: str) -> dt.datetime:
    """A Kubernetes timestamp (RFC 3339, seconds)."""
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")


def admitted(workload: dict[str, Any]) -> bool:
    return (condition(workload, "Admitted") or {}).get("status") == "True"


def the_workload(control_plane: ControlPlane, job_name: str) -> dict[str, Any]:
    found = kueue.workloads(control_plane, job_name)
    assert len(found) == 1, [w["metadata"]["name"] for w in found]
    return found[0]


def listed(doc: dict[str, Any], stamp: str) -> list[str]:
    """The lists of the jobs page that show the run ``stamp``."""
    return [
        k for k in ("Queue", "Active", "History") if any(j["RunStamp"] == stamp for j in doc[k])
    ]


async def test_second_run_waits_in_kueue_until_the_first_ends(
    control_plane: ControlPlane, kueue_process: c.Server, start_proxy: ProxyFactory
) -> None:
    template = template_with(control_plane, "kueue", **{cluster.RUN_FOR_KEY: RUN_FOR})
    proxy = start_proxy(
        "proxy-kueue", template=template, mpijob={"queue_name": LOCAL_QUEUE},
        runs={"start_deadline_seconds": START_DEADLINE},
    )  # fmt: skip
    cpu = run_cpu(control_plane, "proxy-kueue")
    assert cpu > 0
    for doc in queues(cpu, control_plane.namespace):
        control_plane.apply(doc)
    await eventually(
        "the ClusterQueue Active",
        lambda: (condition(control_plane.get_json("clusterqueues.kueue.x-k8s.io", CLUSTER_QUEUE),
                           "Active") or {}).get("status") == "True",
        60,
    )  # fmt: skip

    first_status, first, _ = await submit(proxy.url, ui_request(**{"OpenM.RunName": "first"}))
    assert first_status == 200, first
    second_status, second, _ = await submit(proxy.url, ui_request(**{"OpenM.RunName": "second"}))
    assert second_status == 200, second
    one, two = first["RunStamp"], second["RunStamp"]
    job1 = job_of(control_plane, one)["metadata"]["name"]
    job2 = job_of(control_plane, two)["metadata"]["name"]

    # Kueue admits the first (its Workload, then resumes the MPIJob) and it runs.
    await eventually("the first run's Workload admitted",
                     lambda: admitted(the_workload(control_plane, job1)), 60)  # fmt: skip
    await eventually(
        "the first run's launcher Running",
        lambda: any(
            p["metadata"]["name"].startswith(f"{job1}-launcher")
            and p.get("status", {}).get("phase") == "Running"
            for p in pods_of(control_plane, job1)
        ),
        60,
    )
    assert job_of(control_plane, one)["spec"]["runPolicy"].get("suspend") is False

    # While it runs, the second waits: suspended, its Workload not admitted, no pods.
    mpijob2 = job_of(control_plane, two)
    assert mpijob2["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == LOCAL_QUEUE
    assert mpijob2["spec"]["runPolicy"]["suspend"] is True
    workload2 = the_workload(control_plane, job2)
    assert not admitted(workload2), workload2.get("status")
    assert (condition(workload2, "QuotaReserved") or {}).get("status") != "True"
    assert pods_of(control_plane, job2) == []
    page = await log_page(proxy.url, two)
    assert not page["IsFinal"], page
    assert any(
        f"waits for admission by Kueue (LocalQueue {LOCAL_QUEUE})" in line for line in page["Lines"]
    ), page["Lines"]
    status, jobs = await get(proxy.url, "/api/service/state")
    assert status == 200, jobs
    assert listed(jobs, two) == ["Queue"], jobs
    assert listed(jobs, one) == ["Active"], jobs
    first_running = job_of(control_plane, one)
    assert (condition(first_running, "Succeeded") or {}).get("status") != "True"

    # The first ends; only then is the second admitted; it runs and ends Succeeded.
    pages1 = await follow_log(proxy.url, one, within=120)
    assert "run succeeded" in lines_of(pages1)[-2], lines_of(pages1)[-2:]
    assert (condition(job_of(control_plane, one), "Succeeded") or {}).get("status") == "True"
    finished = await eventually(
        "the first run's Workload Finished",
        lambda: (condition(the_workload(control_plane, job1), "Finished") or {}).get("status")
        == "True" and condition(the_workload(control_plane, job1), "Finished"),
        30,
    )  # fmt: skip
    await eventually("the second run's Workload admitted",
                     lambda: admitted(the_workload(control_plane, job2)), 60)  # fmt: skip
    workload2 = the_workload(control_plane, job2)
    admitted_at = (condition(workload2, "Admitted") or {})["lastTransitionTime"]
    assert admitted_at >= finished["lastTransitionTime"], (admitted_at, finished)
    waited = stamp_time(admitted_at) - stamp_time(workload2["metadata"]["creationTimestamp"])
    assert waited > dt.timedelta(seconds=START_DEADLINE), waited  # and yet not failed (below)
    pages2 = await follow_log(proxy.url, two, within=120)
    shown = lines_of(pages2)
    assert pages2[-1]["IsFinal"]
    assert "run succeeded" in shown[-2], shown[-2:]
    # Kueue's and the MPI Operator's Events on the MPIJob, in the log prelude
    admitted_line = f"Started MPIJob/{job2}: Admitted by clusterQueue {CLUSTER_QUEUE}"
    assert any(admitted_line in line for line in shown), shown
    assert any(f"MPIJobResumed MPIJob/{job2}" in line for line in shown), shown
    assert (condition(job_of(control_plane, two), "Succeeded") or {}).get("status") == "True"
