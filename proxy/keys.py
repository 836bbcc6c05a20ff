"""Typed keys shared by the app factory and every flow (only those of the shared layers).

A key whose value belongs to one flow or client lives next to it (``UPSTREAM`` in
``passthrough.forward``, ``KUBE`` in ``clients.kube``, ``SUBMITTER``/``TEMPLATE`` in
``submit.handler``, ``RUN_CACHE`` in ``follow.cache``), so this module imports nothing above it.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from proxy.config import Config
from proxy.metrics import Metrics

CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
"""aiohttp's client to oms, for the proxy's own calls (model lookups, /readyz, run state)."""
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
OMS_BASE: web.AppKey[str] = web.AppKey("oms_base", str)
STATE: web.AppKey[dict[str, Any]] = web.AppKey("state", dict)

REQUEST_ID_KEY: web.RequestKey[str] = web.RequestKey("request_id", str)


def request_id(request: web.Request) -> str:
    """This request's id (set by the app's middleware)."""
    rid: str = request.get(REQUEST_ID_KEY, "")
    return rid
