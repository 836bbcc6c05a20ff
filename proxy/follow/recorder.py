"""Recording on the MPIJob what makes every replica answer alike (the frozen prelude, the
start-deadline verdict), retried in the background, and making a verdict stick.

Whichever replica can first compute one writes it with a JSON merge patch carrying
``metadata.resourceVersion`` (a 409 means someone else changed the job: re-read, try again).
RBAC: mpijobs patch (and delete, for a verdict under Kueue).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.clients.kube import KubeClient
from proxy.config import FollowConfig
from proxy.errors import KubeConflict, KubeError, KubeForbidden, KubeObjectNotFound
from proxy.follow.runinfo import resource_version
from proxy.follow.store import Run
from proxy.follow.view import FINAL_MESSAGE_KEY, PRELUDE_KEY, RunView, queue_name

_LOGGER = logging.getLogger(__name__)

Obj = dict[str, Any]


class Recorder:
    """Writes a run's frozen prelude and start-deadline verdict on its MPIJob."""

    def __init__(
        self,
        kube: KubeClient,
        tuning: FollowConfig,
        upsert: Callable[[Obj], object],
        spawn: Callable[[Awaitable[Any], str], asyncio.Task[Any]],
    ) -> None:
        self.kube = kube
        self.tuning = tuning
        self._upsert = upsert
        self._spawn = spawn

    def maybe_record(self, run: Run, view: RunView) -> None:
        """Start recording what ``view`` has frozen and the MPIJob lacks (one task per run)."""
        if run.deleted or run.record_task is not None:
            return
        if run.record_attempts >= self.tuning.record_attempts:
            return  # gave up (logged); the answers here stay as frozen
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
        run.record_task = self._spawn(self._record(run, annotations, suspend), "recording")

    async def _record(self, run: Run, annotations: dict[str, str], suspend: bool) -> None:
        """Write ``annotations`` on the run's MPIJob, retrying in the background.

        A 409 (the MPIJob changed) re-reads it and tries again at once; any other failure
        (403 without RBAC ``patch``, 5xx, a timeout) is logged and tried again after
        ``follow.record_retry_seconds``, ``follow.record_attempts`` times in all. Meanwhile,
        and after giving up, this replica answers from what it froze (:class:`Run`).
        """
        try:
            for attempt in range(self.tuning.record_attempts):
                run.record_attempts = attempt + 1
                if run.deleted:
                    return
                current = (run.obj.get("metadata") or {}).get("annotations") or {}
                todo = {k: v for k, v in annotations.items() if k not in current}
                if not todo:
                    return  # recorded meanwhile (by another replica, or seen in the watch)
                if await self._patch_once(run, todo, suspend and FINAL_MESSAGE_KEY in todo):
                    return
                if attempt + 1 < self.tuning.record_attempts:
                    await asyncio.sleep(self.tuning.record_retry_seconds)
            _LOGGER.error(
                "gave up annotating MPIJob %s after %d attempts; this replica answers from "
                "what it froze, other replicas may differ",
                run.name,
                self.tuning.record_attempts,
            )
        finally:
            run.record_task = None

    async def _patch_once(self, run: Run, annotations: dict[str, str], verdict: bool) -> bool:
        """One try at recording; True when there is nothing more to do."""
        patch: Obj = {
            "metadata": {"resourceVersion": resource_version(run.obj), "annotations": annotations}
        }
        if verdict:
            patch["spec"] = {"runPolicy": {"suspend": True}}
        try:
            obj = await self.kube.patch_mpijob(run.name, patch)
        except KubeConflict:  # 409 Conflict: the MPIJob changed; re-read, try again
            with contextlib.suppress(KubeError):
                self._upsert(await self.kube.get_mpijob(run.name))
            return False
        except KubeObjectNotFound:
            return True
        except KubeForbidden as e:
            _LOGGER.warning(
                "cannot annotate MPIJob %s (RBAC needs 'patch' on mpijobs); will try again: %s",
                run.name,
                e,
            )
            return False
        except KubeError as e:
            _LOGGER.warning("annotating MPIJob %s failed, will try again: %s", run.name, e)
            return False
        self._upsert(obj)
        if verdict:
            await self.enforce_verdict(run)
        return True

    async def enforce_verdict(self, run: Run) -> None:
        """Make a recorded start-deadline verdict stick.

        Without Kueue, ``suspend: true`` (in the same patch) keeps the MPI operator from
        starting the run. Under Kueue it does not hold (Kueue resumes a job it admits), so the
        MPIJob is deleted once the verdict is recorded; its tombstone, with the recorded
        prelude and verdict, answers for ``follow.tombstone_seconds``.
        """
        queue = queue_name(run.obj)
        if not queue:
            _LOGGER.info(
                "run %s did not start in time: MPIJob %s suspended", run.info.run_stamp, run.name
            )
            return
        try:
            await self.kube.delete_mpijob(run.name, propagation="Background")
        except KubeObjectNotFound:
            pass
        except KubeError as e:
            _LOGGER.warning("deleting MPIJob %s after its start deadline failed: %s", run.name, e)
            return
        _LOGGER.info(
            "run %s did not start in time: MPIJob %s (Kueue queue %s) deleted",
            run.info.run_stamp,
            run.name,
            queue,
        )
