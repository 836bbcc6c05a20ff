"""What the OpenM++ UI requires of oms's answers (shared/reference/oms-api.md §2)."""

from __future__ import annotations

# Mdf.isRunState: every RunState answer (POST /api/run, log pages) carries all 10 keys.
RUN_STATE_KEYS: tuple[str, ...] = (
    "ModelName",
    "ModelDigest",
    "RunStamp",
    "SubmitStamp",
    "IsFinal",
    "UpdateDateTime",
    "RunName",
    "TaskRunName",
    "IsLog",
    "LogFileName",
)

# isRunStatusProgress: a progress item counts only with these keys (and a Progress array).
PROGRESS_KEYS: tuple[str, ...] = (
    "ModelName",
    "ModelDigest",
    "Name",
    "RunDigest",
    "ValueDigest",
    "RunStamp",
    "SubCount",
    "SubCompleted",
    "Status",
    "CreateDateTime",
    "UpdateDateTime",
)
