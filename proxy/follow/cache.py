"""Launched runs for oms clients: an informer cache of MPIJobs and pods (the handlers' source).

The OpenM++ UI and the R/Python clients follow a run by polling oms: its log pages, its status,
the jobs page. For runs the proxy launched as MPIJobs, oms knows nothing until the model writes
its database row (and never knows about a failure before that), so the proxy answers these
routes itself (:mod:`proxy.follow.handlers`) and passes everything else, including every stamp
it does not own, to oms unchanged.

**The cache** (:class:`RunCache`, over the index :class:`proxy.follow.store.RunStore` that
:func:`proxy.follow.informer.inform` feeds). With ``kubernetes.watch`` on, one list+watch of our
MPIJobs and one of their pods (both selected by ``app.kubernetes.io/managed-by=oms-mpijob-proxy``,
which the renderer also puts on both pod templates) keep a local copy of everything the answers
need. A watch that fails is retried with exponential backoff (capped at 10 s); a 410 Gone re-lists
at once. Until the first list arrived, and while reconnecting, lookups list directly instead (at
most once a second, shared). With ``kubernetes.watch`` off, those direct lists are all there is. A
deleted MPIJob stays as a *tombstone* for 10 minutes so that pollers see a final state.

**API requests per run.** Pollers of a run share one launcher log read per
``kubernetes.log_cache_seconds`` (one read in flight per run; pollers get the cached log while
it runs, except for the first read and the one after the container ended; once that one is
done, never again). After the first whole read, only the log's last 2000 lines are asked for
and joined to what is known (a whole read again if they do not join). The namespace's Events
are listed (one request for all runs) only while some run waits to start, every 5 s, and once
more when a run's prelude is frozen. So a running job costs at most about one request per
second, whatever the number of pollers; a waiting one about one every 5 s.

**What the answers are made of** is :mod:`proxy.follow.view` (pure). Two annotations on the MPIJob
make them identical on every replica and across restarts: the frozen prelude of the log
(:data:`proxy.follow.view.PRELUDE_KEY`), and the start-deadline verdict
(:data:`proxy.follow.view.FINAL_MESSAGE_KEY`). Whichever replica can first compute one writes it
with a JSON merge patch carrying ``metadata.resourceVersion`` (a 409 means someone else changed the
job: re-read and look again); :mod:`proxy.follow.recorder` does it, retrying in the
background, while this replica answers from what it froze. Recording the start deadline also
suspends the MPIJob (``spec.runPolicy.suspend: true``), or deletes it when Kueue queues it
(Kueue would resume it), so a run reported failed cannot start later behind the user's back.

**Retention of finished runs.** Finished MPIJobs (Succeeded, Failed, or past the start
deadline) are kept for ``runs.finished_retention_seconds``, counted from when they finished, so
that their log stays readable; then, once archived (the run history, :mod:`.archiver`), they are
deleted. Every replica sweeps its cache every 30 s and may do it; a 404 is fine. A final or
deleted run is archived by whoever sees it first, then the MPIJob's finalizer is released.

RBAC: mpijobs get/list/watch/patch/delete, pods list/watch, pods/log get, events list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from proxy import names
from proxy.clients.kube import KubeClient
from proxy.config import Config
from proxy.errors import (
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeObjectNotFound,
)
from proxy.follow.archiver import RunHistory
from proxy.follow.informer import inform
from proxy.follow.launcherlog import JOB_NAME_LABEL, LauncherLog, first_launcher
from proxy.follow.recorder import Recorder
from proxy.follow.runinfo import resource_version, terminating
from proxy.follow.store import Run, RunStore, name_of
from proxy.follow.tasks import TaskSet
from proxy.follow.view import (
    FINAL_MESSAGE_KEY,
    FINAL_PHASES,
    PRELUDE_KEY,
    EventsSnapshot,
    RunView,
    ViewSettings,
    compute_view,
    deadline_start,
    queue_name,
)

_LOGGER = logging.getLogger(__name__)

Obj = dict[str, Any]

SELECTOR = f"{names.MANAGED_BY_KEY}={names.MANAGED_BY_VALUE}"
LOG_TAIL_LINES = 2000
"""Lines asked for when re-reading a launcher log; more new lines than this: a whole read."""


def _about_our_run(event: Obj, runs: Mapping[str, Any], prefixes: tuple[str, ...]) -> bool:
    """Whether an Event is about one of our MPIJobs or one of its pods."""
    involved = event.get("involvedObject") or {}
    name = str(involved.get("name") or "")
    return name in runs or name.startswith(prefixes)


def pick(stamp: str, runs: Iterable[Run]) -> Run | None:
    """The run a stamp names when several runs carry it; the same choice on every replica.

    A generated stamp is a run's RunStamp and SubmitStamp at once and is reserved by the
    create of its MPIJob, so it names one run of a model. What remains (a client-chosen
    RunStamp equal to another run's SubmitStamp, or runs of two models found without a model):
    a RunStamp match wins over a SubmitStamp match; then a live MPIJob over a deleted one;
    then the earlier created; then the smaller MPIJob name.
    """
    best: tuple[Any, ...] | None = None
    chosen: Run | None = None
    for run in runs:
        key = (run.info.run_stamp != stamp, run.deleted, run.info.created, run.name)
        if best is None or key < best:
            best, chosen = key, run
    return chosen


class RunCache(RunStore):
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
        super().__init__(self.clock)
        self.watch = config.kubernetes.watch
        self._jobs_synced = False
        self._pods_synced = False
        self._pods_problem: str | None = None
        """Why the pods could not be listed (one line on every run's log page), if so."""
        self._direct_at = -math.inf
        self._direct_task: asyncio.Task[None] | None = None
        self._events: EventsSnapshot | None = None
        self._events_task: asyncio.Task[None] | None = None
        self._events_next = -math.inf
        self._events_forbidden = False
        self._events_problem: str | None = None
        self._tasks = TaskSet(_LOGGER)
        self._closed = False
        self.history: RunHistory | None = None
        """The run records (see :class:`~proxy.follow.ending.ArchivingRunCache`)."""
        self.recorder = Recorder(kube, self.tuning, self._upsert_job, self._spawn)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the informers (if ``kubernetes.watch``) and the sweeper."""
        if self.watch:
            self._spawn(self._inform_jobs(), "MPIJob informer")
            self._spawn(self._inform_pods(), "pod informer")
        self._spawn(self._sweep_forever(), "sweeper")
        if self.history is not None:
            await self.history.start()

    async def close(self) -> None:
        """Stop every background task and wait for them."""
        self._closed = True
        await self._tasks.cancel_all()
        if self.history is not None:
            await self.history.close()

    def _spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro, what)

    def _set_pods_synced(self, ok: bool) -> None:
        self._pods_synced = ok
        if ok:
            self._pods_problem = None

    @property
    def synced(self) -> bool:
        """The watch caches are complete (lookups need no API request)."""
        return self.watch and self._jobs_synced and self._pods_synced

    # -- informers ----------------------------------------------------------------------------

    async def _inform_jobs(self) -> None:
        await inform(
            "MPIJobs",
            self.kube.list_mpijobs,
            self.kube.watch_mpijobs,
            self._replace_jobs,
            self._apply_job,
            lambda ok: setattr(self, "_jobs_synced", ok),
            selector=SELECTOR,
            watch_timeout=self.tuning.watch_timeout_seconds,
            backoff=(self.tuning.backoff_first_seconds, self.tuning.backoff_max_seconds),
            closed=lambda: self._closed,
        )

    async def _inform_pods(self) -> None:
        await inform(
            "pods",
            self.kube.list_pods_rv,
            self.kube.watch_pods,
            self._replace_pods,
            self._apply_pod,
            self._set_pods_synced,
            selector=SELECTOR,
            watch_timeout=self.tuning.watch_timeout_seconds,
            backoff=(self.tuning.backoff_first_seconds, self.tuning.backoff_max_seconds),
            closed=lambda: self._closed,
        )

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
            try:
                jobs, _ = await self.kube.list_mpijobs(SELECTOR)
                if not self._jobs_synced:
                    self._replace_jobs(jobs)
            except KubeError as e:
                _LOGGER.warning("listing MPIJobs failed: %s", e)
            try:
                pods, _ = await self.kube.list_pods_rv(SELECTOR)
                self._pods_problem = None
                if not self._pods_synced:
                    self._replace_pods(pods)
            except KubeError as e:  # the log pages say so: a run's pods are not just "none"
                _LOGGER.warning("listing pods failed: %s", e)
                self._pods_problem = f"the run's pods ({e})"
        finally:
            self._direct_at = time.monotonic()
            if self._direct_task is not None:
                self._tasks.discard(self._direct_task)
            self._direct_task = None

    # -- lookups ----------------------------------------------------------------------------------

    async def find(self, stamp: str, model: str | None = None) -> Run | None:
        """The launched run that ``stamp`` names (of ``model``, if given): see :func:`pick`."""
        if not stamp:
            return None
        await self._ensure_fresh()
        candidates = []
        for job_name in self._by_stamp.get(names.label_value(stamp), ()):
            run = self._runs.get(job_name)
            if run is None or stamp not in (run.info.run_stamp, run.info.submit_stamp):
                continue
            if model is not None and not run.info.matches_model(model):
                continue
            candidates.append(run)
        return pick(stamp, candidates)

    def knows_stamp(self, stamp: str) -> bool:
        """Whether some run known here has ``stamp`` as its run or submit stamp (no I/O)."""
        for job_name in self._by_stamp.get(names.label_value(stamp), ()):
            run = self._runs.get(job_name)
            if run is not None and stamp in (run.info.run_stamp, run.info.submit_stamp):
                return True
        return False

    async def runs_of_model(self, model: str) -> list[Run]:
        """Every launched run of ``model`` (digest or name) this replica knows, tombstones too."""
        await self._ensure_fresh()
        return [r for r in self._runs.values() if r.info.matches_model(model)]

    async def jobs(self) -> tuple[list[RunView], list[RunView], list[RunView]]:
        """The jobs page's (queue, active, history), each by submit stamp.

        From the MPIJobs' state as the watch shows it (not from what the pages have read), so
        every replica moves a run at the same moment: suspended and never admitted → queue;
        ended (Succeeded, Failed, deleted, past the start deadline) → history, for as long as
        this cache keeps the run (retention, then the tombstone); else active.
        """
        await self._ensure_fresh()
        queue: list[RunView] = []
        active: list[RunView] = []
        history: list[RunView] = []
        lists = {"queue": queue, "active": active, "history": history}
        for run in list(self._runs.values()):
            view = self.peek(run)
            if view is not None:
                lists[self.job_list(view)].append(view)
        for views in (queue, active, history):
            views.sort(key=lambda v: (v.info.submit_stamp, v.info.name))
        return queue, active, history

    @staticmethod
    def job_list(view: RunView) -> str:
        """Which list of the jobs page a run is in: queue, active or history (see :meth:`jobs`)."""
        if view.phase in FINAL_PHASES:
            return "history"
        return "queue" if view.phase == "queued" else "active"

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
                run.launcher_name = name_of(first)
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
            log = (log or LauncherLog()).finished(cut=True)  # never read after its end
            run.log = log
            run.log_version += 1
        now = self.clock()
        since = deadline_start(run.obj)
        deadline_passed = since is not None and now - since > timedelta(
            seconds=self.settings.start_deadline_seconds
        )
        prelude_recorded = PRELUDE_KEY in ((run.obj.get("metadata") or {}).get("annotations") or {})
        events = self._events
        problems = (self._pods_problem, self._events_problem, run.log_problem)
        unreadable = tuple(p for p in problems if p)
        key = (
            unreadable,
            resource_version(run.obj),
            run.deleted,
            self._pods_version.get(run.name, 0),
            run.launcher_name,
            None if prelude_recorded or events is None else events.fetched_at,
            run.log_version,
            deadline_passed,
            run.frozen_prelude is not None,
            run.frozen_final is not None,
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
            prelude=run.frozen_prelude,
            final_message=run.frozen_final,
            unreadable=unreadable,
        )
        if view is not None:
            # What this replica froze stays as it is, whatever happens to its recording.
            if run.frozen_prelude is None and view.prelude_to_record is not None:
                run.frozen_prelude = view.prelude_to_record
            if run.frozen_final is None and view.final_to_record is not None:
                run.frozen_final = view.final_to_record
        run.memo_key, run.memo_view = key, view
        return view

    async def view(self, run: Run) -> RunView | None:
        """The run's view, after fetching what it lacks (Events, launcher log) if due.

        Once the MPIJob has ended, the answer is final and whole: this waits for what the
        final page needs (the launcher's end in the pod cache, the Events settled past the
        prelude's freeze point, the whole log) rather than show a page that would still grow.
        """
        view = self.peek(run)
        for _ in range(5):
            if view is None:
                return None
            waited = False
            if view.phase in FINAL_PHASES and not view.is_final:
                waited = await self._await_final(run, view)
            waited = await self._ensure_events(view) or waited
            waited = await self._ensure_log(run, view) or waited
            self.recorder.maybe_record(run, view)
            if not waited:
                break
            view = self.peek(run)
        if view is not None and view.is_final:
            self._archive(run, view)
        return view

    async def _await_final(self, run: Run, view: RunView) -> bool:
        """For an ended MPIJob: wait for what its final page still lacks; True if it waited."""
        waited = False
        launcher = view.launcher
        ended = view.phase in ("succeeded", "failed")
        if ended and launcher is not None and launcher.terminated is None:
            # The MPIJob's end came through its watch before the launcher pod's: read it.
            selector = f"{SELECTOR},{JOB_NAME_LABEL}={run.name}"
            with contextlib.suppress(KubeError):
                pods, _ = await self.kube.list_pods_rv(selector)
                for pod in pods:
                    self._store_pod(pod)
                waited = True
        if view.needs_events is not None:
            # The Events up to the freeze point are complete once settle_seconds have passed
            # (and a list is due again: at most one every 0.5 s).
            wait = max(
                (view.needs_events - self.clock()).total_seconds(),
                self._events_next - time.monotonic(),
            )
            if wait > 0:
                await asyncio.sleep(min(wait, self.tuning.settle_seconds + 1.0))
                waited = True
        return waited

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
            # No Events can be read: "listed now, none" is all there is, so a prelude can still
            # freeze (the page says once what could not be read).
            self._events = EventsSnapshot((), now)
            return True
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
            self._events_problem = f"the namespace's Events ({e})"
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
        # A Succeeded/Failed MPIJob's launcher has exited: what its log has now is all of it.
        ended = launcher.terminated is not None or view.phase in ("succeeded", "failed")
        if run.log_task is None:
            recent = time.monotonic() - run.log_read_at < self.config.kubernetes.log_cache_seconds
            if recent and not ended:
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
            run.log_problem = None
            run.log_version += 1
        except KubeObjectNotFound:  # the pod went: what was read is all there is
            run.log = buf.snapshot(complete=True).finished(cut=True)
            run.log_problem = None
            run.log_version += 1
        except KubeInvalid as e:  # 400: not started yet, or no such container
            _LOGGER.debug("log of %s not readable yet: %s", pod, e)
        except KubeError as e:  # the log page says so (one line), instead of showing nothing
            _LOGGER.warning("reading the log of %s failed: %s", pod, e)
            run.log_problem = f"the launcher's log ({e})"
            run.log_version += 1
        finally:
            run.log_read_at = began
            if run.log_task is not None:
                self._tasks.discard(run.log_task)
            run.log_task = None

    # -- hooks of the run history (:mod:`proxy.follow.ending`) -------------------------------

    def _archive(self, run: Run, view: RunView) -> asyncio.Task[bool] | None:
        """Archive a final run (here: nothing; :class:`~proxy.follow.ending.ArchivingRunCache`)."""
        return None

    def _watch_ending(self, name: str) -> None:
        """A run's MPIJob is being deleted or is gone (here: nothing)."""

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
        history = self.history
        for run in list(self._runs.values()):
            if run.deleted:
                if run.gone_at is not None and mono - run.gone_at > self.tuning.tombstone_seconds:
                    self._unindex(run)
                continue
            if history is not None and terminating(run.obj):
                self._watch_ending(run.name)
                continue
            view = self.peek(run)
            if view is None:
                continue
            archived = history is None or history.settled(run.name)
            if not archived and view.phase in ("succeeded", "failed", "deadline"):
                view = await self.view(run)  # reads what the final view lacks; archives it
                if view is None:
                    continue
            if view.final_to_record is not None:
                with contextlib.suppress(KubeError):
                    await self._ensure_events(view, wait=True)
                view = self.peek(run)
                if view is not None:
                    self.recorder.maybe_record(run, view)
            if (
                view is not None
                and view.phase == "deadline"
                and queue_name(run.obj)
                and FINAL_MESSAGE_KEY in ((run.obj.get("metadata") or {}).get("annotations") or {})
            ):
                await self.recorder.enforce_verdict(run)  # a delete that failed before
                continue
            if (
                view is not None
                and view.phase in ("succeeded", "failed", "deadline")
                and view.final_at is not None
                and now - view.final_at >= retention
                and (archived or history is None or history.archived(run.name))
            ):
                try:
                    await self.kube.delete_mpijob(run.name, propagation="Background")
                    _LOGGER.info("deleted finished MPIJob %s (retention)", run.name)
                except KubeObjectNotFound:
                    pass
                except KubeError as e:
                    _LOGGER.warning("deleting finished MPIJob %s failed: %s", run.name, e)


RUN_CACHE: web.AppKey[RunCache | None] = web.AppKey("run_cache")
"""The informer cache of launched runs; None when runs are not intercepted."""
