"""A stand-in for oms (the OpenM++ web service) on loopback, for tests, the demo and benchmarks.

It answers the oms routes the proxy and the OpenM++ UI use, with oms's shapes and its plain-text
errors (shared/reference/oms-api.md), plus a few test routes under ``/test/`` (echo, sized
downloads and uploads, status codes, slow and chunked answers, a download cut mid-way) and two
fault switches for every route (``delay``, ``drop``). It keeps a small in-memory "database" of
runs that tests fill to play a model writing its ``run_lst`` row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import json
from typing import Any

from aiohttp import web

_BLOCK = bytes(range(256)) * 1024  # 256 KiB of a known pattern


def pattern_sha256(size: int) -> str:
    """SHA-256 of /test/download/<size> without holding it in memory."""
    h = hashlib.sha256()
    left = size
    while left:
        n = min(left, len(_BLOCK))
        h.update(_BLOCK[:n])
        left -= n
    return h.hexdigest()


@dataclasses.dataclass
class Model:
    """A model in the stand-in's catalog."""

    name: str
    digest: str


@dataclasses.dataclass
class RunRow:
    """A row of run_lst, as a model run writes it."""

    model: Model
    run_stamp: str
    status: str = "p"  # i, p, w, s, x, e
    run_digest: str = ""
    name: str = ""
    sub_count: int = 1
    sub_completed: int = 0
    progress: int = 0
    created: str = ""
    updated: str = ""

    def pub(self) -> dict[str, Any]:
        """The RunPub shape oms answers for /status and /status/list."""
        return {
            "ModelName": self.model.name,
            "ModelDigest": self.model.digest,
            "Name": self.name or f"{self.model.name}_{self.run_stamp}",
            "SubCount": self.sub_count,
            "SubStarted": self.sub_count,
            "SubCompleted": self.sub_completed,
            "CreateDateTime": self.created,
            "Status": self.status,
            "UpdateDateTime": self.updated,
            "RunDigest": self.run_digest or hashlib.md5(self.run_stamp.encode()).hexdigest(),  # noqa: S324
            "ValueDigest": "",
            "RunStamp": self.run_stamp,
            "Txt": [],
            "Opts": {},
            "Param": [],
            "Table": [],
            "Entity": [],
            "Progress": [
                {
                    "SubId": 0,
                    "CreateDateTime": self.created,
                    "Status": self.status,
                    "UpdateDateTime": self.updated,
                    "Count": self.progress,
                    "Value": self.progress,
                }
            ],
        }


def _now() -> str:
    return dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _text_error(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain", charset="utf-8")


EMPTY_RUN_STATE: dict[str, Any] = {
    "ModelName": "",
    "ModelDigest": "",
    "RunStamp": "",
    "SubmitStamp": "",
    "IsFinal": False,
    "UpdateDateTime": "",
    "RunName": "",
    "TaskRunName": "",
    "IsLog": False,
    "LogFileName": "",
}


class FakeOms:
    """In-memory oms. ``models``, ``runs`` and ``requests`` are public for tests to inspect."""

    def __init__(self, models: list[Model] | None = None, oms_name: str = "oms-standin") -> None:
        self.models = models or [
            Model("RiskPaths", "d90e1e9a49a06d972ecf1d50e684c62b"),
            Model("modelOne", "_201208171604590148_"),
        ]
        self.runs: dict[tuple[str, str], RunRow] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.run_posts: list[bytes] = []
        self.oms_name = oms_name
        self.url = ""  # set by whoever serves it
        # Faults for tests: every request waits ``delay`` seconds, then, if ``drop``, its
        # connection is closed without an answer.
        self.delay = 0.0
        self.drop = False
        self.app = self._make_app()

    def find_model(self, dn: str) -> Model | None:
        """Digest first, then name (as oms's ModelDicByDigestOrName)."""
        for m in self.models:
            if m.digest == dn:
                return m
        for m in self.models:
            if m.name == dn:
                return m
        return None

    def add_run(self, model: str, run_stamp: str, status: str = "p") -> RunRow:
        """Play a model that wrote its run_lst row."""
        m = self.find_model(model)
        assert m is not None, model
        now = _now()
        row = RunRow(m, run_stamp, status, created=now, updated=now)
        self.runs[(m.digest, run_stamp)] = row
        return row

    # --- handlers --------------------------------------------------------------------------

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.raw_path, dict(request.headers)))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.drop:
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)  # never sent
        result: web.StreamResponse = await handler(request)
        return result

    async def model(self, request: web.Request) -> web.Response:
        m = self.find_model(request.match_info["model"])
        if m is None:
            return _text_error(400, f"Model not found: {request.match_info['model']}")
        return web.json_response(
            {
                "Model": {
                    "ModelId": self.models.index(m) + 1,
                    "Name": m.name,
                    "Digest": m.digest,
                    "Type": 0,
                    "Version": "1.0.0.0",
                    "CreateDateTime": "2024-01-01 00:00:00.000",
                    "DefaultLangCode": "EN",
                },
                "Type": [],
                "Param": [],
                "Table": [],
            }
        )

    async def run_status(self, request: web.Request) -> web.Response:
        m = self.find_model(request.match_info["model"])
        if m is None:
            return _text_error(400, f"Model not found: {request.match_info['model']}")
        row = self.runs.get((m.digest, request.match_info["stamp"]))
        empty = RunRow(m, "").pub() | {
            "ModelName": "",
            "ModelDigest": "",
            "Name": "",
            "RunDigest": "",
            "Status": "",
            "Progress": None,
        }
        if request.path.endswith("/list"):
            return web.json_response([row.pub()] if row else [])
        return web.json_response(row.pub() if row else empty)

    async def run_status_last(self, request: web.Request) -> web.Response:
        m = self.find_model(request.match_info["model"])
        if m is None:
            return _text_error(400, f"Model not found: {request.match_info['model']}")
        rows = [r for (d, _), r in self.runs.items() if d == m.digest]
        if not rows:
            return web.json_response(RunRow(m, "").pub() | {"Status": "", "RunDigest": ""})
        return web.json_response(max(rows, key=lambda r: r.created).pub())

    async def run_log(self, request: web.Request) -> web.Response:
        return web.json_response(
            EMPTY_RUN_STATE | {"Offset": 0, "Size": 0, "TotalSize": 0, "Lines": []}
        )

    async def run_stop(self, request: web.Request) -> web.Response:
        m = self.find_model(request.match_info["model"])
        if m is None:
            return _text_error(400, f"Model not found: {request.match_info['model']}")
        stamp = request.match_info["stamp"]
        return web.Response(
            status=200,
            content_type="text/plain",
            headers={"Content-Location": f"/api/model/{m.digest}/run/{stamp}/false"},
        )

    async def run_post(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.run_posts.append(body)
        if "application/json" not in request.headers.get("Content-Type", ""):
            return _text_error(415, "Expected Content-Type: application/json")
        if not body:
            return _text_error(400, "Invalid (empty) json at /api/run")
        try:
            req = json.loads(body)
        except ValueError:
            return _text_error(400, "Json decode error at /api/run")
        lower = {str(k).lower(): v for k, v in req.items()} if isinstance(req, dict) else {}
        dn = str(lower.get("modeldigest") or lower.get("modelname") or "")
        m = self.find_model(dn)
        if m is None:
            return _text_error(400, f"Model not found: {dn}")
        stamp = dt.datetime.now().strftime("%Y_%m_%d_%H_%M_%S_%f")[:-3]
        state = EMPTY_RUN_STATE | {
            "ModelName": m.name,
            "ModelDigest": m.digest,
            "RunStamp": stamp,
            "SubmitStamp": stamp,
            "UpdateDateTime": _now(),
            "IsLog": True,
            "LogFileName": f"{m.name}.{stamp}.console.log",
        }
        return web.json_response(
            state, headers={"Content-Location": f"/api/model/{m.digest}/run/{stamp}"}
        )

    async def service_config(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"OmsName": self.oms_name, "IsJobControl": False, "RunCatalog": {}}
        )

    async def service_job(self, request: web.Request) -> web.Response:
        """GET /api/service/job/{active|queue|history}/{stamp}: oms's ``emptyRunJobState`` (this
        stand-in starts no jobs itself)."""
        return web.json_response(
            {
                "JobStatus": "",
                "SubmitStamp": request.match_info["stamp"],
                "Pid": 0,
                "CmdPath": "",
                "CmdLine": "",
                "ModelName": "",
                "ModelDigest": "",
                "RunStamp": "",
                "Dir": "",
                "Opts": {},
                "Env": {},
                "Threads": 0,
                "IsMpi": False,
                "Mpi": {"Np": 0, "IsNotOnRoot": False, "IsNotByJob": False},
                "Template": "",
                "Tables": [],
                "Microdata": {"IsToDb": False, "IsInternal": False, "Entity": []},
                "RunNotes": [],
                "Res": {
                    "Cpu": 0,
                    "Mem": 0,
                    "ProcessCount": 0,
                    "ThreadCount": 0,
                    "ProcessMemMb": 0,
                    "ThreadMemMb": 0,
                },
                "IsOverLimit": False,
                "QueuePos": 0,
                "LogFileName": "",
                "LogPath": "",
                "BinDir": "",
                "WorkDir": "",
                "IniPath": "",
                "HostFilePath": "",
                "RunStatus": [],
                "Lines": [],
            }
        )

    async def service_state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "IsJobControl": True,
                "JobUpdateDateTime": _now(),
                "MpiRes": {"Cpu": 0, "Mem": 0},
                "ActiveTotalRes": {"Cpu": 0, "Mem": 0},
                "ActiveOwnRes": {"Cpu": 0, "Mem": 0},
                "QueueTotalRes": {"Cpu": 0, "Mem": 0},
                "QueueOwnRes": {"Cpu": 0, "Mem": 0},
                "MpiErrorRes": {"Cpu": 0, "Mem": 0},
                "MpiMaxThreads": 0,
                "LocalRes": {"Cpu": 0, "Mem": 0},
                "LocalActiveRes": {"Cpu": 0, "Mem": 0},
                "LocalQueueRes": {"Cpu": 0, "Mem": 0},
                "IsQueuePaused": False,
                "IsAllQueuePaused": False,
                "JobServiceState": {},
                "Queue": [],
                "Active": [],
                "History": [],
                "ComputeState": [],
            }
        )

    # --- test routes ------------------------------------------------------------------------

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {
                "method": request.method,
                "raw_path": request.raw_path,
                "headers": [[k, v] for k, v in request.headers.items()],
                "body_len": len(body),
                "body_sha256": hashlib.sha256(body).hexdigest(),
            },
            headers={"X-Echo": "1", "Set-Cookie": "s=1; Path=/"},
        )

    async def download(self, request: web.Request) -> web.StreamResponse:
        size = int(request.match_info["size"])
        chunked = request.query.get("chunked") == "1"
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        if chunked:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = size
        await resp.prepare(request)
        left = size if request.method != "HEAD" else 0
        while left:
            n = min(left, len(_BLOCK))
            await resp.write(_BLOCK[:n])
            left -= n
        await resp.write_eof()
        return resp

    async def reset(self, request: web.Request) -> web.StreamResponse:
        """Announce ``size`` bytes, send half of them, then cut the connection."""
        size = int(request.match_info["size"])
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = size
        await resp.prepare(request)
        await resp.write(_BLOCK[: min(size // 2, len(_BLOCK))])
        await asyncio.sleep(0.05)  # let the half reach the client first
        if request.transport is not None:
            request.transport.abort()
        return resp

    async def upload(self, request: web.Request) -> web.Response:
        h = hashlib.sha256()
        n = 0
        while True:
            data = await request.content.read(256 * 1024)
            if not data:
                break
            h.update(data)
            n += len(data)
        return web.json_response({"body_len": n, "body_sha256": h.hexdigest()})

    async def status(self, request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        if code in (204, 304):
            return web.Response(status=code, headers={"ETag": '"abc"'})
        return web.Response(status=code, text=f"status {code}\n", content_type="text/plain")

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.match_info["seconds"]))
        return web.Response(text="slow\n")

    async def small(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "items": list(range(20))})

    async def gzip(self, request: web.Request) -> web.Response:
        import gzip as gz

        payload = gz.compress(b'{"compressed": true}')
        return web.Response(
            body=payload,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._record], client_max_size=1 << 40)
        r = app.router
        r.add_get("/api/model/{model}", self.model)
        r.add_get("/api/model/{model}/run/status/last", self.run_status_last)
        r.add_get("/api/model/{model}/run/{stamp}/status", self.run_status)
        r.add_get("/api/model/{model}/run/{stamp}/status/list", self.run_status)
        r.add_get("/api/run/log/model/{model}/stamp/{stamp}{tail:(/.*)?}", self.run_log)
        r.add_put("/api/run/stop/model/{model}/stamp/{stamp}", self.run_stop)
        r.add_post("/api/run", self.run_post)
        r.add_get("/api/service/config", self.service_config)
        r.add_get("/api/service/state", self.service_state)
        r.add_get("/api/service/job/{list:active|queue|history}/{stamp}", self.service_job)
        r.add_get("/test/download/{size:[0-9]+}", self.download)
        r.add_route("*", "/test/upload", self.upload)
        r.add_get("/test/reset/{size:[0-9]+}", self.reset)
        r.add_get("/test/status/{code:[0-9]+}", self.status)
        r.add_get("/test/slow/{seconds}", self.slow)
        r.add_get("/test/small", self.small)
        r.add_get("/test/gzip", self.gzip)
        r.add_route("*", "/test/echo{tail:.*}", self.echo)
        return app
