"""What the proxy could not read from the Kubernetes API is said on the log page, in one line.

Run with the proxy's Role missing ``get pods/log`` or ``list pods`` (the stand-in answers those
requests 403, as the API server does): the UI's log page must not show the API's Status JSON as
model output, nor silently show nothing; it says once what could not be read and why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from standins.kube import FakeKube
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor
from tests.test_lifecycle import DIGEST, PREFIX, Client, Env, _scenario


@pytest.fixture
async def env(
    oms: FakeOms,
    fake_kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Env:
    return Env(oms, fake_kube, str(await kubeconfig_for(fake_kube)), aiohttp_client)


async def _lines_until(client: Client, stamp: str, needle: str, within: float = 6.0) -> list[str]:
    """Log page lines, polled like the UI (from the start), until one contains ``needle``."""
    async with asyncio.timeout(within):
        while True:
            resp = await client.get(f"/api/run/log/model/{DIGEST}/stamp/{stamp}/start/0/count/0")
            assert resp.status == 200, await resp.text()
            lines: list[str] = (await resp.json())["Lines"]
            if any(needle in line for line in lines):
                return lines
            await asyncio.sleep(0.05)


def _problem_lines(lines: list[str]) -> list[str]:
    return [x for x in lines if x.startswith(f"{PREFIX}could not read")]


async def test_forbidden_launcher_log_is_one_line_not_model_output(env: Env) -> None:
    _scenario(env.kube, log_lines=["model line"])
    env.kube.forbid("get", "pods/log")
    client = await env.proxy()
    state: Any = await env.submit(client)
    lines = await _lines_until(client, state["RunStamp"], "could not read the launcher's log")
    assert len(_problem_lines(lines)) == 1
    (problem,) = _problem_lines(lines)
    assert "lacks a permission" in problem
    assert "pods/log" in problem or "log" in problem
    assert not [x for x in lines if not x.startswith(PREFIX)], "no model output was read"
    assert not [x for x in lines if '"kind"' in x or "Status" in x], "no API Status as a line"
    again = await _lines_until(client, state["RunStamp"], "could not read")
    assert len(_problem_lines(again)) == 1, "said once, not once per poll"


async def test_forbidden_pod_list_is_said_not_silently_empty(env: Env) -> None:
    _scenario(env.kube, log_lines=["model line"])
    env.kube.forbid("list", "pods")
    env.kube.forbid("watch", "pods")
    client = await env.proxy()
    state: Any = await env.submit(client)
    lines = await _lines_until(client, state["RunStamp"], "could not read the run's pods")
    (problem,) = _problem_lines(lines)
    assert "lacks a permission" in problem
    assert lines[0].startswith(PREFIX)  # the submission line still comes first


async def test_forbidden_events_are_said_once(env: Env) -> None:
    _scenario(env.kube, kind="suspended")  # a run that waits: its page would explain it
    env.kube.forbid("list", "events")
    client = await env.proxy()
    state: Any = await env.submit(client)
    lines = await _lines_until(client, state["RunStamp"], "could not read the namespace's Events")
    (problem,) = _problem_lines(lines)
    assert "lacks a permission" in problem
