"""Stand-in Kubernetes API server with a simulated MPI operator, for tests, the demo and benchmarks.

:class:`FakeKube` is an aiohttp application that speaks enough of the real Kubernetes REST protocol
(JSON bodies, ``Status`` errors, list and watch with resource versions) for the real
``kubernetes_asyncio`` client (``CustomObjectsApi``, ``CoreV1Api``, ``watch.Watch``) to run against
it over plain HTTP. All state is in memory; use one instance per test.

What it emulates:

- ``kubeflow.org/v2beta1`` ``mpijobs``: create (with ``dryRun=All``), get, ``/status`` get, list,
  watch, merge or JSON patch, and delete with Background, Foreground or Orphan propagation and an
  owner-reference cascade; finalizers as the API server has them (a deleted object with
  finalizers stays, with ``deletionTimestamp``, until a patch removes the last one, and only then
  are its dependents deleted; none may be added while it terminates). Core ``configmaps``
  (create, get, list, watch, delete), ``pods`` (get, list, watch, ``/log`` with ``follow``),
  ``events``, ``services`` and ``secrets`` and ``batch/v1`` ``jobs`` (get, list, watch).
  ``/version`` (v1.35.4) and the ``kubeflow.org/v2beta1`` discovery document.
- Watches as from the watch cache: BOOKMARKs (when asked for) 2 s before ``timeoutSeconds``
  ends and then every ``bookmark_interval`` (one minute), with the newest resourceVersion of
  the watched kind.
- Admission of an MPIJob as the API server does it: the CRD's OpenAPI schema (when a CRD file is
  given; needs ``jsonschema``) with pruning, defaulting and ``fieldValidation`` Strict, Warn (a
  ``Warning`` header) or Ignore; metadata name, label and annotation rules; quota
  (``quota_exceeded``); optimistic concurrency (409 Conflict) on patch; the 1 MiB limit of a
  ConfigMap's data (422).
- RBAC as far as the proxy meets it: ``token`` (or none) is an administrator;
  :meth:`FakeKube.grant` adds a ServiceAccount token bound to one namespace, which gets the
  real 403 in any other namespace, existing or not; :meth:`FakeKube.forbid` denies a verb.
- Errors as real ``Status`` bodies: 400, 401 (``token``), 403 (RBAC, quota),
  404 (object, namespace, missing CRD), 405, 409, 410 (watch), 415, 422, and programmed faults
  (:class:`Fault`): 429 with ``Retry-After``, 5xx, delays and dropped connections.
- The mpi-operator in outline (shared/reference/mpijob.md sections 1, 2 and 4): its own validation
  (a ``ValidationError`` Event and nothing else), conditions and Events, the ``<name>-config``
  ConfigMap, the headless Service and the ``<name>-ssh`` Secret, worker pods, and the launcher
  as mpi-operator v0.8 makes it: a batch/v1 Job ``<name>-launcher`` (backoffLimit, TTL and
  deadline from runPolicy) whose job-controller creates the pod ``<name>-launcher-xxxxx`` and
  records ``SuccessfulCreate``, ``Completed`` / ``BackoffLimitExceeded``, ``Suspended`` and
  ``Resumed`` Events on the Job; the TTL-after-finished controller deletes the finished Job.
  The scheduler's FailedScheduling texts are kube-scheduler v1.35's, and pod conditions carry
  ``observedGeneration``. A launcher log grows line by line; cleanPodPolicy, suspend and
  resume. Each job's course is a :class:`Scenario`.
- A record of every request with its RBAC attributes (:attr:`FakeKube.requests`,
  :meth:`FakeKube.rbac_verbs`), so tests can derive the Role the proxy needs.

What it does not emulate:

- TLS, authentication other than bearer tokens, Roles and RoleBindings as objects.
- PUT (update), server-side apply, strategic merge patch, ``deletecollection``, list pagination
  (``limit``/``continue``), ``resourceVersionMatch``, duplicate-field detection, Table output.
- A launcher pod is never restarted (no ``previous`` log) and carries no
  ``batch.kubernetes.io/job-tracking`` finalizer. The Failed reason is plain
  ``BackoffLimitExceeded`` (the real one may carry a ``/<pod reason>`` suffix). Garbage collection
  is immediate rather than eventual. Jobs, Services and Secrets cannot be created, patched or
  deleted through the API.
- Watches filter on an object's current state, so an object that stops matching a label selector
  is not reported as DELETED. There is no namespaces API, only the ``namespaces`` set. As on a
  real server, an administrator listing a missing namespace gets an empty list, while creating
  in one answers 404.
"""

from __future__ import annotations

from standins.kube.rest import FakeKube, find_crd, running, serve, write_kubeconfig
from standins.kube.store import (
    CONFIGMAPS,
    DEFAULT_LOG_LINES,
    ENV_CRD,
    EVENTS,
    JOBS,
    MPIJOBS,
    OPERATOR_LABELS,
    PODS,
    SCHEMA_CRD,
    SECRETS,
    SERVICES,
    Fault,
    RecordedRequest,
    Scenario,
    ScenarioKind,
)

__all__ = [
    "CONFIGMAPS",
    "DEFAULT_LOG_LINES",
    "ENV_CRD",
    "EVENTS",
    "JOBS",
    "MPIJOBS",
    "OPERATOR_LABELS",
    "PODS",
    "SCHEMA_CRD",
    "SECRETS",
    "SERVICES",
    "FakeKube",
    "Fault",
    "RecordedRequest",
    "Scenario",
    "ScenarioKind",
    "find_crd",
    "running",
    "serve",
    "write_kubeconfig",
]
