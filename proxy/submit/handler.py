"""The flow of an intercepted run: read the body within ``runs.max_body_bytes`` → parse it like oms
(:mod:`proxy.submit.decode`) → resolve the model through oms → validate against the limits in
config (:mod:`proxy.submit.validate`) → render the MPIJob (:mod:`proxy.submit.render`, pure) →
create it (:mod:`proxy.clients.kube`) → answer with an oms RunState. Retries are safe because the
MPIJob name is derived from (model, run stamp): a 409 whose object carries this request's id is
our own earlier attempt and counts as success.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from proxy import keys, names, runstate
from proxy.clients.kube import KubeClient
from proxy.clients.oms import OmsClient
from proxy.config import Config
from proxy.errors import (
    BadRequest,
    Conflict,
    KubeAlreadyExists,
    KubeError,
    KubeObjectNotFound,
    KubeServerError,
    KubeTimeout,
    KubeUnavailable,
    ProxyError,
    TooManyRequests,
    UnsupportedMediaType,
    UpstreamUnavailable,
)
from proxy.keys import request_id
from proxy.passthrough.body import read_limited
from proxy.passthrough.forward import forward
from proxy.runstate import RunState
from proxy.stamps import StampSource, local_now, make_datetime
from proxy.submit.decode import ModelInfo, RunRequest, RunRequestError, parse_run_request
from proxy.submit.render import RenderedRun, RenderError, Stamps, render
from proxy.submit.template import Template
from proxy.submit.validate import client_run_stamp, is_mpi, validate_run

_LOGGER = logging.getLogger(__name__)

INTERCEPTED: web.RequestKey[bool] = web.RequestKey("intercepted", bool)
"""Set on a POST /api/run the proxy handles itself (for the submission metrics)."""

# Headers that carry the caller's identity to oms when the proxy looks a model up for them.
_AUTH_HEADERS = ("Authorization", "Cookie", "X-Api-Key")

# After a create whose outcome is unknown (no answer in time, connection lost, 5xx), the proxy
# looks for the MPIJob this many times, every quarter of kubernetes.request_timeout_seconds, and
# deletes it if the create landed late: the client was told it failed, and would submit again.
LATE_CREATE_CHECKS = 12

# Generated stamps tried for one submission before giving up with 429 (each is at least 1 ms
# later than the one before, so this covers a burst of that many runs in one millisecond).
STAMP_ATTEMPTS = 200


@dataclasses.dataclass
class _LateCreateCheck:
    """The background removal of one MPIJob whose create failed with an unknown outcome."""

    request_id: str
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    stopped: bool = False
    task: asyncio.Task[None] | None = None


@dataclasses.dataclass
class Submitter:
    """Everything a submission needs, built once per app."""

    config: Config
    template: Template
    kube: KubeClient
    oms: OmsClient
    stamps: StampSource = dataclasses.field(default_factory=StampSource)
    in_flight: int = 0
    _models: dict[str, tuple[float, ModelInfo]] = dataclasses.field(default_factory=dict)
    _late: dict[str, _LateCreateCheck] = dataclasses.field(default_factory=dict)
    clock: Callable[[], dt.datetime] = local_now
    """Local wall-clock time (oms's stamps are local); tests pass a fixed one."""
    stamp_known: Callable[[str], bool] | None = None
    """Whether a stamp already names a run this replica knows (as run or submit stamp)."""
    on_created: Callable[[dict[str, Any]], None] | None = None
    """Told of each MPIJob just created (the app lets the run cache know: pollers asking right
    after ``POST /api/run`` then find the run before the watch event arrives)."""

    def new_stamp(self, now: dt.datetime) -> str:
        """A new stamp, later than any this process handed out, naming no run known here."""
        stamp = self.stamps.next(now)
        for _ in range(1000):
            if self.stamp_known is None or not self.stamp_known(stamp):
                break
            stamp = self.stamps.next(now)
        return stamp

    async def resolve_model(self, dn: str, request: web.Request) -> ModelInfo:
        """The model by digest or name, as oms knows it (cached briefly)."""
        if not dn:
            raise BadRequest("Model not found: (no ModelDigest or ModelName in the request)")
        now = time.monotonic()
        cached = self._models.get(dn)
        if cached is not None and now - cached[0] < self.config.oms.model_cache_seconds:
            return cached[1]
        headers = {h: request.headers[h] for h in _AUTH_HEADERS if h in request.headers}
        headers["X-Request-ID"] = request_id(request)
        status, doc = await self.oms.model(dn, headers)
        if status in (400, 404):
            raise BadRequest(f"Model not found: {dn}")
        if status != 200:
            raise UpstreamUnavailable(f"oms answered {status} to the model lookup")
        model_doc = doc.get("Model") if isinstance(doc, dict) else None
        if not isinstance(model_doc, dict) or not model_doc.get("Name"):
            raise UpstreamUnavailable("oms answered the model lookup without a model")
        info = ModelInfo(name=str(model_doc["Name"]), digest=str(model_doc.get("Digest") or ""))
        self._models[dn] = (now, info)
        return info

    async def create(self, rendered: RenderedRun, stamps: Stamps) -> dict[str, Any]:
        """Create the MPIJob (and its ConfigMap); exactly one per run stamp.

        When it fails, no MPIJob stays: a create with an unknown outcome is watched for and
        undone in the background (:meth:`_remove_late`).
        """
        check = self._late.get(rendered.name)
        if check is not None and check.request_id == stamps.request_id:
            # A retry of that very request: it may claim the object, so stop removing it.
            async with check.lock:
                check.stopped = True
        try:
            job = await self.kube.create_mpijob(rendered.mpijob)
        except (KubeTimeout, KubeUnavailable, KubeServerError) as e:
            if e.k8s_status != 429:  # a 429 is refused before anything is applied
                self._watch_late_create(rendered.name, stamps.request_id)
            raise
        except KubeAlreadyExists as e:
            try:
                job = await self.kube.get_mpijob(rendered.name)
            except KubeError:  # it may be ours, from an attempt whose answer was lost
                self._watch_late_create(rendered.name, stamps.request_id)
                raise
            ours = job.get("metadata", {}).get("annotations", {}).get(names.REQUEST_ID_KEY)
            if ours != stamps.request_id:
                raise Conflict(
                    f"Model run already submitted: run stamp {stamps.run_stamp} "
                    f"of this model is MPIJob {rendered.name}"
                ) from e
        if rendered.configmap is not None:
            configmap = _owned_by(rendered.configmap, job)
            try:
                await self.kube.create_configmap(configmap)
            except KubeAlreadyExists:
                pass  # our own earlier attempt
            except KubeError:
                if not await _delete_quietly(self.kube, rendered.name):
                    self._watch_late_create(rendered.name, stamps.request_id)
                raise
        return job

    def _watch_late_create(self, name: str, request_id: str) -> None:
        old = self._late.get(name)
        if old is not None and not old.stopped:
            return
        check = _LateCreateCheck(request_id)
        self._late[name] = check
        check.task = asyncio.create_task(self._remove_late(name, check))

    async def _remove_late(self, name: str, check: _LateCreateCheck) -> None:
        """Delete MPIJob ``name`` if it appears with this request's id; bounded in time."""
        interval = self.config.kubernetes.request_timeout_seconds / 4
        try:
            for _ in range(LATE_CREATE_CHECKS):
                await asyncio.sleep(interval)
                async with check.lock:
                    if check.stopped or await self._remove_if_ours(name, check.request_id):
                        return
        finally:
            if self._late.get(name) is check:
                del self._late[name]

    async def _remove_if_ours(self, name: str, rid: str) -> bool:
        """True once there is nothing left to do: the MPIJob is not ours, or is deleted."""
        try:
            job = await self.kube.get_mpijob(name)
        except KubeError:
            return False  # not there (yet), or the API is still failing: look again
        if job.get("metadata", {}).get("annotations", {}).get(names.REQUEST_ID_KEY) != rid:
            return True
        if not await _delete_quietly(self.kube, name):
            return False
        _LOGGER.warning("deleted MPIJob %s: its create was answered as failed", name)
        return True

    async def close(self) -> None:
        """Stop the background removals (at shutdown)."""
        tasks = [c.task for c in self._late.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


SUBMITTER: web.AppKey[Submitter | None] = web.AppKey("submitter")
TEMPLATE: web.AppKey[Template] = web.AppKey("template")


def _owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    meta = dict(obj.get("metadata") or {})
    meta["ownerReferences"] = [
        {
            "apiVersion": owner.get("apiVersion", "kubeflow.org/v2beta1"),
            "kind": owner.get("kind", "MPIJob"),
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return {**obj, "metadata": meta}


async def _delete_quietly(kube: KubeClient, name: str) -> bool:
    """Delete a half-created MPIJob; whether it is gone."""
    try:
        await kube.delete_mpijob(name, propagation="Background")
    except KubeObjectNotFound:
        return True
    except ProxyError as e:
        _LOGGER.error("could not remove half-created MPIJob %s: %s", name, e)
        return False
    return True


def run_state(model: ModelInfo, stamps: Stamps, run_name: str, now: dt.datetime) -> RunState:
    """The RunState answer of a run just submitted (:mod:`proxy.runstate`)."""
    return runstate.run_state(
        model_name=model.name,
        model_digest=model.digest,
        run_stamp=stamps.run_stamp,
        submit_stamp=stamps.submit_stamp,
        is_final=False,
        update_time=make_datetime(now),
        run_name=run_name,
    )


async def handle_submit(request: web.Request) -> web.StreamResponse:
    """POST /api/run."""
    app = request.app
    config, submitter = app[keys.CONFIG], app[SUBMITTER]
    if config.runs.intercept == "none" or submitter is None:
        return await forward(request)
    if "application/json" not in request.headers.get("Content-Type", ""):
        raise UnsupportedMediaType("Expected Content-Type: application/json")
    body = await read_limited(request, config.runs.max_body_bytes)
    try:
        req = parse_run_request(body)
    except RunRequestError as e:
        raise BadRequest(e.message) from e
    if config.runs.intercept == "mpi" and not is_mpi(req):
        return await forward(request, body=body)
    request[INTERCEPTED] = True

    if submitter.in_flight >= config.runs.max_concurrent_submissions:
        raise TooManyRequests(
            f"Too many model runs being submitted at once "
            f"(limit {config.runs.max_concurrent_submissions}); try again shortly"
        )
    submitter.in_flight += 1
    try:
        return await _submit(request, submitter, config, req)
    finally:
        submitter.in_flight -= 1


async def _submit(
    request: web.Request, submitter: Submitter, config: Config, req: RunRequest
) -> web.StreamResponse:
    model = await submitter.resolve_model(req.model_digest or req.model_name, request)
    try:
        run = validate_run(req, model, config.runs)
    except RunRequestError as e:
        raise BadRequest(e.message) from e
    now = submitter.clock()
    try:
        chosen = client_run_stamp(req)
    except RunRequestError as e:
        raise BadRequest(e.message) from e
    identity = config.server.identity_header
    rid = request_id(request) or uuid.uuid4().hex
    user = request.headers.get(identity) if identity else None
    for _ in range(STAMP_ATTEMPTS):
        # A stamp the proxy generates is both the run's SubmitStamp and, unless the client
        # chose one, its RunStamp: the create of the MPIJob (named from model and run stamp)
        # reserves it at the API server, which every replica shares.
        submit_stamp = submitter.new_stamp(now)
        stamps = Stamps(
            run_stamp=chosen or submit_stamp,
            submit_stamp=submit_stamp,
            request_id=rid,
            user=user,
            submitted_at=now,
        )
        try:
            rendered = render(run, model, config, submitter.template, stamps)
        except RenderError as e:
            raise BadRequest(f"Model start failed: {e}") from e
        try:
            job = await submitter.create(rendered, stamps)
            break
        except Conflict:
            if chosen:
                raise  # the client chose a stamp that is taken: 409
            # Another request (on any replica) took this generated stamp: take the next one.
            _LOGGER.info("run stamp %s taken by another submission; next stamp", submit_stamp)
    else:
        raise TooManyRequests(
            f"Could not reserve a new run stamp in {STAMP_ATTEMPTS} attempts "
            "(too many submissions in the same milliseconds); try again shortly"
        )
    if submitter.on_created is not None:
        submitter.on_created(job)
    annotations = job.get("metadata", {}).get("annotations", {})
    # A repeated attempt of the same request answers with the stamps of the MPIJob it created.
    stamps = dataclasses.replace(
        stamps,
        run_stamp=annotations.get(names.RUN_STAMP_KEY, stamps.run_stamp),
        submit_stamp=annotations.get(names.SUBMIT_STAMP_KEY, stamps.submit_stamp),
    )
    _LOGGER.info(
        "created MPIJob %s for model %s run %s",
        rendered.name,
        model.name,
        stamps.run_stamp,
        extra={"fields": {"mpijob": rendered.name, "request_id": stamps.request_id}},
    )
    state = run_state(model, stamps, run.run_name, now)
    return web.json_response(
        state,
        headers={"Content-Location": f"/api/model/{model.digest}/run/{stamps.run_stamp}"},
        dumps=json.dumps,
    )


async def dry_run(submitter: Submitter) -> str:
    """Create a representative MPIJob with dryRun=All; "ok" or the reason it failed."""
    example = parse_run_request(
        b'{"ModelName": "dryrun", "Mpi": {"Np": 2}, "Opts": {"OpenM.RunName": "dry-run"}}'
    )
    model = ModelInfo(name="dryrun", digest="dryrun")
    try:
        run = validate_run(example, model, submitter.config.runs)
        now = dt.datetime.now()
        stamp = submitter.stamps.next(now)
        rendered = render(
            run,
            model,
            submitter.config,
            submitter.template,
            Stamps(stamp, stamp, "dry-run", None, now),
        )
        await submitter.kube.create_mpijob(rendered.mpijob, dry_run=True)
    except (ProxyError, RunRequestError, RenderError) as e:
        return str(getattr(e, "message", e))
    return "ok"
