"""Shared fixtures: stand-ins served on loopback, and the proxy built by its real factory."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app, server_options
from proxy.clientside import ProxyRunner
from proxy.config import Config
from proxy.configload import config_from_dict
from standins.oms import FakeOms

# --- the two tiers ---
# tests/e2e needs a real control plane (`make e2e`): it is collected only when named on the
# command line, so `make test` stays Python-only and fast.

E2E_DIR = Path(__file__).parent / "e2e"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path != E2E_DIR:
        return None
    named = [Path(a.split("::")[0]).resolve() for a in config.args]
    return not any(a == E2E_DIR or E2E_DIR in a.parents for a in named)


# --- end the two tiers ---


# --- oms stand-in and proxy fixtures ---


@pytest.fixture
async def oms() -> AsyncIterator[FakeOms]:
    """A stand-in oms (its ``url`` attribute is set once it is served)."""
    fake = FakeOms()
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    yield fake
    await server.close()


def make_config(oms_url: str, **sections: dict[str, Any]) -> Config:
    """A validated Config pointing at ``oms_url``; ``sections`` override keys per section."""
    data: dict[str, Any] = {"oms": {"url": oms_url}, "runs": {"intercept": "none"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data, "<test>")


ProxyFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


class ProxyTestServer(TestServer):
    """A TestServer serving through the proxy's own runner (proxy.clientside), as ``serve``."""

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return ProxyRunner(self.app, **kwargs)


@pytest.fixture
async def make_proxy(
    aiohttp_client: Callable[..., Awaitable[TestClient[web.Request, web.Application]]],
) -> ProxyFactory:
    """Build a proxy TestClient for a Config, served with the same stack as ``serve``."""

    async def factory(config: Config) -> TestClient[web.Request, web.Application]:
        server = ProxyTestServer(create_app(config), host="127.0.0.1")
        await server.start_server(**server_options(config))
        return await aiohttp_client(server)

    return factory


@pytest.fixture
async def proxy(oms: FakeOms, make_proxy: ProxyFactory) -> TestClient[web.Request, web.Application]:
    """The proxy in pure pass-through mode in front of the stand-in oms."""
    return await make_proxy(make_config(oms.url))


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Every test must leave no asyncio task behind."""
    before = asyncio.all_tasks()
    yield
    others = asyncio.all_tasks() - before - {asyncio.current_task()}
    if others:  # tasks being cancelled by a server's cleanup get a moment to finish
        await asyncio.wait(others, timeout=1.0)
    leaked = [t for t in others if not t.done()]
    for t in leaked:
        t.cancel()
    assert not leaked, f"leaked tasks: {leaked}"


# --- end oms stand-in and proxy fixtures ---


# --- kube stand-in fixtures ---
# Imports are local so that this block stays self-contained in a file two people edit.


@pytest.fixture
def fake_kube() -> Any:
    """A stand-in Kubernetes API (standins.kube.FakeKube) validating against the CRD."""
    from standins.kube import FakeKube, find_crd

    return FakeKube(crd_schema_path=find_crd())


KubeconfigFor = Callable[..., Awaitable[Any]]


@pytest.fixture
async def kubeconfig_for(tmp_path: Any) -> AsyncIterator[KubeconfigFor]:
    """``await kubeconfig_for(kube, token=None)``: serve ``kube`` once, return a kubeconfig Path."""
    from standins.kube import FakeKube, serve, write_kubeconfig

    runners: dict[int, tuple[web.AppRunner, str]] = {}
    written = 0

    async def kubeconfig(kube: FakeKube, token: str | None = None) -> Any:
        nonlocal written
        if id(kube) not in runners:
            runners[id(kube)] = await serve(kube)
        written += 1
        path = tmp_path / f"kubeconfig-{written}.yaml"
        return write_kubeconfig(path, runners[id(kube)][1], token=token)

    yield kubeconfig
    for runner, _ in runners.values():
        await runner.cleanup()


KubeConnect = Callable[..., Awaitable[Any]]


@pytest.fixture
async def kube_connect(kubeconfig_for: KubeconfigFor) -> AsyncIterator[KubeConnect]:
    """``await kube_connect(kube, token=None)``: a kubernetes_asyncio ApiClient for ``kube``."""
    from kubernetes_asyncio import client, config

    clients: list[Any] = []

    async def connect(kube: Any, token: str | None = None) -> Any:
        cfg = client.Configuration()
        path = await kubeconfig_for(kube, token=token)
        await config.load_kube_config(config_file=str(path), client_configuration=cfg)
        api = client.ApiClient(configuration=cfg)
        clients.append(api)
        return api

    yield connect
    for api in clients:
        await api.close()


@pytest.fixture
async def kube_api(fake_kube: Any, kube_connect: KubeConnect) -> Any:
    """A kubernetes_asyncio ApiClient connected to ``fake_kube``."""
    return await kube_connect(fake_kube)


# --- end kube stand-in fixtures ---


# --- RBAC derived from the suite ---
# Every Kubernetes API call the proxy itself makes (recognised by its User-Agent) during the whole
# test suite is recorded; at the end of a full run, the set of (apiGroup, resource, verb) must
# equal the Role in k8s/base/rbac/role.yaml: every call the code makes is granted, nothing more.

PROXY_CALLS: set[tuple[str, str, str]] = set()


@pytest.fixture(autouse=True)
def _record_proxy_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.clients.kube import USER_AGENT
    from standins.kube import FakeKube

    original = FakeKube._record

    async def recording(self: FakeKube, request: web.Request) -> Any:
        recorded = await original(self, request)
        if recorded.user_agent == USER_AGENT and recorded.resource:
            sub = f"/{recorded.subresource}" if recorded.subresource else ""
            PROXY_CALLS.add((recorded.api_group, recorded.resource + sub, recorded.verb))
        return recorded

    monkeypatch.setattr(FakeKube, "_record", recording)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """On a full, green run, compare the recorded calls with the Role."""
    opt = session.config.option
    if exitstatus != 0 or opt.keyword or opt.markexpr or opt.collectonly:
        return  # a partial run does not exercise every code path
    if session.testscollected < 500 or os.environ.get("MUTANT_UNDER_TEST"):
        return  # a partial run (or mutmut's, of the tests that reach one mutant) is not all
    from tests.test_deploy import rbac_rules_from_role

    granted = rbac_rules_from_role()
    if granted != PROXY_CALLS:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            "RBAC does not match the code: calls made but not granted: "
            f"{sorted(PROXY_CALLS - granted)}; granted but never made: "
            f"{sorted(granted - PROXY_CALLS)}"
        )
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- end RBAC derived from the suite ---
