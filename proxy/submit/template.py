"""The MPIJob template: read once at start-up and checked strictly.

The API server silently prunes fields a custom resource's schema does not know, so a typo in
the template (``nodeSelektor``) would simply vanish. :func:`check_template` therefore rejects
every field it does not know, with the file and the dotted path of the field:

* the MPIJob's own fields (top level, ``spec``, ``spec.runPolicy``, the replica specs) against
  the kubeflow.org/v2beta1 API (hand-written lists below);
* everything under ``mpiReplicaSpecs.<Launcher|Worker>.template`` (a PodTemplateSpec) against
  the Kubernetes models generated in kubernetes_asyncio (``openapi_types``/``attribute_map``),
  recursively, including value types (a YAML ``yes`` where a string belongs is an error).

It also rejects settings that the renderer owns (see :mod:`proxy.submit.render`) when they would
conflict: values that come from the proxy config or from the run (name, namespace,
``slotsPerWorker``, the Worker's ``replicas``, ``runPolicy.cleanPodPolicy``/
``activeDeadlineSeconds``/``ttlSecondsAfterFinished``, the Launcher's first container's
``command``/``args``, the Worker's first container's cpu/memory requests, our label and
annotation keys, the ``openmpp-run`` volume), and fixed values given differently (Launcher
``replicas`` other than 1, Launcher ``restartPolicy`` other than Never, ``backoffLimit`` other
than 0, an ``mpiImplementation`` other than OpenMPI, ``runLauncherAsWorker: true``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

import yaml
from kubernetes_asyncio import client as k8s_models

from proxy.config import ConfigError
from proxy.names import OWNED_KEYS

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"
RUN_VOLUME = "openmpp-run"
"""Name of the Launcher volume that holds the per-run ConfigMap (reserved for the renderer)."""

_SPEC_FIELDS = (
    "slotsPerWorker",
    "runLauncherAsWorker",
    "launcherCreationPolicy",
    "sshAuthMountPath",
    "mpiImplementation",
    "runPolicy",
    "mpiReplicaSpecs",
)
_RUN_POLICY_FIELDS = (
    "cleanPodPolicy",
    "ttlSecondsAfterFinished",
    "activeDeadlineSeconds",
    "backoffLimit",
    "schedulingPolicy",
    "suspend",
    "managedBy",
)
_SCHEDULING_POLICY_FIELDS = {
    "minAvailable": "int",
    "queue": "str",
    "minResources": "dict(str, str)",
    "priorityClass": "str",
    "scheduleTimeoutSeconds": "int",
}
_REPLICA_FIELDS = ("replicas", "restartPolicy", "template")
_QUANTITY_FIELDS = frozenset({"limits", "requests", "overhead", "sizeLimit", "minResources"})
QUANTITY_RE = re.compile(
    r"(?P<number>[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[eE][+-]?[0-9]+|m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?"
)
"""A Kubernetes resource quantity (the forms ``resource.Quantity`` accepts)."""
_LIST = re.compile(r"list\[(.+)\]")
_DICT = re.compile(r"dict\(str, (.+)\)")


@dataclasses.dataclass(frozen=True)
class Template:
    """A checked MPIJob template. ``manifest`` is shared: never change it, copy it."""

    source: str
    manifest: JsonObject


def load_template(path: str | os.PathLike[str]) -> Template:
    """Read and check the template file; :class:`~proxy.config.ConfigError` if it is wrong."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(source, "", f"cannot read the MPIJob template: {e.strerror or e}") from e
    return parse_template(text, source)


def parse_template(text: str, source: str) -> Template:
    """Parse YAML text (one document, no repeated keys) and check it."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(source, "", f"not valid YAML: {e}") from e
    if node is not None:
        _no_repeated_keys(node, "", source)
    return check_template(data, source)


def check_template(data: object, source: str) -> Template:
    """Check a parsed template (see the module docstring); the dotted key names any problem."""
    c = _Checker(source)
    top = c.mapping(data, "", ("apiVersion", "kind", "metadata", "spec"))
    if top.get("apiVersion") != API_VERSION:
        c.fail("apiVersion", f"expected {API_VERSION}, got {top.get('apiVersion')!r}")
    if top.get("kind") != KIND:
        c.fail("kind", f"expected {KIND}, got {top.get('kind')!r}")
    if "metadata" in top:
        c.object_metadata(top["metadata"], "metadata", top_level=True)
    if "spec" not in top:
        c.fail("spec", "missing")
    spec = c.mapping(top["spec"], "spec", _SPEC_FIELDS)

    c.owned(spec, "spec", "slotsPerWorker", "set mpijob.slots_per_worker in the proxy config")
    if "runLauncherAsWorker" in spec:
        c.leaf(spec["runLauncherAsWorker"], "bool", "spec.runLauncherAsWorker")
        if spec["runLauncherAsWorker"]:
            c.fail("spec.runLauncherAsWorker", "not supported: the launcher must not run ranks")
    if "launcherCreationPolicy" in spec:
        c.one_of(
            spec["launcherCreationPolicy"],
            "spec.launcherCreationPolicy",
            "AtStartup",
            "WaitForWorkersReady",
        )
    if "sshAuthMountPath" in spec:
        path = c.leaf(spec["sshAuthMountPath"], "str", "spec.sshAuthMountPath")
        if not str(path).startswith("/"):
            c.fail("spec.sshAuthMountPath", f"expected an absolute path, got {path!r}")
    if "mpiImplementation" in spec and spec["mpiImplementation"] != "OpenMPI":
        c.fail(
            "spec.mpiImplementation",
            f"expected OpenMPI (the proxy writes an OpenMPI mpirun command), "
            f"got {spec['mpiImplementation']!r}",
        )
    if "runPolicy" in spec:
        c.run_policy(spec["runPolicy"], "spec.runPolicy")

    if "mpiReplicaSpecs" not in spec:
        c.fail("spec.mpiReplicaSpecs", "missing")
    replicas = c.mapping(spec["mpiReplicaSpecs"], "spec.mpiReplicaSpecs", ("Launcher", "Worker"))
    for role in ("Launcher", "Worker"):
        if role not in replicas:
            c.fail(f"spec.mpiReplicaSpecs.{role}", "missing")
        c.replica(replicas[role], f"spec.mpiReplicaSpecs.{role}", role)
    assert isinstance(data, dict)
    return Template(source=source, manifest=data)


class _Checker:
    """The checks, sharing the file name for the errors."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> NoReturn:
        raise ConfigError(self.source, key, problem)

    def mapping(self, value: object, key: str, fields: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, f"expected a mapping, got {_kind(value)}")
        for name in value:
            if not isinstance(name, str):
                self.fail(key, f"expected text keys, got {name!r}")
            if name not in fields:
                self.fail(_join(key, name), "unknown field" + _suggest(name, fields))
        return value

    def owned(self, parent: Mapping[str, Any], key: str, name: str, instead: str) -> None:
        if name in parent:
            self.fail(_join(key, name), f"written by the proxy; remove it ({instead})")

    def fixed(self, parent: Mapping[str, Any], key: str, name: str, value: object) -> None:
        if name in parent and (parent[name] != value or type(parent[name]) is not type(value)):
            self.fail(
                _join(key, name),
                f"the proxy always writes {value!r}; remove it or set it to that",
            )

    def one_of(self, value: object, key: str, *choices: str) -> None:
        if value not in choices:
            self.fail(key, f"expected one of {', '.join(choices)}, got {value!r}")

    def leaf(self, value: object, type_name: str, key: str) -> object:
        ok = {
            "str": isinstance(value, str),
            "datetime": isinstance(value, str),
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool),
            "object": isinstance(value, int | str) and not isinstance(value, bool),
            "quantity": (isinstance(value, int | float) and not isinstance(value, bool))
            or (isinstance(value, str) and QUANTITY_RE.fullmatch(value) is not None),
        }[type_name]
        if not ok:
            what = {
                "str": "a string (quote it)",
                "datetime": "a date-time string",
                "bool": "true or false",
                "int": "an integer",
                "float": "a number",
                "object": "an integer or a string",
                "quantity": "a quantity such as 500m or 2Gi",
            }[type_name]
            self.fail(key, f"expected {what}, got {_kind(value)}")
        return value

    def string_map(self, value: object, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, f"expected a mapping, got {_kind(value)}")
        for k, v in value.items():
            if not isinstance(k, str):
                self.fail(key, f"expected text keys, got {k!r}")
            self.leaf(v, "str", _join(key, k))
        return value

    def object_metadata(self, value: object, key: str, *, top_level: bool) -> None:
        meta = self.mapping(value, key, ("labels", "annotations", "name", "namespace"))
        for name in ("name", "namespace"):
            if name in meta:
                where = "the run" if name == "name" else "kubernetes.namespace in the proxy config"
                what = "the pods' names" if not top_level else f"the MPIJob's {name}"
                self.fail(_join(key, name), f"written by the proxy from {where}: {what}")
        for part in ("labels", "annotations"):
            if part in meta:
                for k in self.string_map(meta[part], _join(key, part)):
                    if k in OWNED_KEYS:
                        self.fail(_join(_join(key, part), k), "this key is written by the proxy")

    def run_policy(self, value: object, key: str) -> None:
        policy = self.mapping(value, key, _RUN_POLICY_FIELDS)
        self.owned(policy, key, "cleanPodPolicy", "set mpijob.clean_pod_policy")
        self.owned(policy, key, "activeDeadlineSeconds", "set mpijob.active_deadline_seconds")
        self.owned(policy, key, "ttlSecondsAfterFinished", "set mpijob.ttl_seconds_after_finished")
        self.fixed(policy, key, "backoffLimit", 0)
        if "suspend" in policy:
            self.leaf(policy["suspend"], "bool", _join(key, "suspend"))
        if "managedBy" in policy:
            self.leaf(policy["managedBy"], "str", _join(key, "managedBy"))
        if "schedulingPolicy" in policy:
            sp_key = _join(key, "schedulingPolicy")
            sp = self.mapping(policy["schedulingPolicy"], sp_key, tuple(_SCHEDULING_POLICY_FIELDS))
            for name, type_name in _SCHEDULING_POLICY_FIELDS.items():
                if name in sp:
                    self.value(sp[name], type_name, _join(sp_key, name), name)

    def replica(self, value: object, key: str, role: str) -> None:
        spec = self.mapping(value, key, _REPLICA_FIELDS)
        if role == "Launcher":
            self.fixed(spec, key, "replicas", 1)
            self.fixed(spec, key, "restartPolicy", "Never")
        else:
            self.owned(spec, key, "replicas", "the proxy computes it from the run's processes")
            if "restartPolicy" in spec and spec["restartPolicy"] not in ("Never", "OnFailure"):
                self.fail(
                    _join(key, "restartPolicy"),
                    f"expected Never or OnFailure, got {spec['restartPolicy']!r}",
                )
        if "template" not in spec:
            self.fail(_join(key, "template"), "missing")
        tkey = _join(key, "template")
        template = self.mapping(spec["template"], tkey, ("metadata", "spec"))
        if "metadata" in template:
            self.object_metadata(template["metadata"], _join(tkey, "metadata"), top_level=False)
        if "spec" not in template:
            self.fail(_join(tkey, "spec"), "missing")
        skey = _join(tkey, "spec")
        self.value(template["spec"], "V1PodSpec", skey, "spec")
        pod = template["spec"]
        self.owned(pod, skey, "restartPolicy", "the operator sets it from the replica's")
        containers = pod.get("containers")
        if not isinstance(containers, list) or not containers:
            self.fail(_join(skey, "containers"), "expected at least one container")
        ckey = _join(skey, "containers") + "[0]"
        first = containers[0]
        for name in ("name", "image"):
            if not first.get(name):
                self.fail(_join(ckey, name), "missing")
        if role == "Launcher":
            self.owned(first, ckey, "command", "the proxy writes the mpirun command")
            self.owned(first, ckey, "args", "the proxy writes the whole mpirun command")
            for i, volume in enumerate(pod.get("volumes") or ()):
                if volume.get("name") == RUN_VOLUME:
                    self.fail(f"{_join(skey, 'volumes')}[{i}].name", f"{RUN_VOLUME!r} is reserved")
        else:
            requests = (first.get("resources") or {}).get("requests") or {}
            for name in ("cpu", "memory"):
                if name in requests:
                    self.fail(
                        _join(ckey, f"resources.requests.{name}"),
                        "written by the proxy from the run's threads and processes "
                        "(mpijob.cpu_per_thread, mpijob.memory_per_process)",
                    )

    def value(self, value: object, type_name: str, key: str, name: str) -> None:
        """Check ``value`` against a kubernetes_asyncio type name, recursively."""
        if m := _LIST.fullmatch(type_name):
            if not isinstance(value, list):
                self.fail(key, f"expected a list, got {_kind(value)}")
            for i, item in enumerate(value):
                self.value(item, m.group(1), f"{key}[{i}]", name)
            return
        if m := _DICT.fullmatch(type_name):
            if not isinstance(value, dict):
                self.fail(key, f"expected a mapping, got {_kind(value)}")
            item_type = "quantity" if name in _QUANTITY_FIELDS else m.group(1)
            for k, item in value.items():
                if not isinstance(k, str):
                    self.fail(key, f"expected text keys, got {k!r}")
                self.value(item, item_type, _join(key, k), k)
            return
        model = getattr(k8s_models, type_name, None)
        if model is None:
            if type_name == "str" and name in _QUANTITY_FIELDS:
                type_name = "quantity"
            self.leaf(value, type_name, key)
            return
        fields: dict[str, str] = {
            model.attribute_map[attr]: model.openapi_types[attr] for attr in model.openapi_types
        }
        obj = self.mapping(value, key, tuple(fields))
        for field, field_value in obj.items():
            self.value(field_value, fields[field], _join(key, field), field)


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _suggest(name: str, fields: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, fields, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _no_repeated_keys(node: yaml.Node, key: str, source: str) -> None:
    """yaml.safe_load keeps the last of repeated keys silently; refuse them instead."""
    if isinstance(node, yaml.MappingNode):
        seen: set[object] = set()
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else str(k)
            if name in seen:
                raise ConfigError(source, _join(key, str(name)), "given twice")
            seen.add(name)
            _no_repeated_keys(v, _join(key, str(name)), source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_repeated_keys(item, f"{key}[{i}]", source)
