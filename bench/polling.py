"""Polling benchmark: many OpenM++ UIs following many running MPIJob runs through the proxy.

    .venv/bin/python bench/polling.py                  # 20 jobs x 10 pollers for 60 s
    .venv/bin/python bench/polling.py --duration 15    # shorter

The stand-in Kubernetes API (with its simulated MPI operator), the stand-in oms and the proxy
(``proxy.app.create_app`` with the lifecycle routes, default cache timings) run in this process,
on loopback. Runs are submitted with ``POST /api/run`` through the proxy; each job keeps running
and logging two lines a second for the whole measurement. The pollers run in a process of their
own and behave like the UI's run-log page (RunLog.vue): every ``--tick`` seconds a log page
request ``start/<lines shown>/count/max(200, TotalSize - shown)``, and the progress list on
ticks 1, 2, 3 and every 4th.

Printed: poll answers per second, p50/p99 poll latency, and the Kubernetes API requests per
second per running job caused during the measurement (from the stand-in's request record).
Targets: at most 1 request/s per running job, p99 below 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _common as c  # the sibling module (this script's directory is on sys.path)
import aiohttp
from aiohttp import web

from proxy.app import create_app
from proxy.configload import config_from_dict
from standins.kube import FakeKube, Scenario, find_crd, serve, write_kubeconfig
from standins.oms import FakeOms

TARGET_REQUESTS_PER_JOB_SECOND = 1.0
TARGET_P99_MS = 20.0
DIGEST = "_201208171604590148_"
LINE_INTERVAL = 0.5


# --- the pollers (in their own process) -----------------------------------------------------------


async def _poller(
    session: aiohttp.ClientSession,
    base: str,
    stamp: str,
    tick: float,
    until: float,
    latencies: list[float],
    errors: Counter[str],
) -> None:
    shown = 0
    count = 200
    ticks = 0
    await asyncio.sleep(random.random() * tick)  # spread the pollers over a tick
    while time.perf_counter() < until:
        ticks += 1
        began = time.perf_counter()
        url = f"{base}/api/run/log/model/{DIGEST}/stamp/{stamp}/start/{shown}/count/{count}"
        try:
            async with session.get(url) as resp:
                page = await resp.json()
                latencies.append(time.perf_counter() - began)
                if resp.status != 200:
                    errors[f"log {resp.status}"] += 1
                else:
                    new = page["Offset"] + page["Size"] - shown
                    if page["Offset"] == shown and new > 0:
                        shown += new
                    count = max(200, page["TotalSize"] - shown)
            if ticks < 4 or ticks % 4 == 1:
                began = time.perf_counter()
                async with session.get(f"{base}/api/model/{DIGEST}/run/{stamp}/status/list") as r:
                    await r.read()
                    latencies.append(time.perf_counter() - began)
                    if r.status != 200:
                        errors[f"status {r.status}"] += 1
        except (aiohttp.ClientError, TimeoutError) as e:
            errors[type(e).__name__] += 1
        await asyncio.sleep(max(0.0, tick - (time.perf_counter() - began)))


async def _poll_all(base: str, stamps: list[str], per_job: int, tick: float, seconds: float) -> Any:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        until = time.perf_counter() + seconds
        began = time.perf_counter()
        await asyncio.gather(
            *(
                _poller(session, base, stamp, tick, until, latencies, errors)
                for stamp in stamps
                for _ in range(per_job)
            )
        )
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {"latencies": latencies, "errors": dict(errors), "seconds": elapsed}


def poll_all(base: str, stamps: list[str], per_job: int, tick: float, seconds: float) -> Any:
    """UI-like pollers for ``seconds``; their latencies (sorted, seconds) and errors."""
    return asyncio.run(_poll_all(base, stamps, per_job, tick, seconds))


# --- the servers (this process) -------------------------------------------------------------------


async def _main(args: argparse.Namespace) -> int:
    crd = find_crd()
    kube = FakeKube(crd_schema_path=crd)
    lines = int((args.duration + 60) / LINE_INTERVAL)
    kube.set_scenario(
        Scenario(
            log_lines=[f"member=0 Simulation progress={i}% cases={i * 10}" for i in range(lines)],
            line_interval=LINE_INTERVAL,
        )
    )
    oms = FakeOms()
    kube_runner, kube_url = await serve(kube)
    oms_runner = web.AppRunner(oms.app)
    await oms_runner.setup()
    oms_port = c.free_port()
    await web.TCPSite(oms_runner, c.LOOPBACK, oms_port).start()
    oms.url = f"http://{c.LOOPBACK}:{oms_port}"
    with tempfile.TemporaryDirectory(prefix="oms-bench-polling-") as tmp:
        kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig.yaml", kube_url)
        config = config_from_dict(
            {
                "oms": {"url": oms.url},
                "runs": {"intercept": "mpi", "max_processes": 64},
                "kubernetes": {"kubeconfig": str(kubeconfig), "dry_run_on_start": False},
                "logging": {"level": "WARNING"},
            },
            "<bench>",
        )
        app = create_app(config)
        proxy_runner = web.AppRunner(app, access_log=None)
        await proxy_runner.setup()
        port = c.free_port()
        await web.TCPSite(proxy_runner, c.LOOPBACK, port).start()
        base = f"http://{c.LOOPBACK}:{port}"
        try:
            return await _measure(args, kube, base)
        finally:
            await proxy_runner.cleanup()
            await oms_runner.cleanup()
            await kube_runner.cleanup()


async def _measure(args: argparse.Namespace, kube: FakeKube, base: str) -> int:
    stamps: list[str] = []
    async with aiohttp.ClientSession() as session:
        for i in range(args.jobs):
            body = {"ModelDigest": DIGEST, "Mpi": {"Np": 2}, "Opts": {"OpenM.RunName": f"b{i}"}}
            async with session.post(f"{base}/api/run", json=body) as resp:
                if resp.status != 200:
                    print(f"submit failed: {resp.status} {await resp.text()}", file=sys.stderr)
                    return 1
                stamps.append((await resp.json())["RunStamp"])
        # Warm up: every run is running and its log page shows model output.
        deadline = time.monotonic() + 30
        for stamp in stamps:
            while True:
                url = f"{base}/api/run/log/model/{DIGEST}/stamp/{stamp}/start/0/count/0"
                async with session.get(url) as resp:
                    page = await resp.json()
                if any(not x.startswith("[oms-mpijob-proxy]") for x in page["Lines"]):
                    break
                if time.monotonic() > deadline:
                    print(f"run {stamp} did not start", file=sys.stderr)
                    return 1
                await asyncio.sleep(0.2)
    first = len(kube.requests)
    began = time.monotonic()
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(
        None,
        lambda: c.run_in_process(
            poll_all,
            base,
            stamps,
            args.pollers,
            args.tick,
            args.duration,
            timeout=args.duration + 120,
        ),
    )
    seconds = time.monotonic() - began
    made = kube.requests[first:]
    lat = result["latencies"]
    answers = len(lat)
    p50 = c.percentile([x * 1e6 for x in lat], 50) / 1000
    p99 = c.percentile([x * 1e6 for x in lat], 99) / 1000
    per_job = len(made) / seconds / max(1, len(stamps))
    kinds = Counter(
        f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}" for r in made
    )
    print(f"jobs running: {len(stamps)}, pollers per job: {args.pollers}, tick {args.tick:g} s")
    print(f"measured: {seconds:.1f} s")
    rate = answers / result["seconds"]
    print(f"poll answers: {answers} ({rate:.1f}/s), errors: {result['errors'] or 0}")
    print(f"poll latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms (target < {TARGET_P99_MS:g} ms)")
    print(
        f"Kubernetes API requests: {len(made)} ({len(made) / seconds:.2f}/s), per running job "
        f"{per_job:.3f}/s (target <= {TARGET_REQUESTS_PER_JOB_SECOND:g})"
    )
    print("  by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    ok = per_job <= TARGET_REQUESTS_PER_JOB_SECOND and p99 < TARGET_P99_MS and not result["errors"]
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="running jobs (default 20)")
    parser.add_argument("--pollers", type=int, default=10, help="pollers per job (default 10)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--tick", type=float, default=1.0, help="UI tick in seconds (default 1)")
    args = parser.parse_args()
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
