"""The application factory: routes, typed app keys, and the lifecycle of the shared clients.

``cleanup_ctx`` owns the clients, which live as long as the app: the pass-through's pooled
client to oms (:class:`proxy.passthrough.client.Upstream`), one aiohttp ``ClientSession`` to oms
for the proxy's own calls (model lookups, ``/readyz``, run state) and, when runs are intercepted,
one kubernetes_asyncio ``ApiClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from proxy.accesslog import JsonAccessLogger, JsonAccessLoggerWithHealth, install_log_filters
from proxy.clients.kube import KUBE, KubeClient, load_api_client
from proxy.clients.oms import OMS, OmsClient
from proxy.clientside import ProxyRunner
from proxy.config import Config
from proxy.errors import ERROR_KEY, BadRequest, Handler, ProxyError, error_middleware
from proxy.follow.cache import RUN_CACHE
from proxy.follow.handlers import (
    handle_run_log,
    handle_run_status,
    handle_run_status_last,
    handle_run_stop,
    handle_service_job,
    handle_service_state,
    run_cache_context,
)
from proxy.keys import CONFIG, METRICS, REQUEST_ID_KEY, STATE
from proxy.metrics import Metrics, submission_outcome
from proxy.passthrough import headers as hdr
from proxy.passthrough.client import Upstream
from proxy.passthrough.forward import UPSTREAM, forward
from proxy.routes import HEALTH_ROUTES, ROUTES
from proxy.routes import bind as bind_routes
from proxy.submit.handler import (
    INTERCEPTED,
    SUBMITTER,
    TEMPLATE,
    Submitter,
    dry_run,
    handle_submit,
)
from proxy.submit.template import load_template

_LOGGER = logging.getLogger(__name__)

_MAX_REQUEST_ID = 128

# After an answer given before the request body was read (413, 408, 415...), aiohttp reads and
# discards what the client still sends for at most this long before closing, so that the client
# sees the answer rather than a connection reset.
LINGER_SECONDS = 2.0


def server_options(config: Config) -> dict[str, Any]:
    """Keyword arguments for aiohttp's server (``web.run_app``, ``AppRunner``, ``TestServer``).

    aiohttp's keep-alive timer runs from the moment a connection opens and from each answer
    until a request's head is complete, so it also bounds a client dribbling its headers.
    """
    return {
        "keepalive_timeout": config.server.client_header_timeout_seconds,
        "max_line_size": config.server.max_request_target_bytes,
        "max_field_size": config.server.max_header_bytes,
        "max_headers": config.server.max_headers,
        "lingering_time": LINGER_SECONDS,
        "access_log_class": (
            JsonAccessLoggerWithHealth if config.server.access_log_health else JsonAccessLogger
        ),
    }


async def start_site(
    app: web.Application, config: Config, host: str, port: int, **options: Any
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host``:``port`` (0: any free port) with the options of ``serve``.

    ``options`` add to or replace aiohttp's server options (``access_log=None``: none).
    Returns the runner (``await runner.cleanup()`` to stop) and the port it listens on.
    """
    runner = ProxyRunner(
        app,
        handle_signals=False,
        shutdown_timeout=config.server.shutdown_grace_seconds,
        **(server_options(config) | options),
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound: int = runner.addresses[0][1]
    return runner, bound


async def serve_until_signalled(app: web.Application, config: Config) -> None:
    """Serve ``app`` on ``server.host``:``server.port`` until SIGTERM or SIGINT, then shut down.

    The runner's signal handlers raise ``web.GracefulExit`` out of the event loop; the caller
    then cancels this coroutine, whose ``finally`` stops accepting and gives the requests in
    flight ``server.shutdown_grace_seconds`` (``web.run_app`` does the same, but cannot serve
    through :class:`proxy.clientside.ProxyRunner`).
    """
    runner = ProxyRunner(
        app,
        handle_signals=True,
        shutdown_timeout=config.server.shutdown_grace_seconds,
        **server_options(config),
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, config.server.host, config.server.port).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _request_id(incoming: str | None) -> str:
    """The client's X-Request-ID if it is sane, else a new one."""
    if incoming and len(incoming) <= _MAX_REQUEST_ID and incoming.isprintable():
        return incoming
    return os.urandom(16).hex()  # as random as uuid4().hex, at a fraction of its cost


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request an id and count it (the errors are answered by error_middleware)."""
    request[REQUEST_ID_KEY] = _request_id(request.headers.get(hdr.REQUEST_ID))
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        if ERROR_KEY in request:
            response.headers[hdr.REQUEST_ID] = request[REQUEST_ID_KEY]
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        _count(request, status, time.perf_counter() - start, request.get(ERROR_KEY))


@web.middleware
async def http1_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse anything but HTTP/1.x: aiohttp's parser takes "GET /x" (0.9) with headers."""
    if request.version.major != 1:
        raise BadRequest("Unsupported HTTP version: HTTP/1.0 or HTTP/1.1 expected")
    return await handler(request)


_ROUTE_CLASS = {r.name: r.route_class for r in ROUTES + HEALTH_ROUTES}


def _count(request: web.Request, status: int, seconds: float, error: ProxyError | None) -> None:
    """Request metrics: route class, status, duration; submission outcome (metrics.py)."""
    metrics = request.app[METRICS]
    route_class = _ROUTE_CLASS.get(request.match_info.route.name or "", "passthrough")
    metrics.count_request(route_class, status, seconds)
    if route_class == "run_submit" and request.get(INTERCEPTED):
        metrics.submissions.labels(submission_outcome(status, error)).inc()


def _phase_counts(app: web.Application) -> dict[str, int]:
    cache = app.get(RUN_CACHE)
    return cache.phase_counts() if cache is not None else {}


async def metrics_handler(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    return web.Response(
        body=request.app[METRICS].render(),
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any request the proxy does not answer itself goes to oms unchanged."""
    return await forward(request)


async def healthz(request: web.Request) -> web.Response:
    """The process is alive (cheap: no I/O)."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """oms answers (and, when runs are intercepted, the Kubernetes API)."""
    app = request.app
    checks: dict[str, str] = {"oms": await app[OMS].ready()}
    kube = app[KUBE]
    if kube is not None:
        try:
            await kube.list_mpijobs("app.kubernetes.io/managed-by=oms-mpijob-proxy-readyz")
            checks["kubernetes"] = "ok"
        except ProxyError as e:
            checks["kubernetes"] = e.message
        dry = app[STATE].get("dry_run")
        if dry is not None:
            checks["dry_run"] = dry
    ok = all(v == "ok" for v in checks.values())
    return web.json_response(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503
    )


async def _clients(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=config.oms.connect_timeout_seconds,
        sock_connect=config.oms.connect_timeout_seconds,
        sock_read=config.oms.first_byte_timeout_seconds,
    )
    connector = aiohttp.TCPConnector(
        limit=config.oms.max_connections, limit_per_host=0, enable_cleanup_closed=False
    )
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        read_bufsize=config.server.read_chunk_bytes,
    )
    app[OMS] = oms = OmsClient(session, config.oms.url)
    upstream = Upstream(
        config.oms.url,
        connect_timeout=config.oms.connect_timeout_seconds,
        read_timeout=config.oms.first_byte_timeout_seconds,
        max_connections=config.oms.max_connections,
        chunk=config.server.read_chunk_bytes,
        max_head_bytes=config.oms.max_answer_head_bytes,
        max_headers=config.oms.max_answer_headers,
    )
    app[UPSTREAM] = upstream
    kube: KubeClient | None = None
    if config.runs.intercept != "none":
        durations = app[METRICS].kube_duration
        kube = KubeClient(
            await load_api_client(config.kubernetes.kubeconfig),
            config,
            observe=lambda op, seconds: durations.labels(op).observe(seconds),
        )
    app[KUBE] = kube
    app[SUBMITTER] = None
    dry_run_task: asyncio.Task[None] | None = None
    if kube is not None:
        submitter = Submitter(
            config=config,
            template=app[TEMPLATE],
            kube=kube,
            oms=oms,
            on_created=lambda job: _note_created(app, job),
            stamp_known=lambda stamp: _stamp_known(app, stamp),
        )
        app[SUBMITTER] = submitter
        if config.kubernetes.dry_run_on_start:
            dry_run_task = asyncio.create_task(_start_up_dry_run(app, submitter))
    try:
        yield
    finally:
        if dry_run_task is not None:
            dry_run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dry_run_task
        if (started := app[SUBMITTER]) is not None:
            await started.close()
        await upstream.close()
        await session.close()
        if kube is not None:
            await kube.close()


def _note_created(app: web.Application, job: dict[str, Any]) -> None:
    """Let the run cache know an MPIJob the submit path just created.

    Pollers that ask right after ``POST /api/run`` then find the run even before the watch
    event arrives (otherwise they are passed to oms, which answers an empty page).
    """
    cache = app.get(RUN_CACHE)
    if cache is not None:
        cache.note_created(job)


def _stamp_known(app: web.Application, stamp: str) -> bool:
    """Whether ``stamp`` names a run the run cache knows (a new stamp must not)."""
    cache = app.get(RUN_CACHE)
    return cache is not None and cache.knows_stamp(stamp)


async def _start_up_dry_run(app: web.Application, submitter: Submitter) -> None:
    """Create a representative MPIJob with dryRun=All: a missing CRD, namespace or RBAC shows."""
    app[STATE]["dry_run"] = "pending"
    result = await dry_run(submitter)
    app[STATE]["dry_run"] = result
    if result == "ok":
        _LOGGER.info("start-up dry-run of an MPIJob create: ok")
    else:
        _LOGGER.error("start-up dry-run of an MPIJob create failed: %s", result)


_gc_frozen = False


async def _freeze_gc(app: web.Application) -> None:
    """Once per process, after start-up: collect, then put every live object out of GC's reach.

    What is alive now (imported modules, kubernetes_asyncio's models, the config) lives for the
    whole process, yet each full collection would walk it all again: about 20 ms per collection,
    which showed as the p99 latency under load. ``gc.freeze`` keeps those objects out of later
    collections; reference counting still frees them as usual.
    """
    global _gc_frozen
    if not _gc_frozen:
        _gc_frozen = True
        gc.collect()
        gc.freeze()


def create_app(config: Config) -> web.Application:
    """Build the proxy application for ``config``."""
    install_log_filters()
    app = web.Application(
        middlewares=[request_context, error_middleware, http1_only],
        client_max_size=config.runs.max_body_bytes,
    )
    app[CONFIG] = config
    app[METRICS] = metrics = Metrics()
    metrics.phases.source = lambda: _phase_counts(app)
    app[STATE] = {}
    if config.runs.intercept != "none":
        app[TEMPLATE] = load_template(config.template_path())
    app.cleanup_ctx.append(_clients)
    if config.runs.intercept != "none":
        app.cleanup_ctx.append(run_cache_context)  # after _clients: it needs app[KUBE]
    else:
        app[RUN_CACHE] = None
    app.on_startup.append(_freeze_gc)
    _bind_routes(app)
    return app


def _bind_routes(app: web.Application) -> None:
    """Every route the proxy answers itself and its handler, in one table; the rest to oms.

    :func:`proxy.routes.bind` refuses a route of ``routes.ROUTES`` without a handler here (and a
    handler without a route), so the app cannot start with a gap. The follow handlers pass a
    stamp they do not know (and everything, with runs not intercepted) on to oms.
    """
    bind_routes(
        app.router,
        {
            "run_submit": handle_submit,
            "run_log": handle_run_log,
            "run_stop": handle_run_stop,
            "run_status": handle_run_status,
            "run_status_list": handle_run_status,
            "run_status_last": handle_run_status_last,
            "service_state": handle_service_state,
            "service_job_active": handle_service_job,
            "service_job_queue": handle_service_job,
            "service_job_history": handle_service_job,
            "healthz": healthz,
            "readyz": readyz,
            "metrics": metrics_handler,
        },
    )
    app.router.add_route("*", r"/{tail:[\s\S]*}", passthrough)  # any path, %0A included
