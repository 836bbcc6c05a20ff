"""The routes the proxy answers for its launched runs: log pages, progress, stop, jobs page.

A stamp the run cache does not know is passed to oms unchanged, so oms's own runs are answered
by oms. The answers' shapes are built in :mod:`proxy.follow.omsshapes`.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from aiohttp import web

from proxy.clients.kube import KUBE
from proxy.clients.oms import oms_get
from proxy.errors import (
    BadRequest,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.follow.cache import RUN_CACHE, RunCache
from proxy.follow.omsshapes import (
    PagingError,
    history_job,
    job_details,
    log_page,
    parse_go_int,
    progress_item,
    run_job,
    run_pub,
)
from proxy.follow.runinfo import format_time
from proxy.follow.view import (
    FINAL_PHASES,
)
from proxy.keys import CONFIG, request_id
from proxy.passthrough import headers as hdr
from proxy.passthrough.forward import forward

_LOGGER = logging.getLogger(__name__)


def _json(data: Any, request: web.Request, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, headers={hdr.REQUEST_ID: request_id(request)})


def _cache(request: web.Request) -> RunCache | None:
    return request.app.get(RUN_CACHE)


# --- handlers ---------------------------------------------------------------------------------

_PAGING = re.compile(r"(?:/start/(?P<start>[^/]*)(?:/count/(?P<count>[^/]*))?)?/?")


async def handle_run_log(request: web.Request) -> web.StreamResponse:
    """GET /api/run/log/model/{model}/stamp/{stamp}[/start/{n}[/count/{c}]]."""
    cache = _cache(request)
    m = _PAGING.fullmatch(request.match_info.get("paging", ""))
    model, stamp = request.match_info["model"], request.match_info["stamp"]
    if cache is None or m is None or (m["start"] is not None and m["start"] == ""):
        return await forward(request)
    if m["count"] is not None and m["count"] == "":
        return await forward(request)
    run = await cache.find(stamp, model)
    if run is None:
        return await forward(request)
    start_text = request.query.get("start") or m["start"] or ""
    count_text = request.query.get("count") or m["count"] or ""
    try:
        start = parse_go_int(start_text) if start_text else 0
    except PagingError as e:
        raise BadRequest(f"Invalid value of start log start line {model}") from e
    try:
        count = parse_go_int(count_text) if count_text else 0
    except PagingError as e:
        raise BadRequest(f"Invalid value of log line count {model}") from e
    view = await cache.view(run)
    if view is None:
        return await forward(request)
    return _json(log_page(view, start, count), request)


async def handle_run_status(request: web.Request) -> web.StreamResponse:
    """GET /api/model/{model}/run/{stamp}/status and .../status/list."""
    cache = _cache(request)
    if cache is None:
        return await forward(request)
    run = await cache.find(request.match_info["stamp"], request.match_info["model"])
    if run is None:
        return await forward(request)
    view = await cache.view(run)
    answer = await oms_get(request)
    doc = answer.json()
    if view is None or doc is None:
        return answer.response(request)
    if isinstance(doc, list):
        if not doc:
            return _json([run_pub(view)], request)
        out: list[Any] = []
        for item in doc:
            ours = None
            if isinstance(item, dict) and item.get("RunStamp") == view.info.run_stamp:
                ours = progress_item(item, view)
            out.append(item if ours is None else ours)
        return answer.response(request) if out == doc else _json(out, request)
    if isinstance(doc, dict):
        ours = progress_item(doc, view)
        return answer.response(request) if ours is None else _json(ours, request)
    return answer.response(request)


async def handle_run_status_last(request: web.Request) -> web.StreamResponse:
    """GET /api/model/{model}/run/status/last: ours when our newest run is newer than oms's."""
    cache = _cache(request)
    if cache is None:
        return await forward(request)
    runs = await cache.runs_of_model(request.match_info["model"])
    if not runs:
        return await forward(request)
    answer = await oms_get(request)
    doc = answer.json()
    if not isinstance(doc, dict):
        return answer.response(request)
    stamp = str(doc.get("RunStamp") or "")
    newest = max(runs, key=lambda r: (r.info.submitted, r.info.created, r.name))
    if doc.get("Status") and stamp:
        if stamp == newest.info.run_stamp:  # oms has our newest run: its row wins
            view = await cache.view(newest)
            ours = progress_item(doc, view) if view is not None else None
            return answer.response(request) if ours is None else _json(ours, request)
        older_of_ours = any(r.info.run_stamp == stamp for r in runs)
        if not older_of_ours and str(doc.get("CreateDateTime") or "") >= format_time(
            newest.info.submitted
        ):
            return answer.response(request)  # a run oms knows, newer than ours
    # oms's newest row is older than the newest run we launched (or oms has none): ours.
    view = await cache.view(newest)
    return answer.response(request) if view is None else _json(run_pub(view), request)


async def handle_run_stop(request: web.Request) -> web.StreamResponse:
    """PUT /api/run/stop/model/{model}/stamp/{stamp}: delete the run's MPIJob."""
    cache = _cache(request)
    stamp = request.match_info["stamp"]
    run = await cache.find(stamp, request.match_info["model"]) if cache is not None else None
    if cache is None or run is None:
        return await forward(request)
    view = cache.peek(run)
    if not run.deleted and (view is None or view.phase not in FINAL_PHASES):
        await cache.stop(run)
        _LOGGER.info("stop of run %s: MPIJob %s deleted", stamp, run.name)
    return web.Response(
        status=200,
        content_type="text/plain",
        headers={
            "Content-Location": f"/api/model/{run.info.model_digest}/run/{stamp}/true",
            hdr.REQUEST_ID: request_id(request),
        },
    )


def _template_name(request: web.Request) -> str:
    """The template the runs are made from (oms shows its run template's file name)."""
    return PurePath(request.app[CONFIG].mpijob.template).name


def _add_res(doc: dict[str, Any], keys: tuple[str, ...], jobs: list[dict[str, Any]]) -> None:
    """Count ``jobs``' resources into oms's totals (``ComputeRes`` keys of ServiceState)."""
    cpu = sum(int(j["Res"]["Cpu"]) for j in jobs)
    mem = sum(int(j["Res"]["Mem"]) for j in jobs)
    for key in keys:
        total = doc.get(key)
        if isinstance(total, dict):
            doc[key] = {
                **total,
                "Cpu": int(total.get("Cpu") or 0) + cpu,
                "Mem": int(total.get("Mem") or 0) + mem,
            }


async def handle_service_state(request: web.Request) -> web.StreamResponse:
    """GET /api/service/state: oms's, with our runs added to ``Queue``, ``Active``, ``History``
    (and their resources to the totals), as oms lists the runs it starts itself."""
    cache = _cache(request)
    if cache is None:
        return await forward(request)
    answer = await oms_get(request)
    doc = answer.json()
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(k), list) for k in ("Queue", "Active", "History")
    ):
        return answer.response(request)
    queue, active, history = await cache.jobs()
    if not (queue or active or history):
        return answer.response(request)
    template = _template_name(request)
    # QueuePos: the position in the cluster's queue (Kueue's), apart from oms's own queue.
    queued = [run_job(v, template, 1 + i) for i, v in enumerate(queue)]
    running = [run_job(v, template) for v in active]
    doc["Queue"] = [*doc["Queue"], *queued]
    doc["Active"] = [*doc["Active"], *running]
    doc["History"] = [*doc["History"], *(history_job(v) for v in history)]
    _add_res(doc, ("ActiveTotalRes", "ActiveOwnRes"), running)
    _add_res(doc, ("QueueTotalRes", "QueueOwnRes"), queued)
    return _json(doc, request)


async def handle_service_job(request: web.Request) -> web.StreamResponse:
    """GET /api/service/job/{active|queue|history}/{stamp}: oms's ``runJobState`` of a launched
    run that is in that list of the jobs page (others pass through to oms)."""
    cache = _cache(request)
    if cache is None:
        return await forward(request)
    which = request.path.split("/")[4]
    run = await cache.find(request.match_info["stamp"])
    view = await cache.view(run) if run is not None else None
    if run is None or view is None or cache.job_list(view) != which:
        return await forward(request)  # not one of ours in that list: oms answers
    info = view.info
    item: Any = run_pub(view)
    path = f"/api/model/{quote(info.model_digest, safe='')}/run/{quote(info.run_stamp, safe='')}"
    with contextlib.suppress(UpstreamTimeout, UpstreamUnavailable):
        oms_list = (await oms_get(request, path + "/status/list")).json()
        if isinstance(oms_list, list) and oms_list:
            item = progress_item(oms_list[0], view) or oms_list[0]
    position = 0
    if which == "queue":
        queue = [v.info.name for v in (await cache.jobs())[0]]
        position = 1 + queue.index(run.name) if run.name in queue else 0
    return _json(job_details(view, item, _template_name(request), position, which), request)


async def run_cache_context(app: web.Application) -> AsyncIterator[None]:
    """``cleanup_ctx``: the run cache (when there is a Kubernetes client), started and stopped.

    Append it after the ``cleanup_ctx`` that creates the Kubernetes client (``app[KUBE]``).
    """
    kube = app.get(KUBE)
    cache = RunCache(kube, app[CONFIG]) if kube is not None else None
    app[RUN_CACHE] = cache
    if cache is not None:
        await cache.start()
    try:
        yield
    finally:
        if cache is not None:
            await cache.close()
