"""Serve the stand-in Kubernetes API in its own process: ``python -m standins.serve_kube``.

For benchmarks and tests that want the Kubernetes API (with the simulated MPI operator of
:class:`standins.kube.FakeKube`) outside the proxy's process. Once bound it prints one line,
``listening on http://HOST:PORT``, to stdout (``--port 0`` picks a free port), then serves until
SIGTERM/SIGINT or ``--max-seconds`` (a safety net so a forgotten server never lingers).
``--kubeconfig FILE`` also writes a kubeconfig pointing at it.

Admission validates MPIJobs against the CRD's schema as a real API server does (``--crd``,
default :func:`standins.kube.find_crd`); ``--no-validation`` turns that off.

Events older than ``--event-ttl`` seconds (default one hour, as on a real API server) are
deleted. Each MPIJob follows one :class:`~standins.kube.Scenario`: ``--scenario``
(``succeed``, ``fail``, ``no-operator``...), a launcher log of ``--log-lines`` lines, written
over ``--run-seconds`` seconds (one number, or ``MIN:MAX`` for a duration picked per job,
repeatable from the job's name) or one every ``--line-interval`` seconds.

The stand-in's full request log (``FakeKube.requests``) is not kept: only counts by kind, and,
for benchmarks, a bounded record of how long the stand-in took over each request. Debug routes
(outside the Kubernetes API paths; never counted):

- ``GET /debug/standin/stats``: requests by kind, objects by kind, running operator tasks,
  the process's CPU seconds and RSS;
- ``GET /debug/standin/timings?since=N``: one record per request from the N-th on:
  ``[seq, method, verb, resource, subresource, status, start, end, run_stamp]``; ``start`` and
  ``end`` are ``time.monotonic()`` (CLOCK_MONOTONIC, the same clock in every process on Linux)
  when the request reached the stand-in's application and when its answer was ready, and
  ``run_stamp`` is the ``openmpp.org/run-stamp`` annotation or label of a created object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import resource
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from standins import run_until_stopped
from standins.kube import (
    DEFAULT_LOG_LINES,
    EVENTS,
    FakeKube,
    RecordedRequest,
    Scenario,
    ScenarioKind,
    find_crd,
    write_kubeconfig,
)
from standins.kube.selectors import _request_attributes

DEBUG_PREFIX = "/debug/standin/"
RUN_STAMP_KEY = "openmpp.org/run-stamp"
SCENARIOS: tuple[ScenarioKind, ...] = (
    "succeed",
    "fail",
    "image-pull",
    "unschedulable",
    "suspended",
    "no-operator",
)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _CountedRequests(list[RecordedRequest]):
    """A request log that keeps counts by kind and nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.by_kind: collections.Counter[str] = collections.Counter()

    def append(self, item: RecordedRequest, /) -> None:
        if item.path.startswith(DEBUG_PREFIX):
            return
        sub = f"/{item.subresource}" if item.subresource else ""
        self.by_kind[f"{item.verb} {item.resource or item.path}{sub}"] += 1


class Timings:
    """A bounded record of the stand-in's time per request (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.records: collections.deque[list[Any]] = collections.deque(maxlen=limit)
        self.seq = 0

    def add(self, record: list[Any]) -> None:
        self.records.append([self.seq, *record])
        self.seq += 1

    def since(self, first: int) -> list[list[Any]]:
        return [r for r in self.records if r[0] >= first]


def _run_stamp(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        return ""
    for field in ("annotations", "labels"):
        values = meta.get(field)
        if isinstance(values, dict) and isinstance(values.get(RUN_STAMP_KEY), str):
            return str(values[RUN_STAMP_KEY])
    return ""


def _timing_middleware(timings: Timings) -> Middleware:
    @web.middleware
    async def timed(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path.startswith(DEBUG_PREFIX):
            return await handler(request)
        start = time.monotonic()
        status = 0
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            end = time.monotonic()
            stamp = ""
            if request.method == "POST" and request.body_exists:
                stamp = _run_stamp(await request.read())  # already read: cached
            attrs = _request_attributes(request.method, request.path, request.query)
            timings.add(
                [
                    request.method,
                    attrs["verb"],
                    attrs["resource"],
                    attrs["subresource"],
                    status,
                    start,
                    end,
                    stamp,
                ]
            )

    return timed


def scenario_picker(
    kind: ScenarioKind,
    lines: int,
    run_seconds: tuple[float, float] | None,
    line_interval: float,
) -> Callable[[dict[str, Any]], Scenario]:
    """A ``FakeKube.scenario_for``: each job logs ``lines`` lines over its run time.

    The run time is drawn from ``run_seconds`` (min, max) with the job's name as seed, so the
    same job always takes as long; without it, lines come every ``line_interval`` seconds.
    """
    steps = max(0, lines - 7)
    text = [
        *DEFAULT_LOG_LINES[:5],
        *(
            f"2026-01-01 00:00:01.{i % 1000:03d} member=0 Simulation progress={100 * i // steps}% "
            f"cases={i * 10}"
            for i in range(1, steps + 1)
        ),
        *DEFAULT_LOG_LINES[-2:],
    ][: max(lines, 0)]

    def pick(job: dict[str, Any]) -> Scenario:
        interval = line_interval
        if run_seconds is not None:
            low, high = run_seconds
            digest = hashlib.sha256(str(job["metadata"]["name"]).encode()).digest()
            seconds = low + (high - low) * int.from_bytes(digest[:4]) / 2**32
            interval = seconds / max(1, len(text))
        return Scenario(kind=kind, log_lines=list(text), line_interval=interval)

    return pick


def _parse_seconds(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    a, b = float(low), float(high or low)
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"expected SECONDS or MIN:MAX, got {text!r}")
    return a, b


def make_kube(args: argparse.Namespace) -> tuple[FakeKube, Timings]:
    """The stand-in for the parsed flags, with request counting and the debug routes."""
    try:
        crd = None if args.no_validation else find_crd(args.crd)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    kube = FakeKube(
        namespaces=args.namespace,
        crd_schema_path=crd,
        scenario_for=scenario_picker(
            args.scenario, args.log_lines, args.run_seconds, args.line_interval
        ),
    )
    counted = _CountedRequests()
    kube.requests = counted
    kube.history_limit = args.history_limit
    timings = Timings(args.timings_limit)
    app = kube.app
    app.middlewares.insert(0, _timing_middleware(timings))
    started_cpu = time.process_time()

    async def stats(request: web.Request) -> web.Response:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        objects = {kind: len(kube.objects(kind)) for kind in ("mpijobs", "pods", "configmaps")}
        objects["events"] = len(kube.objects("events"))
        return web.json_response(
            {
                "requests": dict(counted.by_kind),
                "objects": objects,
                "operator_tasks": len(kube._tasks),
                "cpu_seconds": time.process_time() - started_cpu,
                "max_rss_kib": usage.ru_maxrss,
                "timings_recorded": timings.seq,
                "validation": crd is not None,
            }
        )

    async def timing_records(request: web.Request) -> web.Response:
        try:
            first = int(request.query.get("since", "0"))
        except ValueError:
            first = 0
        return web.json_response({"records": timings.since(first), "next": timings.seq})

    app.router.add_get(DEBUG_PREFIX + "stats", stats)
    app.router.add_get(DEBUG_PREFIX + "timings", timing_records)
    if args.event_ttl > 0:
        app.cleanup_ctx.append(_event_expiry(kube, args.event_ttl))
    return kube, timings


def _event_expiry(kube: FakeKube, ttl: float) -> Callable[[web.Application], AsyncIterator[None]]:
    """Delete Events older than ``ttl`` seconds, as the API server's ``--event-ttl`` does."""

    async def expire_forever() -> None:
        interval = min(10.0, max(1.0, ttl / 10))
        while True:
            await asyncio.sleep(interval)
            cutoff = (datetime.now(UTC) - timedelta(seconds=ttl)).strftime("%Y-%m-%dT%H:%M:%SZ")
            for ns, name in [
                key
                for key, event in kube._store[EVENTS.resource].items()
                if str(event.get("lastTimestamp") or event.get("eventTime") or "")[:19] + "Z"
                < cutoff
            ]:
                kube._remove(EVENTS, ns, name)

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(expire_forever())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return ctx


async def _serve(args: argparse.Namespace) -> None:
    kube, _ = make_kube(args)
    runner = web.AppRunner(kube.app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    bound = sock.getsockname()[1]
    await web.SockSite(runner, sock, backlog=1024).start()
    url = f"http://{args.host}:{bound}"
    if args.kubeconfig:
        write_kubeconfig(Path(args.kubeconfig), url, namespace=args.namespace[0])
    sys.stdout.write(f"listening on {url}\n")
    sys.stdout.flush()
    await run_until_stopped(runner, args.max_seconds)


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags."""
    p = argparse.ArgumentParser(
        prog="python -m standins.serve_kube",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="listen port (0: any free port)")
    p.add_argument(
        "--max-seconds", type=float, default=3600.0, help="exit after this long (default 3600)"
    )
    p.add_argument(
        "--namespace",
        action="append",
        help="a namespace that exists (repeatable; default: default); the first goes into "
        "--kubeconfig",
    )
    p.add_argument("--kubeconfig", metavar="FILE", help="write a kubeconfig for this server")
    p.add_argument(
        "--crd", metavar="FILE", help="MPIJob CRD file (default: the schema kept in the repository)"
    )
    p.add_argument(
        "--no-validation", action="store_true", help="no CRD schema validation of MPIJobs"
    )
    p.add_argument("--scenario", choices=SCENARIOS, default="succeed", help="(default succeed)")
    p.add_argument("--log-lines", type=int, default=20, help="launcher log lines (default 20)")
    p.add_argument(
        "--run-seconds",
        type=_parse_seconds,
        metavar="SECONDS|MIN:MAX",
        help="how long a job logs (per job, picked from the range); overrides --line-interval",
    )
    p.add_argument(
        "--line-interval", type=float, default=0.5, help="seconds between log lines (0.5)"
    )
    p.add_argument(
        "--history-limit",
        type=int,
        default=10_000,
        help="changes kept for resuming watches (default 10000)",
    )
    p.add_argument(
        "--event-ttl",
        type=float,
        default=3600.0,
        help="delete Events older than this, like the API server's --event-ttl (3600; 0: never)",
    )
    p.add_argument(
        "--timings-limit",
        type=int,
        default=200_000,
        help="request timing records kept (default 200000)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags and serve."""
    args = build_parser().parse_args(argv)
    args.namespace = args.namespace or ["default"]
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
