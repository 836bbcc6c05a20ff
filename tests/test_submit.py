"""POST /api/run through the proxy to the stand-in Kubernetes API over real HTTP.

Every row of the README's Kubernetes-outcome → HTTP table has a test here.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy import names
from standins.kube import FakeKube, Fault
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor, ProxyFactory, make_config
from tests.crd import validate_mpijob
from tests.oms_shapes import RUN_STATE_KEYS

Client = TestClient[web.Request, web.Application]
REQUESTS = Path(__file__).parent / "requests"
UI_MPI = json.loads((REQUESTS / "ui-mpi.json").read_text())
NS = "default"


@pytest.fixture
async def submit_proxy(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, make_proxy: ProxyFactory
) -> Client:
    kubeconfig = await kubeconfig_for(fake_kube)
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={
            "kubeconfig": str(kubeconfig),
            "dry_run_on_start": False,
            "retry_backoff_seconds": 0.01,
            "request_timeout_seconds": 3.0,
        },
        server={"identity_header": "kubeflow-userid"},
    )
    return await make_proxy(config)


def _jobs(kube: FakeKube) -> list[dict[str, Any]]:
    return kube.objects("mpijobs", NS)


async def _post(client: Client, body: Any, **headers: str) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(
        "/api/run", data=data, headers={"Content-Type": "application/json", **headers}
    )


async def test_ui_request_creates_one_valid_mpijob(
    submit_proxy: Client, fake_kube: FakeKube
) -> None:
    resp = await _post(submit_proxy, UI_MPI, **{"kubeflow-userid": "ana@example.org"})
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("application/json")
    state = await resp.json()
    assert set(state) == set(RUN_STATE_KEYS)
    assert state["ModelName"] == "RiskPaths"
    assert state["ModelDigest"] == UI_MPI["ModelDigest"]
    assert state["RunStamp"]
    assert state["SubmitStamp"]
    assert state["IsFinal"] is False
    assert state["RunName"] == "RiskPaths on 4 processes"
    assert state["LogFileName"] == f"RiskPaths.{state['RunStamp']}.console.log"
    assert resp.headers["Content-Location"] == (
        f"/api/model/{state['ModelDigest']}/run/{state['RunStamp']}"
    )
    jobs = _jobs(fake_kube)
    assert len(jobs) == 1
    job = jobs[0]
    validate_mpijob(job)
    ann = job["metadata"]["annotations"]
    assert ann[names.RUN_STAMP_KEY] == state["RunStamp"]
    assert ann[names.SUBMIT_STAMP_KEY] == state["SubmitStamp"]
    assert ann[names.USER_KEY] == "ana@example.org"
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][:3] == ["mpirun", "-n", "4"]
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4


async def test_r_script_request_keeps_its_run_stamp(
    submit_proxy: Client, fake_kube: FakeKube
) -> None:
    body = json.loads((REQUESTS / "r-script.json").read_text())
    resp = await _post(submit_proxy, body)
    assert resp.status == 200, await resp.text()
    state = await resp.json()
    assert state["RunStamp"] == "2025_01_28_21_00_48_385"
    assert len(_jobs(fake_kube)) == 1


async def test_non_mpi_run_passes_through_byte_for_byte(
    submit_proxy: Client, fake_kube: FakeKube, oms: FakeOms
) -> None:
    raw = (REQUESTS / "python-script.json").read_bytes()
    resp = await _post(submit_proxy, raw)
    assert oms.run_posts == [raw]
    assert resp.status == 400  # the stand-in oms does not know that model
    assert _jobs(fake_kube) == []


@pytest.mark.parametrize(
    ("body", "content_type", "status", "fragment"),
    [
        (b"{}", "text/plain", 415, "Expected Content-Type: application/json"),
        (b"", "application/json", 400, "Invalid (empty) json at /api/run"),
        (b"{nope", "application/json", 400, "Json decode error at /api/run"),
        (b'{"Mpi": {"Np": "x"}}', "application/json", 400, "Mpi.Np"),
        (
            b'{"ModelDigest": "nope", "Mpi": {"Np": 2}}',
            "application/json",
            400,
            "Model not found: nope",
        ),
        (
            b'{"ModelName": "RiskPaths", "Mpi": {"Np": 1000}}',
            "application/json",
            400,
            "at most 64 allowed",
        ),
        (
            b'{"ModelName": "RiskPaths", "Mpi": {"Np": 2}, "Env": {"LD_PRELOAD": "/x.so"}}',
            "application/json",
            400,
            "LD_PRELOAD",
        ),
        (
            b'{"ModelName": "RiskPaths", "Mpi": {"Np": 2}, "Opts": {"OpenM.ParamDir": "/etc"}}',
            "application/json",
            400,
            "OpenM.ParamDir",
        ),
    ],
)
async def test_request_errors(
    submit_proxy: Client,
    fake_kube: FakeKube,
    body: bytes,
    content_type: str,
    status: int,
    fragment: str,
) -> None:
    resp = await submit_proxy.post("/api/run", data=body, headers={"Content-Type": content_type})
    text = await resp.text()
    assert resp.status == status, text
    assert fragment in text
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert _jobs(fake_kube) == []


async def test_oversized_body_is_413(submit_proxy: Client) -> None:
    big = io.BytesIO(b'{"x": "' + b"a" * (2 << 20) + b'"}')
    resp = await submit_proxy.post(
        "/api/run", data=big, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 413


async def test_same_run_twice_yields_one_mpijob(submit_proxy: Client, fake_kube: FakeKube) -> None:
    body = json.loads((REQUESTS / "r-script.json").read_text())
    first = await _post(submit_proxy, body)
    assert first.status == 200
    second = await _post(submit_proxy, body)
    assert second.status == 409
    assert "already submitted" in await second.text()
    assert len(_jobs(fake_kube)) == 1


async def test_retry_of_the_same_request_is_idempotent(
    submit_proxy: Client, fake_kube: FakeKube
) -> None:
    body = json.loads((REQUESTS / "r-script.json").read_text())
    first = await _post(submit_proxy, body, **{"X-Request-ID": "req-1"})
    again = await _post(submit_proxy, body, **{"X-Request-ID": "req-1"})
    assert (first.status, again.status) == (200, 200)
    assert (await first.json())["RunStamp"] == (await again.json())["RunStamp"]
    assert len(_jobs(fake_kube)) == 1


async def test_connection_dropped_after_create_still_one_job(
    submit_proxy: Client, fake_kube: FakeKube
) -> None:
    fake_kube.add_fault(Fault("POST", "mpijobs", drop_after=True))
    resp = await _post(submit_proxy, UI_MPI)
    assert resp.status == 200, await resp.text()
    assert len(_jobs(fake_kube)) == 1


async def test_connection_dropped_before_create_is_retried(
    submit_proxy: Client, fake_kube: FakeKube
) -> None:
    fake_kube.add_fault(Fault("POST", "mpijobs", drop_before=True, times=2))
    resp = await _post(submit_proxy, UI_MPI)
    assert resp.status == 200, await resp.text()
    assert len(_jobs(fake_kube)) == 1


@pytest.mark.parametrize(
    ("setup", "status", "fragment", "retry_after"),
    [
        (lambda k: k.add_fault(Fault("POST", "mpijobs", status=422)), 422, "rejected", False),
        (lambda k: k.add_fault(Fault("POST", "mpijobs", status=400)), 422, "rejected", False),
        (
            lambda k: setattr(k, "quota_exceeded", "compute-resources, requested: cpu=4"),
            429,
            "quota",
            True,
        ),
        (lambda k: k.forbid("create", "mpijobs"), 502, "lacks a permission", False),
        (lambda k: setattr(k, "crd_installed", False), 502, "CRD", False),
        (lambda k: k.add_fault(Fault("POST", "mpijobs", status=429, times=10)), 503, "", True),
        (lambda k: k.add_fault(Fault("POST", "mpijobs", status=503, times=10)), 503, "", True),
        (lambda k: k.add_fault(Fault("POST", "mpijobs", status=500, times=10)), 502, "", False),
        (lambda k: k.add_fault(Fault("POST", "mpijobs", delay=3.3)), 504, "no answer", False),
        (lambda k: k.down(), 503, "cannot reach", True),
    ],
)
async def test_kubernetes_outcome_table(
    submit_proxy: Client,
    fake_kube: FakeKube,
    setup: Any,
    status: int,
    fragment: str,
    retry_after: bool,
) -> None:
    setup(fake_kube)
    resp = await _post(submit_proxy, UI_MPI)
    text = await resp.text()
    assert resp.status == status, text
    assert fragment in text
    assert ("Retry-After" in resp.headers) == retry_after
    fake_kube.up()
    if status == 504:
        # The API may still apply a create it answered too late; a retry then finds it (409).
        await asyncio.sleep(0.6)
        assert len(_jobs(fake_kube)) <= 1
        return
    assert _jobs(fake_kube) == []


async def test_unauthorized_is_502(
    oms: FakeOms, kubeconfig_for: KubeconfigFor, make_proxy: ProxyFactory
) -> None:
    from standins.kube import find_crd

    kube = FakeKube(crd_schema_path=find_crd(), token="right")
    kubeconfig = await kubeconfig_for(kube, token="wrong")
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={"kubeconfig": str(kubeconfig), "dry_run_on_start": False},
    )
    client = await make_proxy(config)
    resp = await _post(client, UI_MPI)
    assert resp.status == 502
    assert "credentials" in await resp.text()


async def test_namespace_missing_is_502(
    oms: FakeOms, kubeconfig_for: KubeconfigFor, make_proxy: ProxyFactory
) -> None:
    from standins.kube import find_crd

    kube = FakeKube(crd_schema_path=find_crd(), namespaces=("other",))
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={"kubeconfig": str(await kubeconfig_for(kube)), "dry_run_on_start": False},
    )
    resp = await _post(await make_proxy(config), UI_MPI)
    assert resp.status == 502
    assert "namespace does not exist" in await resp.text()


async def test_namespace_outside_the_service_accounts_role_is_not_ready(
    oms: FakeOms, kubeconfig_for: KubeconfigFor, make_proxy: ProxyFactory
) -> None:
    """With our namespaced Role and a run namespace it does not cover (or that does not
    exist), the API server answers 403 before it looks for the namespace: readiness says
    which permission is missing, and that the namespace may not exist."""
    from standins.kube import find_crd

    kube = FakeKube(crd_schema_path=find_crd(), namespaces=("openmpp",))
    kube.grant("sa-token", "openmpp")
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={"kubeconfig": str(await kubeconfig_for(kube, token="sa-token"))},
    )
    client = await make_proxy(config)
    for _ in range(100):
        resp = await client.get("/readyz")
        doc = await resp.json()
        if doc["checks"].get("dry_run") not in (None, "pending"):
            break
        await asyncio.sleep(0.05)
    assert resp.status == 503
    for check in ("kubernetes", "dry_run"):
        assert "lacks a permission" in doc["checks"][check], doc
        assert "or the namespace does not exist" in doc["checks"][check], doc
        assert 'in the namespace "default"' in doc["checks"][check], doc
    resp = await _post(client, UI_MPI)
    assert resp.status == 502
    assert "or the namespace does not exist" in await resp.text()


async def test_intercept_all_and_none(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, make_proxy: ProxyFactory
) -> None:
    kubeconfig = str(await kubeconfig_for(fake_kube))
    body = {"ModelName": "RiskPaths", "Opts": {"OpenM.RunName": "plain"}}
    for mode, jobs in (("none", 0), ("all", 1)):
        config = make_config(
            oms.url,
            runs={"intercept": mode},
            kubernetes={"kubeconfig": kubeconfig, "dry_run_on_start": False},
        )
        resp = await _post(await make_proxy(config), body)
        assert resp.status == 200, await resp.text()
        assert len(_jobs(fake_kube)) == jobs


async def test_start_up_dry_run_reported_by_readyz(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, make_proxy: ProxyFactory
) -> None:
    fake_kube.forbid("create", "mpijobs")
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={"kubeconfig": str(await kubeconfig_for(fake_kube))},
    )
    client = await make_proxy(config)
    for _ in range(100):
        resp = await client.get("/readyz")
        doc = await resp.json()
        if doc["checks"].get("dry_run") not in (None, "pending"):
            break
        await asyncio.sleep(0.05)
    assert resp.status == 503
    assert "lacks a permission" in doc["checks"]["dry_run"]
    assert doc["checks"]["kubernetes"] == "ok"
    assert _jobs(fake_kube) == []


async def test_kueue_queue_name_reaches_the_api_server(
    oms: FakeOms, fake_kube: FakeKube, kubeconfig_for: KubeconfigFor, make_proxy: ProxyFactory
) -> None:
    """With mpijob.queue_name, the MPIJob the API server stores is labelled and suspended."""
    kubeconfig = await kubeconfig_for(fake_kube)
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={"kubeconfig": str(kubeconfig), "dry_run_on_start": False},
        mpijob={"queue_name": "openmpp-runs"},
    )
    client = await make_proxy(config)
    resp = await _post(client, UI_MPI)
    assert resp.status == 200, await resp.text()
    (job,) = _jobs(fake_kube)
    validate_mpijob(job)
    assert job["metadata"]["labels"][names.KUEUE_QUEUE_NAME_KEY] == "openmpp-runs"
    assert job["spec"]["runPolicy"]["suspend"] is True, "nothing starts before Kueue admits it"
    name = job["metadata"]["name"]
    async with asyncio.timeout(5):
        while True:  # the operator has seen the job: Created, then Suspended
            job = fake_kube.get_object("mpijobs", NS, name) or {}
            conditions = {
                c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])
            }
            if conditions.get("Suspended") == "True":
                break
            await asyncio.sleep(0.01)
    assert not fake_kube.objects("pods", NS), "the operator starts no pod for a suspended job"
