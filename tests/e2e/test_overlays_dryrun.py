"""Every kustomization in k8s/ is accepted by a real API server (server-side apply, dryRun=All).

The fast suite validates the built-in kinds against the OpenAPI schemas offline and the
VirtualService and HTTPRoute only structurally; here the real kube-apiserver checks everything,
the custom resources against their CRDs' schemas with strict field validation. The CRDs come
from their Go modules, fetched at test time into the normal Go module cache (never committed):
the Gateway API's standard channel from ``sigs.k8s.io/gateway-api`` and Istio's from
``istio.io/api``. Both renderings are applied: the test suite's own kustomize
(``tests/test_deploy.py``) and the real one (``kubectl kustomize``, what ``kubectl apply -k``
uses). The sidecar overlay's patches are applied to the example oms Deployment and Service.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import tests.test_deploy as deploy

pytestmark = pytest.mark.e2e

GATEWAY_API = "sigs.k8s.io/gateway-api@v1.6.3"
ISTIO_API = "istio.io/api@v1.32.0"

Obj = dict[str, Any]


def go_module_dir(module: str) -> Path:
    """``go mod download -json MODULE@VERSION`` into the Go module cache; the Dir it reports."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("the e2e tier needs the Go toolchain (go) to fetch the CRDs' modules")
    with tempfile.TemporaryDirectory() as outside_any_module:
        done = subprocess.run(
            [go, "mod", "download", "-json", module],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=outside_any_module,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    if done.returncode != 0:
        pytest.fail(f"go mod download {module} failed: {done.stdout}{done.stderr}")
    info = json.loads(done.stdout)
    if "Error" in info:
        pytest.fail(f"go mod download {module}: {info['Error']}")
    return Path(info["Dir"])


def _crds(paths: list[Path]) -> list[Obj]:
    docs: list[Obj] = []
    for path in paths:
        with path.open(encoding="utf-8") as fh:
            docs += [
                d for d in yaml.safe_load_all(fh) if d and d["kind"] == "CustomResourceDefinition"
            ]
    return docs


def gateway_api_crds() -> list[Obj]:
    standard = go_module_dir(GATEWAY_API) / "config" / "crd" / "standard"
    crds = _crds(sorted(standard.glob("*.yaml")))
    assert "httproutes.gateway.networking.k8s.io" in {c["metadata"]["name"] for c in crds}
    return crds


def istio_crds() -> list[Obj]:
    path = go_module_dir(ISTIO_API) / "kubernetes" / "customresourcedefinitions.gen.yaml"
    crds = _crds([path])
    assert "virtualservices.networking.istio.io" in {c["metadata"]["name"] for c in crds}
    return crds


def _ok(done: subprocess.CompletedProcess[str], what: str) -> str:
    assert done.returncode == 0, f"{what}: {done.stderr.strip() or done.stdout.strip()}"
    return done.stdout


@pytest.fixture(scope="module")
def crds_installed(control_plane: Any) -> list[str]:
    """The Gateway API and Istio CRDs, installed for real and Established."""
    crds = gateway_api_crds() + istio_crds()
    text = yaml.safe_dump_all(crds, sort_keys=False)
    _ok(
        control_plane.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=e2e-crds",
            "-f", "-", input=text,
        ),
        "install the CRDs",
    )  # fmt: skip
    names = [c["metadata"]["name"] for c in crds]
    _ok(
        control_plane.kubectl(
            "wait", "--for=condition=Established", "--timeout=90s",
            *[f"crd/{n}" for n in names],
        ),
        "wait for the CRDs",
    )  # fmt: skip
    return names


def _in_namespace(objs: list[Obj], namespace: str) -> list[Obj]:
    objs = [dict(o) for o in objs]
    deploy._set_namespace(objs, namespace)
    return objs


def dry_run_apply(control_plane: Any, objs: list[Obj]) -> list[str]:
    """Server-side apply with dryRun=All and strict field validation; the objects it names."""
    text = yaml.safe_dump_all(objs, sort_keys=False)
    out = _ok(
        control_plane.kubectl(
            "apply", "--server-side", "--dry-run=server", "--validate=strict",
            "--force-conflicts", "--field-manager=e2e-dryrun", "-o", "name", "-f", "-", input=text,
        ),
        "server-side dry-run apply",
    )  # fmt: skip
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def _expected_names(objs: list[Obj]) -> list[str]:
    out = []
    for o in objs:
        group = o["apiVersion"].rpartition("/")[0]
        kind = o["kind"].lower()
        out.append(
            f"{kind}.{group}/{o['metadata']['name']}"
            if group
            else f"{kind}/{o['metadata']['name']}"
        )
    return sorted(out)


def real_kustomize(control_plane: Any, path: Path) -> list[Obj]:
    out = _ok(control_plane.kubectl("kustomize", str(path)), f"kubectl kustomize {path}")
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("name", sorted(deploy.BUILDS))
def test_overlay_accepted_by_the_api_server(
    name: str, control_plane: Any, crds_installed: list[str]
) -> None:
    assert crds_installed
    ours = _in_namespace(deploy.kustomize_build(deploy.BUILDS[name]), control_plane.namespace)
    theirs = _in_namespace(
        real_kustomize(control_plane, deploy.BUILDS[name]), control_plane.namespace
    )

    def identity(objs: list[Obj]) -> list[tuple[str, str, str]]:
        # The generated ConfigMap's hash suffix differs (kustomize hashes its own encoding).
        return sorted(
            (o["apiVersion"], o["kind"], o["metadata"]["name"].rsplit("-config-", 1)[0])
            for o in objs
        )

    assert identity(ours) == identity(theirs), (
        "the test suite's kustomize renders what kustomize does"
    )
    for objs in (ours, theirs):
        assert dry_run_apply(control_plane, objs) == _expected_names(objs)


def test_sidecar_patches_accepted_by_the_api_server(control_plane: Any) -> None:
    deployment, service = deploy._patched_oms()
    objs = _in_namespace([deployment, service], control_plane.namespace)
    assert dry_run_apply(control_plane, objs) == _expected_names(objs)


def test_the_api_server_rejects_a_broken_route(
    control_plane: Any, crds_installed: list[str]
) -> None:
    """The dry-run really validates the custom resources: a wrong field fails it."""
    assert crds_installed
    objs = deploy.kustomize_build(deploy.BUILDS["routes-only-gateway"])
    (route,) = [o for o in objs if o["kind"] == "HTTPRoute"]
    route["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Regex"  # not in the enum
    vs_objs = deploy.kustomize_build(deploy.BUILDS["routes-only"])
    (vs,) = [o for o in vs_objs if o["kind"] == "VirtualService"]
    vs["spec"]["http"][0]["match"][0]["uri"]["regexp"] = "^/x$"  # unknown field
    for obj in (route, vs):
        text = yaml.safe_dump_all(_in_namespace([obj], control_plane.namespace))
        done = control_plane.kubectl(
            "apply", "--server-side", "--dry-run=server", "--validate=strict",
            "--force-conflicts", "--field-manager=e2e-dryrun", "-f", "-", input=text,
        )  # fmt: skip
        assert done.returncode != 0, f"{obj['kind']} with a wrong field was accepted"
