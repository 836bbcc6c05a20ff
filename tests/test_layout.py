"""The file list is the architecture: the README's table matches the tree; modules stay small."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.routes import HEALTH_ROUTES, ROUTES, bind
from tests.conftest import make_config

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 650
"""About 600 lines at most per production module (a module over it does more than one thing)."""


def _modules() -> set[str]:
    found = set()
    for package in ("proxy", "standins"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name not in ("__init__.py", "__main__.py"):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def _table() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Architecture")
    return readme[start : readme.index("\n## ", start + 1)]


def test_readme_module_table_lists_every_module_and_only_those() -> None:
    listed = set(re.findall(r"`((?:proxy|standins)/[\w/]+\.py)`", _table()))
    assert listed == _modules(), (
        f"README architecture table: missing {sorted(_modules() - listed)}, "
        f"not on disk {sorted(listed - _modules())}"
    )


def test_every_package_is_introduced_in_the_table() -> None:
    packages = {
        p.parent.relative_to(ROOT).as_posix() + "/"
        for pkg in ("proxy", "standins")
        for p in (ROOT / pkg).rglob("__init__.py")
        if p.parent != ROOT / "proxy"
    }
    listed = set(re.findall(r"`((?:proxy|standins)/(?:\w+/)*)`", _table()))
    assert packages <= listed, f"packages not introduced: {sorted(packages - listed)}"


def test_no_production_module_is_too_long() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): n
        for path in (ROOT / "proxy").rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these by responsibility: {long}"


def test_a_route_without_a_handler_stops_start_up() -> None:
    """routes.bind refuses a gap either way: the app cannot start answering less than ROUTES."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response()

    every = {r.name: handler for r in ROUTES + HEALTH_ROUTES}
    bind(web.Application().router, every)
    missing = {k: v for k, v in every.items() if k != "run_stop"}
    with pytest.raises(RuntimeError, match="run_stop"):
        bind(web.Application().router, missing)
    with pytest.raises(RuntimeError, match="run_restart"):
        bind(web.Application().router, {**every, "run_restart": handler})


def test_the_app_answers_every_route_it_publishes() -> None:
    app = create_app(make_config("http://127.0.0.1:9", runs={"intercept": "mpi"}))
    named = app.router.named_resources()
    assert {r.name for r in ROUTES + HEALTH_ROUTES} <= set(named)
