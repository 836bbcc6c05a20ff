"""What the e2e tests do on the wire: the clients' requests to the proxy, reads of the cluster."""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from proxy import names
from tests.e2e.cluster import ControlPlane
from tests.e2e.conftest import UI_MPI

RISKPATHS = UI_MPI["ModelDigest"]
RUN_STATE_KEYS = {
    "ModelName", "ModelDigest", "RunStamp", "SubmitStamp", "IsFinal", "UpdateDateTime",
    "RunName", "TaskRunName", "IsLog", "LogFileName",
}  # fmt: skip


def ui_request(**opts: str) -> dict[str, Any]:
    """The UI's exact MPI run request (tests/requests/ui-mpi.json), with more ``Opts``."""
    body = copy.deepcopy(UI_MPI)
    body["Opts"].update(opts)
    return body


async def submit(
    proxy_url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    """POST /api/run as the UI does (axios: JSON body): status, parsed answer, headers."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy_url + "/api/run",
            data=json.dumps(body),
            headers={"Content-Type": "application/json;charset=UTF-8", **(headers or {})},
        ) as resp,
    ):
        text = await resp.text()
        try:
            answer: Any = json.loads(text)
        except ValueError:
            answer = text
        return resp.status, answer, resp.headers


async def get(proxy_url: str, path: str) -> tuple[int, Any]:
    """GET a path of the proxy: status and JSON (or text)."""
    async with aiohttp.ClientSession() as session, session.get(proxy_url + path) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def log_page(proxy_url: str, stamp: str, start: int = 0, count: int = 0) -> Any:
    """The UI's log request: GET /api/run/log/model/<digest>/stamp/<stamp>/start/N/count/M."""
    status, page = await get(
        proxy_url, f"/api/run/log/model/{RISKPATHS}/stamp/{stamp}/start/{start}/count/{count}"
    )
    assert status == 200, (status, page)
    return page


async def follow_log(proxy_url: str, stamp: str, within: float = 120.0) -> list[Any]:
    """Poll the log as RunLog.vue does (every second, from the lines shown) until complete.

    Returns every page; raises after ``within`` seconds. Lines are appended by ``Offset``,
    as the UI does.
    """
    pages: list[Any] = []
    shown: list[str] = []
    total = 0
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        page = await log_page(proxy_url, stamp, len(shown), max(200, total - len(shown)))
        pages.append(page)
        total = int(page["TotalSize"])
        offset = int(page["Offset"])
        shown[offset:] = page["Lines"]
        if page["IsFinal"] and offset + int(page["Size"]) >= int(page["TotalSize"]):
            return pages
        await asyncio.sleep(1.0)
    raise AssertionError(f"log of {stamp} not final within {within} s; last: {pages[-1:]}")


def lines_of(pages: list[Any]) -> list[str]:
    """The lines a UI shows after ``pages`` (appended by Offset)."""
    shown: list[str] = []
    for page in pages:
        shown[int(page["Offset"]) :] = page["Lines"]
    return shown


def mpijobs(plane: ControlPlane, **annotations: str) -> list[dict[str, Any]]:
    """MPIJobs of the run namespace whose annotations include ``annotations``."""
    items: list[dict[str, Any]] = plane.get_json("mpijobs", "-n", plane.namespace)["items"]
    return [
        job
        for job in items
        if all(job["metadata"].get("annotations", {}).get(k) == v for k, v in annotations.items())
    ]


def job_of(plane: ControlPlane, run_stamp: str) -> dict[str, Any]:
    """The one MPIJob of a run stamp."""
    jobs = mpijobs(plane, **{names.RUN_STAMP_KEY: run_stamp})
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    return jobs[0]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind``, if any."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


async def eventually(
    what: str, check: Callable[[], Any], within: float = 60.0, interval: float = 0.5
) -> Any:
    """Poll ``check`` (a function, or a coroutine function) until it returns something truthy;
    that value."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
        except (AssertionError, KeyError, IndexError, RuntimeError) as e:
            last = e
        else:
            if last:
                return last
        await asyncio.sleep(interval)
    raise AssertionError(f"{what}: not within {within:g} s (last: {last!r})")


def pods_of(plane: ControlPlane, job_name: str) -> list[dict[str, Any]]:
    """The pods of an MPIJob (the operator's training.kubeflow.org/job-name label)."""
    items: list[dict[str, Any]] = plane.get_json(
        "pods", "-n", plane.namespace, "-l", f"training.kubeflow.org/job-name={job_name}"
    )["items"]
    return items
