"""The routes the proxy answers itself — one list, used by the app, the CLI and the k8s overlay.

Everything else is passed through to oms. ``oms-mpijob-proxy routes`` prints this list; the
"routes-only" overlays in ``k8s/`` (Istio, ingress-nginx, Gateway API) are generated from it by
:mod:`proxy.frontdoors` (a test checks they stay equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True)
class Route:
    """One route the proxy handles: method, aiohttp path pattern and an RE2 regex for Istio."""

    name: str
    method: str
    path: str
    regex: str
    route_class: str
    doc: str


_SEG = "[^/]+"

ROUTES: tuple[Route, ...] = (
    Route(
        "run_submit",
        "POST",
        "/api/run",
        "^/api/run/?$",
        "run_submit",
        "MPI runs become MPIJobs; other runs pass through to oms byte-for-byte.",
    ),
    Route(
        "run_log",
        "GET",
        "/api/run/log/model/{model}/stamp/{stamp}{paging:(/.*)?}",
        f"^/api/run/log/model/{_SEG}/stamp/{_SEG}(/.*)?$",
        "run_log",
        "Log pages of launched runs; other runs pass through.",
    ),
    Route(
        "run_stop",
        "PUT",
        "/api/run/stop/model/{model}/stamp/{stamp}",
        f"^/api/run/stop/model/{_SEG}/stamp/{_SEG}/?$",
        "run_stop",
        "Stop deletes the run's MPIJob; other runs pass through.",
    ),
    Route(
        "run_status",
        "GET",
        "/api/model/{model}/run/{stamp}/status",
        f"^/api/model/{_SEG}/run/{_SEG}/status/?$",
        "run_status",
        "Run status, answered for launched runs oms does not know yet.",
    ),
    Route(
        "run_status_list",
        "GET",
        "/api/model/{model}/run/{stamp}/status/list",
        f"^/api/model/{_SEG}/run/{_SEG}/status/list/?$",
        "run_status",
        "Run status list, answered for launched runs oms does not know yet.",
    ),
    Route(
        "run_status_last",
        "GET",
        "/api/model/{model}/run/status/last",
        f"^/api/model/{_SEG}/run/status/last/?$",
        "run_status",
        "Latest run status, answered when the newest run is a launched one.",
    ),
    Route(
        "service_state",
        "GET",
        "/api/service/state",
        "^/api/service/state/?$",
        "service_state",
        "oms's service state with the launched MPIJob runs in its queue, active jobs, history.",
    ),
    Route(
        "service_job_active",
        "GET",
        "/api/service/job/active/{stamp}",
        f"^/api/service/job/active/{_SEG}/?$",
        "service_state",
        "Active job details of launched runs; others pass through.",
    ),
    Route(
        "service_job_queue",
        "GET",
        "/api/service/job/queue/{stamp}",
        f"^/api/service/job/queue/{_SEG}/?$",
        "service_state",
        "Queued job details of launched runs (suspended MPIJobs); others pass through.",
    ),
    Route(
        "service_job_history",
        "GET",
        "/api/service/job/history/{stamp}",
        f"^/api/service/job/history/{_SEG}/?$",
        "service_state",
        "History job details of finished launched runs; others pass through.",
    ),
)

HEALTH_ROUTES: tuple[Route, ...] = (
    Route("healthz", "GET", "/healthz", "^/healthz$", "health", "The process is alive."),
    Route("readyz", "GET", "/readyz", "^/readyz$", "health", "oms and Kubernetes API reachable."),
    Route("metrics", "GET", "/metrics", "^/metrics$", "health", "Prometheus metrics."),
)


_HEAD_TOO = frozenset({"healthz", "readyz"})
"""Routes that answer HEAD as well (probes may use it)."""


def bind(router: web.UrlDispatcher, handlers: Mapping[str, Handler]) -> None:
    """Bind every route of :data:`ROUTES` and :data:`HEALTH_ROUTES` to its handler, by name.

    A route without a handler, or a handler without a route, stops start-up (``RuntimeError``
    naming them): the list that the CLI prints and the Istio overlay copies is exactly what
    the app answers.
    """
    routes = ROUTES + HEALTH_ROUTES
    missing = [r.name for r in routes if r.name not in handlers]
    unknown = sorted(set(handlers) - {r.name for r in routes})
    if missing or unknown:
        raise RuntimeError(
            f"routes without a handler: {missing}; handlers without a route: {unknown}"
        )
    for r in routes:
        if r.name in _HEAD_TOO:
            router.add_get(r.path, handlers[r.name], allow_head=True, name=r.name)
        else:
            router.add_route(r.method, r.path, handlers[r.name], name=r.name)
