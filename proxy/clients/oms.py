"""The proxy's own calls to oms: one place that sends them and translates their failures.

A timeout becomes :class:`~proxy.errors.UpstreamTimeout` (504), a refused or broken connection
:class:`~proxy.errors.UpstreamUnavailable` (502); nothing of aiohttp leaves this module.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.errors import (
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.keys import OMS_BASE, SESSION, request_id
from proxy.passthrough import headers as hdr
from proxy.passthrough.forward import oms_request_headers, upstream_url

MAX_OMS_ANSWER = 32 << 20


@dataclasses.dataclass(frozen=True)
class OmsAnswer:
    """An oms answer read whole."""

    status: int
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON for a 200 JSON answer, else None."""
        if self.status != 200 or "json" not in self.headers.get("Content-Type", ""):
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def response(self, request: web.Request) -> web.Response:
        """This answer, unchanged, for the client."""
        out = hdr.downstream_response_headers(CIMultiDictProxy(self.headers))
        out.popall("Content-Length", None)
        out.setdefault(hdr.REQUEST_ID, request_id(request))
        return web.Response(status=self.status, headers=out, body=self.body)


async def oms_get(request: web.Request, path_qs: str | None = None) -> OmsAnswer:
    """GET the request's URL (or ``path_qs``) from oms, with the client's headers, read whole."""
    app = request.app
    out = oms_request_headers(request, None)
    out["Accept-Encoding"] = "identity"  # the proxy reads this answer
    base = app[OMS_BASE]
    url = upstream_url(base, request) if path_qs is None else URL(base + path_qs, encoded=True)
    try:
        async with app[SESSION].get(
            url, headers=out, allow_redirects=False, auto_decompress=False
        ) as resp:
            body = await resp.content.read(MAX_OMS_ANSWER)
            return OmsAnswer(resp.status, CIMultiDict(resp.headers), body)
    except TimeoutError as e:
        raise UpstreamTimeout("oms did not answer in time") from e
    except (aiohttp.ClientError, OSError) as e:
        raise UpstreamUnavailable(f"oms is unreachable: {type(e).__name__}") from e
