"""Shared fixtures: stand-ins served on loopback, and the proxy built by its real factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.config import Config, config_from_dict
from proxy.standins.oms import FakeOms

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


@pytest.fixture
async def make_proxy(
    aiohttp_client: Callable[..., Awaitable[TestClient[web.Request, web.Application]]],
) -> ProxyFactory:
    """Build a proxy TestClient for a Config."""

    async def factory(config: Config) -> TestClient[web.Request, web.Application]:
        return await aiohttp_client(create_app(config))

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
    await asyncio.sleep(0)
    leaked = [
        t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()
    ]
    for t in leaked:
        t.cancel()
    assert not leaked, f"leaked tasks: {leaked}"


# --- end oms stand-in and proxy fixtures ---
