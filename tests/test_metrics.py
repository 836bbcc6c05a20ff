"""GET /metrics: request, latency, submission and run-phase metrics, scraped over HTTP."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from standins.kube import FakeKube
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor, ProxyFactory, make_config

Client = TestClient[web.Request, web.Application]
UI_MPI = json.loads((Path(__file__).parent / "requests" / "ui-mpi.json").read_text())


def _value(text: str, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` in a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(2))
    return 0.0


async def test_metrics_count_requests_submissions_and_phases(
    oms: FakeOms,
    fake_kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    make_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={"kubeconfig": str(await kubeconfig_for(fake_kube)), "dry_run_on_start": False},
    )
    client = await make_proxy(config)
    assert (await client.get("/api/model/RiskPaths")).status == 200
    assert (await client.get("/test/status/404")).status == 404
    body = json.dumps(UI_MPI | {"RunStamp": "2026_01_01_00_00_00_001"})
    headers = {"Content-Type": "application/json"}
    first = await client.post("/api/run", data=body, headers=headers)
    assert first.status == 200
    assert (await client.post("/api/run", data=body, headers=headers)).status == 409
    assert (await client.post("/api/run", data=b"{", headers=headers)).status == 400
    stamp = (await first.json())["RunStamp"]
    page = await client.get(f"/api/run/log/model/{UI_MPI['ModelDigest']}/stamp/{stamp}")
    assert page.status == 200

    caplog.set_level(logging.INFO, logger="aiohttp.access")
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    text = await resp.text()
    total = "omsproxy_requests_total"
    assert _value(text, total, route_class="passthrough", status="200") == 1
    assert _value(text, total, route_class="passthrough", status="404") == 1
    assert _value(text, total, route_class="run_submit", status="200") == 1
    assert _value(text, total, route_class="run_submit", status="409") == 1
    assert _value(text, total, route_class="run_log", status="200") == 1
    subs = "omsproxy_mpijob_submissions_total"
    assert _value(text, subs, outcome="created") == 1
    assert _value(text, subs, outcome="conflict") == 1
    assert _value(text, "omsproxy_request_duration_seconds_count", route_class="passthrough") == 2
    assert _value(text, "omsproxy_oms_request_duration_seconds_count") >= 2
    kube = "omsproxy_kubernetes_request_duration_seconds_count"
    assert _value(text, kube, operation="create MPIJob") == 2
    assert 'operation="create MPIJob ompp' not in text  # no object names as label values
    assert (
        sum(
            _value(text, "omsproxy_launched_runs", phase=p)
            for p in ("submitted", "queued", "pending", "running", "succeeded")
        )
        == 1
    )
    assert not [r for r in caplog.records if "/metrics" in r.getMessage()]  # not access-logged
