"""Submissions against the real API server and MPI Operator (our Role, our template)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import _common as c
from proxy import names
from tests.e2e import cluster
from tests.e2e.cluster import REPO, ControlPlane
from tests.e2e.conftest import ProxyFactory
from tests.e2e.helpers import (
    RUN_STATE_KEYS,
    condition,
    eventually,
    get,
    job_of,
    mpijobs,
    pods_of,
    submit,
    ui_request,
)

PROXY_GROUP = "system:serviceaccounts:openmpp"


def proxy_audit(plane: ControlPlane, verb: str, resource: str) -> list[dict[str, Any]]:
    """Audit events of the proxy's service accounts for ``verb`` on ``resource``."""
    return [
        e
        for e in plane.audit_events()
        if e.get("verb") == verb
        and e.get("objectRef", {}).get("resource") == resource
        and PROXY_GROUP in e.get("user", {}).get("groups", [])
    ]


def test_control_plane_is_real_and_ready(control_plane: ControlPlane) -> None:
    """Smoke: every component answers, the CRD is served, our ServiceAccount has our Role."""
    version = json.loads(control_plane.raw("/version")[1])
    assert version["gitVersion"].startswith("v1.")
    crd = control_plane.get_json("crd", "mpijobs.kubeflow.org")
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == ["v2beta1"]
    nodes = control_plane.get_json("nodes")["items"]
    assert len(nodes) == len(cluster.KWOK_NODES)
    sa = f"system:serviceaccount:{control_plane.namespace}:{cluster.SERVICE_ACCOUNT}"
    for question, allowed in [
        (("create", "mpijobs.kubeflow.org"), "yes"),
        (("watch", "pods"), "yes"),
        (("get", "pods", "--subresource=log"), "yes"),
        (("delete", "configmaps"), "yes"),  # expired run records (history.*)
        (("delete", "pods"), "no"),
        (("create", "pods"), "no"),
    ]:
        done = control_plane.kubectl(
            "auth", "can-i", *question, "-n", control_plane.namespace, "--as", sa
        )
        assert done.stdout.strip() == allowed, (question, done.stdout, done.stderr)


def _without_server_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {
        k: v
        for k, v in obj["metadata"].items()
        if k not in {"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"}
    }
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


def _schema_default_paths(schema: dict[str, Any], path: str = "") -> set[str]:
    """Dotted paths (``[]`` for list items) of every property with a default in a CRD schema."""
    out: set[str] = set()
    if "default" in schema:
        out.add(path)
    for key, sub in (schema.get("properties") or {}).items():
        out |= _schema_default_paths(sub, f"{path}.{key}" if path else key)
    if isinstance(schema.get("items"), dict):
        out |= _schema_default_paths(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out |= _schema_default_paths(schema["additionalProperties"], f"{path}.*")
    return out


def _diff(sent: Any, stored: Any, path: str = "") -> tuple[list[str], list[str]]:
    """(paths sent but changed or missing in stored, paths only in stored)."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        lost, added = [], []
        for k in sent.keys() | stored.keys():
            sub = f"{path}.{k}" if path else k
            if k not in stored:
                lost.append(sub)
            elif k not in sent:
                added.append(sub)
            else:
                a, b = _diff(sent[k], stored[k], sub)
                lost += a
                added += b
        return lost, added
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        lost, added = [], []
        for a_item, b_item in zip(sent, stored, strict=True):
            a, b = _diff(a_item, b_item, f"{path}[]")
            lost += a
            added += b
        return lost, added
    return ([] if sent == stored else [path]), []


async def test_ui_request_is_stored_as_sent_with_strict_validation(
    control_plane: ControlPlane, proxy: c.Server
) -> None:
    """The UI's exact MPI request: 200 RunState; the stored MPIJob is what we sent, nothing
    pruned or changed (only CRD defaults added); the create carried fieldValidation=Strict."""
    status, state, headers = await submit(proxy.url, ui_request())
    assert status == 200, state
    assert set(state) >= RUN_STATE_KEYS, state
    assert state["RunStamp"], state
    assert headers["Content-Location"].endswith("/run/" + state["RunStamp"])
    stored = job_of(control_plane, state["RunStamp"])
    name = stored["metadata"]["name"]

    creates = [
        e
        for e in proxy_audit(control_plane, "create", "mpijobs")
        if e["objectRef"].get("name") == name
        or e.get("requestObject", {}).get("metadata", {}).get("name") == name
    ]
    assert len(creates) == 1, creates
    create = creates[0]
    assert create["responseStatus"]["code"] == 201
    assert "fieldValidation=Strict" in create["requestURI"], create["requestURI"]
    assert "dryRun" not in create["requestURI"]
    sent = create["requestObject"]

    lost, added = _diff(sent, _without_server_fields(stored))
    assert lost == [], f"the API server pruned or changed what we sent: {lost}"
    crd = yaml.safe_load(cluster.crd_path().read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    defaults = [d.split(".") for d in _schema_default_paths(schema)]
    not_defaults = [
        p
        for p in added
        if not any(
            len(d) == len(p.split("."))
            and all(a in ("*", b) for a, b in zip(d, p.split("."), strict=True))
            for d in defaults
        )
    ]
    assert not_defaults == [], f"fields the API server added that are no CRD default: {added}"


async def test_start_up_dry_run_is_a_real_dry_run_create(
    control_plane: ControlPlane, proxy: c.Server
) -> None:
    """``serve`` created a representative MPIJob with dryRun=All at start-up; it was accepted
    (201, Strict) and nothing was stored; /readyz says so."""
    dry = [
        e
        for e in proxy_audit(control_plane, "create", "mpijobs")
        if "dryRun=All" in e["requestURI"]
    ]
    assert dry, "no dry-run create in the audit log"
    assert all(e["responseStatus"]["code"] == 201 for e in dry), dry
    assert all("fieldValidation=Strict" in e["requestURI"] for e in dry)
    dry_names = {e["requestObject"]["metadata"]["name"] for e in dry}
    stored = {j["metadata"]["name"] for j in mpijobs(control_plane)}
    assert not dry_names & stored
    status, ready = await get(proxy.url, "/readyz")
    assert status == 200, ready
    assert ready["checks"] == {"oms": "ok", "kubernetes": "ok", "dry_run": "ok"}


async def test_real_operator_accepts_the_mpijob(
    control_plane: ControlPlane, proxy: c.Server
) -> None:
    """The MPI Operator v0.8 takes it: Created, no ValidationError, launcher Job, worker pods,
    hostfile ConfigMap and SSH Secret; the launcher pod runs our mpirun argv."""
    status, state, _ = await submit(proxy.url, ui_request())
    assert status == 200, state
    job = job_of(control_plane, state["RunStamp"])
    name, ns = job["metadata"]["name"], control_plane.namespace

    def created() -> dict[str, Any] | None:
        cond = condition(job_of(control_plane, state["RunStamp"]), "Created")
        return cond if cond and cond["status"] == "True" else None

    await eventually("MPIJob Created", created, 60)
    events = control_plane.get_json(
        "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    assert not [e for e in events if e.get("reason") == "ValidationError"], events

    workers = await eventually(
        "4 worker pods",
        lambda: (
            [p for p in pods_of(control_plane, name) if "-worker-" in p["metadata"]["name"]]
            if len(pods_of(control_plane, name)) >= 4
            else None
        ),
        60,
    )
    assert sorted(p["metadata"]["name"] for p in workers) == [
        f"{name}-worker-{i}" for i in range(4)
    ]
    hostfile = control_plane.get_json("configmap", f"{name}-config", "-n", ns)
    assert hostfile["data"]["hostfile"].count(f"{name}-worker-") == 4
    secret = control_plane.get_json("secret", f"{name}-ssh", "-n", ns)
    assert secret["type"] == "kubernetes.io/ssh-auth"
    launcher_job = await eventually(
        "launcher Job",
        lambda: control_plane.get_json("jobs", "-n", ns, f"{name}-launcher"),
        60,
    )
    assert launcher_job["spec"]["backoffLimit"] == 0

    def launcher_pod() -> dict[str, Any] | None:
        pods = [
            p
            for p in pods_of(control_plane, name)
            if p["metadata"]["name"].startswith(f"{name}-launcher")
        ]
        return pods[0] if pods else None

    pod = await eventually("launcher pod", launcher_pod, 60)
    ours = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    theirs = pod["spec"]["containers"][0]
    assert theirs["command"] == ours["command"]
    assert theirs["command"][0] == "mpirun", theirs["command"]
    assert theirs["command"][theirs["command"].index("-n") + 1] == "4"
    run_cm = f"{name}-run"
    assert any(v.get("configMap", {}).get("name") == run_cm for v in pod["spec"]["volumes"])
    assert pod["metadata"]["annotations"][names.RUN_STAMP_KEY] == state["RunStamp"]


async def test_full_quota_is_429_and_creates_nothing(
    control_plane: ControlPlane, proxy: c.Server
) -> None:
    """A full ResourceQuota: the real 'exceeded quota' 403 becomes 429 with Retry-After."""
    ns = control_plane.namespace
    control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "e2e-no-more-mpijobs", "namespace": ns},
            "spec": {"hard": {"count/mpijobs.kubeflow.org": "0"}},
        }
    )
    try:
        await eventually(
            "quota computed by the controller",
            lambda: (
                control_plane.get_json("resourcequota", "e2e-no-more-mpijobs", "-n", ns)
                .get("status", {})
                .get("hard")
            ),
            60,
        )
        stamp = "2026_01_02_03_04_05_429"
        status, answer, headers = await submit(proxy.url, ui_request(**{"OpenM.RunStamp": stamp}))
        assert status == 429, answer
        assert "quota" in str(answer)
        assert float(headers["Retry-After"]) > 0
        assert mpijobs(control_plane, **{names.RUN_STAMP_KEY: stamp}) == []
    finally:
        control_plane.kubectl_ok("delete", "resourcequota", "e2e-no-more-mpijobs", "-n", ns)

    # once the quota is gone, the next submission goes through
    for _ in range(30):
        status, answer, _ = await submit(proxy.url, ui_request())
        if status == 200:
            break
        assert status == 429, answer
        await asyncio.sleep(1)
    assert status == 200, answer


def _role_without_create(name: str) -> dict[str, Any]:
    role = yaml.safe_load((REPO / "k8s" / "base" / "rbac" / "role.yaml").read_text())
    role["metadata"]["name"] = name
    for rule in role["rules"]:
        if "mpijobs" in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "create"]
    return dict(role)


async def test_role_without_create_is_502_naming_the_permission(
    control_plane: ControlPlane, start_proxy: ProxyFactory
) -> None:
    """Our Role minus ``create`` on mpijobs: readiness and the submission say what is missing."""
    ns, sa = control_plane.namespace, "e2e-no-create"
    control_plane.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": sa, "namespace": ns}})  # fmt: skip
    control_plane.apply({**_role_without_create(sa), "metadata": {"name": sa, "namespace": ns}})
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": sa, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        }
    )
    server = start_proxy("proxy-no-create", service_account=sa)

    async def dry_run_done() -> Any:
        _, ready = await get(server.url, "/readyz")
        return ready if ready["checks"].get("dry_run") not in (None, "pending") else None

    ready = await eventually("dry run done", dry_run_done)
    assert "lacks a permission" in ready["checks"]["dry_run"], ready
    assert ready["checks"]["kubernetes"] == "ok"  # list is granted
    status, answer, _ = await submit(server.url, ui_request())
    assert status == 502, answer
    assert "lacks a permission" in str(answer), answer
    assert "create" in str(answer), answer


async def test_missing_namespace_readiness(
    control_plane: ControlPlane, start_proxy: ProxyFactory
) -> None:
    """A run namespace that does not exist. With credentials allowed there (admin): the
    readiness message says the namespace is missing. With our namespaced Role there is nothing
    in that namespace for it: the real API server answers 403, and readiness names the
    missing permission."""
    missing = "e2e-no-such-namespace"
    admin = start_proxy(
        "proxy-missing-ns-admin",
        kubeconfig=control_plane.admin_kubeconfig,
        kubernetes={"namespace": missing},
    )

    async def settled(server: c.Server) -> Any:
        async def check() -> Any:
            status, ready = await get(server.url, "/readyz")
            return (status, ready) if ready["checks"].get("dry_run") != "pending" else None

        return await eventually("dry run done", check)

    status, ready = await settled(admin)
    assert status == 503, ready
    assert "namespace does not exist" in ready["checks"]["dry_run"], ready
    status, answer, _ = await submit(admin.url, ui_request())
    assert status == 502, answer
    assert "namespace does not exist" in str(answer), answer

    ours = start_proxy("proxy-missing-ns-sa", kubernetes={"namespace": missing})
    status, ready = await settled(ours)
    assert status == 503, ready
    assert "lacks a permission" in ready["checks"]["kubernetes"], ready
    assert missing in ready["checks"]["kubernetes"]


async def test_missing_crd_readiness(
    control_plane: ControlPlane, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """An API server without the MPIJob CRD (a second kube-apiserver on its own etcd prefix):
    readiness and a submission say the CRD is not installed."""
    kubeconfig = control_plane.bare_apiserver()
    server = start_proxy("proxy-no-crd", kubeconfig=kubeconfig, kubernetes={"namespace": "default"})

    async def check() -> Any:
        status, ready = await get(server.url, "/readyz")
        return (status, ready) if ready["checks"].get("dry_run") != "pending" else None

    status, ready = await eventually("dry run done", check)
    assert status == 503, ready
    assert "CRD (mpijobs.kubeflow.org/v2beta1) is not installed" in ready["checks"]["kubernetes"]
    assert "is not installed" in ready["checks"]["dry_run"]
    status, answer, _ = await submit(server.url, ui_request())
    assert status == 502, answer
    assert "is not installed" in str(answer), answer


async def test_same_stamp_retry_is_one_mpijob(control_plane: ControlPlane, proxy: c.Server) -> None:
    """A script's retry after a lost answer (same run stamp, same X-Request-ID): 200 twice,
    exactly one MPIJob; another request with that stamp: 409."""
    stamp = "2026_01_02_03_04_05_777"
    body = ui_request(**{"OpenM.RunStamp": stamp})
    rid = uuid.uuid4().hex
    first = await submit(proxy.url, body, {"X-Request-ID": rid})
    again = await submit(proxy.url, body, {"X-Request-ID": rid})
    assert first[0] == 200, first[1]
    assert again[0] == 200, again[1]
    assert first[1]["RunStamp"] == again[1]["RunStamp"] == stamp
    assert len(mpijobs(control_plane, **{names.RUN_STAMP_KEY: stamp})) == 1
    other = await submit(proxy.url, body, {"X-Request-ID": uuid.uuid4().hex})
    assert other[0] == 409, other[1]
    assert len(mpijobs(control_plane, **{names.RUN_STAMP_KEY: stamp})) == 1
    creates = [
        e
        for e in proxy_audit(control_plane, "create", "mpijobs")
        if e.get("requestObject", {})
        .get("metadata", {})
        .get("annotations", {})
        .get(names.RUN_STAMP_KEY)
        == stamp
    ]
    assert sorted(e["responseStatus"]["code"] for e in creates) == [201, 409, 409]


@pytest.mark.parametrize("path", ["/readyz", "/metrics"])
async def test_health_and_metrics_on_the_real_cluster(proxy: c.Server, path: str) -> None:
    """/readyz is 200 with every check ok; /metrics counts the submissions made above."""
    status, body = await get(proxy.url, path)
    assert status == 200, body
    if path == "/metrics":
        assert 'omsproxy_mpijob_submissions_total{outcome="created"}' in body
        assert 'omsproxy_kubernetes_request_duration_seconds_count{operation="create MPIJob"}' in (
            body
        )
