"""Shared helpers for the benchmarks and the memory test: processes, /proc readings, clients.

Everything talks to loopback only. Every server started here is stopped by its owner and, should
that process die first, gets SIGTERM from Linux (PR_SET_PDEATHSIG); the stand-in oms also exits by
itself after ``max_seconds``. Every client loop is bounded in bytes or time, every wait has a
deadline.

Servers (each a separate process):
  - :func:`start_oms` — the stand-in oms (``python -m standins.serve_oms``);
  - :func:`start_kube` — the stand-in Kubernetes API (``python -m standins.serve_kube``);
  - :func:`start_proxy` — the proxy (``python -m proxy serve``) with a temporary config;
  - :func:`start_nginx` — nginx as a reference reverse proxy, when it is installed.

Clients (meant to run in a process of their own: :class:`Worker`, :func:`run_in_process`):
  - :func:`get_load` — keep-alive GETs on N connections for a fixed time, with latencies
    (:func:`get_load_workers` spreads them over several worker processes);
  - :func:`wrk_load` — the same through ``wrk`` when it is installed;
  - :func:`download` / :func:`upload` / :func:`transfers` — large bodies over plain sockets,
    optionally throttled, N at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import hashlib
import http.client
import json
import multiprocessing
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
MIB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
PATTERN = bytes(range(256)) * 1024  # 256 KiB, the stand-in oms's download pattern


# --- processes --------------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to SIGTERM this child when the process that started it goes away."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
    return port


@dataclasses.dataclass
class Server:
    """A server process started by this module."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        """Process id of the serving process."""
        return self.popen.pid

    @property
    def port(self) -> int:
        """The listening port."""
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; safe to call twice."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(grace)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log, for error messages."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _child_env() -> dict[str, str]:
    """This environment, with this checkout last on PYTHONPATH (children run in a temp dir)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO)) if p)
    return env


def _spawn(name: str, argv: Sequence[str], workdir: Path, stdout: int | None) -> Server:
    log = workdir / f"{name}.log"
    with log.open("wb") as err:
        popen = subprocess.Popen(
            list(argv),
            stdout=stdout if stdout is not None else err,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env=_child_env(),
            preexec_fn=_die_with_parent,
        )
    return Server(name, popen, "", log)


def _read_line(popen: subprocess.Popen[bytes], deadline: float) -> str:
    """One line from the child's stdout, or '' at the deadline or when it exits."""
    assert popen.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(popen.stdout, selectors.EVENT_READ)
    buf = b""
    try:
        while time.monotonic() < deadline and b"\n" not in buf:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(popen.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    finally:
        sel.close()
    return buf.decode(errors="replace").split("\n", 1)[0]


def wait_http(url: str, timeout: float = 20.0, proc: Server | None = None) -> None:
    """Wait until ``url`` answers an HTTP request (any status); raise at the deadline."""
    host, port = _host_port(url)
    path = "/" + url.split("/", 3)[3] if url.count("/") >= 3 else "/"
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    for _ in range(int(timeout / 0.05) + 1):
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
                )
                if s.recv(16).startswith(b"HTTP/1."):
                    return
        except OSError as e:
            last = e
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    tail = proc.log_tail() if proc is not None else ""
    raise RuntimeError(f"{url} did not answer within {timeout} s ({last})\n{tail}")


def start_oms(workdir: Path, max_seconds: float = 1800.0) -> Server:
    """The stand-in oms in its own process, on a free loopback port."""
    server = _spawn(
        "oms",
        [
            sys.executable,
            "-m",
            "standins.serve_oms",
            "--host",
            LOOPBACK,
            "--port",
            "0",
            "--max-seconds",
            str(max_seconds),
        ],
        workdir,
        subprocess.PIPE,
    )
    server.url = _announced_url(server, "stand-in oms", 20)
    wait_http(server.url + "/test/small", proc=server)
    return server


def _announced_url(server: Server, what: str, within: float) -> str:
    """The URL a ``serve_*`` stand-in prints on its first line ("listening on <url>")."""
    line = _read_line(server.popen, time.monotonic() + within)
    m = re.fullmatch(r"listening on (http://\S+)", line.strip())
    if m is None:
        server.stop()
        raise RuntimeError(f"{what} did not start: {line!r}\n{server.log_tail()}")
    return m.group(1)


def start_kube(
    workdir: Path,
    options: Sequence[str] = (),
    *,
    name: str = "kube",
    max_seconds: float = 1800.0,
) -> tuple[Server, Path]:
    """The stand-in Kubernetes API (``python -m standins.serve_kube``) in its own process.

    ``options`` are more flags for it (scenario, validation...). Returns the server and the
    kubeconfig it wrote (in ``workdir``) for a proxy to use.
    """
    kubeconfig = workdir / f"{name}-kubeconfig.yaml"
    argv = [sys.executable, "-m", "standins.serve_kube", "--host", LOOPBACK, "--port", "0"]
    argv += ["--max-seconds", str(max_seconds), "--kubeconfig", str(kubeconfig), *options]
    server = _spawn(name, argv, workdir, subprocess.PIPE)
    server.url = _announced_url(server, "stand-in Kubernetes API", 30)
    wait_http(server.url + "/version", proc=server)
    return server, kubeconfig


def write_proxy_config(path: Path, extra: dict[str, Any] | None = None) -> Path:
    """A proxy config for pure pass-through (no Kubernetes), WARNING logs, plus ``extra``."""
    data: dict[str, Any] = {"runs": {"intercept": "none"}, "logging": {"level": "WARNING"}}
    for section, values in (extra or {}).items():
        data.setdefault(section, {}).update(values)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")  # JSON is YAML
    return path


def start_proxy(
    oms_url: str,
    workdir: Path,
    *,
    name: str = "proxy",
    extra_config: dict[str, Any] | None = None,
    uvloop: bool = False,
    code: str | None = None,
) -> Server:
    """The proxy (``python -m proxy serve``) in its own process, in front of ``oms_url``.

    ``uvloop=True`` runs the very same CLI on uvloop's event loop (only to measure it; the
    proxy itself does not use uvloop). ``code``, if given, is run with ``python -c`` in place of
    ``-m proxy`` with the same arguments; it must end by calling ``proxy.cli.main``.
    """
    port = free_port()
    config = write_proxy_config(workdir / f"{name}.yaml", extra_config)
    args = ["serve", "--config", str(config), "--host", LOOPBACK, "--port", str(port)]
    args += ["--oms-url", oms_url]
    if code is not None:
        argv = [sys.executable, "-c", code, *args]
    elif uvloop:
        code = "import sys, uvloop; uvloop.install(); from proxy.cli import main; sys.exit(main())"
        argv = [sys.executable, "-c", code, *args]
    else:
        argv = [sys.executable, "-m", "proxy", *args]
    server = _spawn(name, argv, workdir, None)
    server.url = f"http://{LOOPBACK}:{port}"
    try:
        wait_http(server.url + "/healthz", proc=server)
    except BaseException:
        server.stop()
        raise
    return server


NGINX_CONF = """\
worker_processes 1;
master_process off;
daemon off;
error_log {d}/nginx-error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi_temp;
    uwsgi_temp_path {d}/uwsgi_temp;
    scgi_temp_path {d}/scgi_temp;
    upstream oms {{ server {upstream}; keepalive 256; }}
    server {{
        listen {listen};
        client_max_body_size 0;
        location / {{
            proxy_pass http://oms;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_buffer_size 256k;
            proxy_buffers 4 256k;
            proxy_busy_buffers_size 256k;
            client_body_buffer_size 256k;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def nginx_path() -> str | None:
    """The nginx binary, if installed."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def start_nginx(oms_url: str, workdir: Path, *, probe: bool = True) -> Server | None:
    """nginx in one process (no master), streaming both ways like the proxy; None if absent.

    Reads and writes in 256 KiB buffers, as the proxy does (server.read_chunk_bytes). With
    ``probe`` it returns once GET /test/small answers through it (an oms stand-in behind).
    """
    binary = nginx_path()
    if binary is None:
        return None
    d = workdir / "nginx"
    d.mkdir(exist_ok=True)
    port = free_port()
    upstream = oms_url.split("://", 1)[1]
    conf = d / "nginx.conf"
    conf.write_text(NGINX_CONF.format(d=d, upstream=upstream, listen=f"{LOOPBACK}:{port}"))
    server = _spawn(
        "nginx", [binary, "-p", str(d), "-e", str(d / "early.log"), "-c", str(conf)], d, None
    )
    server.url = f"http://{LOOPBACK}:{port}"
    if not probe:
        return server
    try:
        wait_http(server.url + "/test/small", proc=server)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def workdir(prefix: str = "oms-bench-") -> Iterator[Path]:
    """A temporary directory for configs and logs."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        yield Path(d)


# --- /proc ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def busy_cpu_seconds() -> float:
    """CPU time all cores of this machine have spent busy so far (from /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]  # user .. steal
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK  # minus idle and iowait


def own_cpu_seconds() -> float:
    """CPU time of this process and of its children that have been waited for."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class CpuMeter:
    """CPU used over a ``with`` block by given processes, by the clients, and by everything else
    on the machine ("others": whatever else runs there, which skews the figures).

    The clients' CPU is this process's (including reaped children such as wrk) plus what
    worker processes report: set ``worker_cpu`` inside the block.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.used: dict[str, float] = {}
        self.seconds = 0.0
        self.worker_cpu = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._own = own_cpu_seconds()
        self._busy = busy_cpu_seconds()
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t
        busy = busy_cpu_seconds() - self._busy
        self.used = {name: cpu_seconds(pid) - self._start[name] for name, pid in self.pids.items()}
        self.used["client"] = own_cpu_seconds() - self._own + self.worker_cpu
        self.used["others"] = max(0.0, busy - sum(self.used.values()))

    def share(self, name: str) -> float:
        """CPU of ``name`` in % of one core over the block."""
        return 100 * self.used.get(name, 0.0) / self.seconds if self.seconds else 0.0


def status_kib(pid: int, key: str) -> int:
    """A ``kB`` value of /proc/<pid>/status, e.g. VmRSS or VmHWM."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class PeakRss:
    """Peak RSS of a process over a ``with`` block, in KiB.

    VmHWM is reset at the start (clear_refs) and read at the end; the RSS is also sampled every
    few milliseconds, which is what is used where the reset is not allowed.
    """

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.start_kib = 0
        self.peak_kib = 0
        self._reset = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        self._reset = reset_peak_rss(self.pid)
        self.start_kib = self.peak_kib = status_kib(self.pid, "VmRSS")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak_kib = max(self.peak_kib, status_kib(self.pid, "VmRSS"))
            except (OSError, KeyError):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(OSError, KeyError):
            if self._reset:
                self.peak_kib = max(self.peak_kib, status_kib(self.pid, "VmHWM"))
            else:
                self.peak_kib = max(self.peak_kib, status_kib(self.pid, "VmRSS"))


# --- running a client in a process of its own ---------------------------------------------------


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_in_process(fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
    """``fn(*args)`` in a fresh (spawned) process; its result, or an error after ``timeout``."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} took more than {timeout} s")
        status, value = parent.recv()
    finally:
        parent.close()
        proc.join(2)
        if proc.is_alive():
            proc.kill()
            proc.join(2)
    if status != "ok":
        raise RuntimeError(value)
    return value


def _serve_calls(conn: Connection) -> None:
    """A worker's loop: run each ``(fn, args)`` received, answer (status, value, cpu seconds)."""
    for _ in range(100_000):
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        fn, args = msg
        cpu0 = time.process_time()
        try:
            value = fn(*args)
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}", time.process_time() - cpu0))
        else:
            conn.send(("ok", value, time.process_time() - cpu0))


class Worker:
    """A client process kept for many calls, so that its start-up is not measured."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_calls, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float) -> tuple[Any, float]:
        """``fn(*args)`` in the worker: (result, the worker's CPU seconds for it)."""
        self._conn.send((fn, args))
        if not self._conn.poll(timeout):
            self.close()
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} took more than {timeout} s")
        status, value, cpu = self._conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value, cpu

    def close(self) -> None:
        """Stop the worker (killed if it does not stop at once)."""
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(2)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)
        self._conn.close()


def call_all(
    workers: Sequence[Worker],
    calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]],
    timeout: float,
) -> tuple[list[Any], float]:
    """One call per worker, all at once: (results in order, total worker CPU seconds)."""
    results: list[Any] = [None] * len(calls)
    cpu = [0.0] * len(calls)
    errors: list[str] = []

    def one(i: int) -> None:
        fn, args = calls[i]
        try:
            results[i], cpu[i] = workers[i].call(fn, *args, timeout=timeout)
        except (RuntimeError, TimeoutError, OSError, EOFError) as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError("; ".join(errors) or "a client worker did not answer")
    return results, sum(cpu)


# --- keep-alive GET load ------------------------------------------------------------------------


@dataclasses.dataclass
class Load:
    """Result of a fixed-time GET load."""

    requests: int
    errors: int
    seconds: float
    latencies_us: list[float]  # sorted; may be empty when the client only gives percentiles
    p50_us: float
    p99_us: float
    client_cpu_seconds: float
    client: str

    @property
    def rps(self) -> float:
        """Completed requests per second."""
        return self.requests / self.seconds if self.seconds else 0.0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


_CL = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)", re.IGNORECASE)


class _GetConnection(asyncio.Protocol):
    """One keep-alive connection sending the same GET again and again until the deadline."""

    def __init__(self, request: bytes, deadline_ns: int, out: _GetTotals) -> None:
        self.request = request
        self.deadline_ns = deadline_ns
        self.out = out
        self.buf = bytearray()
        self.need = -1
        self.sent_ns = 0
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        now = time.perf_counter_ns()
        if now >= self.deadline_ns:
            self.transport.close()
            return
        self.buf.clear()
        self.need = -1
        self.sent_ns = now
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.need < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            m = _CL.search(self.buf, 0, end + 2)
            if m is None:  # only Content-Length answers are expected here
                self.out.errors += 1
                assert self.transport is not None
                self.transport.close()
                return
            self.need = end + 4 + int(m.group(1))
        if len(self.buf) < self.need:
            return
        if self.buf[9:12] == b"200":
            self.out.latencies.append((time.perf_counter_ns() - self.sent_ns) // 1000)
        else:
            self.out.errors += 1
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


@dataclasses.dataclass
class _GetTotals:
    latencies: array[int] = dataclasses.field(default_factory=lambda: array("q"))
    errors: int = 0


async def _get_load(host: str, port: int, path: str, connections: int, seconds: float) -> Load:
    loop = asyncio.get_running_loop()
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: */*\r\n\r\n".encode()
    totals = _GetTotals()
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    conns: list[_GetConnection] = []
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(connections):
        _, proto = await loop.create_connection(
            lambda: _GetConnection(request, deadline, totals), host, port
        )
        conns.append(proto)
    await asyncio.wait_for(asyncio.gather(*(c.done for c in conns)), seconds + 30)
    elapsed = time.perf_counter() - t0
    lat = sorted(float(v) for v in totals.latencies)
    return Load(
        requests=len(lat),
        errors=totals.errors,
        seconds=elapsed,
        latencies_us=lat,
        p50_us=percentile(lat, 50),
        p99_us=percentile(lat, 99),
        client_cpu_seconds=time.process_time() - cpu0,
        client="python",
    )


def get_load(url: str, connections: int, seconds: float) -> Load:
    """GET ``url`` on ``connections`` keep-alive connections for ``seconds`` (one process)."""
    host, port = _host_port(url)
    path = "/" + url.split("/", 3)[3]
    return asyncio.run(_get_load(host, port, path, connections, seconds))


def get_load_workers(url: str, connections: int, seconds: float, workers: Sequence[Worker]) -> Load:
    """:func:`get_load` split over client worker processes (at most one per connection)."""
    n = max(1, min(len(workers), connections))
    shares = [connections // n + (1 if i < connections % n else 0) for i in range(n)]
    results, cpu = call_all(
        workers[:n], [(get_load, (url, k, seconds)) for k in shares], timeout=seconds + 60
    )
    lat = sorted(v for r in results for v in r.latencies_us)
    return Load(
        requests=len(lat),
        errors=sum(r.errors for r in results),
        seconds=max(r.seconds for r in results),
        latencies_us=lat,
        p50_us=percentile(lat, 50),
        p99_us=percentile(lat, 99),
        client_cpu_seconds=cpu,
        client=f"python x{n}",
    )


def wrk_path() -> str | None:
    """The wrk binary, if installed."""
    return shutil.which("wrk")


_WRK_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6}


def _wrk_time_us(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if m is None:
        raise ValueError(f"unexpected wrk time {text!r}")
    return float(m.group(1)) * _WRK_UNITS[m.group(2)]


def wrk_load(url: str, connections: int, seconds: float, threads: int = 1) -> Load:
    """The same load as :func:`get_load`, generated by wrk (C, far cheaper per request)."""
    binary = wrk_path()
    if binary is None:
        raise RuntimeError("wrk is not installed")
    argv = [
        binary,
        f"-t{min(threads, connections)}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
    ]
    argv += ["--latency", "--timeout", "10s", url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=seconds + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed: {text}")
    m = re.search(r"^\s*([0-9]+) requests in ([0-9.]+\w+)", text, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"unexpected wrk output: {text}")
    pct = dict(re.findall(r"^\s+(50|99)%\s+([0-9.]+\w+)\s*$", text, re.MULTILINE))
    errors = sum(
        int(n) for n in re.findall(r"(?:connect|read|write|timeout) ([0-9]+)", text)
    ) + sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: ([0-9]+)", text))
    return Load(
        requests=int(m.group(1)),
        errors=errors,
        seconds=_wrk_time_us(m.group(2)) / 1e6,
        latencies_us=[],
        p50_us=_wrk_time_us(pct["50"]),
        p99_us=_wrk_time_us(pct["99"]),
        client_cpu_seconds=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        client="wrk",
    )


def _host_port(url: str) -> tuple[str, int]:
    netloc = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = netloc.rpartition(":")
    return host, int(port)


# --- large transfers over plain sockets -----------------------------------------------------------


@dataclasses.dataclass
class Transfer:
    """One upload or download."""

    bytes: int
    seconds: float
    status: int
    sha256: str = ""
    start: float = 0.0  # perf_counter at the start, to add up concurrent transfers
    end: float = 0.0


def _read_head(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and the body bytes already read."""
    buf = b""
    for _ in range(1024):
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("no response head in time")
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before the response head: {buf[:200]!r}")
        buf += chunk
    else:
        raise ConnectionError("response head too large")
    lines = buf[:end].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, buf[end + 4 :]


def _pace(start: float, done: int, rate: float | None) -> None:
    if rate:
        ahead = start + done / rate - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)


def download(
    url: str, path: str, *, rate: float | None = None, sha: bool = False, timeout: float = 600.0
) -> Transfer:
    """GET ``path``, reading at most ``rate`` bytes/s; needs a Content-Length answer."""
    host, port = _host_port(url)
    deadline = time.monotonic() + timeout
    h = hashlib.sha256() if sha else None
    size = 64 * 1024 if rate else MIB
    buf = bytearray(size)
    view = memoryview(buf)
    start = time.perf_counter()
    with socket.create_connection((host, port), timeout=60) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        status, headers, got_bytes = _read_head(s, deadline)
        if "content-length" not in headers:
            raise ConnectionError(f"no Content-Length in the answer ({status})")
        length = int(headers["content-length"])
        got = len(got_bytes)
        if h is not None:
            h.update(got_bytes)
        while got < length:
            if time.monotonic() > deadline:
                raise TimeoutError(f"download not done after {timeout} s")
            n = s.recv_into(view, min(size, length - got))
            if n == 0:
                raise ConnectionError(f"connection closed after {got} of {length} bytes")
            if h is not None:
                h.update(view[:n])
            got += n
            _pace(start, got, rate)
    end = time.perf_counter()
    return Transfer(got, end - start, status, h.hexdigest() if h else "", start, end)


def upload(
    url: str, path: str, size: int, *, rate: float | None = None, timeout: float = 600.0
) -> Transfer:
    """PUT ``size`` bytes of the download pattern to ``path`` with a Content-Length.

    The stand-in's upload routes answer the length and SHA-256 they received; ``sha256`` of the
    result is that answer.
    """
    host, port = _host_port(url)
    deadline = time.monotonic() + timeout
    block = memoryview(PATTERN) if not rate else memoryview(PATTERN)[: 64 * 1024]
    start = time.perf_counter()
    with socket.create_connection((host, port), timeout=60) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = (
            f"PUT {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n"
            "Connection: close\r\n\r\n"
        )
        s.sendall(head.encode())
        sent = 0
        while sent < size:
            if time.monotonic() > deadline:
                raise TimeoutError(f"upload not done after {timeout} s")
            n = min(len(block), size - sent)
            s.sendall(block[:n])  # every block starts at a multiple of 256 in the pattern
            sent += n
            _pace(start, sent, rate)
        status, headers, body = _read_head(s, deadline)
        length = int(headers.get("content-length", "0"))
        for _ in range(1024):
            if len(body) >= length:
                break
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    end = time.perf_counter()
    answer = json.loads(body) if status == 200 else {}
    if status == 200 and answer.get("body_len") != size:
        raise ConnectionError(f"oms received {answer.get('body_len')} of {size} bytes")
    return Transfer(sent, end - start, status, str(answer.get("body_sha256", "")), start, end)


def transfers(
    kind: str, url: str, path: str, size: int, count: int, rate: float | None, sha: bool
) -> list[Transfer]:
    """``count`` downloads or uploads at once (one thread each); raises on the first failure."""
    results: list[Transfer | None] = [None] * count
    failures: list[str] = []
    barrier = threading.Barrier(count)

    def one(i: int) -> None:
        try:
            barrier.wait(30)
            if kind == "download":
                results[i] = download(url, path, rate=rate, sha=sha)
            else:
                results[i] = upload(url, path, size, rate=rate)
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(660)
    if failures or any(r is None for r in results):
        raise RuntimeError("; ".join(failures) or "a transfer did not finish")
    return [r for r in results if r is not None]


# --- profiling ----------------------------------------------------------------------------------


@contextlib.contextmanager
def py_spy(pid: int, out: Path, limit_s: float) -> Iterator[None]:
    """Sample ``pid`` with py-spy (from this venv) over the block, as collapsed stacks in ``out``.

    py-spy is not a dependency: install it into the venv (``pip install py-spy``) to use this.
    """
    binary = Path(sys.executable).with_name("py-spy")
    argv = [str(binary), "record", "-p", str(pid), "-o", str(out), "--format", "raw"]
    argv += ["-r", "200", "-d", str(int(limit_s)), "--nonblocking"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # let it attach
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=5)
        if not out.exists():
            print(f"py-spy failed: {err.decode(errors='replace')[-500:]}")


def summarize_profile(path: Path, title: str, top: int = 25) -> None:
    """Print the functions with the most samples, inclusive and self, from collapsed stacks."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        n = int(count_text)
        frames = [re.sub(r":[0-9]+\)$", ")", f) for f in stack.split(";")]
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    if not total:
        print(f"no samples in {path}")
        return
    print(f"\n{title} (py-spy, {total} samples; raw stacks in {path})")
    print("  inclusive %  function")
    for frame, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / total:10.1f}  {frame}")
    print("  self %       function")
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / total:10.1f}  {frame}")


def get_json(url: str, timeout: float = 60.0) -> Any:
    """GET a JSON document over loopback."""
    host, port = _host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/" + url.split("/", 3)[3])
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {url}: {resp.status} {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


def wait_ready(url: str, timeout: float = 30.0) -> None:
    """Wait until the proxy's /readyz answers 200."""
    last = ""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.1) + 1):
        try:
            get_json(url + "/readyz", timeout=5)
            return
        except (RuntimeError, OSError, ValueError) as e:
            last = str(e)
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the proxy did not become ready: {last}")
