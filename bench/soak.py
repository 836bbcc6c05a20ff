"""Soak test: mixed traffic through the proxy for minutes; errors, latencies, memory and fds.

    .venv/bin/python bench/soak.py                    # 3 minutes, 100 clients
    .venv/bin/python bench/soak.py --duration 45      # shorter (runs then take 2-11 s)

The stand-in oms, the stand-in Kubernetes API (``python -m standins.serve_kube``: CRD
validation on, a simulated operator running each MPIJob for ``--run-seconds``) and the proxy
(``python -m proxy serve``, intercept mpi, WARNING logs, with the lifecycle routes that answer
the UI's polling for launched runs) each run in a process of their own, on loopback. The clients
run in ``--client-procs`` processes (2), each with half of every kind of client:

- small pass-through GETs (/test/small, /api/model/<digest>, /api/service/config), each client
  pausing about ``--small-think`` seconds between requests;
- a handful of 64 MiB downloads and uploads, one after another per client (upload bodies are
  checked by the SHA-256 oms answers);
- MPI submissions (the UI's request with a RunStamp of its own), one per ``--submit-every``
  seconds per submitter, stopping early enough for every run to end before the traffic does;
- for EVERY run launched, a poller that behaves like the UI's run-log page: a log page request
  on every 1 s tick (``start/<lines shown>/count/max(200, TotalSize-shown)``), the progress
  list on ticks 1, 2, 3 and every 4th while the log is incomplete and on every tick after, until
  the log is complete (IsFinal) and every progress item is final; it then checks that all the
  model's log lines arrived.

Sampled every second: the proxy's RSS, open fds (/proc/<pid>/fd) and CPU. After the traffic,
the proxy is left idle until its pooled connections close (at most 30 s) before the fds are
counted again. Checks (exit 1 if one fails): no error in any class, one MPIJob per successful
submission (listed through the stand-in), every launched run followed until final with its
whole log, no fd growth, and an RSS trend over the second half below ``--max-slope``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _common as c  # the sibling module (this script's directory is on sys.path)
import aiohttp

from standins.oms import pattern_sha256

REQUEST = c.REPO / "tests" / "requests" / "ui-mpi.json"
TEMPLATE = c.REPO / "proxy" / "data" / "mpijob-template.yaml"
DIGEST = "d90e1e9a49a06d972ecf1d50e684c62b"
NAMESPACE = "default"
SELECTOR = "app.kubernetes.io/managed-by=oms-mpijob-proxy"
MPIJOBS_PATH = f"/apis/kubeflow.org/v2beta1/namespaces/{NAMESPACE}/mpijobs"
SMALL_PATHS = ("/test/small", f"/api/model/{DIGEST}", "/api/service/config")
PRELUDE = "[oms-mpijob-proxy]"
RUN_STATE_KEYS = (
    *("ModelName", "ModelDigest", "RunStamp", "SubmitStamp", "IsFinal", "UpdateDateTime"),
    *("RunName", "TaskRunName", "IsLog", "LogFileName"),
)
PAGE_KEYS = (*RUN_STATE_KEYS, "Offset", "Size", "TotalSize", "Lines")
PROGRESS_KEYS = (
    *("ModelName", "ModelDigest", "Name", "RunDigest", "ValueDigest", "RunStamp", "SubCount"),
    *("SubCompleted", "Status", "CreateDateTime", "UpdateDateTime", "Progress"),
)
FINAL_STATUS = frozenset("sxe")
CLASSES = ("small GET", "download", "upload", "submit", "log page", "status list")

# --- the clients (in worker processes) --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one client process does."""

    index: int
    url: str
    tag: str
    seconds: float
    submit_seconds: float
    poll_seconds: float
    small: int
    small_think: float
    downloads: int
    uploads: int
    submitters: int
    submit_every: float
    size: int
    log_lines: int
    seed: int


@dataclasses.dataclass
class Outcome:
    """What one client process saw (latencies in ms, sorted; transfer rates in MB/s)."""

    latencies: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    samples: list[str] = dataclasses.field(default_factory=list)
    rates: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    submitted: list[str] = dataclasses.field(default_factory=list)
    followed: int = 0
    max_pollers: int = 0

    def latency(self, kind: str, seconds: float) -> None:
        self.latencies.setdefault(kind, []).append(seconds * 1000)

    def error(self, kind: str, what: str) -> None:
        self.errors[kind] += 1
        if len(self.samples) < 20:
            self.samples.append(f"{kind}: {what}"[:300])


class _Client:
    def __init__(self, plan: Plan, session: aiohttp.ClientSession) -> None:
        self.plan = plan
        self.session = session
        self.out = Outcome()
        self.rng = random.Random(plan.seed)
        self.start = time.monotonic()
        self.end = self.start + plan.seconds
        self.pollers: set[asyncio.Task[None]] = set()
        self.pool = concurrent.futures.ThreadPoolExecutor(plan.downloads + plan.uploads + 1)
        self.expect_sha = pattern_sha256(plan.size)

    async def small(self) -> None:
        url = self.plan.url
        await asyncio.sleep(self.rng.random() * self.plan.small_think)
        for _ in range(1_000_000):
            if time.monotonic() >= self.end:
                return
            path = self.rng.choice(SMALL_PATHS)
            t0 = time.monotonic()
            try:
                async with self.session.get(url + path) as resp:
                    await resp.read()
                    if resp.status == 200:
                        self.out.latency("small GET", time.monotonic() - t0)
                    else:
                        self.out.error("small GET", f"{path}: {resp.status}")
            except (aiohttp.ClientError, TimeoutError) as e:
                self.out.error("small GET", f"{path}: {type(e).__name__}: {e}")
            await asyncio.sleep(self.plan.small_think * self.rng.uniform(0.5, 1.5))

    async def transfer(self, kind: str) -> None:
        loop = asyncio.get_running_loop()
        size = self.plan.size
        await asyncio.sleep(self.rng.random() * 2)
        for _ in range(100_000):
            if time.monotonic() > self.end - 3:
                return
            try:
                if kind == "download":
                    result = await loop.run_in_executor(
                        self.pool,
                        functools.partial(
                            c.download, self.plan.url, f"/test/download/{size}", timeout=120
                        ),
                    )
                    ok = result.status == 200 and result.bytes == size
                else:
                    result = await loop.run_in_executor(
                        self.pool,
                        functools.partial(
                            c.upload, self.plan.url, "/test/upload", size, timeout=120
                        ),
                    )
                    ok = result.status == 200 and result.sha256 == self.expect_sha
                if ok:
                    self.out.latency(kind, result.seconds)
                    self.out.rates.setdefault(kind, []).append(size / result.seconds / 1e6)
                else:
                    self.out.error(kind, f"{result.status}, {result.bytes} bytes")
            except (OSError, TimeoutError, ValueError) as e:
                self.out.error(kind, f"{type(e).__name__}: {e}")
            await asyncio.sleep(self.rng.uniform(0.5, 1.5))

    async def submitter(self, index: int, base: dict[str, Any]) -> None:
        plan = self.plan
        until = self.start + plan.submit_seconds
        poll_until = self.start + plan.poll_seconds
        await asyncio.sleep(self.rng.random() * plan.submit_every)
        for n in range(1_000_000):
            if time.monotonic() >= until:
                return
            stamp = f"{plan.tag}-{plan.index}-{index}-{n}"
            body = json.dumps({**base, "RunStamp": stamp})
            t0 = time.monotonic()
            try:
                async with self.session.post(
                    plan.url + "/api/run",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    text = await resp.read()
                    if resp.status != 200:
                        self.out.error("submit", f"{stamp}: {resp.status} {text[:200]!r}")
                    elif json.loads(text).get("RunStamp") != stamp:
                        self.out.error("submit", f"{stamp}: answered {text[:200]!r}")
                    else:
                        self.out.latency("submit", time.monotonic() - t0)
                        self.out.submitted.append(stamp)
                        task = asyncio.create_task(self.follow(stamp, poll_until))
                        self.pollers.add(task)
                        task.add_done_callback(self.pollers.discard)
                        self.out.max_pollers = max(self.out.max_pollers, len(self.pollers))
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                self.out.error("submit", f"{stamp}: {type(e).__name__}: {e}")
            await asyncio.sleep(plan.submit_every * self.rng.uniform(0.5, 1.5))

    async def _get_json(self, kind: str, path: str) -> Any:
        t0 = time.monotonic()
        try:
            async with self.session.get(self.plan.url + path) as resp:
                data = await resp.read()
                if resp.status != 200:
                    self.out.error(kind, f"{path}: {resp.status} {data[:200]!r}")
                    return None
                doc = json.loads(data)
                self.out.latency(kind, time.monotonic() - t0)
                return doc
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            self.out.error(kind, f"{path}: {type(e).__name__}: {e}")
            return None

    async def follow(self, stamp: str, until: float) -> None:
        """Poll one run like the UI's run-log page until it is complete (or ``until``)."""
        lines: list[str] = []
        count = 200
        log_done = progress_done = False
        await asyncio.sleep(self.rng.random())  # pollers' ticks spread over the second
        for tick in range(1, 100_000):
            began = time.monotonic()
            if began > until:
                self.out.error("log page", f"{stamp}: not final after the soak's end")
                return
            if not log_done:
                path = f"/api/run/log/model/{DIGEST}/stamp/{stamp}/start/{len(lines)}/count/{count}"
                page = await self._get_json("log page", path)
                if isinstance(page, dict) and all(k in page for k in PAGE_KEYS):
                    offset, size, total = page["Offset"], page["Size"], page["TotalSize"]
                    if offset <= len(lines):
                        lines.extend(page["Lines"][len(lines) - offset :])
                    count = max(200, total - len(lines))
                    log_done = bool(page["IsFinal"]) and offset + size >= total
                elif page is not None:
                    self.out.error("log page", f"{stamp}: not a RunStateLogPage: {page!r:.200}")
            if log_done or tick <= 3 or tick % 4 == 1:
                items = await self._get_json(
                    "status list", f"/api/model/{DIGEST}/run/{stamp}/status/list"
                )
                if isinstance(items, list):
                    valid = [
                        i
                        for i in items
                        if isinstance(i, dict) and all(k in i for k in PROGRESS_KEYS)
                    ]
                    progress_done = bool(valid) and all(i["Status"] in FINAL_STATUS for i in valid)
            if log_done and progress_done:
                break
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
        model_lines = [x for x in lines if not x.startswith(PRELUDE)]
        if len(model_lines) != self.plan.log_lines:
            self.out.error(
                "log page",
                f"{stamp}: {len(model_lines)} model log lines, expected {self.plan.log_lines}",
            )
        else:
            self.out.followed += 1

    async def run(self) -> Outcome:
        base = json.loads(REQUEST.read_bytes())
        plan = self.plan
        jobs = [self.small() for _ in range(plan.small)]
        jobs += [self.transfer("download") for _ in range(plan.downloads)]
        jobs += [self.transfer("upload") for _ in range(plan.uploads)]
        jobs += [self.submitter(i, base) for i in range(plan.submitters)]
        await asyncio.gather(*jobs)
        if self.pollers:
            await asyncio.wait(
                set(self.pollers),
                timeout=max(1.0, self.start + plan.poll_seconds + 5 - time.monotonic()),
            )
        for task in list(self.pollers):
            task.cancel()
            self.out.error("log page", "a poller was still running at the end")
        self.pool.shutdown(wait=True)
        for values in self.out.latencies.values():
            values.sort()
        return self.out


async def _run_clients(plan: Plan) -> Outcome:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return await _Client(plan, session).run()


def run_clients(plan: Plan) -> Outcome:
    """One client process's share of the traffic (see the module docstring)."""
    return asyncio.run(_run_clients(plan))


# --- the driver -------------------------------------------------------------------------------


def fd_count(pid: int) -> int:
    """Open file descriptors of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclasses.dataclass
class Sample:
    t: float
    rss_kib: int
    fds: int
    cpu: float


class Sampler:
    """RSS, fds and CPU of a process every ``interval`` seconds, in a thread."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def take(self) -> Sample:
        return Sample(
            time.monotonic() - self.t0,
            c.status_kib(self.pid, "VmRSS"),
            fd_count(self.pid),
            c.cpu_seconds(self.pid),
        )

    def _run(self) -> None:
        for _ in range(1_000_000):
            try:
                self.samples.append(self.take())
            except (OSError, KeyError):
                return
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def slope_mib_per_min(samples: list[Sample]) -> float:
    """Least-squares slope of RSS over time, MiB per minute."""
    if len(samples) < 2:
        return 0.0
    xs = [s.t / 60 for s in samples]
    ys = [s.rss_kib / 1024 for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def settle_fds(pid: int, target: int, limit_s: float) -> tuple[int, float]:
    """Wait until ``pid`` has at most ``target`` fds or ``limit_s`` passed: (fds, seconds)."""
    t0 = time.monotonic()
    fds = fd_count(pid)
    for _ in range(int(limit_s / 0.5) + 1):
        fds = fd_count(pid)
        if fds <= target or time.monotonic() - t0 >= limit_s:
            break
        time.sleep(0.5)
    return fds, time.monotonic() - t0


@dataclasses.dataclass
class JobAccount:
    """MPIJobs of this soak: creates answered 201 by stamp, deletes answered 2xx, listed now."""

    created: Counter[str]
    deleted: int
    existing: list[str]


def _count_jobs(records: list[list[Any]], tag: str) -> tuple[Counter[str], int]:
    created: Counter[str] = Counter()
    deleted = 0
    for _seq, method, _verb, resource, _sub, status, _t0, _t1, stamp in records:
        if resource != "mpijobs":
            continue
        if method == "POST" and status == 201 and stamp.startswith(tag):
            created[stamp] += 1
        elif method == "DELETE" and 200 <= status < 300:
            deleted += 1
    return created, deleted


def mpijob_accounting(kube_url: str, tag: str) -> JobAccount:
    """Count the soak's MPIJobs from the stand-in's records and a list, consistently."""
    account = JobAccount(Counter(), 0, [])
    for _ in range(10):
        before = _count_jobs(c.get_json(f"{kube_url}/debug/standin/timings")["records"], tag)
        doc = c.get_json(f"{kube_url}{MPIJOBS_PATH}?labelSelector={SELECTOR}")
        after = _count_jobs(c.get_json(f"{kube_url}/debug/standin/timings")["records"], tag)
        account = JobAccount(
            after[0],
            after[1],
            [
                str((i.get("metadata", {}).get("annotations") or {}).get("openmpp.org/run-stamp"))
                for i in doc.get("items") or ()
            ],
        )
        if before == after:  # no MPIJob created or deleted while listing
            break
        time.sleep(0.5)
    return account


def _split(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=180.0, help="seconds of traffic (180)")
    p.add_argument("--clients", type=int, default=100, help="concurrent clients (100)")
    p.add_argument("--client-procs", type=int, default=2, help="client processes (2)")
    p.add_argument("--transfers", type=int, help="transfer clients (default clients/25)")
    p.add_argument("--submitters", type=int, help="submitting clients (default clients/25)")
    p.add_argument("--small-think", type=float, default=0.2, help="seconds between GETs (0.2)")
    p.add_argument("--submit-every", type=float, default=2.0, help="seconds per submitter (2)")
    p.add_argument("--size-mib", type=int, default=64, help="transfer size (64 MiB)")
    p.add_argument("--log-lines", type=int, default=20, help="model log lines per run (20)")
    p.add_argument(
        "--run-seconds",
        help="MIN:MAX run time of a job (default 5:30; shorter when --duration < 120)",
    )
    p.add_argument(
        "--max-slope",
        type=float,
        default=4.0,
        help="largest RSS trend over the second half, MiB/min (4)",
    )
    p.add_argument("--fd-slack", type=int, default=4, help="fds allowed over the start (4)")
    p.add_argument(
        "--retention",
        type=float,
        default=15.0,
        help="runs.finished_retention_seconds; below 600 s, deleted runs' tombstones last as long "
        "and the proxy sweeps every 5 s, so that the proxy's memory can reach a steady state "
        "(15; 3600 is the production default)",
    )
    p.add_argument(
        "--event-ttl",
        type=float,
        default=60.0,
        help="the stand-in deletes Events older than this (60; a real API server: 3600)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="sample the proxy with py-spy during the traffic; raw stacks to FILE",
    )
    args = p.parse_args(argv)
    # The run cache's timings are configuration (group ``follow``): a short retention needs
    # tombstones and sweeps at least as short, set the way an operator would set them.
    args.follow = (
        {"tombstone_seconds": args.retention, "sweep_seconds": min(5.0, args.retention)}
        if args.retention < 600
        else {}
    )
    if args.duration < 20:
        p.error("--duration must be at least 20 s")
    if args.run_seconds is None:
        args.run_seconds = "5:30" if args.duration >= 120 else f"2:{max(3, args.duration / 4):g}"
    low, _, high = args.run_seconds.partition(":")
    args.run_range = (float(low), float(high or low))
    per = max(2, args.clients // 25)
    args.transfers = per if args.transfers is None else args.transfers
    args.submitters = per if args.submitters is None else args.submitters
    args.small = args.clients - args.transfers - args.submitters
    if args.small < 0:
        p.error("--clients must exceed --transfers + --submitters")
    return args


def _pct(values: list[float], q: float) -> float:
    return c.percentile(values, q)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    cores = os.cpu_count() or 1
    tag = f"soak{random.randrange(16**6):06x}"
    # Runs start within ~3 s of their submission; the last one must end before the traffic.
    submit_seconds = max(5.0, args.duration - args.run_range[1] - 10)
    poll_seconds = args.duration + 30
    print(
        f"oms-mpijob-proxy soak: {args.duration:g} s, {args.clients} clients in "
        f"{args.client_procs} processes ({args.small} small GET every ~{args.small_think:g} s, "
        f"{args.transfers} x {args.size_mib} MiB transfers, {args.submitters} submitters every "
        f"~{args.submit_every:g} s for the first {submit_seconds:g} s) + one UI-like poller per "
        f"launched run; runs take {args.run_range[0]:g}-{args.run_range[1]:g} s and log "
        f"{args.log_lines} lines; {cores} CPU cores, python {sys.version.split()[0]}",
        flush=True,
    )
    workers = [c.Worker() for _ in range(args.client_procs)]
    servers: list[c.Server] = []
    with c.workdir("oms-bench-soak-") as work:
        try:
            oms = c.start_oms(work, max_seconds=args.duration + 600)
            servers.append(oms)
            kube_opts = ["--scenario", "succeed", "--log-lines", str(args.log_lines)]
            kube_opts += ["--run-seconds", f"{args.run_range[0]:g}:{args.run_range[1]:g}"]
            kube_opts += ["--event-ttl", f"{args.event_ttl:g}"]
            kube, kubeconfig = c.start_kube(work, kube_opts, max_seconds=args.duration + 600)
            servers.append(kube)
            proxy = c.start_proxy(
                oms.url,
                work,
                extra_config={
                    "runs": {"intercept": "mpi", "finished_retention_seconds": args.retention},
                    "kubernetes": {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE},
                    "mpijob": {"template": str(TEMPLATE)},
                    "follow": args.follow,
                },
            )
            servers.append(proxy)
            c.wait_ready(proxy.url)
            return _soak(args, tag, submit_seconds, poll_seconds, workers, proxy, kube, oms)
        finally:
            for w in workers:
                w.close()
            for s in reversed(servers):
                s.stop()


def _soak(
    args: argparse.Namespace,
    tag: str,
    submit_seconds: float,
    poll_seconds: float,
    workers: list[c.Worker],
    proxy: c.Server,
    kube: c.Server,
    oms: c.Server,
) -> int:
    # Warm up: every kind of request once, then let the pools settle.
    for path in SMALL_PATHS:
        c.get_json(proxy.url + path)
    c.download(proxy.url, "/test/download/1048576", timeout=30)
    c.upload(proxy.url, "/test/upload", 1 << 20, timeout=30)
    time.sleep(1.0)
    start_rss = c.status_kib(proxy.pid, "VmRSS")
    start_fds = fd_count(proxy.pid)
    procs = args.client_procs
    plans = [
        Plan(
            index=i,
            url=proxy.url,
            tag=tag,
            seconds=args.duration,
            submit_seconds=submit_seconds,
            poll_seconds=poll_seconds,
            small=_split(args.small, procs, i),
            small_think=args.small_think,
            downloads=_split(args.transfers // 2 + args.transfers % 2, procs, i),
            uploads=_split(args.transfers // 2, procs, i),
            submitters=_split(args.submitters, procs, i),
            submit_every=args.submit_every,
            size=args.size_mib * c.MIB,
            log_lines=args.log_lines,
            seed=i + 1,
        )
        for i in range(procs)
    ]
    pids = {"proxy": proxy.pid, "kube": kube.pid, "oms": oms.pid}
    with contextlib.ExitStack() as stack:
        if args.profile is not None:
            stack.enter_context(c.py_spy(proxy.pid, args.profile, poll_seconds + 120))
        sampler = stack.enter_context(Sampler(proxy.pid))
        cpu = stack.enter_context(c.CpuMeter(pids))
        outcomes, cpu.worker_cpu = c.call_all(
            workers, [(run_clients, (plan,)) for plan in plans], timeout=poll_seconds + 120
        )
    traffic_seconds = cpu.seconds
    after_fds = fd_count(proxy.pid)
    end_fds, settled_in = settle_fds(proxy.pid, start_fds + args.fd_slack, 30.0)
    end_rss = c.status_kib(proxy.pid, "VmRSS")

    merged = Outcome()
    for o in outcomes:
        for k, v in o.latencies.items():
            merged.latencies.setdefault(k, []).extend(v)
        for k, v in o.rates.items():
            merged.rates.setdefault(k, []).extend(v)
        merged.errors.update(o.errors)
        merged.samples += o.samples
        merged.submitted += o.submitted
        merged.followed += o.followed
        merged.max_pollers += o.max_pollers
    for values in merged.latencies.values():
        values.sort()

    jobs = mpijob_accounting(kube.url, tag)
    listed = jobs.existing
    kube_stats = c.get_json(f"{kube.url}/debug/standin/stats")
    log_text = proxy.log.read_text(errors="replace") if proxy.log.exists() else ""
    log_problems = [
        line
        for line in log_text.splitlines()
        if any(w in line for w in ("ERROR", "CRITICAL", "Traceback", "Unclosed", "Task was"))
    ]

    samples = sampler.samples
    half = [s for s in samples if s.t >= samples[-1].t / 2] if samples else []
    slope_all = slope_mib_per_min(samples)
    slope_half = slope_mib_per_min(half)
    peak_rss = max([s.rss_kib for s in samples] + [start_rss, end_rss])
    submitted = len(merged.submitted)

    # --- report ---
    print(
        f"\ntraffic: {traffic_seconds:.0f} s; launched runs: {submitted}, followed to final with"
        f" their whole log: {merged.followed}; pollers at once (peak, summed over processes):"
        f" {merged.max_pollers}"
    )
    print(
        "CPU over the soak (% of one core): "
        + ", ".join(f"{k} {cpu.share(k):.0f}" for k in ("proxy", "kube", "oms", "client", "others"))
    )
    header = (
        f"{'class':<12} {'requests':>9} {'errors':>6} {'p50 ms':>9} {'p99 ms':>9} {'MB/s p50':>9}"
    )
    print("\n" + header)
    print("-" * len(header))
    for kind in CLASSES:
        lat = merged.latencies.get(kind, [])
        rate = sorted(merged.rates.get(kind, []))
        mbs = f"{_pct(rate, 50):9.0f}" if rate else f"{'':9}"
        print(
            f"{kind:<12} {len(lat) + merged.errors.get(kind, 0):>9} {merged.errors.get(kind, 0):>6}"
            f" {_pct(lat, 50):9.1f} {_pct(lat, 99):9.1f} {mbs}"
        )
    for sample in merged.samples[:10]:
        print(f"  error: {sample}")

    print("\nproxy RSS (MiB) over time:")
    marks = [samples[min(len(samples) - 1, round(i * (len(samples) - 1) / 8))] for i in range(9)]
    print(
        "  " + "  ".join(f"{s.t:4.0f}s {s.rss_kib / 1024:5.1f}" for s in marks) if samples else ""
    )
    print(
        f"  start {start_rss / 1024:.1f}, end {end_rss / 1024:.1f}, peak {peak_rss / 1024:.1f}; "
        f"trend {slope_all:+.2f} MiB/min overall, {slope_half:+.2f} MiB/min over the second half"
    )
    print(
        f"proxy open fds: start {start_fds}, peak {max([s.fds for s in samples] + [start_fds])}, "
        f"right after the traffic {after_fds}, after {settled_in:.0f} s idle {end_fds}"
    )
    print(
        f"MPIJobs: created {sum(jobs.created.values())} (by the stand-in's records), deleted by "
        f"the proxy's retention {jobs.deleted}, listed now {len(listed)}; successful "
        f"submissions {submitted}"
    )
    requests = kube_stats.get("requests", {})
    total_api = sum(requests.values())
    print(
        f"Kubernetes API requests: {total_api} ({total_api / traffic_seconds:.1f}/s): "
        + ", ".join(f"{k} {n}" for k, n in sorted(requests.items()))
    )
    print(f"proxy log lines with ERROR/Traceback/Unclosed: {len(log_problems)}")
    for line in log_problems[:5]:
        print(f"  {line[:300]}")

    # With production retention every run stays in the proxy's cache for the whole soak, so its
    # memory grows with the runs by design; the trend is then reported, not judged.
    judged = args.retention < 600
    checks = [
        ("no errors in any class", str(sum(merged.errors.values())), "0", not merged.errors),
        (
            "one MPIJob per successful submission",
            f"{sum(jobs.created.values())} vs {submitted}",
            "created once each, no other",
            jobs.created == Counter(merged.submitted) and submitted > 0,
        ),
        (
            "MPIJobs listed + deleted == submissions",
            f"{len(listed)} + {jobs.deleted} vs {submitted}",
            "equal, same stamps",
            set(listed) <= set(merged.submitted)
            and len(set(listed)) == len(listed)
            and len(listed) + jobs.deleted == submitted,
        ),
        (
            "every launched run followed to final",
            f"{merged.followed}/{submitted}",
            "all",
            merged.followed == submitted,
        ),
        (
            "open fds after idle vs start",
            f"{end_fds} vs {start_fds}",
            f"<= start + {args.fd_slack}",
            end_fds <= start_fds + args.fd_slack,
        ),
        (
            "RSS trend, second half",
            f"{slope_half:+.2f} MiB/min",
            f"<= {args.max_slope:g}" if judged else "info: finished runs retained",
            slope_half <= args.max_slope or not judged,
        ),
        ("proxy log without errors", str(len(log_problems)), "0", not log_problems),
    ]
    if args.profile is not None and args.profile.exists():
        c.summarize_profile(args.profile, "Proxy profile over the soak")
    print("\nChecks")
    for name, value, limit, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name:<40} {value:>22}  {limit}")

    print("\nSummary (Markdown)\n")
    print("| class | requests | errors | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for kind in CLASSES:
        lat = merged.latencies.get(kind, [])
        print(
            f"| {kind} | {len(lat) + merged.errors.get(kind, 0)} | {merged.errors.get(kind, 0)} "
            f"| {_pct(lat, 50):.1f} | {_pct(lat, 99):.1f} |"
        )
    print(
        f"\n{traffic_seconds:.0f} s, {args.clients} clients + up to {merged.max_pollers} pollers; "
        f"{submitted} runs launched, {sum(jobs.created.values())} MPIJobs created "
        f"({jobs.deleted} since deleted by retention), {merged.followed} followed to final. "
        f"Proxy RSS {start_rss / 1024:.1f} → {end_rss / 1024:.1f} MiB (peak "
        f"{peak_rss / 1024:.1f}; trend {slope_half:+.2f} MiB/min over the second half); fds "
        f"{start_fds} → {end_fds}; proxy CPU {cpu.share('proxy'):.0f}% of a core."
    )
    return 0 if all(ok for *_, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
