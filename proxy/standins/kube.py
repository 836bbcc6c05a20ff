"""Stand-in Kubernetes API server with a simulated MPI operator, for tests, the demo and benchmarks.

:class:`FakeKube` is an aiohttp application that speaks enough of the real Kubernetes REST protocol
(JSON bodies, ``Status`` errors, list and watch with resource versions) for the real
``kubernetes_asyncio`` client (``CustomObjectsApi``, ``CoreV1Api``, ``watch.Watch``) to run against
it over plain HTTP. All state is in memory; use one instance per test.

What it emulates:

- ``kubeflow.org/v2beta1`` ``mpijobs``: create (with ``dryRun=All``), get, ``/status`` get, list,
  watch, merge or JSON patch, and delete with Background, Foreground or Orphan propagation and an
  owner-reference cascade. Core ``configmaps`` (create, get, list, watch, delete), ``pods`` (get,
  list, watch, ``/log`` with ``follow``) and ``events`` (get, list, watch). ``/version`` and the
  ``kubeflow.org/v2beta1`` discovery document.
- Admission of an MPIJob as the API server does it: the CRD's OpenAPI schema (when a CRD file is
  given; needs ``jsonschema``) with pruning, defaulting and ``fieldValidation`` Strict, Warn (a
  ``Warning`` header) or Ignore; metadata name, label and annotation rules; quota
  (``quota_exceeded``); optimistic concurrency (409 Conflict) on patch.
- Errors as real ``Status`` bodies: 400, 401 (``token``), 403 (:meth:`FakeKube.forbid`, quota),
  404 (object, namespace, missing CRD), 405, 409, 410 (watch), 415, 422, and programmed faults
  (:class:`Fault`): 429 with ``Retry-After``, 5xx, delays and dropped connections.
- The mpi-operator in outline (shared/reference/mpijob.md sections 1, 2 and 4): its own validation
  (a ``ValidationError`` Event and nothing else), conditions and Events, the ``<name>-config``
  ConfigMap, worker and launcher pods with the operator's labels and owner references, a launcher
  log that grows line by line, cleanPodPolicy, suspend and resume. Each job's course is a
  :class:`Scenario`.
- A record of every request with its RBAC attributes (:attr:`FakeKube.requests`,
  :meth:`FakeKube.rbac_verbs`), so tests can derive the Role the proxy needs.

What it does not emulate:

- TLS, authentication other than one bearer token, RBAC other than :meth:`FakeKube.forbid`.
- PUT (update), server-side apply, strategic merge patch, ``deletecollection``, list pagination
  (``limit``/``continue``), ``resourceVersionMatch``, duplicate-field detection, Table output.
- The operator's Service, Secret and launcher batch/v1 Job: the launcher pod is owned by the MPIJob
  directly and is never restarted (no ``previous`` log). The Failed reason is plain
  ``BackoffLimitExceeded`` (the real one may carry a ``/<pod reason>`` suffix). Garbage collection
  is immediate rather than eventual.
- Watches filter on an object's current state, so an object that stops matching a label selector
  is not reported as DELETED. There is no namespaces API, only the ``namespaces`` set. As on a
  real server, listing a missing namespace answers an empty list, while creating in one answers
  404.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import json
import logging
import os
import re
import secrets
import time
import uuid
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from aiohttp import web

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError as SchemaError
    from jsonschema.protocols import Validator

_LOGGER = logging.getLogger(__name__)

Json = dict[str, Any]
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ENV_CRD = "OMS_MPIJOB_PROXY_CRD"
"""Environment variable naming the MPIJob CRD file, for :func:`find_crd`."""

_REPO_CRD = Path(__file__).resolve().parents[2] / ".." / "shared" / "k8s" / "mpijob-crd.yaml"

OPERATOR_LABELS = (
    "training.kubeflow.org/operator-name",
    "training.kubeflow.org/job-name",
    "training.kubeflow.org/job-role",
    "training.kubeflow.org/replica-index",
)
_OPERATOR_NAME, _JOB_NAME, _JOB_ROLE, _REPLICA_INDEX = OPERATOR_LABELS

# How often an idle watch or log stream checks whether its client has gone.
_IDLE_CHECK_SECONDS = 0.25
# The characters Kubernetes uses for generateName and pod-name suffixes.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

DEFAULT_LOG_LINES: tuple[str, ...] = (
    "2026-01-01 00:00:00.000 modelOne",
    "2026-01-01 00:00:00.001 Model version  : 1.0.0.0",
    "2026-01-01 00:00:00.002 Run: 101 modelOne_Default",
    "2026-01-01 00:00:00.003 Reading Parameters",
    "2026-01-01 00:00:00.004 Running Simulation",
    "2026-01-01 00:00:00.005 member=0 Simulation progress=50% cases=500",
    "2026-01-01 00:00:00.006 member=0 Simulation progress=100% cases=1000",
    "2026-01-01 00:00:00.007 Writing Output Tables",
    "2026-01-01 00:00:00.008 Done.",
)
"""Launcher stdout of a default :class:`Scenario`, shaped like an OpenM++ model's console log."""


# --- public value types ----------------------------------------------------------------------


ScenarioKind = Literal["succeed", "fail", "image-pull", "unschedulable", "suspended", "no-operator"]


@dataclasses.dataclass
class Scenario:
    """How the simulated operator and cluster treat one MPIJob. Times are in seconds.

    ``kind``:

    - ``succeed``: Created, pods Pending then Running, Running=True, the launcher log grows by one
      of ``log_lines`` every ``line_interval``, then Succeeded=True with launcher exit code 0.
    - ``fail``: as ``succeed``, but ends in Failed=True (``BackoffLimitExceeded``) with the launcher
      terminated with ``exit_code`` and reason ``Error``.
    - ``image-pull``: Created; the pods stay Pending in ``ImagePullBackOff`` with pod Events.
    - ``unschedulable``: Created; the pods stay Pending with ``PodScheduled=False/Unschedulable``.
    - ``suspended``: as if Kueue queued the job: the create forces ``spec.runPolicy.suspend: true``,
      the job shows Suspended=True and no pods until someone patches ``suspend: false``, after
      which it runs as ``succeed``.
    - ``no-operator``: nothing happens (no operator installed).
    """

    kind: ScenarioKind = "succeed"
    created_after: float = 0.02
    running_after: float = 0.05
    log_lines: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_LOG_LINES))
    line_interval: float = 0.01
    exit_code: int = 1


@dataclasses.dataclass
class Fault:
    """A programmed misbehaviour for the next ``times`` requests that match.

    A request matches on HTTP ``method`` and ``resource`` (``"*"`` matches anything), on
    ``subresource`` unless it is None (``""`` means the main resource only, ``"log"`` a pod log),
    and on the Kubernetes ``verb`` (e.g. ``"watch"``) unless it is None. The actions happen in this
    order: wait ``delay`` seconds; then ``drop_before`` closes the connection without applying or
    answering, or ``status`` answers with that code and a proper ``Status`` body (429 adds
    ``Retry-After: retry_after``, default 1); otherwise the request is applied, and ``drop_after``
    closes the connection instead of answering.
    """

    method: str
    resource: str
    subresource: str | None = None
    verb: str | None = None
    times: int = 1
    status: int | None = None
    message: str | None = None
    retry_after: int | None = None
    delay: float = 0.0
    drop_before: bool = False
    drop_after: bool = False

    def matches(self, request: RecordedRequest) -> bool:
        """Whether this fault applies to ``request``."""
        return (
            self.method in ("*", request.method)
            and self.resource in ("*", request.resource)
            and self.subresource in (None, request.subresource)
            and self.verb in (None, request.verb)
        )


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it, with its Kubernetes authorization attributes.

    ``verb`` is the RBAC verb (get, list, watch, create, update, patch, delete, deletecollection)
    for resource requests and the lower-case HTTP method for others, such as ``/version``, where
    ``resource`` is empty. ``body`` is the decoded JSON body, the raw text if it is not JSON, or
    None.
    """

    method: str
    path: str
    query: dict[str, str]
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    body: Any
    user_agent: str = ""


# --- helpers: files, kubeconfig, serving ----------------------------------------------------


def find_crd(path: str | Path | None = None) -> Path | None:
    """The MPIJob CRD file: ``path``, else ``$OMS_MPIJOB_PROXY_CRD``, else the shared copy.

    The shared copy is ``<repo>/../shared/k8s/mpijob-crd.yaml``. Returns the first candidate that
    is an existing file, or None.
    """
    for candidate in (path, os.environ.get(ENV_CRD), _REPO_CRD):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def write_kubeconfig(
    path: Path, server_url: str, token: str | None = None, namespace: str = "default"
) -> Path:
    """Write a kubeconfig whose current context points at ``server_url``; returns ``path``."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake-kube", "cluster": {"server": server_url}}],
        "users": [{"name": "fake-kube-user", "user": {"token": token} if token else {}}],
        "contexts": [
            {
                "name": "fake-kube",
                "context": {
                    "cluster": "fake-kube",
                    "user": "fake-kube-user",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "fake-kube",
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


async def serve(
    kube: FakeKube, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve ``kube`` on ``host:port`` (0 picks a free port); returns the runner and base URL.

    Call ``await runner.cleanup()`` to stop it.
    """
    runner = web.AppRunner(kube.app, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{shown}:{bound_port}"


@contextlib.asynccontextmanager
async def running(kube: FakeKube, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``kube`` for the duration of an ``async with`` block, which receives the base URL."""
    runner, url = await serve(kube, host, port)
    try:
        yield url
    finally:
        await runner.cleanup()


# --- helpers: time, names, Status bodies ----------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp_precise(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _suffix(length: int = 5) -> str:
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(length))


@dataclasses.dataclass(frozen=True)
class _Kind:
    """A served resource type and the field selectors it supports."""

    resource: str
    kind: str
    group: str
    version: str
    field_labels: frozenset[str]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_resource(self) -> str:
        """``mpijobs.kubeflow.org`` or ``pods``, as Status messages name the resource."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def qualified_kind(self) -> str:
        """``MPIJob.kubeflow.org`` or ``ConfigMap``, as 422 messages name the kind."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


_META_LABELS = frozenset({"metadata.name", "metadata.namespace"})
MPIJOBS = _Kind("mpijobs", "MPIJob", "kubeflow.org", "v2beta1", _META_LABELS)
CONFIGMAPS = _Kind("configmaps", "ConfigMap", "", "v1", _META_LABELS)
PODS = _Kind(
    "pods",
    "Pod",
    "",
    "v1",
    _META_LABELS
    | {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName"}
    | {"status.phase", "status.podIP", "status.nominatedNodeName"},
)
EVENTS = _Kind(
    "events",
    "Event",
    "",
    "v1",
    _META_LABELS
    | {f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion")}
    | {"involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "type"},
)
_KINDS = {k.resource: k for k in (MPIJOBS, CONFIGMAPS, PODS, EVENTS)}


def _kind_named(name: str) -> _Kind:
    """The kind for a resource plural or Kind name, case-insensitive (``mpijobs``, ``Pod``)."""
    for kind in _KINDS.values():
        if name.lower() in (kind.resource, kind.kind.lower()):
            return kind
    raise KeyError(f"the stand-in serves no kind {name!r}")


def _status_body(code: int, reason: str, message: str, details: Json | None = None) -> Json:
    body: Json = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


class _ApiError(Exception):
    """A failure answer with a ``Status`` body; handlers raise it, the middleware sends it."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Json | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.body = _status_body(code, reason, message, details)
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        return web.json_response(self.body, status=self.code, headers=self.headers)


def _details(kind: _Kind, name: str) -> Json:
    details: Json = {"name": name}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.resource
    return details


def _bad_request(message: str) -> _ApiError:
    return _ApiError(400, "BadRequest", message)


class _PageNotFound(_ApiError):
    """What the API server answers for a path no API group serves (e.g. a CRD not installed):
    Go's plain-text ``404 page not found``, not a ``Status``."""

    def __init__(self) -> None:
        super().__init__(404, "NotFound", "404 page not found")

    def response(self) -> web.Response:
        return web.Response(status=404, text="404 page not found\n", content_type="text/plain")


def _no_such_resource() -> _ApiError:
    return _PageNotFound()


def _not_found(kind: _Kind, name: str) -> _ApiError:
    message = f'{kind.qualified_resource} "{name}" not found'
    return _ApiError(404, "NotFound", message, _details(kind, name))


def _invalid(kind: _Kind, name: str, causes: list[Json]) -> _ApiError:
    parts = [f"{c['field']}: {c['message']}" for c in causes]
    listed = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    message = f'{kind.qualified_kind} "{name}" is invalid: {listed}'
    return _ApiError(422, "Invalid", message, {**_details(kind, name), "causes": causes})


# Reasons and default messages of the codes a Fault may answer with.
_FAULT_ANSWERS: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    401: ("Unauthorized", "Unauthorized"),
    403: ("Forbidden", "forbidden"),
    404: ("NotFound", "the server could not find the requested resource"),
    409: ("Conflict", "the object has been modified; please apply your changes to the latest"),
    410: ("Gone", "the resource is gone"),
    422: ("Invalid", "the object is invalid"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: (
        "Timeout",
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
    ),
}


def _fault_error(fault: Fault, status: int) -> _ApiError:
    reason, default_message = _FAULT_ANSWERS.get(status, ("InternalError", "injected fault"))
    details: Json = {}
    headers: dict[str, str] = {}
    retry_after = (
        fault.retry_after if fault.retry_after is not None else (1 if status == 429 else 0)
    )
    if retry_after:
        details["retryAfterSeconds"] = retry_after
        headers["Retry-After"] = str(retry_after)
    return _ApiError(status, reason, fault.message or default_message, details or None, headers)


# --- helpers: request attributes --------------------------------------------------------------

_RESOURCE_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/(?P<namespace>[^/]+)/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<subresource>[^/]+))?)?$"
)


def _is_true(value: str | None) -> bool:
    """A query flag as Go's strconv.ParseBool reads it (kubernetes_asyncio sends ``True``)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _request_attributes(method: str, path: str, query: Mapping[str, str]) -> Json:
    """RBAC attributes of a request: verb, apiGroup, resource, subresource, namespace, name."""
    match = _RESOURCE_PATH.match(path)
    if match is None:
        empty = dict.fromkeys(("api_group", "resource", "subresource", "namespace", "name"), "")
        return {"verb": method.lower(), **empty}
    name = match["name"] or ""
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if verb is None and method == "DELETE":
        verb = "delete" if name else "deletecollection"
    if verb is None:
        verb = "get" if name else ("watch" if _is_true(query.get("watch")) else "list")
    return {
        "verb": verb,
        "api_group": match["group"] or "",
        "resource": match["resource"],
        "subresource": match["subresource"] or "",
        "namespace": match["namespace"],
        "name": name,
    }


# --- helpers: selectors -----------------------------------------------------------------------

_SELECTOR_PART = re.compile(
    r"^\s*(?:(?P<absent>!)\s*(?P<akey>[^\s!=,()]+)"
    r"|(?P<key>[^\s!=,()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s!=,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
)

_Predicate = Callable[[Json], bool]


def _labels_of(obj: Json) -> Mapping[str, str]:
    labels = obj.get("metadata", {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def _label_requirement(part: str) -> _Predicate:
    match = _SELECTOR_PART.match(part)
    if match is None:
        raise _bad_request(f"unable to parse requirement: found '{part.strip()}', expected: key")
    if match["absent"]:
        absent_key = match["akey"]
        return lambda obj: absent_key not in _labels_of(obj)
    key = match["key"]
    if match["op"]:
        value, negate = match["value"], match["op"] == "!="
        return lambda obj: (_labels_of(obj).get(key) == value) != negate
    if match["setop"]:
        values = {v.strip() for v in match["values"].split(",") if v.strip()}
        wanted = match["setop"] == "in"
        return lambda obj: (key in _labels_of(obj) and _labels_of(obj)[key] in values) == wanted
    return lambda obj: key in _labels_of(obj)


def _parse_label_selector(selector: str) -> list[_Predicate]:
    """Equality (``k=v``, ``k==v``, ``k!=v``), existence (``k``, ``!k``) and ``in``/``notin``."""
    parts = re.split(r",(?![^()]*\))", selector)
    return [_label_requirement(part) for part in parts if part.strip()]


def _dig(obj: Json, dotted: str) -> str:
    value: Any = obj
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _parse_field_selector(kind: _Kind, selector: str) -> list[_Predicate]:
    predicates: list[_Predicate] = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        match = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", part)
        if match is None:
            raise _bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        field, op, value = match.groups()
        if field not in kind.field_labels:
            raise _bad_request(f'"{field}" is not a known field selector: only "{kind.resource}"')
        negate = op == "!="
        predicates.append(functools.partial(_field_matches, field, value, negate))
    return predicates


def _field_matches(field: str, value: str, negate: bool, obj: Json) -> bool:
    return (_dig(obj, field) == value) != negate


# --- helpers: admission (schema, pruning, defaults, metadata rules) ---------------------------

_OBJECT_META_FIELDS = (
    *("name", "generateName", "namespace", "labels", "annotations", "ownerReferences"),
    *("finalizers", "uid", "resourceVersion", "generation", "creationTimestamp"),
    *("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"),
)
_OBJECT_META_SCHEMA: Json = {
    "type": "object",
    "properties": {field: {} for field in _OBJECT_META_FIELDS},
}
_CONFIGMAP_SCHEMA: Json = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": _OBJECT_META_SCHEMA,
        "data": {"type": "object", "additionalProperties": {"type": "string"}},
        "binaryData": {"type": "object", "additionalProperties": {"type": "string"}},
        "immutable": {"type": "boolean"},
    },
}

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    r"for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_NAME_PART_RULE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_RULE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  "
    "or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_ANNOTATIONS_MAX_BYTES = 256 * 1024


def _cause(reason: str, field: str, message: str) -> Json:
    return {"reason": reason, "message": message, "field": field}


def _invalid_value(field: str, value: Any, detail: str) -> Json:
    return _cause("FieldValueInvalid", field, f"Invalid value: {json.dumps(value)}: {detail}")


def _name_causes(name: str) -> list[Json]:
    if len(name) > 253:
        return [_invalid_value("metadata.name", name, "must be no more than 253 characters")]
    if not _DNS_SUBDOMAIN.fullmatch(name):
        return [_invalid_value("metadata.name", name, _SUBDOMAIN_RULE)]
    return []


def _key_causes(field: str, key: str) -> list[Json]:
    prefix, _, name = key.rpartition("/")
    causes = []
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        causes.append(_invalid_value(field, key, f"prefix part {_SUBDOMAIN_RULE}"))
    if len(name) > 63:
        causes.append(_invalid_value(field, key, "name part must be no more than 63 characters"))
    elif not _QUALIFIED_NAME.fullmatch(name):
        causes.append(_invalid_value(field, key, _NAME_PART_RULE))
    return causes


def _metadata_causes(meta: Json) -> list[Json]:
    """metadata.labels and metadata.annotations rules (apimachinery ValidateObjectMeta)."""
    causes: list[Json] = []
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        raise _bad_request("metadata.labels and metadata.annotations must be JSON objects")
    for key, value in labels.items():
        causes += _key_causes("metadata.labels", key)
        if not isinstance(value, str):
            causes.append(_invalid_value("metadata.labels", value, "must be a string"))
        elif len(value) > 63:
            causes.append(_invalid_value("metadata.labels", value, "must be no more than 63 chars"))
        elif not _LABEL_VALUE.fullmatch(value):
            causes.append(_invalid_value("metadata.labels", value, _LABEL_VALUE_RULE))
    for key in annotations:
        causes += _key_causes("metadata.annotations", key)
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > _ANNOTATIONS_MAX_BYTES:
        causes.append(
            _cause(
                "FieldValueTooLong",
                "metadata.annotations",
                f"Too long: must have at most {_ANNOTATIONS_MAX_BYTES} bytes",
            )
        )
    return causes


def _join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _normalize(value: Any, schema: Json, path: str, unknown: list[str]) -> None:
    """Prune unknown fields (listing their paths) and non-nullable nulls; fill in defaults.

    Works in place, like the API server's structural pruning and defaulting of a custom resource.
    """
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                for key in [k for k in value if k not in props]:
                    unknown.append(_join_path(path, key))
                    del value[key]
            for key in [k for k, v in value.items() if v is None]:
                if not props.get(key, {}).get("nullable"):
                    del value[key]  # null means "unset" unless the schema allows null
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    _normalize(value[key], sub, _join_path(path, key), unknown)
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                _normalize(item, schema["additionalProperties"], _join_path(path, key), unknown)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _normalize(item, schema["items"], _join_path(path, index), unknown)


def _json_type(value: Any) -> str:
    """The JSON type name of a decoded value, as schema errors name it."""
    names: tuple[tuple[type, str], ...] = (
        *((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")),
        *((list, "array"), (dict, "object")),
    )
    return next((name for python_type, name in names if isinstance(value, python_type)), "null")


def _schema_causes(error: SchemaError) -> list[Json]:
    """The Status causes for one jsonschema error, worded like the API server's."""
    field = ""
    for key in error.absolute_path:
        field = _join_path(field, key)
    expected: Any = error.validator_value
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [p for p in expected if p not in error.instance]
        return [
            _cause("FieldValueRequired", _join_path(field, p), "Required value") for p in missing
        ]
    if error.validator == "type":
        got = _json_type(error.instance)
        detail = f'{field} in body must be of type {expected}: "{got}"'
        return [_cause("FieldValueTypeInvalid", field, f'Invalid value: "{got}": {detail}')]
    if error.validator == "enum":
        supported = ", ".join(json.dumps(v) for v in expected)
        message = f"Unsupported value: {json.dumps(error.instance)}: supported values: {supported}"
        return [_cause("FieldValueNotSupported", field, message)]
    return [_invalid_value(field, error.instance, error.message)]


@functools.lru_cache(maxsize=4)
def _load_crd(path: str) -> tuple[Json, Validator]:
    """The v2beta1 openAPIV3Schema of the MPIJob CRD in ``path`` and a validator for it."""
    import jsonschema  # a test dependency, needed only when a CRD is given

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as fh:
        docs = [doc for doc in yaml.load_all(fh, Loader=loader) if isinstance(doc, dict)]
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc.get("kind") != "CustomResourceDefinition" or spec.get("group") != MPIJOBS.group:
            continue
        for version in spec.get("versions") or ():
            if version.get("name") == MPIJOBS.version:
                schema: Json = version["schema"]["openAPIV3Schema"]
                return schema, jsonschema.Draft7Validator(schema)
    raise ValueError(f"{path}: no kubeflow.org/{MPIJOBS.version} CustomResourceDefinition")


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _json_patch(target: Json, operations: list[Any]) -> Json:
    """RFC 6902 JSON patch with the add, remove, replace and test operations."""
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise _bad_request(f"the server rejected our request: invalid JSON patch op {op!r}")
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        if not keys:
            raise _bad_request("the server rejected our request: JSON patch of the root")
        parent: Any = doc
        try:
            for key in keys[:-1]:
                parent = parent[int(key)] if isinstance(parent, list) else parent[key]
            last: Any = keys[-1]
            if isinstance(parent, list):
                last = len(parent) if last == "-" else int(last)
            kind = op.get("op")
            if kind == "add" and isinstance(parent, list):
                parent.insert(last, copy.deepcopy(op.get("value")))
            elif kind in ("add", "replace"):
                if kind == "replace" and isinstance(parent, dict) and last not in parent:
                    raise KeyError(last)
                parent[last] = copy.deepcopy(op.get("value"))
            elif kind == "remove":
                del parent[last]
            elif kind == "test":
                if parent[last] != op.get("value"):
                    raise _ApiError(422, "Invalid", f"testing value {op['path']} failed")
            else:
                raise _bad_request(f"the server rejected our request: unsupported op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as err:
            message = f"the server rejected our request: {op['path']}: {err!r}"
            raise _ApiError(422, "Invalid", message) from err
    return doc


# --- internal state types ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Change:
    """One stored change: the resourceVersion it made and a snapshot of the object."""

    rv: int
    kind: _Kind
    type: str
    obj: Json


@dataclasses.dataclass(eq=False)
class _Watcher:
    kind: _Kind
    accepts: _Predicate
    queue: asyncio.Queue[_Change | None]


@dataclasses.dataclass(eq=False)
class _Run:
    """The simulated operator's work on one MPIJob."""

    scenario: Scenario
    task: asyncio.Task[None] | None = None
    created: bool = False
    resumed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


@dataclasses.dataclass(frozen=True)
class _LogLine:
    at: datetime
    text: str


# --- the server -------------------------------------------------------------------------------


class FakeKube:
    """A stand-in Kubernetes API server plus a simulated mpi-operator (see the module docstring).

    Public attributes may be changed at any time: ``namespaces``, ``crd_installed``, ``token``,
    ``quota_exceeded`` (the text after "exceeded quota: " of a 403 on MPIJob create),
    ``scenario_for`` (picks the :class:`Scenario` of each created MPIJob), ``foreground_delay``
    (seconds a Foreground-deleted MPIJob lingers after its dependents are gone),
    ``bookmark_interval`` (seconds between BOOKMARK events of an idle watch that asked for them),
    ``history_limit`` (changes kept for watches that resume from a resourceVersion) and ``user``
    (named in 403 messages). ``requests`` records every request.
    """

    def __init__(
        self,
        *,
        namespaces: Iterable[str] = ("default",),
        crd_schema_path: str | Path | None = None,
        crd_installed: bool = True,
        token: str | None = None,
        scenario_for: Callable[[Json], Scenario] | None = None,
        foreground_delay: float = 0.05,
    ) -> None:
        self.namespaces = set(namespaces)
        self.crd_installed = crd_installed
        self.token = token
        self.quota_exceeded: str | None = None
        self.scenario_for: Callable[[Json], Scenario] = scenario_for or self._scenario_by_name
        self.default_scenario = Scenario()
        self.foreground_delay = foreground_delay
        self.bookmark_interval = 1.0
        self.history_limit = 10_000
        first_namespace = min(self.namespaces) if self.namespaces else "default"
        self.user = f"system:serviceaccount:{first_namespace}:oms-mpijob-proxy"
        self.requests: list[RecordedRequest] = []

        self._schema: Json | None = None
        self._validator: Validator | None = None
        if crd_schema_path is not None:
            self._schema, self._validator = _load_crd(str(Path(crd_schema_path).resolve()))
        self._scenarios: dict[str, Scenario] = {}
        self._store: dict[str, dict[tuple[str, str], Json]] = {k: {} for k in _KINDS}
        self._logs: dict[tuple[str, str, str], list[_LogLine]] = {}
        self._rv = 0
        self._history: deque[_Change] = deque()
        self._compacted_rv = 0
        self._watchers: set[_Watcher] = set()
        self._streams: set[asyncio.BaseTransport] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._runs: dict[tuple[str, str], _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._forbidden: set[tuple[str, str]] = set()
        self._faults: list[Fault] = []
        self._down = False
        self._pod_ips = 0
        self._last_event_ns = 0
        self._app = self._make_app()

    # -- public API ------------------------------------------------------------------------------

    @property
    def app(self) -> web.Application:
        """The aiohttp application; serve it once (:func:`serve`, :func:`running`, a TestServer)."""
        return self._app

    def set_scenario(self, scenario: Scenario, name: str | None = None) -> None:
        """Use ``scenario`` for the MPIJob called ``name``, or for all others if ``name`` is None.

        Only has an effect while ``scenario_for`` is the default.
        """
        if name is None:
            self.default_scenario = scenario
        else:
            self._scenarios[name] = scenario

    def forbid(self, verb: str, resource: str) -> None:
        """Answer 403 to ``verb`` (``"*"``: any) on ``resource`` (``"mpijobs"``, ``"pods/log"``)."""
        self._forbidden.add((verb, resource))

    def add_fault(self, fault: Fault) -> None:
        """Queue ``fault``; the first queued fault that matches a request applies to it."""
        self._faults.append(fault)

    def down(self) -> None:
        """Drop every connection (open streams now, new requests as they come) until :meth:`up`."""
        self._down = True
        for transport in list(self._streams):
            transport.close()
        self._wake_streams()

    def up(self) -> None:
        """Answer requests again after :meth:`down`."""
        self._down = False

    def compact(self) -> None:
        """Forget the change history, so watches from any older resourceVersion get 410 Expired."""
        self._history.clear()
        self._compacted_rv = self._rv

    def rbac_verbs(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource[/subresource], verb) of every recorded resource request."""
        return {
            (r.api_group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource, r.verb)
            for r in self.requests
            if r.resource
        }

    def get_object(self, kind: str, namespace: str, name: str) -> Json | None:
        """A copy of a stored object; ``kind`` is a plural or a Kind (``"pods"``, ``"MPIJob"``)."""
        obj = self._store[_kind_named(kind).resource].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: str, namespace: str | None = None) -> list[Json]:
        """Copies of the stored objects of ``kind``, by namespace and name."""
        store = self._store[_kind_named(kind).resource]
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(store.items())
            if namespace is None or ns == namespace
        ]

    def launcher_log(self, name: str, namespace: str = "default") -> str:
        """The log of the first container of MPIJob ``name``'s launcher pod ("" if none)."""
        for pod in self._pods_of_job(namespace, name, role="launcher"):
            container = pod["spec"]["containers"][0]["name"]
            lines = self._logs.get((namespace, pod["metadata"]["name"], container), [])
            return "".join(f"{line.text}\n" for line in lines)
        return ""

    async def wait_until(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        """Wait until ``predicate()`` holds; it is re-checked after every change of state.

        Raises TimeoutError after ``within`` seconds.
        """
        async with asyncio.timeout(within):
            while not predicate():
                await self._wake.wait()

    # -- state changes -----------------------------------------------------------------------------

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def _record_change(self, kind: _Kind, change_type: str, obj: Json) -> None:
        change = _Change(self._rv, kind, change_type, copy.deepcopy(obj))
        self._history.append(change)
        while len(self._history) > self.history_limit:
            self._compacted_rv = self._history.popleft().rv
        for watcher in self._watchers:
            if watcher.kind is kind:
                watcher.queue.put_nowait(change)
        self._notify()

    def _put(self, kind: _Kind, obj: Json, change_type: str) -> None:
        """Store ``obj`` (new or changed) with the next resourceVersion and tell the watchers."""
        self._rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        self._store[kind.resource][(meta["namespace"], meta["name"])] = obj
        self._record_change(kind, change_type, obj)

    def _remove(self, kind: _Kind, namespace: str, name: str) -> Json:
        obj = self._store[kind.resource].pop((namespace, name))
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if kind is PODS:
            for key in [k for k in self._logs if k[:2] == (namespace, name)]:
                del self._logs[key]
        if kind is MPIJOBS:
            self._stop_operator((namespace, name))
        self._record_change(kind, "DELETED", obj)
        return obj

    def _stamp(self, obj: Json, namespace: str) -> None:
        meta = obj["metadata"]
        meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1

    def _dependents(self, namespace: str, owner_uid: str) -> Iterator[tuple[_Kind, Json]]:
        for kind in _KINDS.values():
            for (ns, _), obj in list(self._store[kind.resource].items()):
                refs = obj["metadata"].get("ownerReferences") or ()
                if ns == namespace and any(ref.get("uid") == owner_uid for ref in refs):
                    yield kind, obj

    def _cascade(self, namespace: str, owner_uid: str) -> None:
        """Delete every object owned by ``owner_uid``, and theirs, as the garbage collector does."""
        for kind, obj in list(self._dependents(namespace, owner_uid)):
            key = (namespace, obj["metadata"]["name"])
            if key in self._store[kind.resource]:
                removed = self._remove(kind, *key)
                self._cascade(namespace, removed["metadata"]["uid"])

    def _orphan(self, namespace: str, owner_uid: str) -> None:
        for kind, obj in list(self._dependents(namespace, owner_uid)):
            refs = obj["metadata"]["ownerReferences"]
            obj["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
            self._put(kind, obj, "MODIFIED")

    # -- application and middleware ----------------------------------------------------------------

    def _make_app(self) -> web.Application:
        @web.middleware
        async def kube_api(request: web.Request, handler: _Handler) -> web.StreamResponse:
            return await self._dispatch(request, handler)

        app = web.Application(middlewares=[kube_api])
        router = app.router
        router.add_get("/version", self._version)
        router.add_get("/version/", self._version)  # as VersionApi asks
        router.add_get("/apis/kubeflow.org/v2beta1", self._guard(MPIJOBS, self._discovery))
        for kind in _KINDS.values():
            prefix = f"/apis/{kind.api_version}" if kind.group else "/api/v1"
            base = f"{prefix}/namespaces/{{namespace}}/{kind.resource}"
            router.add_get(base, self._guard(kind, functools.partial(self._list, kind)))
            item = self._guard(kind, functools.partial(self._get, kind))
            router.add_get(base + "/{name}", item)
            if kind in (MPIJOBS, CONFIGMAPS):
                router.add_post(base, self._guard(kind, functools.partial(self._create, kind)))
                delete = self._guard(kind, functools.partial(self._delete, kind))
                router.add_delete(base + "/{name}", delete)
            if kind is MPIJOBS:
                router.add_get(base + "/{name}/status", item)
                router.add_patch(base + "/{name}", self._guard(kind, self._patch))
            if kind is PODS:
                router.add_get(base + "/{name}/log", self._guard(kind, self._pod_log))
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def _guard(self, kind: _Kind, handler: _Handler) -> _Handler:
        """``handler``, answering 404 for MPIJob paths while the CRD is not installed."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            if kind is MPIJOBS and not self.crd_installed:
                raise _no_such_resource()
            return await handler(request)

        return guarded

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing = True
        self._wake_streams()

    async def _on_cleanup(self, app: web.Application) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _wake_streams(self) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._notify()

    async def _record(self, request: web.Request) -> RecordedRequest:
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        query = dict(request.query)
        self._notify()
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            query=query,
            body=body,
            user_agent=request.headers.get("User-Agent", ""),
            **_request_attributes(request.method, request.path, query),
        )
        self.requests.append(recorded)
        return recorded

    def _take_fault(self, request: RecordedRequest) -> Fault | None:
        for fault in self._faults:
            if fault.matches(request):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    @staticmethod
    def _drop(request: web.Request) -> web.Response:
        """Close the connection; the response returned is never sent."""
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)

    def _authorize(self, request: RecordedRequest) -> None:
        resource = request.resource
        full = f"{resource}/{request.subresource}" if request.subresource else resource
        if not ({(request.verb, full), ("*", full)} & self._forbidden):
            return
        kind = _KINDS.get(resource)
        qualified = kind.qualified_resource if kind else resource
        target = f'{qualified} "{request.name}"' if request.name else qualified
        message = (
            f'{target} is forbidden: User "{self.user}" cannot {request.verb} resource "{full}" '
            f'in API group "{request.api_group}" in the namespace "{request.namespace}"'
        )
        details: Json = {"name": request.name} if request.name else {}
        if request.api_group:
            details["group"] = request.api_group
        details["kind"] = resource
        raise _ApiError(403, "Forbidden", message, details)

    async def _dispatch(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        recorded = await self._record(request)
        if self._down:
            return self._drop(request)
        fault: Fault | None = None
        try:
            bearer = request.headers.get("Authorization")
            if self.token is not None and bearer != f"Bearer {self.token}":
                raise _ApiError(401, "Unauthorized", "Unauthorized")
            fault = self._take_fault(recorded)
            if fault is not None:
                await asyncio.sleep(fault.delay)
                if fault.drop_before:
                    return self._drop(request)
                if fault.status is not None:
                    raise _fault_error(fault, fault.status)
            if recorded.resource:
                self._authorize(recorded)
            response = await handler(request)
        except _ApiError as err:
            return err.response()
        except web.HTTPNotFound:
            return _no_such_resource().response()
        except web.HTTPMethodNotAllowed:
            message = "the server does not allow this method on the requested resource"
            return _ApiError(405, "MethodNotAllowed", message, {}).response()
        if fault is not None and fault.drop_after:
            return self._drop(request)
        return response

    # -- request helpers ---------------------------------------------------------------------------

    def _require_namespace(self, namespace: str) -> None:
        if namespace not in self.namespaces:
            message = f'namespaces "{namespace}" not found'
            raise _ApiError(404, "NotFound", message, {"name": namespace, "kind": "namespaces"})

    @staticmethod
    async def _json_body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise _bad_request(f"couldn't get version/kind; json parse error: {err}") from err

    @staticmethod
    def _dry_run(request: web.Request) -> bool:
        value = request.query.get("dryRun")
        if value not in (None, "All"):
            raise _bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
        return value == "All"

    @staticmethod
    def _field_validation(request: web.Request) -> str:
        value = request.query.get("fieldValidation", "Warn")
        if value not in ("Strict", "Warn", "Ignore"):
            raise _bad_request(
                f"fieldValidation must be one of Ignore, Warn, or Strict, got {value!r}"
            )
        return value

    def _lookup(self, kind: _Kind, namespace: str, name: str) -> Json:
        obj = self._store[kind.resource].get((namespace, name))
        if obj is None:
            raise _not_found(kind, name)
        return obj

    def _admit(self, kind: _Kind, namespace: str, body: Any, validation: str) -> list[str]:
        """Check and normalise a new or patched object in place; returns Warning texts."""
        if not isinstance(body, dict):
            raise _bad_request(f"the body of a {kind.kind} must be a JSON object")
        if kind.group and not (body.get("kind") and body.get("apiVersion")):
            raise _bad_request(f"Object 'Kind' is missing in '{json.dumps(body)[:200]}'")
        if body.setdefault("apiVersion", kind.api_version) != kind.api_version:
            raise _bad_request(
                f"the API version in the data ({body['apiVersion']}) does not match the expected "
                f"API version ({kind.api_version})"
            )
        if body.setdefault("kind", kind.kind) != kind.kind:
            raise _bad_request(
                f"the kind in the data ({body['kind']}) does not match the expected kind "
                f"({kind.kind})"
            )
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _bad_request("metadata must be a JSON object")
        if meta.get("namespace") not in (None, "", namespace):
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        meta.pop("managedFields", None)  # the server keeps its own

        unknown: list[str] = []
        schema = self._schema if kind is MPIJOBS else _CONFIGMAP_SCHEMA
        if schema is not None:
            pruning = {**schema, "properties": {**schema["properties"]}}
            pruning["properties"]["metadata"] = _OBJECT_META_SCHEMA
            _normalize(body, pruning, "", unknown)
        if unknown and validation == "Strict":
            listed = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise _bad_request(f"strict decoding error: {listed}")

        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["name"] = f"{meta['generateName']}{_suffix()}"
        causes = (
            _name_causes(name)
            if name
            else [
                _cause(
                    "FieldValueRequired",
                    "metadata.name",
                    "Required value: name or generateName is required",
                )
            ]
        )
        causes += _metadata_causes(meta)
        if kind is MPIJOBS and self._validator is not None:
            for error in self._validator.iter_errors(body):
                causes += [c for c in _schema_causes(error) if c not in causes]
        if causes:
            raise _invalid(kind, name, sorted(causes, key=lambda c: str(c["field"])))
        return [f'unknown field "{path}"' for path in unknown] if validation == "Warn" else []

    @staticmethod
    def _json(body: Json, status: int = 200, warnings: Iterable[str] = ()) -> web.Response:
        response = web.json_response(body, status=status)
        for warning in warnings:
            response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        return response

    def _filter(self, kind: _Kind, namespace: str, query: Mapping[str, str]) -> _Predicate:
        predicates = _parse_label_selector(query.get("labelSelector", ""))
        predicates += _parse_field_selector(kind, query.get("fieldSelector", ""))

        def accepts(obj: Json) -> bool:
            return obj["metadata"]["namespace"] == namespace and all(p(obj) for p in predicates)

        return accepts

    # -- handlers --------------------------------------------------------------------------------

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "major": "1",
                "minor": "31",
                "gitVersion": "v1.31.0",
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2024-08-13T07:28:49Z",
                "goVersion": "go1.22.5",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def _discovery(self, request: web.Request) -> web.Response:
        verbs = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
        resource = {"name": "mpijobs", "singularName": "mpijob", "namespaced": True}
        status = {"name": "mpijobs/status", "singularName": "", "namespaced": True}
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": MPIJOBS.api_version,
                "resources": [
                    resource | {"kind": "MPIJob", "verbs": verbs},
                    status | {"kind": "MPIJob", "verbs": ["get", "patch", "update"]},
                ],
            }
        )

    async def _create(self, kind: _Kind, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        dry_run = self._dry_run(request)
        validation = self._field_validation(request)
        body = await self._json_body(request)
        self._require_namespace(namespace)
        meta = body.get("metadata") if isinstance(body, dict) else None
        if isinstance(meta, dict) and meta.get("resourceVersion"):
            raise _bad_request("resourceVersion should not be set on objects to be created")
        warnings = self._admit(kind, namespace, body, validation)
        name = body["metadata"]["name"]
        if kind is MPIJOBS and self.quota_exceeded is not None:
            message = (
                f'{kind.qualified_resource} "{name}" is forbidden: '
                f"exceeded quota: {self.quota_exceeded}"
            )
            raise _ApiError(403, "Forbidden", message, _details(kind, name))
        if (namespace, name) in self._store[kind.resource]:
            message = f'{kind.qualified_resource} "{name}" already exists'
            raise _ApiError(409, "AlreadyExists", message, _details(kind, name))
        scenario: Scenario | None = None
        if kind is MPIJOBS:
            body.pop("status", None)  # the status subresource ignores it
            scenario = self.scenario_for(body)
            if scenario.kind == "suspended":  # Kueue's webhook queues the job
                body.setdefault("spec", {}).setdefault("runPolicy", {})["suspend"] = True
        self._stamp(body, namespace)
        if not dry_run:
            self._put(kind, body, "ADDED")
            if scenario is not None and scenario.kind != "no-operator":
                self._start_operator(namespace, name, scenario)
        return self._json(body, 201, warnings)

    async def _get(self, kind: _Kind, request: web.Request) -> web.Response:
        info = request.match_info
        return web.json_response(self._lookup(kind, info["namespace"], info["name"]))

    async def _list(self, kind: _Kind, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        accepts = self._filter(kind, namespace, request.query)
        if _is_true(request.query.get("watch")):
            return await self._watch(kind, accepts, request)
        items = []
        for obj in (o for _, o in sorted(self._store[kind.resource].items()) if accepts(o)):
            item = copy.deepcopy(obj)
            if not kind.group:  # core lists leave kind and apiVersion off their items
                del item["kind"], item["apiVersion"]
            items.append(item)
        return web.json_response(
            {
                "apiVersion": kind.api_version,
                "kind": f"{kind.kind}List",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    async def _watch(
        self, kind: _Kind, accepts: _Predicate, request: web.Request
    ) -> web.StreamResponse:
        query = request.query
        try:
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
            since = int(query.get("resourceVersion") or 0)
        except ValueError as err:
            raise _bad_request(f"invalid watch parameter: {err}") from err
        bookmarks = _is_true(query.get("allowWatchBookmarks"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if 0 < since < self._compacted_rv:
            message = f"too old resource version: {since} ({self._compacted_rv + 1})"
            await response.prepare(request)
            await response.write(_event_line("ERROR", _status_body(410, "Expired", message)))
            return response
        # From here to the first await, nothing may change, or the watcher would miss it.
        if since == 0:
            store = self._store[kind.resource]
            initial = [
                _Change(self._rv, kind, "ADDED", copy.deepcopy(o)) for _, o in sorted(store.items())
            ]
        else:
            initial = [c for c in self._history if c.rv > since and c.kind is kind]
        watcher = _Watcher(kind, accepts, asyncio.Queue())
        for change in initial:
            watcher.queue.put_nowait(change)
        self._watchers.add(watcher)
        transport = request.transport
        if transport is not None:
            self._streams.add(transport)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            await response.prepare(request)
            await self._pump(watcher, request, response, deadline, bookmarks)
        except ConnectionError:
            _LOGGER.debug("watch client of %s went away", kind.resource)
        finally:
            self._watchers.discard(watcher)
            if transport is not None:
                self._streams.discard(transport)
        return response

    async def _pump(
        self,
        watcher: _Watcher,
        request: web.Request,
        response: web.StreamResponse,
        deadline: float | None,
        bookmarks: bool,
    ) -> None:
        """Send a watcher's changes until its deadline, shutdown, down() or the client leaves."""
        loop = asyncio.get_running_loop()
        last_sent = loop.time()
        while not self._closing and not self._down:
            if request.transport is None or request.transport.is_closing():
                return
            wait = _IDLE_CHECK_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    return
            try:
                change = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                if bookmarks and loop.time() - last_sent >= self.bookmark_interval:
                    kind = watcher.kind
                    meta = {"resourceVersion": str(self._rv)}
                    bookmark = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta}
                    await response.write(_event_line("BOOKMARK", bookmark))
                    last_sent = loop.time()
                continue
            if change is None:
                return
            if watcher.accepts(change.obj):
                await response.write(_event_line(change.type, change.obj))
                last_sent = loop.time()

    async def _delete(self, kind: _Kind, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        dry_run = self._dry_run(request)
        options = await self._json_body(request)
        options = options if isinstance(options, dict) else {}
        policy = request.query.get("propagationPolicy") or options.get("propagationPolicy")
        if policy is None:
            orphan = request.query.get("orphanDependents", options.get("orphanDependents"))
            policy = "Orphan" if _is_true(str(orphan)) else "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            message = (
                f'propagationPolicy: Unsupported value: "{policy}": supported values: '
                '"Foreground", "Background", "Orphan"'
            )
            raise _ApiError(422, "Invalid", message, {"causes": []})
        obj = self._lookup(kind, namespace, name)
        meta = obj["metadata"]
        success: Json = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {**_details(kind, name), "uid": meta["uid"]},
        }
        if dry_run:
            return web.json_response(obj if policy == "Foreground" else success)
        if meta.get("deletionTimestamp"):
            return web.json_response(obj)
        if policy == "Foreground":
            meta["deletionTimestamp"] = _now()
            meta["deletionGracePeriodSeconds"] = 0
            meta["finalizers"] = [*meta.get("finalizers", []), "foregroundDeletion"]
            if kind is MPIJOBS:
                self._stop_operator((namespace, name))  # the operator ignores terminating jobs
            self._put(kind, obj, "MODIFIED")
            self._spawn(self._finish_foreground(kind, namespace, name, meta["uid"]))
            return web.json_response(obj)
        self._remove(kind, namespace, name)
        if policy == "Background":
            self._cascade(namespace, meta["uid"])
        else:
            self._orphan(namespace, meta["uid"])
        return web.json_response(success)

    async def _finish_foreground(self, kind: _Kind, namespace: str, name: str, uid: str) -> None:
        self._cascade(namespace, uid)
        await asyncio.sleep(self.foreground_delay)
        obj = self._store[kind.resource].get((namespace, name))
        if obj is not None and obj["metadata"]["uid"] == uid:
            obj["metadata"]["finalizers"].remove("foregroundDeletion")
            self._remove(kind, namespace, name)

    async def _patch(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        dry_run = self._dry_run(request)
        validation = self._field_validation(request)
        patch = await self._json_body(request)
        current = self._lookup(MPIJOBS, namespace, name)
        content_type = request.content_type
        if content_type == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise _bad_request("a merge patch must be a JSON object")
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
                # A resourceVersion in the patch is a precondition, as on a real API server.
                message = (
                    f'Operation cannot be fulfilled on {MPIJOBS.qualified_resource} "{name}": '
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again"
                )
                raise _ApiError(409, "Conflict", message, _details(MPIJOBS, name))
            patched = _merge_patch(copy.deepcopy(current), patch)
        elif content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise _bad_request(
                    f"json: cannot unmarshal {_json_type(patch)} into Go value of type "
                    "[]handlers.jsonPatchOp"
                )
            patched = _json_patch(current, patch)
        else:
            raise _ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        meta = patched.setdefault("metadata", {})
        if meta.get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
            message = (
                f'Operation cannot be fulfilled on {MPIJOBS.qualified_resource} "{name}": the '
                "object has been modified; please apply your changes to the latest version and "
                "try again"
            )
            raise _ApiError(409, "Conflict", message, _details(MPIJOBS, name))
        for field in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            meta[field] = current["metadata"][field]
        meta.pop("resourceVersion", None)
        if "status" in current:
            patched["status"] = copy.deepcopy(current["status"])  # a status subresource
        else:
            patched.pop("status", None)
        warnings = self._admit(MPIJOBS, namespace, patched, validation)
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if patched == current or dry_run:
            return self._json(patched if dry_run else current, 200, warnings)
        if patched.get("spec") != current.get("spec"):
            meta["generation"] += 1
        was_suspended = _suspend_requested(current)
        self._put(MPIJOBS, patched, "MODIFIED")
        if _suspend_requested(patched) != was_suspended:
            self._on_suspend_change((namespace, name), _suspend_requested(patched))
        return self._json(patched, 200, warnings)

    async def _pod_log(self, request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        query = request.query
        pod = self._lookup(PODS, namespace, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container") or ""
        if not container:
            if len(names) != 1:
                raise _bad_request(
                    f"a container name must be specified for pod {name}, "
                    f"choose one of: [{' '.join(names)}]"
                )
            container = names[0]
        if container not in names:
            raise _bad_request(f"container {container} is not valid for pod {name}")
        if not pod["spec"].get("nodeName"):
            # No node, no kubelet to ask: the API server streams nothing (204 No Content).
            return web.Response(status=204)
        if _is_true(query.get("previous")):
            raise _bad_request(
                f'previous terminated container "{container}" in pod "{name}" not found'
            )
        waiting = _container_state(pod, container).get("waiting")
        if waiting is not None:
            reason = waiting.get("reason", "")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                reason = "trying and failing to pull image"
            raise _bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        try:
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
            tail = int(query["tailLines"]) if "tailLines" in query else None
            since = int(query["sinceSeconds"]) if "sinceSeconds" in query else None
        except ValueError as err:
            raise _bad_request(f"invalid log option: {err}") from err
        key = (namespace, name, container)
        lines = list(self._logs.get(key, []))
        if since is not None:
            cutoff = datetime.now(UTC) - timedelta(seconds=since)
            lines = [line for line in lines if line.at >= cutoff]
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        timestamps = _is_true(query.get("timestamps"))

        def render(chunk: Iterable[_LogLine]) -> bytes:
            return "".join(
                f"{_stamp_precise(line.at)} {line.text}\n" if timestamps else f"{line.text}\n"
                for line in chunk
            ).encode()

        if not _is_true(query.get("follow")):
            data = render(lines)
            return web.Response(
                body=data[:limit] if limit is not None else data, content_type="text/plain"
            )
        return await self._follow_log(request, key, render(lines), render, limit)

    async def _follow_log(
        self,
        request: web.Request,
        key: tuple[str, str, str],
        first: bytes,
        render: Callable[[Iterable[_LogLine]], bytes],
        limit: int | None,
    ) -> web.StreamResponse:
        """Stream a container's log until the container ends, shutdown, down() or ``limit``."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        transport = request.transport
        if transport is not None:
            self._streams.add(transport)
        budget = limit if limit is not None else -1
        sent = len(self._logs.get(key, []))

        async def send(data: bytes) -> bool:
            nonlocal budget
            if budget >= 0:
                data, budget = data[:budget], budget - min(budget, len(data))
            if data:
                await response.write(data)
            return budget != 0

        try:
            await response.prepare(request)
            more = await send(first)
            while more and not self._closing and not self._down:
                lines = self._logs.get(key, [])
                if len(lines) > sent:
                    more = await send(render(lines[sent:]))
                    sent = len(lines)
                    continue
                pod = self._store["pods"].get(key[:2])
                if pod is None or "terminated" in _container_state(pod, key[2]):
                    break
                if request.transport is None or request.transport.is_closing():
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_IDLE_CHECK_SECONDS):
                        await self._wake.wait()
        except ConnectionError:
            _LOGGER.debug("log follower of %s/%s went away", *key[:2])
        finally:
            if transport is not None:
                self._streams.discard(transport)
        return response

    # -- the simulated operator ------------------------------------------------------------------

    def _scenario_by_name(self, job: Json) -> Scenario:
        return self._scenarios.get(job["metadata"]["name"], self.default_scenario)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _LOGGER.error("stand-in background task failed", exc_info=task.exception())

    def _start_operator(self, namespace: str, name: str, scenario: Scenario) -> None:
        run = _Run(scenario)
        self._runs[(namespace, name)] = run
        run.task = self._spawn(self._operate((namespace, name), run))

    def _stop_operator(self, key: tuple[str, str]) -> None:
        run = self._runs.pop(key, None)
        if run is not None and run.task is not None:
            run.task.cancel()

    def _on_suspend_change(self, key: tuple[str, str], suspend: bool) -> None:
        run = self._runs.get(key)
        job = self._store["mpijobs"][key]
        if run is None or _finished(job):
            return
        if not suspend:
            run.resumed.set()
            return
        if run.task is not None:
            run.task.cancel()
        self._delete_pods(job)
        run.task = self._spawn(self._operate(key, run))

    def _job(self, key: tuple[str, str]) -> Json:
        return self._store["mpijobs"][key]

    def _set_condition(self, job: Json, type_: str, status: str, reason: str, message: str) -> None:
        conditions = job.setdefault("status", {}).setdefault("conditions", [])
        now = _now()
        for condition in conditions:
            if condition["type"] == type_:
                if condition["status"] != status:
                    condition["lastTransitionTime"] = now
                condition.update(status=status, reason=reason, message=message, lastUpdateTime=now)
                return
        conditions.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            }
        )

    def _event(
        self,
        obj: Json,
        type_: str,
        reason: str,
        message: str,
        component: str = "mpi-job-controller",
    ) -> None:
        meta = obj["metadata"]
        now = _now()
        event: Json = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{self._event_clock():x}"},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": "",
        }
        if component == "default-scheduler":
            # The scheduler records through events.k8s.io/v1: seen through core/v1, such an
            # Event has only eventTime (microseconds), no source, timestamps or count.
            event.update(
                source={},
                firstTimestamp=None,
                lastTimestamp=None,
                count=None,
                eventTime=_stamp_precise(datetime.now(UTC)),
                action="Binding" if reason == "Scheduled" else "Scheduling",
                reportingInstance="default-scheduler-standin",
            )
        self._stamp(event, meta["namespace"])
        self._put(EVENTS, event, "ADDED")

    def _event_clock(self) -> int:
        """Nanoseconds for Event names, strictly increasing so names sort as events happened."""
        self._last_event_ns = max(time.time_ns(), self._last_event_ns + 1)
        return self._last_event_ns

    def _job_event(self, job: Json, type_: str, reason: str, text: str) -> None:
        meta = job["metadata"]
        self._event(job, type_, reason, f"MPIJob {meta['namespace']}/{meta['name']} {text}")

    async def _operate(self, key: tuple[str, str], run: _Run) -> None:
        """Drive one MPIJob through its scenario, as the operator, scheduler and kubelet would."""
        scenario = run.scenario
        if not run.created:
            await asyncio.sleep(scenario.created_after)
            job = self._job(key)
            problems = _operator_problems(job)
            if problems:  # the operator only reports this, as an Event (mpijob.md section 1)
                text = f"Found validation errors: [{', '.join(problems)}]"
                self._event(job, "Warning", "ValidationError", text)
                return
            message = f"MPIJob {key[0]}/{key[1]} is created."
            self._set_condition(job, "Created", "True", "MPIJobCreated", message)
            self._put(MPIJOBS, job, "MODIFIED")
            self._job_event(job, "Normal", "MPIJobCreated", "is created.")
            self._create_hostfile(job)
            run.created = True
        await self._while_suspended(key, run)
        job = self._job(key)
        launcher = self._create_pod(job, "launcher")
        workers = [self._create_pod(job, "worker", i) for i in range(_worker_replicas(job))]
        pods = [launcher, *workers]
        if scenario.kind == "unschedulable":
            for pod in pods:
                self._unschedulable(pod)
            return
        for index, pod in enumerate(pods):
            self._schedule(pod, index)
        if scenario.kind == "image-pull":
            for pod in pods:
                self._image_pull_backoff(pod)
            return
        await asyncio.sleep(scenario.running_after)
        for pod in pods:
            self._start_pod(pod)
        job = self._job(key)
        status = job.setdefault("status", {})
        status["startTime"] = _now()
        status["replicaStatuses"] = {"Launcher": {"active": 1}}
        if workers:
            status["replicaStatuses"]["Worker"] = {"active": len(workers)}
        self._set_condition(
            job, "Running", "True", "MPIJobRunning", f"MPIJob {key[0]}/{key[1]} is running."
        )
        self._put(MPIJOBS, job, "MODIFIED")
        self._job_event(job, "Normal", "MPIJobRunning", "is running")
        container = launcher["spec"]["containers"][0]["name"]
        for text in scenario.log_lines:
            await asyncio.sleep(scenario.line_interval)
            log_key = (key[0], launcher["metadata"]["name"], container)
            self._logs.setdefault(log_key, []).append(_LogLine(datetime.now(UTC), text))
            self._notify()
        failed = scenario.kind == "fail"
        self._finish(key, launcher, workers, scenario.exit_code if failed else None)

    async def _while_suspended(self, key: tuple[str, str], run: _Run) -> None:
        suspended = False
        while _suspend_requested(self._job(key)):
            job = self._job(key)
            if not _condition_true(job, "Suspended"):
                text = f"MPIJob {key[0]}/{key[1]} is suspended."
                if _condition_true(job, "Running"):
                    self._set_condition(job, "Running", "False", "MPIJobSuspended", text)
                self._set_condition(job, "Suspended", "True", "MPIJobSuspended", text)
                job.get("status", {}).pop("startTime", None)
                self._put(MPIJOBS, job, "MODIFIED")
                self._job_event(job, "Normal", "MPIJobSuspended", "is suspended.")
            suspended = True
            run.resumed.clear()
            await run.resumed.wait()
        if suspended:
            job = self._job(key)
            text = f"MPIJob {key[0]}/{key[1]} is resumed."
            self._set_condition(job, "Suspended", "False", "MPIJobResumed", text)
            self._put(MPIJOBS, job, "MODIFIED")
            self._job_event(job, "Normal", "MPIJobResumed", "is resumed.")

    def _finish(
        self, key: tuple[str, str], launcher: Json, workers: list[Json], exit_code: int | None
    ) -> None:
        """End the job: succeeded if ``exit_code`` is None, else failed with that exit code."""
        failed = exit_code is not None
        now = _now()
        container = launcher["spec"]["containers"][0]
        state = launcher["status"]["containerStatuses"][0]
        terminated: Json = {
            "exitCode": exit_code or 0,
            "reason": "Error" if failed else "Completed",
            "startedAt": state["state"]["running"]["startedAt"],
            "finishedAt": now,
            "containerID": state["containerID"],
        }
        if failed and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            log_key = (key[0], launcher["metadata"]["name"], container["name"])
            tail = "".join(f"{line.text}\n" for line in self._logs.get(log_key, [])[-80:])
            terminated["message"] = tail[-2048:]
        state.update(ready=False, started=False, state={"terminated": terminated})
        launcher["status"]["phase"] = "Failed" if failed else "Succeeded"
        for condition in launcher["status"]["conditions"]:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition.update(status="False", reason="PodFailed" if failed else "PodCompleted")
        self._put(PODS, launcher, "MODIFIED")

        job = self._job(key)
        status = job["status"]
        status["completionTime"] = now
        status["replicaStatuses"]["Launcher"] = {"failed": 1} if failed else {"succeeded": 1}
        if failed:
            reason, text = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            self._set_condition(job, "Failed", "True", reason, text)
        else:
            reason, text = "MPIJobSucceeded", f"MPIJob {key[0]}/{key[1]} successfully completed."
            self._set_condition(job, "Succeeded", "True", reason, text)
        for condition in status["conditions"]:  # as the operator does: only the status flips
            if condition["type"] == "Running":
                condition["status"] = "False"
        policy = job["spec"].get("runPolicy", {}).get("cleanPodPolicy", "None")
        if workers and policy in ("Running", "All"):
            status["replicaStatuses"]["Worker"] = {}
            for worker in workers:
                self._remove(PODS, key[0], worker["metadata"]["name"])
        self._put(MPIJOBS, job, "MODIFIED")
        if failed:
            self._event(job, "Warning", reason, text)
        else:
            self._job_event(job, "Normal", reason, "successfully completed.")

    def _create_hostfile(self, job: Json) -> None:
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        slots = job["spec"].get("slotsPerWorker", 1)
        hosts = "".join(
            f"{name}-worker-{i}.{name}.{ns}.svc slots={slots}\n"
            for i in range(_worker_replicas(job))
        )
        config_map: Json = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{name}-config",
                "labels": {"app": name},
                "ownerReferences": [_owner_reference(job)],
            },
            "data": {"hostfile": hosts},
        }
        if (ns, f"{name}-config") not in self._store["configmaps"]:
            self._stamp(config_map, ns)
            self._put(CONFIGMAPS, config_map, "ADDED")

    def _create_pod(self, job: Json, role: str, index: int = 0) -> Json:
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        replica = job["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
        template = copy.deepcopy(replica.get("template") or {})
        template_meta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        labels = {**template_meta.get("labels", {}), _OPERATOR_NAME: "mpi-operator"}
        labels |= {_JOB_NAME: name, _JOB_ROLE: role}
        if role == "worker":
            pod_name = f"{name}-worker-{index}"
            labels[_REPLICA_INDEX] = str(index)
            spec |= {"hostname": pod_name, "subdomain": name}
        else:
            pod_name = f"{name}-launcher-{_suffix()}"
        default_restart = "OnFailure" if role == "launcher" else "Never"
        spec["restartPolicy"] = replica.get("restartPolicy") or default_restart
        containers = spec.get("containers") or []
        if containers:
            env = containers[0].setdefault("env", [])
            env.append({"name": "K_MPI_JOB_ROLE", "value": role})
        pod: Json = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": labels,
                "annotations": template_meta.get("annotations", {}),
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": []},
        }
        self._stamp(pod, ns)
        self._put(PODS, pod, "ADDED")
        return pod

    def _container_statuses(self, pod: Json, state: Json, ready: bool) -> list[Json]:
        return [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                "state": copy.deepcopy(state),
            }
            for c in pod["spec"].get("containers", [])
        ]

    def _unschedulable(self, pod: Json) -> None:
        message = "0/3 nodes are available: 3 Insufficient cpu."
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        condition |= {"message": message, "lastTransitionTime": _now()}
        pod["status"]["conditions"] = [condition]
        self._put(PODS, pod, "MODIFIED")
        self._event(pod, "Warning", "FailedScheduling", message, "default-scheduler")

    def _schedule(self, pod: Json, index: int) -> None:
        node = f"fake-node-{index % 3}"
        pod["spec"]["nodeName"] = node
        now = _now()
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
        ]
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        pod["status"]["containerStatuses"] = self._container_statuses(pod, waiting, False)
        self._put(PODS, pod, "MODIFIED")
        meta = pod["metadata"]
        text = f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"
        self._event(pod, "Normal", "Scheduled", text, "default-scheduler")

    def _image_pull_backoff(self, pod: Json) -> None:
        image = pod["spec"]["containers"][0].get("image", "")
        back_off = f'Back-off pulling image "{image}"'
        waiting = {"waiting": {"reason": "ImagePullBackOff", "message": back_off}}
        pod["status"]["containerStatuses"] = self._container_statuses(pod, waiting, False)
        self._put(PODS, pod, "MODIFIED")
        pull_error = (
            f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and '
            f'unpack image "{image}": not found'
        )
        self._event(pod, "Warning", "Failed", pull_error, "kubelet")
        self._event(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet")
        self._event(pod, "Warning", "BackOff", back_off, "kubelet")

    def _start_pod(self, pod: Json) -> None:
        now = _now()
        self._pod_ips += 1
        status = pod["status"]
        status |= {"phase": "Running", "startTime": now, "hostIP": "10.0.0.1"}
        status["podIP"] = f"10.244.{self._pod_ips // 250}.{self._pod_ips % 250 + 2}"
        status["conditions"] = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        running = {"running": {"startedAt": now}}
        status["containerStatuses"] = self._container_statuses(pod, running, True)
        for container_status in status["containerStatuses"]:
            container_status["containerID"] = f"containerd://{secrets.token_hex(32)}"
        self._put(PODS, pod, "MODIFIED")
        self._event(pod, "Normal", "Started", "Started container", "kubelet")

    def _pods_of_job(self, namespace: str, name: str, role: str | None = None) -> list[Json]:
        return [
            pod
            for (ns, _), pod in sorted(self._store["pods"].items())
            if ns == namespace
            and _labels_of(pod).get(_JOB_NAME) == name
            and role in (None, _labels_of(pod).get(_JOB_ROLE))
        ]

    def _delete_pods(self, job: Json) -> None:
        meta = job["metadata"]
        for kind, obj in list(self._dependents(meta["namespace"], meta["uid"])):
            if kind is PODS:
                self._remove(PODS, meta["namespace"], obj["metadata"]["name"])


# --- small pure helpers about objects -----------------------------------------------------------


def _event_line(change_type: str, obj: Json) -> bytes:
    return json.dumps({"type": change_type, "object": obj}).encode() + b"\n"


def _owner_reference(owner: Json) -> Json:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _container_state(pod: Json, container: str) -> Json:
    for status in pod.get("status", {}).get("containerStatuses", []):
        if status["name"] == container:
            state: Json = status.get("state", {})
            return state
    return {"waiting": {"reason": "ContainerCreating"}}


def _operator_problems(job: Json) -> list[str]:
    """What the operator's own validation rejects (pkg/apis/kubeflow/validation), abridged."""
    specs = job.get("spec", {}).get("mpiReplicaSpecs")
    specs = specs if isinstance(specs, dict) else {}
    problems = []
    launcher = specs.get("Launcher")
    if not isinstance(launcher, dict):
        problems.append("spec.mpiReplicaSpecs[Launcher]: Required value: must have Launcher")
    else:
        if launcher.get("replicas", 1) != 1:
            replicas = launcher.get("replicas")
            problems.append(
                f"spec.mpiReplicaSpecs[Launcher].replicas: Invalid value: {replicas}: must be 1"
            )
        if not ((launcher.get("template") or {}).get("spec") or {}).get("containers"):
            problems.append(
                "spec.mpiReplicaSpecs[Launcher].template.spec.containers: Required value: "
                "must define at least one container"
            )
    worker = specs.get("Worker")
    if isinstance(worker, dict) and not (
        isinstance(worker.get("replicas"), int) and worker["replicas"] >= 1
    ):
        problems.append(
            f"spec.mpiReplicaSpecs[Worker].replicas: Invalid value: {worker.get('replicas', 0)}: "
            "must be greater than or equal to 1"
        )
    for role, spec in specs.items():
        policy = spec.get("restartPolicy") if isinstance(spec, dict) else None
        if policy not in (None, "Never", "OnFailure"):
            problems.append(
                f'spec.mpiReplicaSpecs[{role}].restartPolicy: Unsupported value: "{policy}": '
                'supported values: "Never", "OnFailure"'
            )
    last_worker = f"{job['metadata']['name']}-worker-{max(_worker_replicas(job) - 1, 0)}"
    if len(last_worker) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", last_worker):
        problems.append(
            f'metadata.name: Invalid value: "{job["metadata"]["name"]}": will not able to create '
            "pod and service with invalid DNS label"
        )
    return problems


def _worker_replicas(job: Json) -> int:
    worker = (job.get("spec", {}).get("mpiReplicaSpecs") or {}).get("Worker") or {}
    replicas = worker.get("replicas", 0) if isinstance(worker, dict) else 0
    return replicas if isinstance(replicas, int) else 0


def _suspend_requested(job: Json) -> bool:
    return bool((job.get("spec", {}).get("runPolicy") or {}).get("suspend"))


def _condition_true(job: Json, type_: str) -> bool:
    conditions = job.get("status", {}).get("conditions", [])
    return any(c["type"] == type_ and c["status"] == "True" for c in conditions)


def _finished(job: Json) -> bool:
    return _condition_true(job, "Succeeded") or _condition_true(job, "Failed")
