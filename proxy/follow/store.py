"""The index the informers feed: our MPIJobs (as :class:`Run`) and their pods, by name and stamp.

Every change arrives here, from a watch event or a direct list; what is older than what is
known (by resourceVersion) is ignored, and a name reused by a new MPIJob replaces the old run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from proxy import names
from proxy.follow.launcherlog import JOB_NAME_LABEL, LauncherLog, LogBuffer
from proxy.follow.runinfo import RunInfo, resource_version, run_info
from proxy.follow.view import FinalMessage, RunView

Obj = dict[str, Any]


def _newer(new: Obj, old: Obj) -> bool:
    """``new`` is not older than ``old`` (resourceVersions compared as numbers when they are)."""
    a, b = resource_version(new), resource_version(old)
    if a.isdigit() and b.isdigit():
        return int(a) >= int(b)
    return True


def name_of(obj: Mapping[str, Any]) -> str:
    """``metadata.name`` of a Kubernetes object."""
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
    log_problem: str | None = None
    """Why the launcher's log could not be read (shown on the log page), if it could not."""
    record_task: asyncio.Task[None] | None = None
    record_attempts: int = 0
    frozen_prelude: tuple[str, ...] | None = None
    """The prelude this replica froze (shown until the recorded one arrives, never changed)."""
    frozen_final: FinalMessage | None = None
    """The start-deadline verdict this replica reached (likewise)."""
    memo_key: tuple[Any, ...] | None = None
    memo_view: RunView | None = None

    @property
    def deleted(self) -> bool:
        """The MPIJob is gone (this is a tombstone)."""
        return self.deleted_at is not None


class RunStore:
    """Our MPIJobs and their pods as the informers (or direct lists) last showed them, indexed.

    An MPIJob is found by its name and by either of its stamps; a pod by its name and by its
    MPIJob (the operator's job-name label). A deleted MPIJob stays as a tombstone until the
    cache expires it, so that pollers still see its final state.
    """

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self._runs: dict[str, Run] = {}
        self._by_stamp: dict[str, set[str]] = {}
        self._pods: dict[str, Obj] = {}
        self._pods_by_job: dict[str, set[str]] = {}
        self._pods_version: dict[str, int] = {}

    def _replace_jobs(self, items: Iterable[Obj]) -> None:
        seen: set[str] = set()
        for obj in items:
            seen.add(name_of(obj))
            self._upsert_job(obj, force=True)
        for run in list(self._runs.values()):
            if run.name not in seen and not run.deleted:
                self._bury(run, run.obj)

    def _apply_job(self, change: str, obj: Obj) -> None:
        if change == "DELETED":
            run = self._runs.get(name_of(obj))
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
        fresh = {name_of(p): p for p in items}
        for name in [n for n in self._pods if n not in fresh]:
            self._remove_pod(name)
        for pod in fresh.values():
            self._store_pod(pod)

    def _apply_pod(self, change: str, obj: Obj) -> None:
        if change == "DELETED":
            self._remove_pod(name_of(obj))
        elif change in ("ADDED", "MODIFIED"):
            self._store_pod(obj)

    @staticmethod
    def _job_of(pod: Obj) -> str:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return str(labels.get(JOB_NAME_LABEL) or "")

    def _store_pod(self, pod: Obj) -> None:
        name, job = name_of(pod), self._job_of(pod)
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
