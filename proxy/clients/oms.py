"""The proxy's own calls to oms: one client that sends them and translates their failures.

The pass-through does not come here (it streams with :mod:`proxy.passthrough.client`). These are
the calls the proxy makes for itself: the model lookup of a run request, oms's own answers that
the follow handlers amend (status, service state), and the readiness check. Every one goes
through :meth:`OmsClient._get`: a timeout becomes :class:`~proxy.errors.UpstreamTimeout` (504), a
refused, reset or broken connection :class:`~proxy.errors.UpstreamUnavailable` (502); nothing of
aiohttp leaves this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.errors import (
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.keys import request_id
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


class OmsClient:
    """The proxy's own client of oms: one aiohttp session, one base URL, one error translation."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base = base_url.rstrip("/")

    @contextlib.asynccontextmanager
    async def _get(
        self,
        url: str | URL,
        headers: Mapping[str, str],
        what: str,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """GET ``url``; a timeout or connection failure is raised as the project's error."""
        about = f" {what}" if what else ""
        try:
            async with self.session.get(
                url, headers=headers, allow_redirects=False, auto_decompress=False
            ) as resp:
                yield resp
        except TimeoutError as e:
            raise UpstreamTimeout(f"oms did not answer{about} in time") from e
        except (aiohttp.ClientError, OSError) as e:
            where = f" ({what})" if what else ""
            raise UpstreamUnavailable(f"oms is unreachable{where}: {type(e).__name__}") from e

    async def relay_get(self, request: web.Request, path_qs: str | None = None) -> OmsAnswer:
        """GET the request's URL (or ``path_qs``) with the client's headers; read it whole."""
        out = oms_request_headers(request, None)
        out["Accept-Encoding"] = "identity"  # the proxy reads this answer
        base = self.base
        url = upstream_url(base, request) if path_qs is None else URL(base + path_qs, encoded=True)
        async with self._get(url, out, "") as resp:
            body = await resp.content.read(MAX_OMS_ANSWER)
            return OmsAnswer(resp.status, CIMultiDict(resp.headers), body)

    async def model(self, digest_or_name: str, headers: Mapping[str, str]) -> tuple[int, Any]:
        """``GET /api/model/<dn>``: (status, the JSON document when 200, else None)."""
        url = f"{self.base}/api/model/{quote(digest_or_name, safe='')}"
        async with self._get(url, headers, "the model lookup") as resp:
            if resp.status != 200:
                return resp.status, None
            try:
                return 200, json.loads(await resp.content.read(MAX_OMS_ANSWER))
            except ValueError as e:
                raise UpstreamUnavailable("oms answered the model lookup with no JSON") from e

    async def ready(self) -> str:
        """``ok`` when oms answers ``/api/service/config`` (below 500) within 5 s, else why not."""
        try:
            async with (
                asyncio.timeout(5),
                self._get(self.base + "/api/service/config", {}, "") as r,
            ):
                return "ok" if r.status < 500 else f"oms answered {r.status}"
        except TimeoutError as e:
            return f"unreachable: {type(e).__name__}"
        except (UpstreamTimeout, UpstreamUnavailable) as e:
            return f"unreachable: {type(e.__cause__).__name__}"


OMS: web.AppKey[OmsClient] = web.AppKey("oms", OmsClient)
"""The proxy's own client of oms."""


def oms_get(request: web.Request, path_qs: str | None = None) -> Awaitable[OmsAnswer]:
    """:meth:`OmsClient.relay_get` of the request's app."""
    return request.app[OMS].relay_get(request, path_qs)
