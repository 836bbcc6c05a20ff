"""A finished run's record (pure): what is kept of it after its MPIJob, and how it is stored.

A :class:`RunRecord` is the run as the clients last saw it: who it was (model, stamps, run name,
size), how it ended (phase, oms status letter ``s``/``e``/``x``, the reason line, times) and its
log lines **exactly as they were served**. :func:`record_of` makes one from a final
:class:`~proxy.follow.view.RunView`; :meth:`RunRecord.view` turns it back into a view, so the log
pages and status answers of an archived run come from the same code as those of a live one.

Stored as one ConfigMap per run (:func:`configmap_of`), named after the MPIJob
(``<mpijob>-record``), labelled for a list+watch (:data:`SELECTOR`), with the record as gzip'd
JSON in ``binaryData`` and the lookup keys (stamps, model, end time) as annotations, so an
informer can index a record without unpacking it (:func:`entry_of`).

**The size cap.** A ConfigMap holds at most 1 MiB. The log lines are capped at
``history.max_log_bytes`` (UTF-8, one newline per line): above it, the first and the last lines
are kept, half the budget each, with one marker line between them saying how many lines are not
kept. Then, should the compressed record still exceed :data:`MAX_RECORD_BYTES` (a log that does
not compress), the budget is cut until it fits. The submission line and the epilogue (the reason)
are always kept.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import gzip
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from proxy import names
from proxy.follow.runinfo import RunInfo, annotations_of, labels_of, object_meta, time_of
from proxy.follow.view import PREFIX, Phase, RunView

Obj = dict[str, Any]

SCHEMA = 1
"""Version of the record's JSON layout (``"schema"``)."""
COMPONENT_KEY = "app.kubernetes.io/component"
COMPONENT_VALUE = "run-record"
SELECTOR = f"{names.MANAGED_BY_KEY}={names.MANAGED_BY_VALUE},{COMPONENT_KEY}={COMPONENT_VALUE}"
"""Label selector of the run-record ConfigMaps (and of nothing else the proxy creates)."""
DATA_KEY = "record.json.gz"
"""``binaryData`` key of the gzip'd JSON record."""
MPIJOB_KEY = "openmpp.org/mpijob"
STATUS_KEY = "openmpp.org/status"
FINAL_AT_KEY = "openmpp.org/final-at"
FINALIZER = names.RUN_RECORD_FINALIZER
"""Finalizer on each MPIJob (``history.finalizer``): removed once its run is archived."""

CONFIGMAP_LIMIT = 1 << 20
"""What the API server accepts in one ConfigMap's data (``data`` + ``binaryData``)."""
MAX_RECORD_BYTES = 700_000
"""Largest compressed record written: under :data:`CONFIGMAP_LIMIT`, and with base64 and the
metadata the create request stays under 1 MiB (the client sends it in one piece)."""

_STATUS = {"succeeded": "s", "failed": "e", "deadline": "e", "stopped": "x"}
_REASON_MARKS = (" run succeeded:", " run failed:", " run stopped:")


def record_name(mpijob: str) -> str:
    """The run-record ConfigMap of MPIJob ``mpijob`` (at most 54 + 7 characters)."""
    return f"{mpijob}-record"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """A finished run as the proxy keeps it (the JSON in the ConfigMap, typed)."""

    mpijob: str
    uid: str
    model_name: str
    model_digest: str
    run_stamp: str
    submit_stamp: str
    run_name: str
    phase: Phase
    status: str
    """oms status letter: ``s`` succeeded, ``e`` failed (or never started), ``x`` stopped."""
    reason: str
    """The line that says how the run ended (from the log's epilogue)."""
    created: datetime
    submitted: datetime
    final_at: datetime
    updated: datetime
    archived_at: datetime
    mpi_np: int
    workers: int
    slots: int
    threads: int
    not_on_root: bool
    sub_values: int
    lines: tuple[str, ...]
    lines_not_kept: int = 0
    """Lines left out by the size cap (0: the log is whole)."""

    @property
    def info(self) -> RunInfo:
        """The run's identity, as :func:`proxy.follow.runinfo.run_info` reads it from an MPIJob."""
        return RunInfo(
            name=self.mpijob,
            uid=self.uid,
            model_name=self.model_name,
            model_digest=self.model_digest,
            run_stamp=self.run_stamp,
            submit_stamp=self.submit_stamp,
            run_name=self.run_name,
            created=self.created,
            submitted=self.submitted,
            mpi_np=self.mpi_np,
            workers=self.workers,
            slots=self.slots,
            threads=self.threads,
            not_on_root=self.not_on_root,
            sub_values=self.sub_values,
        )

    def view(self) -> RunView:
        """The final view this record was made from (as the handlers answer with it)."""
        return RunView(
            info=self.info,
            phase=self.phase,
            is_final=True,
            status=self.status,
            lines=self.lines,
            updated=self.updated,
            final_at=self.final_at,
            launcher=None,
            prelude_frozen=True,
            prelude_to_record=None,
            final_to_record=None,
            needs_events=None,
            events_live=False,
            wants_log=False,
        )

    def to_json(self) -> Obj:
        """The JSON document stored (the inverse of :func:`record_from_json`)."""
        return {
            "schema": SCHEMA,
            "mpijob": self.mpijob,
            "uid": self.uid,
            "modelName": self.model_name,
            "modelDigest": self.model_digest,
            "runStamp": self.run_stamp,
            "submitStamp": self.submit_stamp,
            "runName": self.run_name,
            "phase": self.phase,
            "status": self.status,
            "reason": self.reason,
            "created": _iso(self.created),
            "submitted": _iso(self.submitted),
            "finalAt": _iso(self.final_at),
            "updated": _iso(self.updated),
            "archivedAt": _iso(self.archived_at),
            "resources": {
                "np": self.mpi_np,
                "workers": self.workers,
                "slotsPerWorker": self.slots,
                "threads": self.threads,
                "notOnRoot": self.not_on_root,
                "subValues": self.sub_values,
            },
            "linesNotKept": self.lines_not_kept,
            "lines": list(self.lines),
        }


class RecordError(ValueError):
    """A stored record that cannot be read (another schema, damaged data)."""


def _time(doc: Mapping[str, Any], key: str) -> datetime:
    moment = time_of(doc.get(key))
    if moment is None:
        raise RecordError(f"no time in {key!r}")
    return moment


def record_from_json(doc: Any) -> RunRecord:
    """A :class:`RunRecord` from its JSON document; :class:`RecordError` if it is not one."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise RecordError("not a run record of schema 1")
    res = doc.get("resources") if isinstance(doc.get("resources"), dict) else {}
    assert isinstance(res, dict)
    lines = doc.get("lines")
    phase = doc.get("phase")
    if not isinstance(lines, list) or phase not in _STATUS:
        raise RecordError("a run record needs its lines and a final phase")
    try:
        return RunRecord(
            mpijob=str(doc["mpijob"]),
            uid=str(doc.get("uid") or ""),
            model_name=str(doc.get("modelName") or ""),
            model_digest=str(doc.get("modelDigest") or ""),
            run_stamp=str(doc["runStamp"]),
            submit_stamp=str(doc.get("submitStamp") or doc["runStamp"]),
            run_name=str(doc.get("runName") or ""),
            phase=phase,
            status=str(doc.get("status") or _STATUS[phase]),
            reason=str(doc.get("reason") or ""),
            created=_time(doc, "created"),
            submitted=_time(doc, "submitted"),
            final_at=_time(doc, "finalAt"),
            updated=_time(doc, "updated"),
            archived_at=_time(doc, "archivedAt"),
            mpi_np=int(res.get("np") or 0),
            workers=int(res.get("workers") or 0),
            slots=int(res.get("slotsPerWorker") or 1),
            threads=int(res.get("threads") or 1),
            not_on_root=bool(res.get("notOnRoot")),
            sub_values=int(res.get("subValues") or 1),
            lines=tuple(str(x) for x in lines),
            lines_not_kept=int(doc.get("linesNotKept") or 0),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise RecordError(f"a run record field is missing or wrong: {e}") from e


# --- making a record -----------------------------------------------------------------------------


def reason_line(lines: Sequence[str]) -> str:
    """The epilogue line saying how the run ended ('' if there is none)."""
    for line in reversed(lines):
        if line.startswith(PREFIX) and any(mark in line for mark in _REASON_MARKS):
            return line[len(PREFIX) :]
    return ""


def _size(line: str) -> int:
    return len(line.encode("utf-8")) + 1


def cap_lines(
    lines: Sequence[str], max_bytes: int, reason_from: int
) -> tuple[tuple[str, ...], int]:
    """(kept lines, lines not kept): head and tail of ``lines`` within ``max_bytes``.

    Lines from index ``reason_from`` on (the epilogue) are always kept, as is the first line;
    the rest of the budget is split between the first and the last lines of the middle, with
    one marker line where lines were left out.
    """
    total = sum(_size(x) for x in lines)
    if total <= max_bytes or len(lines) <= 2:
        return tuple(lines), 0
    first, epilogue = lines[:1], list(lines[reason_from:])
    middle = list(lines[1:reason_from])
    budget = max(0, max_bytes - sum(_size(x) for x in (*first, *epilogue)) - 200)
    head: list[str] = []
    used = 0
    for line in middle:
        if used + _size(line) > budget // 2:
            break
        head.append(line)
        used += _size(line)
    tail: list[str] = []
    used_tail = 0
    for line in reversed(middle[len(head) :]):
        if used_tail + _size(line) > budget - used:
            break
        tail.append(line)
        used_tail += _size(line)
    tail.reverse()
    left_out = len(middle) - len(head) - len(tail)
    if left_out <= 0:
        return tuple(lines), 0
    dropped_bytes = sum(_size(x) for x in middle[len(head) : len(middle) - len(tail)])
    marker = (
        f"{PREFIX}... {left_out} log lines ({dropped_bytes} bytes) are not kept in the run "
        f"history (history.max_log_bytes = {max_bytes})"
    )
    return (*first, *head, marker, *tail, *epilogue), left_out


def _epilogue_start(lines: Sequence[str]) -> int:
    """Index of the first epilogue line (the reason line and what follows it)."""
    for i in range(len(lines) - 1, 0, -1):
        line = lines[i]
        if line.startswith(PREFIX) and any(mark in line for mark in _REASON_MARKS):
            return i
    return len(lines)


def record_of(view: RunView, archived_at: datetime, max_log_bytes: int) -> RunRecord:
    """The record of a final view (its lines capped at ``max_log_bytes``)."""
    if not view.is_final or view.final_at is None or view.phase not in _STATUS:
        raise ValueError("only a final run is archived")
    info = view.info
    lines, not_kept = cap_lines(view.lines, max_log_bytes, _epilogue_start(view.lines))
    return RunRecord(
        mpijob=info.name,
        uid=info.uid,
        model_name=info.model_name,
        model_digest=info.model_digest,
        run_stamp=info.run_stamp,
        submit_stamp=info.submit_stamp,
        run_name=info.run_name,
        phase=view.phase,
        status=_STATUS[view.phase],
        reason=reason_line(view.lines),
        created=info.created,
        submitted=info.submitted,
        final_at=view.final_at,
        updated=view.updated,
        archived_at=archived_at,
        mpi_np=info.mpi_np,
        workers=info.workers,
        slots=info.slots,
        threads=info.threads,
        not_on_root=info.not_on_root,
        sub_values=info.sub_values,
        lines=lines,
        lines_not_kept=not_kept,
    )


def encode(record: RunRecord) -> bytes:
    """The record as gzip'd JSON (deterministic: no file name, no time in the gzip header)."""
    text = json.dumps(record.to_json(), ensure_ascii=False, separators=(",", ":"))
    return gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)


def decode(blob: bytes) -> RunRecord:
    """The inverse of :func:`encode`; :class:`RecordError` for anything else."""
    try:
        doc = json.loads(gzip.decompress(blob))
    except (OSError, EOFError, ValueError) as e:
        raise RecordError(f"not gzip'd JSON: {type(e).__name__}") from e
    return record_from_json(doc)


def fit(view: RunView, archived_at: datetime, max_log_bytes: int) -> tuple[RunRecord, bytes]:
    """The record of ``view`` and its encoding, cut until it is under :data:`MAX_RECORD_BYTES`."""
    budget = max_log_bytes
    while True:
        record = record_of(view, archived_at, budget)
        blob = encode(record)
        if len(blob) <= MAX_RECORD_BYTES or budget <= 4096:
            return record, blob
        budget = max(4096, int(budget * MAX_RECORD_BYTES / len(blob) * 0.9))


# --- the ConfigMap -------------------------------------------------------------------------------


def configmap_of(record: RunRecord, blob: bytes) -> Obj:
    """The run-record ConfigMap (no ownerReference: it must outlive the MPIJob)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": record_name(record.mpijob),
            "labels": {
                names.MANAGED_BY_KEY: names.MANAGED_BY_VALUE,
                COMPONENT_KEY: COMPONENT_VALUE,
                names.MODEL_DIGEST_KEY: names.label_value(record.model_digest),
                names.RUN_STAMP_KEY: names.label_value(record.run_stamp),
            },
            "annotations": {
                MPIJOB_KEY: record.mpijob,
                names.MODEL_NAME_KEY: record.model_name,
                names.MODEL_DIGEST_KEY: record.model_digest,
                names.RUN_STAMP_KEY: record.run_stamp,
                names.SUBMIT_STAMP_KEY: record.submit_stamp,
                names.SUBMITTED_AT_KEY: _iso(record.submitted),
                STATUS_KEY: record.status,
                FINAL_AT_KEY: _iso(record.final_at),
            },
        },
        "immutable": True,
        "binaryData": {DATA_KEY: base64.b64encode(blob).decode("ascii")},
    }


@dataclasses.dataclass(frozen=True)
class RecordEntry:
    """A run-record ConfigMap as the informer indexes it (the record itself still packed)."""

    name: str
    mpijob: str
    model_name: str
    model_digest: str
    run_stamp: str
    submit_stamp: str
    submitted: datetime
    status: str
    final_at: datetime
    blob: bytes
    resource_version: str

    def matches_model(self, model: str) -> bool:
        """``model`` (from a URL) names this run's model by digest or by name."""
        return bool(model) and model in (self.model_digest, self.model_name)


def entry_of(obj: Mapping[str, Any]) -> RecordEntry | None:
    """The entry of a run-record ConfigMap, or None if it is not a readable one."""
    if labels_of(obj).get(COMPONENT_KEY) != COMPONENT_VALUE:
        return None
    ann = annotations_of(obj)
    meta = object_meta(obj)
    binary = obj.get("binaryData") if isinstance(obj.get("binaryData"), Mapping) else {}
    assert isinstance(binary, Mapping)
    raw = binary.get(DATA_KEY)
    final_at = time_of(ann.get(FINAL_AT_KEY))
    submitted = time_of(ann.get(names.SUBMITTED_AT_KEY))
    run_stamp = ann.get(names.RUN_STAMP_KEY)
    if not isinstance(raw, str) or final_at is None or not run_stamp:
        return None
    try:
        blob = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None
    return RecordEntry(
        name=str(meta.get("name") or ""),
        mpijob=str(ann.get(MPIJOB_KEY) or ""),
        model_name=str(ann.get(names.MODEL_NAME_KEY) or ""),
        model_digest=str(ann.get(names.MODEL_DIGEST_KEY) or ""),
        run_stamp=str(run_stamp),
        submit_stamp=str(ann.get(names.SUBMIT_STAMP_KEY) or run_stamp),
        submitted=submitted or final_at,
        status=str(ann.get(STATUS_KEY) or ""),
        final_at=final_at,
        blob=blob,
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def expired(
    entries: Sequence[RecordEntry],
    now: datetime,
    *,
    retention_days: float,
    max_runs: int,
    max_total_bytes: int,
) -> list[RecordEntry]:
    """The entries to delete: past retention, then the oldest beyond the count and size caps."""
    by_age = sorted(entries, key=lambda e: (e.final_at, e.name))
    out: list[RecordEntry] = []
    keep: list[RecordEntry] = []
    for entry in by_age:
        too_old = retention_days > 0 and (now - entry.final_at).total_seconds() > (
            retention_days * 86400
        )
        (out if too_old else keep).append(entry)
    total = sum(len(e.blob) for e in keep)
    while keep and (len(keep) > max_runs or total > max_total_bytes):
        oldest = keep.pop(0)
        total -= len(oldest.blob)
        out.append(oldest)
    return out
