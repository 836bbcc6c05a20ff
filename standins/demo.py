"""``oms-mpijob-proxy demo``: the whole run flow on in-process stand-ins, no cluster needed.

Starts, on loopback, a stand-in oms, a stand-in Kubernetes API with a simulated MPI Operator, and
the real proxy (built by :func:`proxy.app.create_app`, talking to the stand-in API through the
real kubernetes_asyncio client and a kubeconfig), then plays what the OpenM++ UI does and prints a
transcript with the HTTP statuses. ``--serve`` keeps everything running for curl.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from proxy import names
from proxy.app import create_app, start_site
from proxy.config import Config
from proxy.configload import config_from_dict, default_config_dir
from standins.kube import FakeKube, Scenario, find_crd, serve, write_kubeconfig
from standins.oms import FakeOms

MODEL_LOG = [
    "RiskPaths",
    "Model version  : 3.0.0.0",
    "Model created  : 2024-01-01 00:00:00.000",
    "OpenM++ version: 1.17.0",
    "Run: 0 RiskPaths_demo",
    "Reading Parameters",
    "Running Simulation",
    "member=0 Simulation progress=25% cases=2500",
    "member=1 Simulation progress=25% cases=2500",
    "member=0 Simulation progress=50% cases=5000",
    "member=1 Simulation progress=50% cases=5000",
    "member=0 Simulation progress=100% cases=10000",
    "member=1 Simulation progress=100% cases=10000",
    "Writing Output Tables",
    "Done.",
]

# The body the OpenM++ UI sends for an MPI run (shared/reference/oms-api.md §2).
UI_REQUEST: dict[str, Any] = {
    "ModelDigest": "d90e1e9a49a06d972ecf1d50e684c62b",
    "Dir": "",
    "Opts": {
        "OpenM.RunName": "RiskPaths_demo",
        "OpenM.SetName": "Default",
        "OpenM.ProgressPercent": "25",
        "OpenM.Threads": "2",
        "OpenM.LogRank": "true",
        "OpenM.NotOnRoot": "true",
        "EN.RunDescription": "Demo run through oms-mpijob-proxy",
    },
    "Threads": 2,
    "IsMpi": True,
    "Mpi": {"Np": 2, "IsNotOnRoot": True, "IsNotByJob": True},
    "Template": "",
    "Tables": ["T01_LifeExpectancy"],
    "Microdata": {"IsToDb": False, "IsInternal": False, "Entity": []},
    "RunNotes": [],
}


def _scenario_for(job: dict[str, Any]) -> Scenario:
    labels = job.get("metadata", {}).get("labels", {})
    if labels.get(names.MODEL_NAME_KEY) == "modelOne":  # the job the demo stops: runs for long
        return Scenario(log_lines=[f"member=0 step {i}" for i in range(10_000)], line_interval=0.2)
    return Scenario(log_lines=MODEL_LOG, line_interval=0.15, running_after=0.6, created_after=0.2)


class Transcript:
    """Readable lines for the person watching."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str = "") -> None:
        self.lines.append(text)
        print(text, flush=True)

    def http(self, method: str, path: str, status: int, note: str = "") -> None:
        self.say(f"  {method:4} {path}  ->  {status}{'  ' + note if note else ''}")


async def _start(app: web.Application, port: int = 0) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    host, bound = runner.addresses[0][:2]
    return runner, f"http://{host}:{bound}"


class Stack:
    """The stand-ins and the proxy, started on loopback."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.oms = FakeOms()
        self.kube = FakeKube(
            namespaces=("openmpp",),
            crd_schema_path=find_crd(),
            scenario_for=_scenario_for,
        )
        self.runners: list[web.AppRunner] = []
        self.proxy_url = ""

    def config(self, kube_url: str) -> Config:
        kubeconfig = write_kubeconfig(self.workdir / "kubeconfig", kube_url, namespace="openmpp")
        return config_from_dict(
            {
                "oms": {"url": self.oms.url},
                "kubernetes": {"namespace": "openmpp", "kubeconfig": str(kubeconfig)},
                "runs": {"start_deadline_seconds": 60, "finished_retention_seconds": 600},
                "logging": {"level": "WARNING"},
            },
            "<demo>",
            base_dir=str(default_config_dir()),
        )

    async def start(self, proxy_port: int = 0) -> None:
        runner, self.oms.url = await _start(self.oms.app)
        self.runners.append(runner)
        kube_runner, kube_url = await serve(self.kube)
        self.runners.append(kube_runner)
        config = self.config(kube_url)
        runner, port = await start_site(
            create_app(config), config, "127.0.0.1", proxy_port, access_log=None
        )
        self.proxy_url = f"http://127.0.0.1:{port}"
        self.runners.insert(0, runner)

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


async def _follow_log(
    http: aiohttp.ClientSession, base: str, digest: str, stamp: str, t: Transcript
) -> dict[str, Any]:
    """Poll the log pages as the UI does until the log is complete; print new lines."""
    shown = 0
    page: dict[str, Any] = {}
    statuses: dict[int, int] = {}
    for _ in range(600):
        count = max(200, int(page.get("TotalSize", 0)) - shown)
        path = f"/api/run/log/model/{digest}/stamp/{stamp}/start/{shown}/count/{count}"
        async with http.get(base + path) as resp:
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            page = await resp.json()
        lines = page.get("Lines") or []
        offset = int(page.get("Offset", 0))
        for i, line in enumerate(lines):
            if offset + i >= shown:
                t.say(f"    | {line}")
        shown = max(shown, offset + len(lines))
        if page.get("IsFinal") and offset + int(page.get("Size", 0)) >= int(page["TotalSize"]):
            break
        await asyncio.sleep(0.25)
    t.say(f"  (log pages: {', '.join(f'{n} x {s}' for s, n in sorted(statuses.items()))})")
    return page


async def play(stack: Stack) -> int:
    """Do what the UI does, printing a transcript; returns a process exit status."""
    t = Transcript()
    base = stack.proxy_url
    t.say("oms-mpijob-proxy demo — stand-in oms, stand-in Kubernetes API + simulated MPI Operator")
    t.say(f"  proxy {base}   oms {stack.oms.url}")
    t.say()
    async with aiohttp.ClientSession() as http:
        # Wait for the proxy's start-up dry run so its readiness is shown.
        for _ in range(50):
            async with http.get(base + "/readyz") as resp:
                ready = await resp.json()
            if ready.get("checks", {}).get("dry_run", "ok") != "pending":
                break
            await asyncio.sleep(0.1)
        t.say("1. Readiness")
        t.http("GET", "/readyz", resp.status, json.dumps(ready["checks"]))
        t.say()

        t.say("2. A normal oms call passes through")
        async with http.get(base + "/api/model/RiskPaths") as resp:
            model = await resp.json()
        t.http("GET", "/api/model/RiskPaths", resp.status, f"digest {model['Model']['Digest']}")
        t.say()

        t.say("3. The UI submits an MPI run (Np=2, not on root, 2 threads)")
        async with http.post(base + "/api/run", json=UI_REQUEST) as resp:
            body = await resp.text()
            status = resp.status
            location = resp.headers.get("Content-Location", "")
        t.http("POST", "/api/run", status, f"Content-Location: {location}")
        if status != 200:
            t.say(f"  unexpected answer: {body}")
            return 1
        state = json.loads(body)
        t.say(f"  RunState: {json.dumps(state)}")
        t.say()

        jobs = stack.kube.objects("mpijobs", "openmpp")
        t.say(f"4. The MPIJob it created ({len(jobs)} in namespace openmpp), as YAML:")
        job = jobs[0]
        shown = {k: job[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        for key in ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"):
            shown["metadata"].pop(key, None)
        for line in yaml.safe_dump(shown, sort_keys=False, width=100).splitlines():
            t.say(f"    {line}")
        t.say()

        t.say("5. The UI follows the log pages to the end (start/count paging as the UI does)")
        digest, stamp = state["ModelDigest"], state["RunStamp"]
        page = await _follow_log(http, base, digest, stamp, t)
        t.say(f"  IsFinal={page.get('IsFinal')}  TotalSize={page.get('TotalSize')}")
        async with http.get(base + f"/api/model/{digest}/run/{stamp}/status/list") as resp:
            progress = await resp.json()
        t.http(
            "GET",
            f"/api/model/{digest}/run/{stamp}/status/list",
            resp.status,
            f"Status {[p.get('Status') for p in progress]}",
        )
        t.say()

        t.say("6. A second run (modelOne), then the UI's stop button")
        second = dict(UI_REQUEST, ModelDigest="_201208171604590148_")
        async with http.post(base + "/api/run", json=second) as resp:
            state2 = await resp.json()
        t.http("POST", "/api/run", resp.status, f"RunStamp {state2['RunStamp']}")
        await asyncio.sleep(1.0)
        async with http.get(base + "/api/service/state") as resp:
            service = await resp.json()
        active = [a.get("SubmitStamp") for a in service.get("Active", [])]
        t.http("GET", "/api/service/state", resp.status, f"Active jobs: {active}")
        stop_path = f"/api/run/stop/model/{state2['ModelDigest']}/stamp/{state2['RunStamp']}"
        async with http.put(base + stop_path) as resp:
            t.http("PUT", stop_path, resp.status, resp.headers.get("Content-Location", ""))
        await stack.kube.wait_until(lambda: len(stack.kube.objects("mpijobs", "openmpp")) == 1, 10)
        t.say(f"  MPIJobs left: {[j['metadata']['name'] for j in stack.kube.objects('mpijobs')]}")
        page = await _follow_log(
            http, base, state2["ModelDigest"], state2["RunStamp"], Transcript()
        )
        tail = (page.get("Lines") or [""])[-1]
        t.say(f"  stopped run: IsFinal={page.get('IsFinal')}, last line: {tail}")
        t.say()
        t.say("Done: the UI's whole run flow worked through the proxy on MPIJob-backed runs.")
    return 0


async def _main(serve_forever: bool, port: int) -> int:
    with tempfile.TemporaryDirectory(prefix="oms-mpijob-proxy-demo-") as tmp:
        stack = Stack(Path(tmp))
        await stack.start(port if serve_forever else 0)
        try:
            if not serve_forever:
                return await play(stack)
            print(f"proxy:  {stack.proxy_url}   (oms stand-in {stack.oms.url})", flush=True)
            print(
                f"try:    curl -s {stack.proxy_url}/api/model/RiskPaths\n"
                f"        curl -s -H 'Content-Type: application/json' "
                f"-d '{json.dumps(UI_REQUEST)}' {stack.proxy_url}/api/run\n"
                "Ctrl-C stops.",
                flush=True,
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):
                    loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            return 0
        finally:
            await stack.stop()


def run_demo(serve: bool = False, port: int = 8080) -> int:
    """Entry point of ``oms-mpijob-proxy demo``."""
    return asyncio.run(_main(serve, port))
