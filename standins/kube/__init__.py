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
  (create, get, list, watch, delete), ``pods`` (get, list, watch, ``/log`` with ``follow``) and
  ``events`` (get, list, watch). ``/version`` and the ``kubeflow.org/v2beta1`` discovery
  document.
- Admission of an MPIJob as the API server does it: the CRD's OpenAPI schema (when a CRD file is
  given; needs ``jsonschema``) with pruning, defaulting and ``fieldValidation`` Strict, Warn (a
  ``Warning`` header) or Ignore; metadata name, label and annotation rules; quota
  (``quota_exceeded``); optimistic concurrency (409 Conflict) on patch; the 1 MiB limit of a
  ConfigMap's data (422).
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

from standins.kube.rest import FakeKube, find_crd, running, serve, write_kubeconfig
from standins.kube.store import (
    CONFIGMAPS,
    DEFAULT_LOG_LINES,
    ENV_CRD,
    EVENTS,
    MPIJOBS,
    OPERATOR_LABELS,
    PODS,
    SCHEMA_CRD,
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
    "MPIJOBS",
    "OPERATOR_LABELS",
    "PODS",
    "SCHEMA_CRD",
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
