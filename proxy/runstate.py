"""oms's ``RunState``: the answer to ``POST /api/run`` and the head of every log page.

Built here and only here (the submit path for a new run, :mod:`proxy.follow.omsshapes` for the
log pages of a launched one), with the 10 keys that the UI's ``Mdf.isRunState`` requires.
"""

from __future__ import annotations

from typing import TypedDict


class RunState(TypedDict):
    """oms ``db.RunState``."""

    ModelName: str
    ModelDigest: str
    RunStamp: str
    SubmitStamp: str
    IsFinal: bool
    UpdateDateTime: str
    RunName: str
    TaskRunName: str
    IsLog: bool
    LogFileName: str


def log_file_name(model_name: str, run_stamp: str) -> str:
    """oms's console log file name of a run: ``<model>.<run stamp>.console.log``."""
    return f"{model_name}.{run_stamp}.console.log"


def run_state(
    *,
    model_name: str,
    model_digest: str,
    run_stamp: str,
    submit_stamp: str,
    is_final: bool,
    update_time: str,
    run_name: str,
) -> RunState:
    """A RunState of a run the proxy launched (always logged, never part of a task)."""
    return {
        "ModelName": model_name,
        "ModelDigest": model_digest,
        "RunStamp": run_stamp,
        "SubmitStamp": submit_stamp,
        "IsFinal": is_final,
        "UpdateDateTime": update_time,
        "RunName": run_name,
        "TaskRunName": "",
        "IsLog": True,
        "LogFileName": log_file_name(model_name, run_stamp),
    }
