"""The stand-in's vocabulary and its object store.

Kinds, Status bodies and errors, the public value types (:class:`Scenario`, :class:`Fault`,
:class:`RecordedRequest`), and :class:`Store`: the objects, their resourceVersions and the watch
history, which the REST side (:mod:`standins.kube.rest`) and the simulated operator
(:mod:`standins.kube.operator`) both change.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import secrets
import uuid
from collections import deque
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

_LOGGER = logging.getLogger(__name__)

Json = dict[str, Any]
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Predicate = Callable[[Json], bool]

ENV_CRD = "OMS_MPIJOB_PROXY_CRD"
"""Environment variable naming the MPIJob CRD file, for :func:`find_crd`."""

SCHEMA_CRD = Path(__file__).resolve().parents[1] / "schemas" / "mpijob-v2beta1.yaml"
"""The MPIJob CRD kept in the repository (see ``standins/schemas/README.md`` for its provenance)."""

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
JOBS = _Kind("jobs", "Job", "batch", "v1", _META_LABELS | {"status.successful"})
SERVICES = _Kind("services", "Service", "", "v1", _META_LABELS)
SECRETS = _Kind("secrets", "Secret", "", "v1", _META_LABELS | {"type"})
_KINDS = {k.resource: k for k in (MPIJOBS, CONFIGMAPS, PODS, EVENTS, JOBS, SERVICES, SECRETS)}


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


# --- the store ------------------------------------------------------------------------------


class Store:
    """Everything the stand-in knows; no HTTP here (see :class:`standins.kube.FakeKube`)."""

    def __init__(
        self,
        *,
        namespaces: Iterable[str] = ("default",),
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
        self.bookmark_interval = 60.0
        self.history_limit = 10_000
        first_namespace = min(self.namespaces) if self.namespaces else "default"
        self.user = f"system:serviceaccount:{first_namespace}:oms-mpijob-proxy"
        self.requests: list[RecordedRequest] = []

        self._schema: Json | None = None
        self._validator: Validator | None = None
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
        # Objects deleted while they had finalizers: the propagation to apply once they are gone.
        self._pending_deletes: dict[tuple[str, str, str], str] = {}
        self._last_event_ns = 0

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

    def _finalize(self, kind: _Kind, namespace: str, name: str) -> None:
        """Remove a terminating object whose last finalizer went, then propagate its deletion."""
        obj = self._store[kind.resource].get((namespace, name))
        if obj is None or not obj["metadata"].get("deletionTimestamp"):
            return
        if obj["metadata"].get("finalizers"):
            return
        policy = self._pending_deletes.pop((kind.resource, namespace, name), "Background")
        removed = self._remove(kind, namespace, name)
        if policy == "Background":
            self._cascade(namespace, removed["metadata"]["uid"])
        elif policy == "Orphan":
            self._orphan(namespace, removed["metadata"]["uid"])

    def _orphan(self, namespace: str, owner_uid: str) -> None:
        for kind, obj in list(self._dependents(namespace, owner_uid)):
            refs = obj["metadata"]["ownerReferences"]
            obj["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
            self._put(kind, obj, "MODIFIED")

    # -- background tasks -----------------------------------------------------------------------

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

    def _stop_operator(self, key: tuple[str, str]) -> None:
        """Stop simulating the operator for MPIJob ``key`` (the operator overrides this)."""
