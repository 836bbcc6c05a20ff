"""Launched runs answered in oms's own shapes (pure): RunState, RunStateLogPage, RunPub, RunJob.

Each shape is built here and only here, from a :class:`proxy.follow.view.RunView`; the field
lists and their meaning follow oms's Go structs (``db.RunState``, ``RunStateLogPage``,
``db.RunPub``, ``RunJob``), which the UI and the R/Python clients read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import tzinfo
from typing import Any

from proxy import runstate
from proxy.follow.runinfo import format_time
from proxy.follow.view import RunView
from proxy.runstate import RunState

# --- answers in oms's shapes ---------------------------------------------------------------------


class PagingError(ValueError):
    """A bad ``start`` or ``count`` (oms answers 400)."""


_GO_INT = re.compile(r"[+-]?[0-9]+")
_GO_INT_MAX = 2**63 - 1


def parse_go_int(text: str) -> int:
    """Go ``strconv.Atoi``: optional sign, decimal digits, 64-bit range; else PagingError."""
    if not _GO_INT.fullmatch(text):
        raise PagingError(text)
    value = int(text)
    if not -_GO_INT_MAX - 1 <= value <= _GO_INT_MAX:
        raise PagingError(text)
    return value


def lines_page(offset: int, count: int, lines: Sequence[str]) -> tuple[int, int, list[str]]:
    """oms ``getLinesPage``: (offset, size, lines); count <= 0 means all lines from offset."""
    total = len(lines)
    if total <= 0:
        return 0, 0, []
    offset = max(offset, 0)
    if offset >= total:
        return offset, 0, []
    if count <= 0 or offset + count > total:
        count = total - offset
    return offset, count, list(lines[offset : offset + count])


def run_state(view: RunView, tz: tzinfo | None = None) -> RunState:
    """oms ``RunState`` (all 10 keys) of a launched run (:mod:`proxy.runstate`)."""
    info = view.info
    return runstate.run_state(
        model_name=info.model_name,
        model_digest=info.model_digest,
        run_stamp=info.run_stamp,
        submit_stamp=info.submit_stamp,
        is_final=view.is_final,
        update_time=format_time(view.updated, tz),
        run_name=info.run_name,
    )


def log_page(view: RunView, start: int, count: int, tz: tzinfo | None = None) -> dict[str, Any]:
    """oms ``RunStateLogPage``: RunState plus Offset, Size, TotalSize and Lines."""
    offset, size, page = lines_page(start, count, view.lines)
    return {
        **run_state(view, tz),
        "Offset": offset,
        "Size": size,
        "TotalSize": len(view.lines),
        "Lines": page,
    }


def run_pub(view: RunView, tz: tzinfo | None = None) -> dict[str, Any]:
    """A ``RunPub`` status item for a run oms has no database row of (yet).

    It has every key the UI checks. ``RunDigest`` stays empty (there is no run in the
    database), so the UI shows the item without asking oms for the run's texts.
    """
    info = view.info
    status = view.status if view.is_final else "i"
    created = format_time(info.submitted, tz)
    return {
        "ModelName": info.model_name,
        "ModelDigest": info.model_digest,
        "ModelVersion": "",
        "ModelCreateDateTime": "",
        "Name": info.run_name or f"{info.model_name}_{info.run_stamp}",
        "SubCount": info.sub_values,
        "SubStarted": info.sub_values
        if view.phase not in ("submitted", "queued", "pending")
        else 0,
        "SubCompleted": info.sub_values if status == "s" else 0,
        "CreateDateTime": created,
        "Status": status,
        "UpdateDateTime": format_time(view.updated, tz),
        "RunId": 0,
        "RunDigest": "",
        "ValueDigest": "",
        "RunStamp": info.run_stamp,
        "Txt": [],
        "Opts": {},
        "Param": [],
        "Table": [],
        "Entity": [],
        "Progress": [],
    }


def run_res(view: RunView) -> dict[str, Any]:
    """oms ``RunRes`` of a launched run: CPU = processes x threads, memory in GB as oms sums it
    (``memoryRunSize``: processes x per-process MiB / 1024, rounded up)."""
    info = view.info
    processes, threads = info.process_count, info.threads
    return {
        "Cpu": processes * threads,
        "Mem": math.ceil(processes * info.process_mem_mb / 1024),
        "ProcessCount": processes,
        "ThreadCount": threads,
        "ProcessMemMb": info.process_mem_mb,
        "ThreadMemMb": 0,
    }


def run_job(view: RunView, template: str = "", queue_pos: int = 0) -> dict[str, Any]:
    """oms ``RunJob`` (a job on the service-state page) of a launched run, as oms shows its own:
    run options, template, Mpi and resources; server-only fields empty (oms clears them too)."""
    info = view.info
    return {
        "SubmitStamp": info.submit_stamp,
        "Pid": 0,
        "CmdPath": "",
        "CmdLine": "",
        "ModelName": info.model_name,
        "ModelDigest": info.model_digest,
        "RunStamp": info.run_stamp,
        "Dir": "",
        "Opts": dict(info.opts),
        "Env": {},
        "Threads": info.threads,
        "IsMpi": True,
        "Mpi": {"Np": info.mpi_np, "IsNotOnRoot": info.not_on_root, "IsNotByJob": False},
        "Template": template,
        "Tables": [],
        "Microdata": {"IsToDb": False, "IsInternal": False, "Entity": []},
        "RunNotes": [],
        "Res": run_res(view),
        "IsOverLimit": False,
        "QueuePos": queue_pos,
        "LogFileName": info.log_file_name,
        "LogPath": "",
        "BinDir": "",
        "WorkDir": "",
        "IniPath": "",
        "HostFilePath": "",
    }


_JOB_STATUS = {"succeeded": "success", "failed": "error", "deadline": "error", "stopped": "kill"}


def job_status(view: RunView) -> str:
    """oms's history ``JobStatus`` of a finished run: success, error or kill (stopped)."""
    return _JOB_STATUS.get(view.phase, "")


def history_job(view: RunView) -> dict[str, Any]:
    """oms ``historyJobFile`` (a History item of the service-state page) of a finished run."""
    info = view.info
    return {
        "SubmitStamp": info.submit_stamp,
        "ModelName": info.model_name,
        "ModelDigest": info.model_digest,
        "RunStamp": info.run_stamp,
        "JobStatus": job_status(view),
        "RunTitle": info.run_name,
    }


def job_details(
    view: RunView, run_status: Any, template: str = "", queue_pos: int = 0, which: str = "active"
) -> dict[str, Any]:
    """oms ``runJobState``, the answer to ``/api/service/job/<which>/<submitStamp>``: the RunJob,
    its run status and its log (oms shows no log for a queued job; ``JobStatus`` only in
    history)."""
    return {
        "JobStatus": job_status(view) if which == "history" else "",
        **run_job(view, template, queue_pos),
        "RunStatus": [run_status],
        "Lines": list(view.lines) if which != "queue" else [],
    }


# --- progress items -------------------------------------------------------------------------

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
