"""Submission benchmark: many MPI ``POST /api/run`` at once through the proxy, into MPIJobs.

    .venv/bin/python bench/submit.py              # 500 submissions, CRD validation on
    .venv/bin/python bench/submit.py -n 200       # fewer
    .venv/bin/python bench/submit.py --validation both

The stand-in oms, the stand-in Kubernetes API (``python -m standins.serve_kube``, CRD
schema validation on as a real API server does it, simulated operator off by default), the
proxy (``python -m proxy serve``, intercept mpi, WARNING logs) and the client (aiohttp) each run
in a process of their own, all on loopback. Every submission is the OpenM++ UI's MPI request
(tests/requests/ui-mpi.json) with a top-level ``RunStamp`` of its own.

Phases (each on a fresh stand-in Kubernetes API and, through the proxy, a fresh proxy):

- ``direct``: the same two creates the proxy makes per run (MPIJob, then its ConfigMap owned by
  it), with the bodies the proxy renders, sent by a bare aiohttp client straight to the
  stand-in, all at once over at most 100 connections (the proxy's Kubernetes client pool):
  what the stand-in alone can do;
- ``burst``: N submissions at once through the proxy (one client connection each, opened
  beforehand): submissions/s;
- ``paced``: N submissions at ``--rate`` per second (open loop) through the proxy: the latency
  at that rate, without the queueing a burst causes.

Before a phase through the proxy, its model cache is warmed by one request that is refused
after the model lookup (``Mpi.Np`` over the limit: 400, no MPIJob).

How the proxy's own time is separated from the stand-in's: the stand-in records, for every
request, when it reached its application and when its answer was ready (CLOCK_MONOTONIC, the
same clock in every process), and which run stamp the created object carries. For each
submission, *own* = the client's end-to-end time minus the stand-in's time on that run's two
creates. What remains is the proxy's work, its Kubernetes client, loopback, and any queueing
in the proxy or before the stand-in's application picks the request up (so it is an upper
bound of the proxy's work). CPU per submission comes from /proc/<pid>/stat of each process.

After each phase the MPIJobs are listed through the stand-in: exactly one per submission, with
that submission's run stamp, must exist.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import http.client
import json
import os
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import _common as c  # the sibling module (this script's directory is on sys.path)
import aiohttp

from proxy.configload import config_from_dict
from proxy.submit.decode import ModelInfo, parse_run_request
from proxy.submit.render import Stamps, render
from proxy.submit.template import load_template
from proxy.submit.validate import validate_run

REQUEST = c.REPO / "tests" / "requests" / "ui-mpi.json"
TEMPLATE = c.REPO / "proxy" / "data" / "mpijob-template.yaml"
MODEL = ModelInfo(name="RiskPaths", digest="d90e1e9a49a06d972ecf1d50e684c62b")
NAMESPACE = "default"
SELECTOR = "app.kubernetes.io/managed-by=oms-mpijob-proxy"
MPIJOBS_PATH = f"/apis/kubeflow.org/v2beta1/namespaces/{NAMESPACE}/mpijobs"
CONFIGMAPS_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
CREATE_QUERY = "?fieldValidation=Strict&fieldManager=oms-mpijob-proxy"
KUBE_POOL = 100  # kubernetes_asyncio's default connection pool, which the proxy uses

TARGET_RATE = 200.0
TARGET_P99_MS = 50.0


# --- the client (in a worker process) ---------------------------------------------------------


async def _hold_connections(session: aiohttp.ClientSession, url: str, count: int) -> None:
    """Open ``count`` keep-alive connections (each holds its request until all are open)."""
    barrier = asyncio.Barrier(count)

    async def one() -> None:
        async with session.get(url) as resp:
            await resp.read()
            await barrier.wait()

    async with asyncio.timeout(60):
        await asyncio.gather(*(one() for _ in range(count)))


async def _submit_all(
    url: str, bodies: list[tuple[str, bytes]], rate: float | None, limit_s: float
) -> list[tuple[str, float, float, int, str]]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=limit_s)
    ) as session:
        await _hold_connections(session, url + "/healthz", len(bodies))
        start = time.monotonic() + 0.05

        async def one(i: int, stamp: str, body: bytes) -> tuple[str, float, float, int, str]:
            if rate:
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            t0 = time.monotonic()
            try:
                async with session.post(
                    url + "/api/run", data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    text = await resp.read()
                    t1 = time.monotonic()
                    problem = ""
                    if resp.status == 200:
                        got = json.loads(text).get("RunStamp")
                        if got != stamp:
                            problem = f"answered RunStamp {got!r}"
                    else:
                        problem = text[:300].decode(errors="replace")
                    return stamp, t0, t1, resp.status, problem
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                return stamp, t0, time.monotonic(), 0, f"{type(e).__name__}: {e}"

        return await asyncio.gather(*(one(i, s, b) for i, (s, b) in enumerate(bodies)))


def submit_all(
    url: str, bodies: list[tuple[str, bytes]], rate: float | None, limit_s: float
) -> list[tuple[str, float, float, int, str]]:
    """POST every body to ``url``/api/run: all at once, or ``rate`` per second.

    Returns (stamp, start, end, status, problem) per submission; times are time.monotonic().
    """
    return asyncio.run(_submit_all(url, bodies, rate, limit_s))


async def _direct_all(
    kube_url: str, jobs: list[tuple[str, bytes, dict[str, Any] | None]], limit_s: float
) -> list[tuple[str, float, float, int, str]]:
    connector = aiohttp.TCPConnector(limit=KUBE_POOL)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=limit_s)
    ) as session:
        await _hold_connections(session, kube_url + "/version", KUBE_POOL)

        async def one(
            stamp: str, mpijob: bytes, configmap: dict[str, Any] | None
        ) -> tuple[str, float, float, int, str]:
            t0 = time.monotonic()
            try:
                url = kube_url + MPIJOBS_PATH + CREATE_QUERY
                async with session.post(url, data=mpijob, headers=headers) as resp:
                    job = await resp.json()
                    if resp.status != 201:
                        return stamp, t0, time.monotonic(), resp.status, str(job)[:300]
                if configmap is not None:
                    meta = configmap["metadata"]
                    owner = {
                        "apiVersion": job["apiVersion"],
                        "kind": job["kind"],
                        "name": job["metadata"]["name"],
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                    body = {**configmap, "metadata": {**meta, "ownerReferences": [owner]}}
                    url = kube_url + CONFIGMAPS_PATH + CREATE_QUERY
                    async with session.post(url, json=body, headers=headers) as resp:
                        await resp.read()
                        if resp.status != 201:
                            return stamp, t0, time.monotonic(), resp.status, "ConfigMap create"
                return stamp, t0, time.monotonic(), 200, ""
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                return stamp, t0, time.monotonic(), 0, f"{type(e).__name__}: {e}"

        return await asyncio.gather(*(one(*job) for job in jobs))


def direct_all(
    kube_url: str, jobs: list[tuple[str, bytes, dict[str, Any] | None]], limit_s: float
) -> list[tuple[str, float, float, int, str]]:
    """The proxy's two creates per run straight to the stand-in, all at once (pool of 100)."""
    return asyncio.run(_direct_all(kube_url, jobs, limit_s))


# --- helpers of the driver --------------------------------------------------------------------


def post_json(url: str, body: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    """POST a JSON body over loopback; (status, body)."""
    host, port = c._host_port(url)
    path = "/" + url.split("/", 3)[3]
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def mpijob_stamps(kube_url: str) -> list[str]:
    """The run stamps of the MPIJobs the proxy made, one entry per MPIJob (via the stand-in)."""
    doc = c.get_json(f"{kube_url}{MPIJOBS_PATH}?labelSelector={SELECTOR}")
    return [
        str(((i.get("metadata") or {}).get("annotations") or {}).get("openmpp.org/run-stamp"))
        for i in doc.get("items") or ()
    ]


def stand_in_seconds(kube_url: str) -> dict[str, float]:
    """The stand-in's time on the creates of each run stamp (from its timing records)."""
    records = c.get_json(f"{kube_url}/debug/standin/timings")["records"]
    spent: dict[str, float] = defaultdict(float)
    for _seq, method, _verb, _res, _sub, _status, start, end, stamp in records:
        if method == "POST" and stamp:
            spent[stamp] += end - start
    return spent


def make_bodies(n: int, tag: str) -> list[tuple[str, bytes]]:
    """The UI's MPI request, each with a RunStamp of its own."""
    base = json.loads(REQUEST.read_bytes())
    out = []
    for i in range(n):
        stamp = f"{tag}_{i:05d}"
        out.append((stamp, json.dumps({**base, "RunStamp": stamp}).encode()))
    return out


def render_jobs(
    bodies: list[tuple[str, bytes]],
) -> list[tuple[str, bytes, dict[str, Any] | None]]:
    """What the proxy would create for each body (MPIJob JSON, ConfigMap without owner)."""
    config = config_from_dict({"mpijob": {"template": str(TEMPLATE)}}, "<bench>")
    template = load_template(config.template_path())
    now = dt.datetime.now()
    out = []
    for stamp, body in bodies:
        run = validate_run(parse_run_request(body), MODEL, config.runs)
        stamps = Stamps(stamp, stamp, uuid.uuid4().hex, None, now)
        rendered = render(run, MODEL, config, template, stamps)
        out.append((stamp, json.dumps(rendered.mpijob).encode(), rendered.configmap))
    return out


def proxy_config(kubeconfig: Path, n: int) -> dict[str, Any]:
    return {
        "runs": {"intercept": "mpi", "max_concurrent_submissions": max(64, 2 * n)},
        "kubernetes": {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE},
        "mpijob": {"template": str(TEMPLATE)},
    }


# --- phases -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    phase: str
    validation: bool
    n: int
    ok: int
    errors: dict[str, int]
    seconds: float
    e2e_ms: list[float]
    kube_ms: list[float]
    own_ms: list[float]
    cpu_ms: dict[str, float]
    jobs: int
    jobs_ok: bool
    problems: list[str]

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


def _pct(values: list[float], q: float) -> float:
    return c.percentile(sorted(values), q)


def _row(
    phase: str,
    validation: bool,
    results: list[tuple[str, float, float, int, str]],
    spent: dict[str, float],
    cpu: c.CpuMeter,
    stamps_listed: list[str],
) -> Row:
    ok = [r for r in results if r[3] == 200 and not r[4]]
    errors: dict[str, int] = defaultdict(int)
    problems = []
    for stamp, _t0, _t1, status, problem in results:
        if status != 200 or problem:
            errors[str(status)] += 1
            if len(problems) < 5:
                problems.append(f"{stamp}: {status} {problem}")
    span = max(r[2] for r in results) - min(r[1] for r in results)
    e2e = [(t1 - t0) * 1000 for _s, t0, t1, _st, _p in ok]
    kube = [spent.get(s, 0.0) * 1000 for s, *_ in ok]
    own = [e - k for e, k in zip(e2e, kube, strict=True)]
    wanted = sorted(s for s, *_ in ok)
    n = max(1, len(results))
    return Row(
        phase=phase,
        validation=validation,
        n=len(results),
        ok=len(ok),
        errors=dict(errors),
        seconds=span,
        e2e_ms=e2e,
        kube_ms=kube,
        own_ms=own,
        cpu_ms={k: v / n * 1000 for k, v in cpu.used.items()},
        jobs=len(stamps_listed),
        jobs_ok=sorted(stamps_listed) == wanted and len(wanted) == len(results),
        problems=problems,
    )


def _kube_options(args: argparse.Namespace, validation: bool) -> list[str]:
    opts = ["--scenario", args.scenario, "--log-lines", "20", "--run-seconds", "10"]
    return opts if validation else [*opts, "--no-validation"]


def run_direct(
    args: argparse.Namespace, work: Path, worker: c.Worker, oms: c.Server, validation: bool
) -> Row:
    kube, _kubeconfig = c.start_kube(work, _kube_options(args, validation), name="kube-direct")
    try:
        bodies = make_bodies(args.n, f"direct{uuid.uuid4().hex[:6]}")
        jobs = render_jobs(bodies)
        with c.CpuMeter({"kube": kube.pid, "oms": oms.pid}) as cpu:
            results, cpu.worker_cpu = worker.call(
                direct_all, kube.url, jobs, args.timeout, timeout=args.timeout + 60
            )
        return _row(
            "direct (no proxy)",
            validation,
            results,
            stand_in_seconds(kube.url),
            cpu,
            mpijob_stamps(kube.url),
        )
    finally:
        kube.stop()


def run_proxy(
    args: argparse.Namespace,
    work: Path,
    worker: c.Worker,
    oms: c.Server,
    validation: bool,
    rate: float | None,
) -> Row:
    kube, kubeconfig = c.start_kube(work, _kube_options(args, validation), name="kube")
    proxy = None
    try:
        proxy = c.start_proxy(
            oms.url, work, name="proxy", extra_config=proxy_config(kubeconfig, args.n)
        )
        c.wait_ready(proxy.url)
        warm = json.loads(REQUEST.read_bytes())
        warm["Mpi"]["Np"] = 100_000
        status, text = post_json(proxy.url + "/api/run", json.dumps(warm).encode())
        if status != 400:
            raise RuntimeError(f"warm-up request: expected 400, got {status} {text[:200]!r}")
        bodies = make_bodies(args.n, f"run{uuid.uuid4().hex[:6]}")
        pids = {"proxy": proxy.pid, "kube": kube.pid, "oms": oms.pid}
        profile = args.profile if (args.profile and rate is None and validation) else None
        with contextlib.ExitStack() as stack:
            if profile is not None:
                stack.enter_context(c.py_spy(proxy.pid, profile, args.timeout))
            cpu = stack.enter_context(c.CpuMeter(pids))
            results, cpu.worker_cpu = worker.call(
                submit_all, proxy.url, bodies, rate, args.timeout, timeout=args.timeout + 60
            )
        label = f"paced {rate:g}/s via proxy" if rate else "burst via proxy"
        return _row(
            label,
            validation,
            results,
            stand_in_seconds(kube.url),
            cpu,
            mpijob_stamps(kube.url),
        )
    finally:
        if proxy is not None:
            proxy.stop()
        kube.stop()


# --- output -----------------------------------------------------------------------------------

HEADER = (
    f"{'phase':<24} {'CRD':>3} {'ok':>5} {'err':>4} {'sub/s':>6} "
    f"{'e2e p50':>8} {'e2e p99':>8} {'kube p50':>8} {'kube p99':>8} "
    f"{'own p50':>8} {'own p99':>8} {'cpu ms/sub proxy/kube/oms/client/others':>40} "
    f"{'MPIJobs':>7}"
)


def print_row(r: Row) -> None:
    cpu = "/".join(
        f"{r.cpu_ms.get(k, 0.0):.2f}" for k in ("proxy", "kube", "oms", "client", "others")
    )
    jobs = f"{r.jobs}{'' if r.jobs_ok else '!'}"
    print(
        f"{r.phase:<24} {'on' if r.validation else 'off':>3} {r.ok:>5} "
        f"{sum(r.errors.values()):>4} {r.rate:6.0f} "
        f"{_pct(r.e2e_ms, 50):8.1f} {_pct(r.e2e_ms, 99):8.1f} "
        f"{_pct(r.kube_ms, 50):8.2f} {_pct(r.kube_ms, 99):8.2f} "
        f"{_pct(r.own_ms, 50):8.1f} {_pct(r.own_ms, 99):8.1f} {cpu:>40} {jobs:>7}",
        flush=True,
    )
    for p in r.problems:
        print(f"    {p}")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-n", type=int, default=500, help="submissions per phase (500)")
    p.add_argument(
        "--rate", type=float, default=TARGET_RATE, help="submissions/s of the paced phase (200)"
    )
    p.add_argument(
        "--validation",
        choices=("on", "off", "both", "auto"),
        default="auto",
        help="CRD schema validation in the stand-in; auto: on, and also off if the stand-in's "
        "CPU per submission exceeds the proxy's (default auto)",
    )
    p.add_argument(
        "--scenario",
        default="no-operator",
        help="what the simulated operator does with each MPIJob (default no-operator: nothing,"
        " so that its work does not compete for the CPU)",
    )
    p.add_argument("--no-direct", action="store_true", help="skip the direct phase")
    p.add_argument("--no-paced", action="store_true", help="skip the paced phase")
    p.add_argument("--timeout", type=float, default=120.0, help="limit per phase, seconds (120)")
    p.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="sample the proxy with py-spy during the (first) burst; raw stacks to FILE",
    )
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("-n must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    cores = os.cpu_count() or 1
    print(
        f"oms-mpijob-proxy submission benchmark: {cores} CPU cores, python "
        f"{sys.version.split()[0]}; {args.n} submissions per phase of the UI's MPI request "
        f"(tests/requests/ui-mpi.json), each with its own RunStamp; stand-in operator: "
        f"{args.scenario}"
    )
    print(
        "Phases: direct = the proxy's two creates per run (MPIJob, ConfigMap), as rendered by "
        "the proxy, sent straight to the stand-in, all at once over 100 connections (the "
        "stand-in's own ceiling); burst = all submissions at once through the proxy; paced = "
        f"{args.rate:g} submissions/s through the proxy (latency without a burst's queueing). "
        "Each phase on a fresh stand-in (and proxy), with the proxy's model cache warmed."
    )
    print(
        "Columns: e2e = the client's time per submission; kube = the stand-in Kubernetes API's "
        "time on that run's MPIJob + ConfigMap creates (its own records); own = e2e - kube: the "
        "proxy's work plus any queueing (in the proxy, or before the stand-in picks a request "
        "up). cpu = CPU time of each process over the phase / submissions (/proc); others: every "
        "other process on this machine in that time. MPIJobs: "
        "listed through the stand-in ('!': not exactly one per submission). Times in ms."
    )
    if cores <= 2:
        print(f"note: client, proxy and both stand-ins share {cores} cores.")
    plan = [True] if args.validation in ("on", "auto") else [False]
    if args.validation == "both":
        plan = [True, False]
    rows: list[Row] = []
    worker = c.Worker()
    with c.workdir("oms-bench-submit-") as work:
        oms = c.start_oms(work, max_seconds=3600)
        try:
            print()
            print(HEADER)
            print("-" * len(HEADER))
            for i, validation in enumerate(plan):
                phase_rows = []
                if not args.no_direct:
                    phase_rows.append(run_direct(args, work, worker, oms, validation))
                    print_row(phase_rows[-1])
                phase_rows.append(run_proxy(args, work, worker, oms, validation, None))
                print_row(phase_rows[-1])
                if not args.no_paced:
                    phase_rows.append(run_proxy(args, work, worker, oms, validation, args.rate))
                    print_row(phase_rows[-1])
                rows += phase_rows
                burst = next(r for r in phase_rows if r.phase == "burst via proxy")
                dominated = burst.cpu_ms.get("kube", 0.0) > burst.cpu_ms.get("proxy", 0.0)
                if args.validation == "auto" and i == 0 and validation and dominated:
                    print(
                        "(the stand-in's CPU per submission exceeds the proxy's: "
                        "again without CRD validation)"
                    )
                    plan.append(False)
        finally:
            worker.close()
            oms.stop()

    if args.profile is not None and args.profile.exists():
        c.summarize_profile(args.profile, "Proxy profile of the burst")
    print("\nTargets")
    failed = False
    checks: list[tuple[str, str, str, bool]] = []
    for r in rows:
        tag = f"{r.phase}, CRD validation {'on' if r.validation else 'off'}"
        checks.append((f"{tag}: errors", str(sum(r.errors.values())), "0", not r.errors))
        checks.append((f"{tag}: MPIJobs", str(r.jobs), f"== {r.n}, one per stamp", r.jobs_ok))
        if r.phase == "burst via proxy":
            checks.append(
                (
                    f"{tag}: submissions/s",
                    f"{r.rate:.0f}",
                    f">= {TARGET_RATE:g}",
                    r.rate >= TARGET_RATE,
                )
            )
        if r.phase.startswith("paced"):
            p99 = _pct(r.own_ms, 99)
            checks.append(
                (f"{tag}: own p99", f"{p99:.1f} ms", f"< {TARGET_P99_MS:g} ms", p99 < TARGET_P99_MS)
            )
    for r in rows:
        if r.phase == "burst via proxy" and r.cpu_ms.get("proxy"):
            per = r.cpu_ms["proxy"]
            print(
                f"  info  proxy CPU per submission, burst, CRD validation "
                f"{'on' if r.validation else 'off'}: {per:.2f} ms, so one core of this machine "
                f"sustains about {1000 / per:.0f} submissions/s of proxy work"
            )
    for name, value, limit, ok in checks:
        failed |= not ok
        print(f"  {'PASS' if ok else 'FAIL'}  {name:<58} {value:>10}  {limit}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
