"""The run cache with the run history: each run archived when it ends, its MPIJob released after.

:class:`ArchivingRunCache` is the :class:`~proxy.follow.cache.RunCache` the app uses. It adds:

- **Archiving.** A run's view, once final, is archived (:class:`~proxy.follow.archiver.RunHistory`,
  one ConfigMap per run) in the background, by whichever replica sees it first.
- **The finalizer.** Each MPIJob carries :data:`proxy.names.RUN_RECORD_FINALIZER` (rendered
  in, ``history.finalizer``). When it is being deleted (stop, retention, ``kubectl delete``),
  the API server keeps it, with its pods, until the finalizer goes: the cache reads the launcher's
  log one last time, archives the run, then removes the finalizer, and the garbage collector
  deletes the rest. Whoever deletes an MPIJob, its run is archived first. A log cut short by a
  pod that went before its container ended says so in one line.
- **No churn.** A record whose MPIJob still exists is never expired (it would be archived again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from proxy.clients.kube import KubeClient
from proxy.config import Config
from proxy.follow.archiver import RunHistory, release
from proxy.follow.cache import RunCache
from proxy.follow.runinfo import terminating
from proxy.follow.store import Run, name_of
from proxy.follow.view import RunView

_LOGGER = logging.getLogger(__name__)

Obj = dict[str, Any]


class ArchivingRunCache(RunCache):
    """The run cache, archiving every run that ends (see the module doc)."""

    def __init__(
        self,
        kube: KubeClient,
        config: Config,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(kube, config, clock=clock)
        if config.history.enabled:
            self.history = RunHistory(kube, config, clock=self.clock)
            self.history.live = self._exists

    def _exists(self, mpijob: str) -> bool:
        run = self._runs.get(mpijob)
        return run is not None and not run.deleted

    def _archive(self, run: Run, view: RunView) -> asyncio.Task[bool] | None:
        """Archive a final run in the background unless it is (being) archived."""
        history = self.history
        if history is None or time.monotonic() < run.archive_after:
            return None
        if self._pods_problem or run.log_problem:
            return None  # a passing read failure is no part of the run's final lines
        task = history.archive(view)
        if task is not None:

            def done(t: asyncio.Task[bool]) -> None:
                if not t.cancelled() and t.exception() is None and not t.result():
                    run.archive_after = time.monotonic() + self.tuning.record_retry_seconds

            task.add_done_callback(done)
        return task

    def _apply_job(self, change: str, obj: Obj) -> None:
        super()._apply_job(change, obj)
        self._watch_ending(name_of(obj))

    def _replace_jobs(self, items: Iterable[Obj]) -> None:
        jobs = list(items)
        super()._replace_jobs(jobs)
        for obj in jobs:
            self._watch_ending(name_of(obj))

    def _watch_ending(self, name: str) -> None:
        """A run whose MPIJob is being deleted (or is gone) gets archived, then released."""
        run = self._runs.get(name)
        if self.history is None or run is None or run.finish_task is not None:
            return
        if run.deleted or terminating(run.obj):
            run.finish_task = self._spawn(self._finish(run), "archiving a deleted run")

    async def _finish(self, run: Run) -> None:
        """Archive a run whose MPIJob is being deleted, then remove our finalizer from it."""
        history = self.history
        assert history is not None
        try:
            for _ in range(50):
                if history.settled(run.name):
                    break
                view = self.peek(run)
                if view is None:
                    return
                launcher, log = view.launcher, run.log
                if not (
                    view.is_final
                    or run.deleted
                    or launcher is None
                    or launcher.started_at is None
                    or (log is not None and log.complete)
                ):
                    # The run's last read: its pods go once the finalizer is released.
                    if run.log_task is not None:
                        await asyncio.shield(run.log_task)
                    await self._read_log(run, launcher.pod, launcher.container, True)
                    if launcher.terminated is None and run.log is not None:
                        run.log, run.log_version = run.log.finished(cut=True), run.log_version + 1
                view = await self.view(run)
                if view is not None and view.is_final:
                    task = self._archive(run, view)
                    if task is not None and await task:
                        break
                await asyncio.sleep(min(self.tuning.record_retry_seconds, 1.0))
            done = history.settled(run.name)
            obj = await release(self.kube, run.name, run.obj) if done and not run.deleted else None
            if obj is not None:
                self._upsert_job(obj, force=True)
                _LOGGER.info("run %s archived: MPIJob %s released", run.info.run_stamp, run.name)
        finally:
            run.finish_task = None
