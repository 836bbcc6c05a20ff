"""The run history's I/O: run records written once, read by an informer, expired in the background.

:class:`RunHistory` keeps every run-record ConfigMap of the namespace (selected by
:data:`proxy.follow.archive.SELECTOR`) in memory, fed by one list+watch, so answering an old run
costs no Kubernetes request, and every replica (and a restarted one) serves the same records.
A record is unpacked when it is first asked for and kept in a small LRU.

**Writing.** The run cache calls :meth:`RunHistory.archive` for a run once its view is final.
The record's name comes from the MPIJob's, so a create that meets ``AlreadyExists`` (409) means
another replica archived it first: success. Records are immutable.

**Retention** (``history.retention_days``, ``history.max_runs``, ``history.max_total_bytes``):
every ``follow.sweep_seconds`` each replica computes the same expired set from the same records
and deletes it; a 404 (another replica was first) is fine.

RBAC: configmaps create (shared with the per-run ConfigMap), list, watch, delete.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from proxy import names
from proxy.clients.kube import KubeClient
from proxy.config import Config
from proxy.errors import (
    KubeAlreadyExists,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeObjectNotFound,
)
from proxy.follow.archive import (
    SELECTOR,
    RecordEntry,
    RecordError,
    RunRecord,
    configmap_of,
    decode,
    entry_of,
    expired,
    fit,
)
from proxy.follow.informer import inform
from proxy.follow.runinfo import resource_version
from proxy.follow.tasks import TaskSet
from proxy.follow.view import RunView

_LOGGER = logging.getLogger(__name__)

Obj = dict[str, Any]
UNPACKED_KEPT = 32
"""Unpacked records kept in memory (the ones asked for last)."""


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


@dataclasses.dataclass
class HistoryCounters:
    """What the history did since start-up (for ``/metrics``)."""

    archived: int = 0
    already: int = 0
    failed: int = 0
    expired: int = 0
    truncated: int = 0


class RunHistory:
    """The run records of the namespace, in memory; writes and expiry (see the module doc)."""

    def __init__(
        self,
        kube: KubeClient,
        config: Config,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.settings = config.history
        self.tuning = config.follow
        self.clock = clock or (lambda: datetime.now(UTC))
        self.watch = config.kubernetes.watch
        self.counters = HistoryCounters()
        self._entries: dict[str, RecordEntry] = {}
        self._by_stamp: dict[str, set[str]] = {}
        self._by_mpijob: dict[str, str] = {}
        self._unpacked: collections.OrderedDict[str, tuple[str, RunRecord]] = (
            collections.OrderedDict()
        )
        self._synced = False
        self._direct_at = -math.inf
        self._direct_task: asyncio.Task[None] | None = None
        self._writing: dict[str, asyncio.Task[bool]] = {}
        self._tasks = TaskSet(_LOGGER)
        self._closed = False
        self.forbidden = False
        """Creating records is not allowed (RBAC): archiving is given up (logged once)."""
        self.refused: set[str] = set()
        """MPIJobs whose record the API server refused as invalid (422): not tried again."""
        self.live: Callable[[str], bool] = lambda mpijob: False
        """Whether an MPIJob still exists (set by the run cache): its record is not expired,
        or the cache would only archive it again."""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the informer (``kubernetes.watch``) and the retention sweeper."""
        if self.watch:
            self._spawn(self._inform(), "run-record informer")
        self._spawn(self._sweep_forever(), "run-record sweeper")

    async def close(self) -> None:
        """Stop the background tasks."""
        self._closed = True
        await self._tasks.cancel_all()

    def _spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro, what)

    async def _inform(self) -> None:
        await inform(
            "run records",
            self.kube.list_configmaps,
            self.kube.watch_configmaps,
            self._replace,
            self._apply,
            lambda ok: setattr(self, "_synced", ok),
            selector=SELECTOR,
            watch_timeout=self.tuning.watch_timeout_seconds,
            backoff=(self.tuning.backoff_first_seconds, self.tuning.backoff_max_seconds),
            closed=lambda: self._closed,
        )

    # -- the index ------------------------------------------------------------------------------

    def _replace(self, items: list[Obj]) -> None:
        fresh = {_name(o): o for o in items}
        for name in [n for n in self._entries if n not in fresh]:
            self._forget(name)
        for obj in fresh.values():
            self._store(obj)

    def _apply(self, change: str, obj: Obj) -> None:
        if change == "DELETED":
            self._forget(_name(obj))
        elif change in ("ADDED", "MODIFIED"):
            self._store(obj)

    def _store(self, obj: Obj) -> None:
        entry = entry_of(obj)
        if entry is None:
            return
        old = self._entries.get(entry.name)
        if old is not None:
            self._forget(entry.name)
        self._entries[entry.name] = entry
        for stamp in (entry.run_stamp, entry.submit_stamp):
            self._by_stamp.setdefault(stamp, set()).add(entry.name)
        if entry.mpijob:
            self._by_mpijob[entry.mpijob] = entry.name

    def _forget(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        for stamp in (entry.run_stamp, entry.submit_stamp):
            bucket = self._by_stamp.get(stamp)
            if bucket is not None:
                bucket.discard(name)
                if not bucket:
                    del self._by_stamp[stamp]
        if self._by_mpijob.get(entry.mpijob) == name:
            del self._by_mpijob[entry.mpijob]
        self._unpacked.pop(name, None)

    async def _ensure_fresh(self) -> None:
        """Without a synced watch, list the records (at most once per direct_cache_seconds)."""
        if self.watch and self._synced:
            return
        if self._direct_task is None:
            if time.monotonic() - self._direct_at < self.tuning.direct_cache_seconds:
                return
            self._direct_task = asyncio.get_running_loop().create_task(self._direct_list())
            self._tasks.add(self._direct_task)
        with contextlib.suppress(KubeError):
            await asyncio.shield(self._direct_task)

    async def _direct_list(self) -> None:
        try:
            items, _ = await self.kube.list_configmaps(SELECTOR)
            if not self._synced:
                self._replace(items)
        except KubeError as e:
            _LOGGER.warning("listing run records failed: %s", e)
        finally:
            self._direct_at = time.monotonic()
            if self._direct_task is not None:
                self._tasks.discard(self._direct_task)
            self._direct_task = None

    def _unpack(self, entry: RecordEntry) -> RunRecord | None:
        cached = self._unpacked.get(entry.name)
        if cached is not None and cached[0] == entry.resource_version:
            self._unpacked.move_to_end(entry.name)
            return cached[1]
        try:
            record = decode(entry.blob)
        except RecordError as e:
            _LOGGER.warning("run record %s is unreadable: %s", entry.name, e)
            return None
        self._unpacked[entry.name] = (entry.resource_version, record)
        while len(self._unpacked) > UNPACKED_KEPT:
            self._unpacked.popitem(last=False)
        return record

    # -- lookups (the typed API of the history) --------------------------------------------

    def archived(self, mpijob: str) -> bool:
        """A record of MPIJob ``mpijob`` exists (in memory; no I/O)."""
        return mpijob in self._by_mpijob

    def settled(self, mpijob: str) -> bool:
        """Nothing more will be done for MPIJob ``mpijob``: archived, or archiving given up
        (records forbidden by RBAC, or this record refused as invalid): it may go."""
        return self.archived(mpijob) or self.forbidden or mpijob in self.refused

    def get(self, stamp: str, model: str | None = None) -> RunRecord | None:
        """The record of the run with run or submit stamp ``stamp`` (of ``model``), from memory."""
        best: RecordEntry | None = None
        for name in self._by_stamp.get(stamp, ()):
            entry = self._entries.get(name)
            if entry is None or (model is not None and not entry.matches_model(model)):
                continue
            if best is None or (entry.submitted, entry.name) > (best.submitted, best.name):
                best = entry
        return self._unpack(best) if best is not None else None

    async def find(self, stamp: str, model: str | None = None) -> RunRecord | None:
        """:meth:`get`, after a direct list when the watch is not synced."""
        if not stamp:
            return None
        await self._ensure_fresh()
        return self.get(stamp, model)

    def finished_runs(self, model: str | None = None) -> list[RecordEntry]:
        """Every record kept (of ``model``, if given), newest end first; records stay packed."""
        entries = [e for e in self._entries.values() if model is None or e.matches_model(model)]
        return sorted(entries, key=lambda e: (e.final_at, e.name), reverse=True)

    async def of_model(self, model: str) -> list[RecordEntry]:
        """:meth:`finished_runs` of ``model`` after a direct list when the watch is not synced."""
        await self._ensure_fresh()
        return self.finished_runs(model)

    def unpack(self, entry: RecordEntry) -> RunRecord | None:
        """The record of an entry of :meth:`finished_runs` (None if it is unreadable)."""
        return self._unpack(entry)

    def stats(self) -> tuple[int, int]:
        """(records kept, their compressed bytes)."""
        return len(self._entries), sum(len(e.blob) for e in self._entries.values())

    # -- writing ----------------------------------------------------------------------------------

    def archive(self, view: RunView) -> asyncio.Task[bool] | None:
        """Archive a final view in the background, once (None: archived or being archived)."""
        name = view.info.name
        if self.settled(name):
            return None
        task = self._writing.get(name)
        if task is not None:
            return task
        task = asyncio.get_running_loop().create_task(self._write(view))
        self._writing[name] = task
        self._tasks.add(task)

        def done(t: asyncio.Task[bool]) -> None:
            self._tasks.discard(t)
            if self._writing.get(name) is t:
                del self._writing[name]

        task.add_done_callback(done)
        return task

    async def _write(self, view: RunView) -> bool:
        # Compressing a long log takes a while: not on the event loop.
        record, blob = await asyncio.to_thread(fit, view, self.clock(), self.settings.max_log_bytes)
        body = configmap_of(record, blob)
        try:
            created = await self.kube.create_configmap(body)
        except KubeAlreadyExists:
            self.counters.already += 1
            if not self.archived(view.info.name):
                self._store(body)  # another replica was first; its watch event follows
            return True
        except KubeForbidden as e:
            self.forbidden = True
            self.counters.failed += 1
            _LOGGER.warning(
                "cannot create run records (RBAC needs 'create' on configmaps): runs will not "
                "outlive their MPIJobs: %s",
                e,
            )
            return False
        except KubeInvalid as e:  # will not change on a retry: the MPIJob may go without it
            self.counters.failed += 1
            self.refused.add(view.info.name)
            _LOGGER.error("the record of run %s was refused: %s", view.info.run_stamp, e)
            return False
        except KubeError as e:
            self.counters.failed += 1
            _LOGGER.warning("archiving run %s failed: %s", view.info.run_stamp, e)
            return False
        self.counters.archived += 1
        if record.lines_not_kept:
            self.counters.truncated += 1
        self._store(created)
        _LOGGER.info(
            "run %s archived in ConfigMap %s (%d bytes)",
            record.run_stamp,
            body["metadata"]["name"],
            len(blob),
        )
        return True

    # -- retention ------------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tuning.sweep_seconds)
            await self.sweep()

    async def sweep(self) -> int:
        """Delete the records past retention or beyond the caps; returns how many went."""
        await self._ensure_fresh()
        gone = 0
        for entry in expired(
            [e for e in self._entries.values() if not self.live(e.mpijob)],
            self.clock(),
            retention_days=self.settings.retention_days,
            max_runs=self.settings.max_runs,
            max_total_bytes=self.settings.max_total_bytes,
        ):
            try:
                await self.kube.delete_configmap(entry.name)
            except KubeObjectNotFound:
                pass
            except KubeError as e:
                _LOGGER.warning("deleting run record %s failed: %s", entry.name, e)
                continue
            self._forget(entry.name)
            self.counters.expired += 1
            gone += 1
        return gone


async def release(kube: KubeClient, name: str, obj: Obj) -> Obj | None:
    """Remove :data:`names.RUN_RECORD_FINALIZER` from MPIJob ``name`` (last seen as ``obj``).

    The patch carries the resourceVersion (a 409 re-reads and tries again, three times at most).
    Returns the patched MPIJob, or None when there was nothing to do or it failed (logged).
    """
    for _ in range(3):
        finalizers = list((obj.get("metadata") or {}).get("finalizers") or ())
        if names.RUN_RECORD_FINALIZER not in finalizers:
            return None
        patch: Obj = {
            "metadata": {
                "resourceVersion": resource_version(obj),
                "finalizers": [f for f in finalizers if f != names.RUN_RECORD_FINALIZER],
            }
        }
        try:
            return await kube.patch_mpijob(name, patch)
        except KubeConflict:  # 409: it changed; look again
            try:
                obj = await kube.get_mpijob(name)
            except KubeError:
                return None
        except KubeObjectNotFound:
            return None
        except KubeError as e:
            _LOGGER.warning("releasing MPIJob %s failed: %s", name, e)
            return None
    return None
