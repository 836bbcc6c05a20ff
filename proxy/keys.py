"""Typed application keys shared by the app factory and the handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from proxy.config import Config
from proxy.metrics import Metrics
from proxy.upstream import Upstream

if TYPE_CHECKING:
    from proxy.k8s import KubeClient
    from proxy.lifecycle import RunCache
    from proxy.runs import Submitter
    from proxy.template import Template

CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
"""aiohttp's client to oms, for the proxy's own calls (model lookups, /readyz, run state)."""
UPSTREAM: web.AppKey[Upstream] = web.AppKey("upstream", Upstream)
"""The pass-through's own pooled client to oms (proxy.upstream), used by passthrough.forward."""
KUBE: web.AppKey[KubeClient | None] = web.AppKey("kube")
SUBMITTER: web.AppKey[Submitter | None] = web.AppKey("submitter")
TEMPLATE: web.AppKey[Template] = web.AppKey("template")
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
OMS_BASE: web.AppKey[str] = web.AppKey("oms_base", str)
STATE: web.AppKey[dict[str, Any]] = web.AppKey("state", dict)
RUN_CACHE: web.AppKey[RunCache | None] = web.AppKey("run_cache")
"""The informer cache of launched runs (proxy.lifecycle); None when runs are not intercepted."""
