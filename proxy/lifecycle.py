"""Launched runs for oms clients: an informer cache of MPIJobs and pods, and the handlers.

The OpenM++ UI and the R/Python clients follow a run by polling oms: its log pages, its status,
the jobs page. For runs the proxy launched as MPIJobs, oms knows nothing until the model writes
its database row (and never knows about a failure before that), so the proxy answers these
routes itself (:data:`proxy.routes.ROUTES`) and passes everything else, including every stamp
it does not own, to oms unchanged.

**The cache** (:class:`RunCache`). With ``kubernetes.watch`` on, one list+watch of our MPIJobs
and one of their pods (both selected by ``app.kubernetes.io/managed-by=oms-mpijob-proxy``, which
the renderer also puts on both pod templates) keep a local copy of everything the answers need.
A watch that fails is retried with exponential backoff (capped at 10 s); a 410 Gone re-lists at
once. Until the first list arrived, and while reconnecting, lookups list directly instead (at
most once a second, shared). With ``kubernetes.watch`` off, those direct lists are all there is.
A deleted MPIJob stays as a *tombstone* for 10 minutes so that pollers see a final state.

**API requests per run.** Pollers of a run share one launcher log read per
``kubernetes.log_cache_seconds`` (one read in flight per run; pollers get the cached log while
it runs, except for the first read and the one after the container ended; once that one is
done, never again). After the first whole read, only the log's last 2000 lines are asked for
and joined to what is known (a whole read again if they do not join). The namespace's Events
are listed (one request for all runs) only while some run waits to start, every 5 s, and once
more when a run's prelude is frozen. So a running job costs at most about one request per
second, whatever the number of pollers; a waiting one about one every 5 s.

**What the answers are made of** is :mod:`proxy.runview` (pure). Two annotations on the MPIJob
make them identical on every replica and across restarts: the frozen prelude of the log
(:data:`proxy.runview.PRELUDE_KEY`), and the start-deadline verdict
(:data:`proxy.runview.FINAL_MESSAGE_KEY`). Whichever replica can first compute one writes it with
a JSON merge patch carrying ``metadata.resourceVersion`` (a 409 means someone else changed the
job: re-read and look again). Recording the start deadline also suspends the MPIJob
(``spec.runPolicy.suspend: true``), so a run reported failed cannot start later behind the
user's back.

**Retention of finished runs.** Finished MPIJobs (Succeeded, Failed, or past the start
deadline) are kept for ``runs.finished_retention_seconds``, counted from when they finished, so
that their log stays readable; then they are deleted. Every replica sweeps its cache every 30 s
and may do it; a 404 (another replica was first) is fine. The MPI Operator's own
``ttlSecondsAfterFinished`` only removes the launcher Job, never the MPIJob, hence this.

RBAC: mpijobs get/list/watch/patch/delete, pods list/watch, pods/log get, events list.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy import headers as hdr
from proxy import names
from proxy.config import Config
from proxy.errors import (
    BadRequest,
    KubeAlreadyExists,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeObjectNotFound,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.k8s import KubeClient
from proxy.keys import CONFIG, KUBE, OMS_BASE, RUN_CACHE, SESSION
from proxy.passthrough import forward, oms_request_headers, request_id, upstream_url
from proxy.routes import ROUTES
from proxy.runview import (
    FINAL_MESSAGE_KEY,
    FINAL_PHASES,
    JOB_NAME_LABEL,
    PRELUDE_KEY,
    EventsSnapshot,
    LauncherLog,
    LogBuffer,
    PagingError,
    RunInfo,
    RunView,
    ViewSettings,
    compute_view,
    first_launcher,
    format_time,
    log_page,
    parse_go_int,
    run_info,
    run_job,
    run_pub,
)

_LOGGER = logging.getLogger(__name__)

Obj = dict[str, Any]

SELECTOR = f"{names.MANAGED_BY_KEY}={names.MANAGED_BY_VALUE}"
MAX_OMS_ANSWER = 32 << 20
LOG_TAIL_LINES = 2000
"""Lines asked for when re-reading a launcher log; more new lines than this: a whole read."""


def _about_our_run(event: Obj, runs: Mapping[str, Any], prefixes: tuple[str, ...]) -> bool:
    """Whether an Event is about one of our MPIJobs or one of its pods."""
    involved = event.get("involvedObject") or {}
    name = str(involved.get("name") or "")
    return name in runs or name.startswith(prefixes)


# --- the cache -----------------------------------------------------------------------------------


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _newer(new: Obj, old: Obj) -> bool:
    """``new`` is not older than ``old`` (resourceVersions compared as numbers when they are)."""
    a, b = _rv(new), _rv(old)
    if a.isdigit() and b.isdigit():
        return int(a) >= int(b)
    return True


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


@dataclasses.dataclass(eq=False)
class Run:
    """One launched run (an MPIJob of ours) as this replica knows it."""

    name: str
    obj: Obj
    info: RunInfo
    deleted_at: datetime | None = None
    gone_at: float | None = None
    """Monotonic time the MPIJob was seen deleted (tombstone expiry)."""
    launcher_name: str | None = None
    launcher_obj: Obj | None = None
    log: LauncherLog | None = None
    log_buffer: LogBuffer = dataclasses.field(default_factory=LogBuffer)
    log_read_at: float = -math.inf
    log_version: int = 0
    log_task: asyncio.Task[None] | None = None
    record_task: asyncio.Task[None] | None = None
    record_after: float = 0.0
    record_attempts: int = 0
    memo_key: tuple[Any, ...] | None = None
    memo_view: RunView | None = None

    @property
    def deleted(self) -> bool:
        """The MPIJob is gone (this is a tombstone)."""
        return self.deleted_at is not None


class RunCache:
    """Informer cache of our MPIJobs and their pods, plus per-run log and Events caching."""

    def __init__(
        self,
        kube: KubeClient,
        config: Config,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.tuning = config.follow
        self.clock = clock or (lambda: datetime.now(UTC))
        self.settings = ViewSettings(
            start_deadline_seconds=config.runs.start_deadline_seconds,
            settle_seconds=self.tuning.settle_seconds,
        )
        self.watch = config.kubernetes.watch
        self._runs: dict[str, Run] = {}
        self._by_stamp: dict[str, set[str]] = {}
        self._pods: dict[str, Obj] = {}
        self._pods_by_job: dict[str, set[str]] = {}
        self._pods_version: dict[str, int] = {}
        self._jobs_synced = False
        self._pods_synced = False
        self._direct_at = -math.inf
        self._direct_task: asyncio.Task[None] | None = None
        self._events: EventsSnapshot | None = None
        self._events_task: asyncio.Task[None] | None = None
        self._events_next = -math.inf
        self._events_forbidden = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the informers (if ``kubernetes.watch``) and the sweeper."""
        if self.watch:
            self._spawn(self._inform_jobs(), "MPIJob informer")
            self._spawn(self._inform_pods(), "pod informer")
        self._spawn(self._sweep_forever(), "sweeper")

    async def close(self) -> None:
        """Stop every background task and wait for them."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        async def guarded() -> Any:
            try:
                return await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                _LOGGER.exception("%s failed", what)
                return None

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def synced(self) -> bool:
        """The watch caches are complete (lookups need no API request)."""
        return self.watch and self._jobs_synced and self._pods_synced

    # -- informers ----------------------------------------------------------------------------

    async def _inform_jobs(self) -> None:
        await self._inform(
            "MPIJobs",
            self.kube.list_mpijobs,
            self.kube.watch_mpijobs,
            self._replace_jobs,
            self._apply_job,
            lambda ok: setattr(self, "_jobs_synced", ok),
        )

    async def _inform_pods(self) -> None:
        await self._inform(
            "pods",
            self.kube.list_pods_rv,
            self.kube.watch_pods,
            self._replace_pods,
            self._apply_pod,
            lambda ok: setattr(self, "_pods_synced", ok),
        )

    async def _inform(
        self,
        what: str,
        list_fn: Callable[[str], Awaitable[tuple[list[Obj], str]]],
        watch_fn: Callable[[str, str, int], AsyncIterator[tuple[str, Obj]]],
        replace: Callable[[list[Obj]], None],
        apply: Callable[[str, Obj], None],
        set_synced: Callable[[bool], None],
    ) -> None:
        """List, then watch from the list's resourceVersion, for ever (see the module doc)."""
        t = self.tuning
        backoff = t.backoff_first_seconds
        while not self._closed:
            try:
                items, rv = await list_fn(SELECTOR)
                replace(items)
                set_synced(True)
                while True:
                    began, events = time.monotonic(), 0
                    async for change, obj in watch_fn(SELECTOR, rv, t.watch_timeout_seconds):
                        events += 1
                        rv = _rv(obj) or rv
                        if change != "BOOKMARK":
                            apply(change, obj)
                    backoff = t.backoff_first_seconds
                    if events == 0 and time.monotonic() - began < 1.0:
                        await asyncio.sleep(t.backoff_first_seconds)  # a server ending at once
            except KubeError as e:
                set_synced(False)
                if e.k8s_status == 410:
                    _LOGGER.info("watch of %s expired (410): listing again", what)
                    continue
                _LOGGER.warning("watch of %s failed, again in %.1f s: %s", what, backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, t.backoff_max_seconds)

    def _replace_jobs(self, items: Iterable[Obj]) -> None:
        seen: set[str] = set()
        for obj in items:
            seen.add(_name(obj))
            self._upsert_job(obj, force=True)
        for run in list(self._runs.values()):
            if run.name not in seen and not run.deleted:
                self._bury(run, run.obj)

    def _apply_job(self, change: str, obj: Obj) -> None:
        if change == "DELETED":
            run = self._runs.get(_name(obj))
            if run is not None and not run.deleted:
                self._bury(run, obj)
        elif change in ("ADDED", "MODIFIED"):
            self._upsert_job(obj, force=True)

    def _upsert_job(self, obj: Obj, *, force: bool = False) -> Run | None:
        info = run_info(obj)
        if info is None:
            return None
        run = self._runs.get(info.name)
        if run is not None and run.info.uid != info.uid and info.uid:
            if not run.deleted and not force:
                return run
            self._unindex(run)
            run = None  # the name was reused by a new MPIJob
        if run is None:
            run = Run(name=info.name, obj=obj, info=info)
            self._runs[info.name] = run
        elif not run.deleted and (force or _newer(obj, run.obj)):
            run.obj, run.info = obj, info
        else:
            return run
        for stamp in (info.run_stamp, info.submit_stamp):
            self._by_stamp.setdefault(names.label_value(stamp), set()).add(info.name)
        return run

    def _bury(self, run: Run, obj: Obj) -> None:
        run.obj = obj
        run.deleted_at = self.clock()
        run.gone_at = time.monotonic()

    def _unindex(self, run: Run) -> None:
        for stamp in (run.info.run_stamp, run.info.submit_stamp):
            bucket = self._by_stamp.get(names.label_value(stamp))
            if bucket is not None:
                bucket.discard(run.name)
                if not bucket:
                    del self._by_stamp[names.label_value(stamp)]
        if self._runs.get(run.name) is run:
            del self._runs[run.name]

    def _replace_pods(self, items: Iterable[Obj]) -> None:
        fresh = {_name(p): p for p in items}
        for name in [n for n in self._pods if n not in fresh]:
            self._remove_pod(name)
        for pod in fresh.values():
            self._store_pod(pod)

    def _apply_pod(self, change: str, obj: Obj) -> None:
        if change == "DELETED":
            self._remove_pod(_name(obj))
        elif change in ("ADDED", "MODIFIED"):
            self._store_pod(obj)

    @staticmethod
    def _job_of(pod: Obj) -> str:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return str(labels.get(JOB_NAME_LABEL) or "")

    def _store_pod(self, pod: Obj) -> None:
        name, job = _name(pod), self._job_of(pod)
        old = self._pods.get(name)
        if old is not None and not _newer(pod, old):
            return
        self._pods[name] = pod
        if job:
            self._pods_by_job.setdefault(job, set()).add(name)
            self._pods_version[job] = self._pods_version.get(job, 0) + 1

    def _remove_pod(self, name: str) -> None:
        pod = self._pods.pop(name, None)
        if pod is None:
            return
        job = self._job_of(pod)
        bucket = self._pods_by_job.get(job)
        if bucket is not None:
            bucket.discard(name)
            if not bucket:
                del self._pods_by_job[job]
        self._pods_version[job] = self._pods_version.get(job, 0) + 1

    # -- direct reads (no synced watch) ----------------------------------------------------------

    async def _ensure_fresh(self) -> None:
        if self.synced:
            return
        if self._direct_task is None:
            if time.monotonic() - self._direct_at < self.tuning.direct_cache_seconds:
                return
            self._direct_task = asyncio.get_running_loop().create_task(self._direct_refresh())
            self._tasks.add(self._direct_task)
        task = self._direct_task
        with contextlib.suppress(KubeError):
            await asyncio.shield(task)

    async def _direct_refresh(self) -> None:
        try:
            jobs, _ = await self.kube.list_mpijobs(SELECTOR)
            pods, _ = await self.kube.list_pods_rv(SELECTOR)
            if not self._jobs_synced:
                self._replace_jobs(jobs)
            if not self._pods_synced:
                self._replace_pods(pods)
        except KubeError as e:
            _LOGGER.warning("listing MPIJobs and pods failed: %s", e)
        finally:
            self._direct_at = time.monotonic()
            if self._direct_task is not None:
                self._tasks.discard(self._direct_task)
            self._direct_task = None

    # -- lookups ----------------------------------------------------------------------------------

    async def find(self, stamp: str, model: str | None = None) -> Run | None:
        """The launched run with run stamp or submit stamp ``stamp`` (of ``model``, if given)."""
        if not stamp:
            return None
        await self._ensure_fresh()
        best: Run | None = None
        for job_name in self._by_stamp.get(names.label_value(stamp), ()):
            run = self._runs.get(job_name)
            if run is None or stamp not in (run.info.run_stamp, run.info.submit_stamp):
                continue
            if model is not None and not run.info.matches_model(model):
                continue
            if best is None or (not run.deleted, run.info.created) > (
                not best.deleted,
                best.info.created,
            ):
                best = run
        return best

    async def runs_of_model(self, model: str) -> list[Run]:
        """Every launched run of ``model`` (digest or name) this replica knows, tombstones too."""
        await self._ensure_fresh()
        return [r for r in self._runs.values() if r.info.matches_model(model)]

    async def active(self) -> list[RunView]:
        """Views of the runs that are not final yet (for the jobs page)."""
        await self._ensure_fresh()
        views = [self.peek(r) for r in list(self._runs.values()) if not r.deleted]
        return [v for v in views if v is not None and not v.is_final]

    def phase_counts(self) -> dict[str, int]:
        """Runs known to the cache by phase, from what is cached (no API call; for metrics)."""
        counts: dict[str, int] = {}
        for run in list(self._runs.values()):
            view = self.peek(run)
            if view is not None:
                counts[view.phase] = counts.get(view.phase, 0) + 1
        return counts

    def note_created(self, obj: Obj) -> None:
        """Tell the cache about an MPIJob just created (before its watch event arrives)."""
        self._upsert_job(obj)

    # -- views ------------------------------------------------------------------------------------

    def _pods_of(self, run: Run) -> tuple[list[Obj], Obj | None, bool]:
        """(current pods, launcher pod to follow, launcher pod gone)."""
        pods = [self._pods[n] for n in self._pods_by_job.get(run.name, ()) if n in self._pods]
        if run.launcher_name is None:
            first = first_launcher(pods, run.name)
            if first is not None:
                run.launcher_name = _name(first)
        gone = False
        if run.launcher_name is not None:
            current = self._pods.get(run.launcher_name)
            if current is not None:
                run.launcher_obj = current
            else:
                gone = run.launcher_obj is not None
        return pods, run.launcher_obj, gone

    def peek(self, run: Run) -> RunView | None:
        """The run's view from what is cached now (no I/O)."""
        pods, launcher, gone = self._pods_of(run)
        log = run.log
        if (gone or (run.deleted and launcher is None)) and (log is None or not log.complete):
            # No more output can be read: what we have is all there is.
            log = log.finished() if log is not None else LauncherLog(complete=True)
            run.log = log
            run.log_version += 1
        now = self.clock()
        deadline_passed = now - run.info.created > timedelta(
            seconds=self.settings.start_deadline_seconds
        )
        prelude_recorded = PRELUDE_KEY in ((run.obj.get("metadata") or {}).get("annotations") or {})
        events = self._events
        key = (
            _rv(run.obj),
            run.deleted,
            self._pods_version.get(run.name, 0),
            run.launcher_name,
            None if prelude_recorded or events is None else events.fetched_at,
            run.log_version,
            deadline_passed,
        )
        if run.memo_key == key and run.memo_view is not None:
            return run.memo_view
        view = compute_view(
            run.obj,
            pods=pods,
            launcher_pod=launcher,
            events=events,
            log=log,
            deleted_at=run.deleted_at,
            now=now,
            settings=self.settings,
        )
        run.memo_key, run.memo_view = key, view
        return view

    async def view(self, run: Run) -> RunView | None:
        """The run's view, after fetching what it lacks (Events, launcher log) if due."""
        view = self.peek(run)
        for _ in range(3):
            if view is None:
                return None
            waited = await self._ensure_events(view)
            waited = await self._ensure_log(run, view) or waited
            self._maybe_record(run, view)
            if not waited:
                break
            view = self.peek(run)
        return view

    # -- Events -----------------------------------------------------------------------------------

    async def _ensure_events(self, view: RunView, *, wait: bool = False) -> bool:
        """Fetch the Events if the view needs newer ones; True if it waited for a fetch."""
        snap, now = self._events, self.clock()
        if view.events_live:
            if snap is not None and (now - snap.fetched_at).total_seconds() < (
                self.tuning.events_refresh_seconds
            ):
                return False
            urgent = snap is None
        elif view.needs_events is not None:
            if now < view.needs_events or (
                snap is not None and snap.fetched_at >= view.needs_events
            ):
                return False
            urgent = True
        else:
            return False
        if self._events_forbidden:
            return False
        if self._events_task is None:
            if time.monotonic() < self._events_next:
                return False
            self._events_task = asyncio.get_running_loop().create_task(self._fetch_events())
            self._tasks.add(self._events_task)
        if not (urgent or wait):
            return False
        await asyncio.shield(self._events_task)
        return True

    async def _fetch_events(self) -> None:
        fetched_at = self.clock()
        try:
            items = await self.kube.list_events("")
            # Keep only the Events of our MPIJobs and their pods (<name>, <name>-worker-i,
            # <name>-launcher-xxxxx): the namespace may hold many more.
            prefixes = tuple(f"{name}-" for name in self._runs)
            ours = tuple(e for e in items if _about_our_run(e, self._runs, prefixes))
            self._events = EventsSnapshot(ours, fetched_at)
        except KubeForbidden as e:
            _LOGGER.warning("cannot list Events, runs will be explained less: %s", e)
            self._events_forbidden = True
            self._events = EventsSnapshot((), fetched_at)
        except KubeError as e:
            _LOGGER.warning("listing Events failed: %s", e)
        finally:
            self._events_next = time.monotonic() + 0.5
            if self._events_task is not None:
                self._tasks.discard(self._events_task)
            self._events_task = None

    # -- the launcher log -------------------------------------------------------------------------

    async def _ensure_log(self, run: Run, view: RunView) -> bool:
        """Read the launcher log if due; True if this call waited for a read."""
        launcher = view.launcher
        if not view.wants_log or launcher is None:
            return False
        if run.log is not None and run.log.complete:
            return False
        ended = launcher.terminated is not None
        if run.log_task is None:
            if time.monotonic() - run.log_read_at < self.config.kubernetes.log_cache_seconds:
                return False  # at most one read per log_cache_seconds, shared by all pollers
            run.log_task = asyncio.get_running_loop().create_task(
                self._read_log(run, launcher.pod, launcher.container, ended)
            )
            self._tasks.add(run.log_task)
        if run.log is not None and not ended:
            return False  # pollers get the cached log; the read refreshes it for the next ones
        await asyncio.shield(run.log_task)
        return True

    async def _read_log(self, run: Run, pod: str, container: str, ended: bool) -> None:
        """Read the launcher log: its tail when possible, joined to what was read before."""
        began = time.monotonic()
        buf = run.log_buffer
        name = container or None
        try:
            done = False
            if not buf.empty:
                text = await self.kube.read_pod_log(
                    pod, name, timestamps=True, tail_lines=LOG_TAIL_LINES
                )
                done = buf.add_tail(text, LOG_TAIL_LINES)
            if not done:
                buf.add_full(await self.kube.read_pod_log(pod, name, timestamps=True))
            run.log = buf.snapshot(complete=ended)
            run.log_version += 1
        except KubeObjectNotFound:
            run.log = buf.snapshot(complete=True)
            run.log_version += 1
        except KubeInvalid as e:  # 400: not started yet, or no such container
            _LOGGER.debug("log of %s not readable yet: %s", pod, e)
        except KubeError as e:
            _LOGGER.warning("reading the log of %s failed: %s", pod, e)
        finally:
            run.log_read_at = began
            if run.log_task is not None:
                self._tasks.discard(run.log_task)
            run.log_task = None

    # -- recording annotations ------------------------------------------------------------------

    def _maybe_record(self, run: Run, view: RunView) -> None:
        if run.deleted or run.record_task is not None:
            return
        if run.record_attempts >= self.tuning.record_attempts:
            return
        if time.monotonic() < run.record_after:
            return
        annotations: dict[str, str] = {}
        suspend = False
        if view.final_to_record is not None:
            if not view.prelude_frozen:
                return  # record both at once, once the prelude can be frozen
            annotations[FINAL_MESSAGE_KEY] = view.final_to_record.to_json()
            suspend = True
        if view.prelude_to_record is not None:
            annotations[PRELUDE_KEY] = json.dumps(list(view.prelude_to_record), ensure_ascii=False)
        if not annotations:
            return
        run.record_attempts += 1
        run.record_task = self._spawn(self._record(run, annotations, suspend), "recording")

    async def _record(self, run: Run, annotations: dict[str, str], suspend: bool) -> None:
        patch: Obj = {"metadata": {"resourceVersion": _rv(run.obj), "annotations": annotations}}
        if suspend:
            patch["spec"] = {"runPolicy": {"suspend": True}}
        try:
            obj = await self.kube.patch_mpijob(run.name, patch)
            self._upsert_job(obj)
            if suspend:
                _LOGGER.info(
                    "run %s did not start in time: MPIJob %s suspended",
                    run.info.run_stamp,
                    run.name,
                )
        except KubeAlreadyExists:  # 409 Conflict: the MPIJob changed; look again
            with contextlib.suppress(KubeError):
                self._upsert_job(await self.kube.get_mpijob(run.name))
        except KubeObjectNotFound:
            pass
        except KubeForbidden as e:
            run.record_attempts = self.tuning.record_attempts
            _LOGGER.warning(
                "cannot annotate MPIJob %s (RBAC needs 'patch' on mpijobs); answers may differ "
                "between replicas: %s",
                run.name,
                e,
            )
        except KubeError as e:
            run.record_after = time.monotonic() + self.tuning.record_retry_seconds
            _LOGGER.warning("annotating MPIJob %s failed: %s", run.name, e)
        finally:
            run.record_task = None

    # -- stop and retention -----------------------------------------------------------------------

    async def stop(self, run: Run) -> None:
        """Delete the run's MPIJob (Foreground: the MPIJob goes once its pods are gone)."""
        with contextlib.suppress(KubeObjectNotFound):
            await self.kube.delete_mpijob(run.name, propagation="Foreground")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tuning.sweep_seconds)
            await self.sweep()

    async def sweep(self) -> None:
        """Expire tombstones, record start deadlines, delete finished MPIJobs past retention."""
        now, mono = self.clock(), time.monotonic()
        retention = timedelta(seconds=self.config.runs.finished_retention_seconds)
        for run in list(self._runs.values()):
            if run.deleted:
                if run.gone_at is not None and mono - run.gone_at > self.tuning.tombstone_seconds:
                    self._unindex(run)
                continue
            view = self.peek(run)
            if view is None:
                continue
            if view.final_to_record is not None:
                with contextlib.suppress(KubeError):
                    await self._ensure_events(view, wait=True)
                view = self.peek(run)
                if view is not None:
                    self._maybe_record(run, view)
            if (
                view is not None
                and view.phase in ("succeeded", "failed", "deadline")
                and view.final_at is not None
                and now - view.final_at >= retention
            ):
                try:
                    await self.kube.delete_mpijob(run.name, propagation="Background")
                    _LOGGER.info("deleted finished MPIJob %s (retention)", run.name)
                except KubeObjectNotFound:
                    pass
                except KubeError as e:
                    _LOGGER.warning("deleting finished MPIJob %s failed: %s", run.name, e)


# --- talking to oms -------------------------------------------------------------------------------


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


async def _oms_get(request: web.Request, path_qs: str | None = None) -> OmsAnswer:
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


def _json(data: Any, request: web.Request, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, headers={hdr.REQUEST_ID: request_id(request)})


def _cache(request: web.Request) -> RunCache | None:
    return request.app.get(RUN_CACHE)


# --- status answers (pure helpers) ----------------------------------------------------------

_OVERRIDDEN = frozenset({"failed", "stopped", "deadline"})
_NOT_DONE = frozenset({"", "i", "p", "w"})


def progress_item(oms_item: Any, view: RunView) -> dict[str, Any] | None:
    """Our answer for one run status item, or None to pass oms's unchanged.

    oms's item wins when it has a status, unless our MPIJob ended badly while oms still thinks
    the run is going (a model that died cannot write its final status): then its Status
    becomes ``e`` (``x`` if stopped). Without an item from oms, a synthesised one answers.
    """
    if isinstance(oms_item, dict) and oms_item.get("Status"):
        if view.is_final and view.phase in _OVERRIDDEN and oms_item.get("Status") in _NOT_DONE:
            return {**oms_item, "Status": view.status, "UpdateDateTime": format_time(view.updated)}
        return None
    return run_pub(view)


# --- handlers ---------------------------------------------------------------------------------

_PAGING = re.compile(r"(?:/start/(?P<start>[^/]*)(?:/count/(?P<count>[^/]*))?)?/?")


async def handle_run_log(request: web.Request) -> web.StreamResponse:
    """GET /api/run/log/model/{model}/stamp/{stamp}[/start/{n}[/count/{c}]]."""
    cache = _cache(request)
    m = _PAGING.fullmatch(request.match_info.get("paging", ""))
    model, stamp = request.match_info["model"], request.match_info["stamp"]
    if cache is None or m is None or (m["start"] is not None and m["start"] == ""):
        return await forward(request)
    if m["count"] is not None and m["count"] == "":
        return await forward(request)
    run = await cache.find(stamp, model)
    if run is None:
        return await forward(request)
    start_text = request.query.get("start") or m["start"] or ""
    count_text = request.query.get("count") or m["count"] or ""
    try:
        start = parse_go_int(start_text) if start_text else 0
    except PagingError as e:
        raise BadRequest(f"Invalid value of start log start line {model}") from e
    try:
        count = parse_go_int(count_text) if count_text else 0
    except PagingError as e:
        raise BadRequest(f"Invalid value of log line count {model}") from e
    view = await cache.view(run)
    if view is None:
        return await forward(request)
    return _json(log_page(view, start, count), request)


async def handle_run_status(request: web.Request) -> web.StreamResponse:
    """GET /api/model/{model}/run/{stamp}/status and .../status/list."""
    cache = _cache(request)
    if cache is None:
        return await forward(request)
    run = await cache.find(request.match_info["stamp"], request.match_info["model"])
    if run is None:
        return await forward(request)
    view = await cache.view(run)
    answer = await _oms_get(request)
    doc = answer.json()
    if view is None or doc is None:
        return answer.response(request)
    if isinstance(doc, list):
        if not doc:
            return _json([run_pub(view)], request)
        out: list[Any] = []
        for item in doc:
            ours = None
            if isinstance(item, dict) and item.get("RunStamp") == view.info.run_stamp:
                ours = progress_item(item, view)
            out.append(item if ours is None else ours)
        return answer.response(request) if out == doc else _json(out, request)
    if isinstance(doc, dict):
        ours = progress_item(doc, view)
        return answer.response(request) if ours is None else _json(ours, request)
    return answer.response(request)


async def handle_run_status_last(request: web.Request) -> web.StreamResponse:
    """GET /api/model/{model}/run/status/last: ours when our newest run is newer than oms's."""
    cache = _cache(request)
    if cache is None:
        return await forward(request)
    runs = await cache.runs_of_model(request.match_info["model"])
    if not runs:
        return await forward(request)
    answer = await _oms_get(request)
    doc = answer.json()
    if not isinstance(doc, dict):
        return answer.response(request)
    stamp = doc.get("RunStamp") or ""
    same = [r for r in runs if r.info.run_stamp == stamp and stamp]
    if same and doc.get("Status"):
        view = await cache.view(max(same, key=lambda r: r.info.submitted))
        ours = progress_item(doc, view) if view is not None else None
        return answer.response(request) if ours is None else _json(ours, request)
    newest = max(runs, key=lambda r: r.info.submitted)
    if doc.get("Status") and str(doc.get("CreateDateTime") or "") >= format_time(
        newest.info.submitted
    ):
        return answer.response(request)
    view = await cache.view(newest)
    return answer.response(request) if view is None else _json(run_pub(view), request)


async def handle_run_stop(request: web.Request) -> web.StreamResponse:
    """PUT /api/run/stop/model/{model}/stamp/{stamp}: delete the run's MPIJob."""
    cache = _cache(request)
    stamp = request.match_info["stamp"]
    run = await cache.find(stamp, request.match_info["model"]) if cache is not None else None
    if cache is None or run is None:
        return await forward(request)
    view = cache.peek(run)
    if not run.deleted and (view is None or view.phase not in FINAL_PHASES):
        await cache.stop(run)
        _LOGGER.info("stop of run %s: MPIJob %s deleted", stamp, run.name)
    return web.Response(
        status=200,
        content_type="text/plain",
        headers={
            "Content-Location": f"/api/model/{run.info.model_digest}/run/{stamp}/true",
            hdr.REQUEST_ID: request_id(request),
        },
    )


async def handle_service_state(request: web.Request) -> web.StreamResponse:
    """GET /api/service/state: oms's, with our active runs added to ``Active``."""
    cache = _cache(request)
    if cache is None:
        return await forward(request)
    answer = await _oms_get(request)
    doc = answer.json()
    if not isinstance(doc, dict) or not isinstance(doc.get("Active"), list):
        return answer.response(request)
    views = sorted(await cache.active(), key=lambda v: v.info.submit_stamp)
    if not views:
        return answer.response(request)
    doc["Active"] = [*doc["Active"], *(run_job(v) for v in views)]
    return _json(doc, request)


async def handle_service_job_active(request: web.Request) -> web.StreamResponse:
    """GET /api/service/job/active/{stamp}: job details of a launched run."""
    cache = _cache(request)
    run = await cache.find(request.match_info["stamp"]) if cache is not None else None
    if cache is None or run is None:
        return await forward(request)
    view = await cache.view(run)
    if view is None:
        return await forward(request)
    info = view.info
    item: Any = run_pub(view)
    path = f"/api/model/{quote(info.model_digest, safe='')}/run/{quote(info.run_stamp, safe='')}"
    with contextlib.suppress(UpstreamTimeout, UpstreamUnavailable):
        oms_list = (await _oms_get(request, path + "/status/list")).json()
        if isinstance(oms_list, list) and oms_list:
            item = progress_item(oms_list[0], view) or oms_list[0]
    return _json(
        {"JobStatus": "", **run_job(view), "RunStatus": [item], "Lines": list(view.lines)}, request
    )


_HANDLERS: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
    "run_log": handle_run_log,
    "run_stop": handle_run_stop,
    "run_status": handle_run_status,
    "run_status_list": handle_run_status,
    "run_status_last": handle_run_status_last,
    "service_state": handle_service_state,
    "service_job_active": handle_service_job_active,
}


def notify_created(app: web.Application, job: Obj) -> None:
    """Let the run cache know an MPIJob the submit path just created.

    Pollers that ask right after ``POST /api/run`` then find the run even before the watch
    event arrives (otherwise they are passed to oms, which answers an empty page).
    """
    cache = app.get(RUN_CACHE)
    if cache is not None:
        cache.note_created(job)


def setup_lifecycle(app: web.Application) -> None:
    """Add the lifecycle routes and the run cache's start/stop to ``app``.

    Call it after the ``cleanup_ctx`` that creates the Kubernetes client (``app[KUBE]``).
    Calling it again does nothing.
    """
    if "run_log" in app.router.named_resources():
        return
    for route in ROUTES:
        handler = _HANDLERS.get(route.name)
        if handler is not None:
            app.router.add_route(route.method, route.path, handler, name=route.name)

    async def run_cache(app: web.Application) -> AsyncIterator[None]:
        kube = app.get(KUBE)
        cache = RunCache(kube, app[CONFIG]) if kube is not None else None
        app[RUN_CACHE] = cache
        if cache is not None:
            await cache.start()
        try:
            yield
        finally:
            if cache is not None:
                await cache.close()

    app.cleanup_ctx.append(run_cache)
