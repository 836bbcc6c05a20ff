"""What a launched run looks like to oms clients, computed from Kubernetes objects: pure.

:func:`compute_view` turns one MPIJob (or the tombstone of a deleted one), its pods, the Events
of the namespace, the launcher's log and the time into a :class:`RunView`: the phase, the oms
status letter, ``IsFinal`` and the run's log **lines**. No I/O and no clock: ``now`` is passed in.

The log lines are what the OpenM++ UI pages through by offset (it asks for ``start = lines it
already shows``), so they must only ever grow at the end, and every proxy replica (and a
restarted one) must produce the same lines. They are built from three parts:

1. **Prelude** (lines made by the proxy, prefixed with :data:`PREFIX`): one line describing the
   submission (from the MPIJob), then the MPIJob's ``Created``/``Suspended`` conditions and the
   Events of the MPIJob and its pods, sorted by (time, name). While the run waits, only events
   whose whole timestamp second ended ``settle_seconds`` before the Events were listed are shown,
   so late-listed events rarely land in the middle. Once the launcher container started (or the
   run ended without starting) the prelude is *frozen*: the events up to that moment. The first
   replica that can compute the frozen prelude records it in the MPIJob annotation
   :data:`PRELUDE_KEY`; from then on everybody renders it from there, even after the Events
   expired (Kubernetes keeps them for about an hour).
2. **Launcher log**: the launcher container's output, complete lines only, right-trimmed, empty
   lines skipped (as oms's ``readLogFile``). Shown only after the prelude is frozen.
3. **Epilogue** (proxy lines), only once the run is final: how it ended (Succeeded, Failed with
   reason and launcher exit code, deleted, or the start deadline with the reasons recorded in
   the annotation :data:`FINAL_MESSAGE_KEY`).

Kubernetes timestamps without a fraction (most of them) stand for their whole second.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

from proxy import names
from proxy.stamps import make_datetime

Obj = Mapping[str, Any]

PREFIX = "[oms-mpijob-proxy] "
"""Start of every line the proxy adds to a run's log (model output never has it)."""

FINAL_MESSAGE_KEY = "openmpp.org/final-message"
"""MPIJob annotation: JSON ``{"reason", "time", "deadlineSeconds", "details"}`` written once by
the replica that first saw the start deadline pass."""

PRELUDE_KEY = "openmpp.org/prelude"
"""MPIJob annotation: JSON list of the frozen prelude's event lines (without the first line)."""

DEADLINE_REASON = "StartDeadlineExceeded"

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"

Phase = Literal[
    "submitted", "queued", "pending", "running", "succeeded", "failed", "stopped", "deadline"
]
FINAL_PHASES: frozenset[str] = frozenset({"succeeded", "failed", "stopped", "deadline"})
_STATUS: dict[str, str] = {
    "submitted": "i",
    "queued": "i",
    "pending": "i",
    "running": "p",
    "succeeded": "s",
    "failed": "e",
    "deadline": "e",
    "stopped": "x",
}

MAX_PRELUDE_LINES = 100
MAX_LINE_CHARS = 1000
MAX_DETAILS = 12
_WAITING_NORMAL = frozenset({"ContainerCreating", "PodInitializing"})


# --- small helpers -----------------------------------------------------------------------------


def parse_time(value: Any) -> tuple[datetime, bool] | None:
    """An RFC 3339 Kubernetes time as (aware UTC datetime, has a fraction), or None."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    precise = False
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)\.(\d+)(.*)", text)
    if m:
        precise = True
        text = f"{m[1]}.{m[2][:6].ljust(6, '0')}{m[3]}"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC), precise


def _time(value: Any) -> datetime | None:
    parsed = parse_time(value)
    return parsed[0] if parsed else None


def _end(value: Any) -> datetime | None:
    """The latest moment a timestamp may stand for (a whole second unless it has a fraction)."""
    parsed = parse_time(value)
    if parsed is None:
        return None
    moment, precise = parsed
    return moment if precise else moment + timedelta(seconds=1)


def format_time(moment: datetime, tz: tzinfo | None = None) -> str:
    """``YYYY-MM-DD hh:mm:ss.SSS`` in local time (or ``tz``), as oms's ``UpdateDateTime``."""
    return make_datetime(moment.astimezone(tz).replace(tzinfo=None))


def _line_time(moment: datetime, tz: tzinfo | None) -> str:
    return format_time(moment, tz)[:19]


def _clean(text: Any) -> str:
    """One line of text: no line breaks, no trailing blanks, bounded length."""
    s = " ".join(str(text or "").split("\n")).replace("\r", " ").rstrip()
    return s if len(s) <= MAX_LINE_CHARS else s[: MAX_LINE_CHARS - 3] + "..."


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Obj) -> Mapping[str, str]:
    ann = _meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def _labels(obj: Obj) -> Mapping[str, str]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _conditions(job: Obj) -> list[Obj]:
    status = job.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conds or () if isinstance(c, Mapping)]


def condition(job: Obj, type_: str) -> Obj | None:
    """The MPIJob condition of ``type_``, if any."""
    for c in _conditions(job):
        if c.get("type") == type_:
            return c
    return None


def _is_true(job: Obj, type_: str) -> bool:
    c = condition(job, type_)
    return c is not None and c.get("status") == "True"


# --- the run's identity and shape ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """Who a run is and how it was asked for, read from its MPIJob."""

    name: str
    uid: str
    model_name: str
    model_digest: str
    run_stamp: str
    submit_stamp: str
    run_name: str
    created: datetime
    submitted: datetime
    """When the proxy submitted it (``openmpp.org/submitted-at``, ms precision), else created."""
    mpi_np: int
    """``mpirun -n``."""
    workers: int
    slots: int
    threads: int
    not_on_root: bool
    sub_values: int

    @property
    def process_count(self) -> int:
        """Modelling processes (oms ``Res.ProcessCount``)."""
        return max(1, self.mpi_np - 1) if self.not_on_root else max(1, self.mpi_np)

    @property
    def log_file_name(self) -> str:
        """``<Model>.<RunStamp>.console.log``, as oms names it."""
        return f"{self.model_name}.{self.run_stamp}.console.log"

    def matches_model(self, model: str) -> bool:
        """``model`` (from a URL) names this run's model by digest or by name."""
        return bool(model) and model in (self.model_digest, self.model_name)


def _launcher_argv(job: Obj) -> list[str]:
    spec = job.get("spec") if isinstance(job.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    try:
        container = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    except (KeyError, IndexError, TypeError):
        return []
    argv = [*(container.get("command") or ()), *(container.get("args") or ())]
    return [str(a) for a in argv]


def _opt(argv: Sequence[str], key: str) -> str | None:
    want = key.lower()
    for i, token in enumerate(argv[:-1]):
        if token.lower() in (want, "-" + want):
            return argv[i + 1]
    return None


def _int(value: Any, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def _submitted(value: Any) -> datetime | None:
    """``openmpp.org/submitted-at``: ISO 8601, local time when it has no offset."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (moment.astimezone() if moment.tzinfo is None else moment).astimezone(UTC)


def run_info(job: Obj) -> RunInfo | None:
    """The run an MPIJob carries, or None if it is not one of ours (annotations missing)."""
    ann = _annotations(job)
    meta = _meta(job)
    run_stamp = ann.get(names.RUN_STAMP_KEY)
    created = _time(meta.get("creationTimestamp"))
    if not run_stamp or created is None:
        return None
    spec = job.get("spec") if isinstance(job.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    replicas = (
        spec.get("mpiReplicaSpecs") if isinstance(spec.get("mpiReplicaSpecs"), Mapping) else {}
    )
    assert isinstance(replicas, Mapping)
    worker = replicas.get("Worker") if isinstance(replicas.get("Worker"), Mapping) else {}
    assert isinstance(worker, Mapping)
    workers = _int(worker.get("replicas"), 0)
    slots = _int(spec.get("slotsPerWorker"), 1)
    argv = _launcher_argv(job)
    np_text = _opt(argv, "-n") or _opt(argv, "-np")
    return RunInfo(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        model_name=str(ann.get(names.MODEL_NAME_KEY) or ""),
        model_digest=str(ann.get(names.MODEL_DIGEST_KEY) or ""),
        run_stamp=str(run_stamp),
        submit_stamp=str(ann.get(names.SUBMIT_STAMP_KEY) or run_stamp),
        run_name=_opt(argv, "-OpenM.RunName") or "",
        created=created,
        submitted=_submitted(ann.get(names.SUBMITTED_AT_KEY)) or created,
        mpi_np=_int(np_text, workers * slots) if np_text else workers * slots,
        workers=workers,
        slots=slots,
        threads=max(1, _int(_opt(argv, "-OpenM.Threads"), 1)),
        not_on_root=any(t.lower() == "-openm.notonroot" for t in argv),
        sub_values=max(1, _int(_opt(argv, "-OpenM.SubValues"), 1)),
    )


# --- the launcher --------------------------------------------------------------------------------


def is_launcher_of(pod: Obj, job_name: str) -> bool:
    """The pod is the launcher of MPIJob ``job_name`` (by the operator's labels)."""
    labels = _labels(pod)
    return labels.get(JOB_NAME_LABEL) == job_name and labels.get(JOB_ROLE_LABEL) == "launcher"


def first_launcher(pods: Iterable[Obj], job_name: str) -> Obj | None:
    """The earliest launcher pod of the job, by (creationTimestamp, name)."""
    launchers = [p for p in pods if is_launcher_of(p, job_name)]
    if not launchers:
        return None
    return min(
        launchers,
        key=lambda p: (str(_meta(p).get("creationTimestamp") or ""), str(_meta(p).get("name"))),
    )


@dataclasses.dataclass(frozen=True)
class LauncherState:
    """The launcher pod's first container, as far as its status tells."""

    pod: str
    container: str
    started_at: str | None
    """RFC 3339 ``startedAt`` of the container (running or terminated), if it ever started."""
    terminated: Obj | None
    """``state.terminated`` ({exitCode, reason, finishedAt, ...}) once it ended."""


def launcher_state(pod: Obj | None) -> LauncherState | None:
    """What the launcher's first container did; None without a launcher pod."""
    if pod is None:
        return None
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    containers = spec.get("containers") or []
    cname = str(containers[0].get("name") or "") if containers else ""
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    cstatus: Obj = {}
    for cs in status.get("containerStatuses") or ():
        if isinstance(cs, Mapping) and (cs.get("name") == cname or not cname):
            cstatus = cs
            break
    state = cstatus.get("state") if isinstance(cstatus.get("state"), Mapping) else {}
    assert isinstance(state, Mapping)
    last = cstatus.get("lastState") if isinstance(cstatus.get("lastState"), Mapping) else {}
    assert isinstance(last, Mapping)
    running = state.get("running") if isinstance(state.get("running"), Mapping) else None
    terminated = state.get("terminated") if isinstance(state.get("terminated"), Mapping) else None
    last_term = last.get("terminated") if isinstance(last.get("terminated"), Mapping) else None
    started = None
    for source in (last_term, running, terminated):
        if source is not None and source.get("startedAt"):
            started = str(source["startedAt"])
            break
    if started is None and terminated is not None:
        # Ended without a start time (e.g. failed to start): its end counts as its start.
        started = str(terminated.get("finishedAt") or "") or None
    return LauncherState(
        pod=str(_meta(pod).get("name") or ""),
        container=cname,
        started_at=started,
        terminated=terminated,
    )


_TS_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) ")


def _printable_strip(s: str) -> str:
    end = len(s)
    while end and (s[end - 1].isspace() or not s[end - 1].isprintable()):
        end -= 1
    return s[:end]


def _parse_raw(raw: str, timestamped: bool) -> tuple[str, datetime | None]:
    """One raw log line: (text as oms shows it, its timestamp)."""
    at: datetime | None = None
    if timestamped:
        m = _TS_PREFIX.match(raw)
        if m:
            raw, at = raw[m.end() :], _time(m[1])
    return _printable_strip(raw), at


@dataclasses.dataclass(frozen=True)
class LauncherLog:
    """The launcher container's output, as oms's ``readLogFile`` reads a log file.

    ``lines`` are the complete lines, right-trimmed, empty ones skipped; ``pending`` is a last
    line without its newline yet, shown only once the log is ``complete``.
    """

    lines: tuple[str, ...] = ()
    last_time: datetime | None = None
    """Timestamp of the last line (logs read with timestamps only)."""
    complete: bool = False
    """No more output will come: read after the container ended, or the pod is gone."""
    pending: str = ""

    @classmethod
    def parse(cls, text: str, *, timestamped: bool = False, complete: bool = False) -> LauncherLog:
        """A whole log as read (``kubectl logs [--timestamps]``)."""
        buf = LogBuffer(timestamped=timestamped)
        buf.add_full(text)
        return buf.snapshot(complete=complete)

    def finished(self) -> LauncherLog:
        """The same output, marked complete."""
        return dataclasses.replace(self, complete=True)


def log_lines(log: LauncherLog | None) -> tuple[tuple[str, ...], datetime | None]:
    """(model output lines, time of the last one) as shown for a log."""
    if log is None:
        return (), None
    if log.complete and log.pending:
        return (*log.lines, log.pending), log.last_time
    return log.lines, log.last_time


class LogBuffer:
    """The launcher log of one run, grown by whole or tail reads (no I/O here).

    A tail read (``tailLines``) is joined to what is known by finding the last few raw lines
    read before (timestamps make them unique) in it; when they are not there, more was written
    than the tail holds and :meth:`add_tail` asks for a whole read instead.
    """

    ANCHOR = 3

    def __init__(self, *, timestamped: bool = True) -> None:
        self.timestamped = timestamped
        self.lines: list[str] = []
        self.last_time: datetime | None = None
        self.pending = ""
        self._recent: list[str] = []  # the last raw complete lines, for joining tail reads
        self.reads = 0

    @property
    def empty(self) -> bool:
        """Nothing was read yet."""
        return self.reads == 0

    def _split(self, text: str) -> tuple[list[str], str]:
        parts = text.split("\n")
        tail = parts.pop()
        return parts, tail

    def _append(self, raws: list[str], tail: str) -> None:
        for raw in raws:
            line, at = _parse_raw(raw, self.timestamped)
            if at is not None:
                self.last_time = at
            if line:
                self.lines.append(line)
        self._recent = (self._recent + raws)[-self.ANCHOR :]
        self.pending = _parse_raw(tail, self.timestamped)[0]
        self.reads += 1

    def add_full(self, text: str) -> None:
        """A read of the whole log."""
        raws, tail = self._split(text)
        self.lines, self.last_time, self._recent = [], None, []
        self._append(raws, tail)

    def add_tail(self, text: str, tail_lines: int) -> bool:
        """A read of the last ``tail_lines`` lines; False if it does not join what is known."""
        raws, tail = self._split(text)
        if self._recent:
            n = len(self._recent)
            for i in range(len(raws) - n, -1, -1):
                if raws[i : i + n] == self._recent:
                    self._append(raws[i + n :], tail)
                    return True
            return False
        if len(raws) + (1 if tail else 0) < tail_lines:  # fewer than asked: the whole log
            self.add_full(text)
            return True
        return False

    def snapshot(self, *, complete: bool) -> LauncherLog:
        """What is known now, as a :class:`LauncherLog`."""
        return LauncherLog(tuple(self.lines), self.last_time, complete, self.pending)


# --- events and conditions -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EventsSnapshot:
    """The namespace's Events as listed at ``fetched_at`` (aware UTC)."""

    items: tuple[Obj, ...]
    fetched_at: datetime


def _belongs(event: Obj, info: RunInfo) -> bool:
    inv = event.get("involvedObject") if isinstance(event.get("involvedObject"), Mapping) else {}
    assert isinstance(inv, Mapping)
    name = str(inv.get("name") or "")
    kind = str(inv.get("kind") or "")
    if name == info.name:
        return kind != "MPIJob" or not inv.get("uid") or inv.get("uid") == info.uid
    return name.startswith((f"{info.name}-launcher", f"{info.name}-worker-"))


def _event_time(event: Obj) -> str:
    for key in ("eventTime", "firstTimestamp", "lastTimestamp"):
        if event.get(key):
            return str(event[key])
    return str(_meta(event).get("creationTimestamp") or "")


@dataclasses.dataclass(frozen=True)
class _Entry:
    at: datetime
    end: datetime
    key: str
    text: str


def _event_entries(events: Iterable[Obj], info: RunInfo, tz: tzinfo | None) -> list[_Entry]:
    created_second = info.created.replace(microsecond=0)
    out: list[_Entry] = []
    for ev in events:
        if not _belongs(ev, info):
            continue
        raw = _event_time(ev)
        at, end = _time(raw), _end(raw)
        if at is None or end is None or at < created_second:
            continue
        inv = ev.get("involvedObject") if isinstance(ev.get("involvedObject"), Mapping) else {}
        assert isinstance(inv, Mapping)
        text = _clean(
            f"{PREFIX}{_line_time(at, tz)} {ev.get('type') or 'Normal'} {ev.get('reason') or ''} "
            f"{inv.get('kind') or '?'}/{inv.get('name') or '?'}: {ev.get('message') or ''}"
        )
        out.append(_Entry(at, end, f"e:{_meta(ev).get('name') or ''}", text))
    return out


_CONDITION_TEXT = {
    ("Created", "True"): "MPIJob accepted by the MPI operator",
    ("Suspended", "True"): "queued: MPIJob suspended",
    ("Suspended", "False"): "resumed: MPIJob no longer suspended",
}


def _condition_entries(job: Obj, events: Iterable[Obj], tz: tzinfo | None) -> list[_Entry]:
    """``Created``/``Suspended`` transitions, unless the operator reported them as Events."""
    reported = {str(e.get("reason") or "") for e in events}
    out: list[_Entry] = []
    for c in _conditions(job):
        label = _CONDITION_TEXT.get((str(c.get("type")), str(c.get("status"))))
        raw = c.get("lastTransitionTime")
        at, end = _time(raw), _end(raw)
        if label is None or at is None or end is None or str(c.get("reason") or "") in reported:
            continue
        detail = f" ({c.get('reason')}: {c.get('message')})" if c.get("reason") else ""
        text = _clean(f"{PREFIX}{_line_time(at, tz)} {label}{detail}")
        out.append(_Entry(at, end, f"c:{c.get('type')}", text))
    return out


def _cap(lines: list[str]) -> list[str]:
    """At most :data:`MAX_PRELUDE_LINES` lines; the cut keeps the first ones (append-only)."""
    if len(lines) <= MAX_PRELUDE_LINES:
        return lines
    return [*lines[: MAX_PRELUDE_LINES - 1], f"{PREFIX}... more events not shown"]


def submission_line(info: RunInfo, tz: tzinfo | None = None) -> str:
    """The first line of every launched run's log."""
    workers = f"{info.workers} worker{'s' if info.workers != 1 else ''}"
    slots = f"{info.slots} slot{'s' if info.slots != 1 else ''}"
    threads = f"{info.threads} thread{'s' if info.threads != 1 else ''}"
    return _clean(
        f"{PREFIX}{_line_time(info.created, tz)} submitted as MPIJob {info.name}: model "
        f"{info.model_name} ({info.model_digest}), run stamp {info.run_stamp}, "
        f"{info.mpi_np} MPI processes on {workers} x {slots}, {threads} per process"
    )


# --- the start deadline --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FinalMessage:
    """Why a run was given up, as recorded in :data:`FINAL_MESSAGE_KEY`."""

    reason: str
    time: datetime
    deadline_seconds: float
    details: tuple[str, ...]

    def to_json(self) -> str:
        """The annotation value."""
        return json.dumps(
            {
                "reason": self.reason,
                "time": self.time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "deadlineSeconds": self.deadline_seconds,
                "details": list(self.details),
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> FinalMessage | None:
        """Parse the annotation value; None if it is not one."""
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        moment = _time(doc.get("time"))
        details = doc.get("details")
        if moment is None or not isinstance(details, list):
            return None
        try:
            seconds = float(doc.get("deadlineSeconds") or 0)
        except (TypeError, ValueError):
            seconds = 0.0
        return cls(
            reason=str(doc.get("reason") or DEADLINE_REASON),
            time=moment,
            deadline_seconds=seconds,
            details=tuple(_clean(d) for d in details if isinstance(d, str)),
        )


def _group(found: dict[str, list[str]], text: str, pod: str) -> None:
    found.setdefault(_clean(text), []).append(pod)


def stuck_reasons(job: Obj, pods: Sequence[Obj], events: Iterable[Obj]) -> tuple[str, ...]:
    """Why a run has not started: pod waiting states, scheduling failures, warning events."""
    info = run_info(job)
    out: list[str] = []
    if not _conditions(job):
        out.append("the MPI operator has not accepted the MPIJob (it has no status)")
    if _is_true(job, "Suspended"):
        out.append("the MPIJob is still queued (suspended)")
    found: dict[str, list[str]] = {}
    for pod in pods:
        pod_name = str(_meta(pod).get("name") or "?")
        status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
        assert isinstance(status, Mapping)
        for c in status.get("conditions") or ():
            if (
                isinstance(c, Mapping)
                and c.get("type") == "PodScheduled"
                and c.get("status") == "False"
            ):
                _group(
                    found,
                    f"{c.get('reason') or 'Unschedulable'}: {c.get('message') or ''}",
                    pod_name,
                )
        for cs in status.get("containerStatuses") or ():
            waiting = (cs.get("state") or {}).get("waiting") if isinstance(cs, Mapping) else None
            if isinstance(waiting, Mapping) and waiting.get("reason") not in _WAITING_NORMAL:
                _group(found, f"{waiting.get('reason')}: {waiting.get('message') or ''}", pod_name)
    for text, pod_names in found.items():
        shown = ", ".join(sorted(pod_names)[:3])
        more = f" and {len(pod_names) - 3} more" if len(pod_names) > 3 else ""
        out.append(f"{text.rstrip(': ')} (pod {shown}{more})")
    if not pods and _conditions(job) and not _is_true(job, "Suspended"):
        out.append("no pods were created")
    if info is not None:
        warnings = [
            e
            for e in events
            if _belongs(e, info) and e.get("type") == "Warning" and _time(_event_time(e))
        ]
        warnings.sort(key=lambda e: (_event_time(e), str(_meta(e).get("name") or "")))
        seen: set[str] = set()
        picked: list[str] = []
        for e in reversed(warnings):
            inv = e.get("involvedObject") or {}
            text = _clean(f"{e.get('reason')}: {e.get('message')}")
            if text in seen or any(text in o for o in out):
                continue
            seen.add(text)
            picked.append(f"{text} ({inv.get('kind')}/{inv.get('name')})")
            if len(picked) == 3:
                break
        out.extend(reversed(picked))
    if not out:
        out.append("no reason reported by Kubernetes")
    return tuple(_clean(o) for o in out[:MAX_DETAILS])


# --- the view ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ViewSettings:
    """Knobs of :func:`compute_view`."""

    start_deadline_seconds: float
    settle_seconds: float = 2.0
    tz: tzinfo | None = None
    """Time zone of times shown to people (None: the local one, as oms)."""


@dataclasses.dataclass(frozen=True)
class RunView:
    """A launched run as oms clients see it."""

    info: RunInfo
    phase: Phase
    is_final: bool
    status: str
    """oms run status letter: i (waiting), p, s, e (failed or start deadline), x (stopped)."""
    lines: tuple[str, ...]
    updated: datetime
    """The latest change known (from Kubernetes objects and the log's timestamps)."""
    final_at: datetime | None
    """When the run ended (for the retention of finished MPIJobs)."""
    launcher: LauncherState | None
    prelude_frozen: bool
    prelude_to_record: tuple[str, ...] | None
    """The frozen prelude, when it is known but not yet in :data:`PRELUDE_KEY`."""
    final_to_record: FinalMessage | None
    """The start deadline passed here and is not yet in :data:`FINAL_MESSAGE_KEY`."""
    needs_events: datetime | None
    """Events listed at or after this time are needed to freeze the prelude (None: not needed)."""
    events_live: bool
    """The run waits to start: its prelude shows the Events as they come (refresh them)."""
    wants_log: bool
    """The launcher's log is needed (it started, and the log is not complete yet)."""


def _recorded_prelude(job: Obj) -> tuple[str, ...] | None:
    raw = _annotations(job).get(PRELUDE_KEY)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, list):
        return None
    return tuple(_clean(x) for x in doc if isinstance(x, str))


def recorded_final(job: Obj) -> FinalMessage | None:
    """The final message a replica recorded on the MPIJob, if any."""
    raw = _annotations(job).get(FINAL_MESSAGE_KEY)
    return FinalMessage.from_json(raw) if raw else None


def _phase(
    job: Obj,
    deleted: bool,
    launcher: LauncherState | None,
    recorded: FinalMessage | None,
    deadline_passed: bool,
) -> Phase:
    if recorded is not None:
        return "deadline"
    if _is_true(job, "Succeeded"):
        return "succeeded"
    if _is_true(job, "Failed"):
        return "failed"
    if deleted or _meta(job).get("deletionTimestamp"):
        return "stopped"
    started = launcher is not None and launcher.started_at is not None
    if started or _is_true(job, "Running"):
        return "running"
    if deadline_passed:
        return "deadline"
    if _is_true(job, "Suspended"):
        return "queued"
    if _conditions(job):
        return "pending"
    return "submitted"


def _final_time(
    job: Obj,
    phase: str,
    info: RunInfo,
    recorded: FinalMessage | None,
    deleted_at: datetime | None,
    deadline: float,
) -> datetime | None:
    if phase == "deadline":
        return recorded.time if recorded else info.created + timedelta(seconds=deadline)
    if phase in ("succeeded", "failed"):
        c = condition(job, "Succeeded" if phase == "succeeded" else "Failed")
        status = job.get("status") if isinstance(job.get("status"), Mapping) else {}
        assert isinstance(status, Mapping)
        return (
            _time(c.get("lastTransitionTime") if c else None)
            or _time(status.get("completionTime"))
            or info.created
        )
    if phase == "stopped":
        return _time(_meta(job).get("deletionTimestamp")) or deleted_at or info.created
    return None


def _epilogue(
    job: Obj,
    phase: str,
    final_at: datetime,
    launcher: LauncherState | None,
    recorded: FinalMessage | None,
    tz: tzinfo | None,
    deadline: float,
    reasons: tuple[str, ...],
) -> list[str]:
    when = _line_time(final_at, tz)
    name = _meta(job).get("name")
    out: list[str] = []
    exit_line = ""
    if launcher is not None and launcher.terminated is not None:
        t = launcher.terminated
        exit_line = (
            f"{PREFIX}launcher exit code {t.get('exitCode')} ({t.get('reason') or 'no reason'})"
        )
    if phase == "succeeded":
        out.append(f"{PREFIX}{when} run succeeded: MPIJob {name} completed")
    elif phase == "failed":
        c = condition(job, "Failed") or {}
        out.append(
            f"{PREFIX}{when} run failed: {c.get('reason') or 'Failed'}: {c.get('message') or ''}"
        )
    elif phase == "stopped":
        out.append(f"{PREFIX}{when} run stopped: MPIJob {name} deleted")
    else:
        seconds = recorded.deadline_seconds if recorded and recorded.deadline_seconds else deadline
        details = recorded.details if recorded else reasons
        out.append(f"{PREFIX}{when} run failed: it did not start within {seconds:g} s:")
        out.extend(f"{PREFIX}  {d}" for d in details)
        exit_line = ""
    if exit_line:
        out.append(exit_line)
    return [_clean(x) for x in out]


def compute_view(
    job: Obj,
    *,
    pods: Sequence[Obj] = (),
    launcher_pod: Obj | None = None,
    events: EventsSnapshot | None = None,
    log: LauncherLog | None = None,
    deleted_at: datetime | None = None,
    now: datetime,
    settings: ViewSettings,
) -> RunView | None:
    """The view of the run in MPIJob ``job`` (None if ``job`` is not a launched run).

    ``pods`` are the job's current pods; ``launcher_pod`` the launcher to follow (default: the
    earliest in ``pods``); ``deleted_at`` is set for a tombstone (the MPIJob is gone).
    """
    info = run_info(job)
    if info is None:
        return None
    tz = settings.tz
    deadline = settings.start_deadline_seconds
    if launcher_pod is None:
        launcher_pod = first_launcher(pods, info.name)
    launcher = launcher_state(launcher_pod)
    started = launcher is not None and launcher.started_at is not None
    recorded = recorded_final(job)
    deleted = deleted_at is not None
    running_cond = condition(job, "Running")
    # Running=False/MPIJobSuspended is also set on jobs that were only ever queued.
    ever_running = running_cond is not None and (
        running_cond.get("status") == "True" or running_cond.get("reason") != "MPIJobSuspended"
    )
    deadline_passed = (
        now - info.created > timedelta(seconds=deadline) and not started and not ever_running
    )
    phase = _phase(job, deleted, launcher, recorded, deadline_passed)
    final = phase in FINAL_PHASES
    final_at = _final_time(job, phase, info, recorded, deleted_at, deadline) if final else None
    event_items = events.items if events is not None else ()

    # When the prelude freezes: the launcher's start, else the end of the run.
    freeze_raw: str | None = None
    if started and phase != "deadline" and launcher is not None:
        freeze_raw = launcher.started_at
    elif final and final_at is not None:
        freeze_raw = final_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    freeze_at, freeze_end = _time(freeze_raw), _end(freeze_raw)

    recorded_prelude = _recorded_prelude(job)
    prelude_to_record: tuple[str, ...] | None = None
    needs_events: datetime | None = None
    if recorded_prelude is not None:
        event_lines = list(recorded_prelude)
        frozen = True
    else:
        entries: list[_Entry] = []
        if events is not None:
            entries = _event_entries(event_items, info, tz) + _condition_entries(
                job, event_items, tz
            )
        settle = timedelta(seconds=settings.settle_seconds)
        if freeze_at is not None and freeze_end is not None:
            ready_at = freeze_end + settle
            frozen = events is not None and events.fetched_at >= ready_at
            cutoff = freeze_end if frozen else (events.fetched_at - settle if events else None)
            if not frozen:
                needs_events = ready_at
        else:
            frozen = False
            cutoff = events.fetched_at - settle if events else None
        chosen = [e for e in entries if cutoff is not None and e.end <= cutoff]
        chosen.sort(key=lambda e: (e.at, e.key))
        event_lines = _cap([e.text for e in chosen])
        if frozen:
            prelude_to_record = tuple(event_lines)

    lines: list[str] = [submission_line(info, tz), *event_lines]
    model_lines: tuple[str, ...] = ()
    last_log: datetime | None = None
    log_complete = log is not None and log.complete
    if started and phase != "deadline":
        model_lines, last_log = log_lines(log)
    wants_log = started and phase != "deadline" and not log_complete
    if frozen:
        lines.extend(model_lines)

    final_to_record: FinalMessage | None = None
    reasons: tuple[str, ...] = ()
    if phase == "deadline" and recorded is None and final_at is not None:
        reasons = stuck_reasons(job, pods, event_items)
        final_to_record = FinalMessage(DEADLINE_REASON, final_at, deadline, reasons)

    is_final = final and frozen and (not started or phase == "deadline" or log_complete)
    if is_final and final_at is not None:
        lines.extend(_epilogue(job, phase, final_at, launcher, recorded, tz, deadline, reasons))

    updated = _latest_change(job, info, launcher, last_log, final_at)
    return RunView(
        info=info,
        phase=phase,
        is_final=is_final,
        status=_STATUS[phase],
        lines=tuple(lines),
        updated=updated,
        final_at=final_at,
        launcher=launcher,
        prelude_frozen=frozen,
        prelude_to_record=prelude_to_record,
        final_to_record=final_to_record,
        needs_events=needs_events,
        events_live=recorded_prelude is None and freeze_at is None,
        wants_log=wants_log,
    )


def _latest_change(
    job: Obj,
    info: RunInfo,
    launcher: LauncherState | None,
    last_log: datetime | None,
    final_at: datetime | None,
) -> datetime:
    moments: list[datetime | None] = [info.created, last_log, final_at]
    for c in _conditions(job):
        moments.append(_time(c.get("lastTransitionTime")))
    if launcher is not None:
        moments.append(_time(launcher.started_at))
        if launcher.terminated is not None:
            moments.append(_time(launcher.terminated.get("finishedAt")))
    return max(m for m in moments if m is not None)


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


def run_state(view: RunView, tz: tzinfo | None = None) -> dict[str, Any]:
    """oms ``RunState`` (all 10 keys) of a launched run."""
    info = view.info
    return {
        "ModelName": info.model_name,
        "ModelDigest": info.model_digest,
        "RunStamp": info.run_stamp,
        "SubmitStamp": info.submit_stamp,
        "IsFinal": view.is_final,
        "UpdateDateTime": format_time(view.updated, tz),
        "RunName": info.run_name,
        "TaskRunName": "",
        "IsLog": True,
        "LogFileName": info.log_file_name,
    }


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


def run_job(view: RunView) -> dict[str, Any]:
    """oms ``RunJob`` (an active job on the service-state page) of a launched run."""
    info = view.info
    threads = info.threads
    processes = info.process_count
    return {
        "SubmitStamp": info.submit_stamp,
        "Pid": 0,
        "CmdPath": "",
        "CmdLine": "",
        "ModelName": info.model_name,
        "ModelDigest": info.model_digest,
        "RunStamp": info.run_stamp,
        "Dir": "",
        "Opts": {},
        "Env": {},
        "Threads": threads,
        "IsMpi": True,
        "Mpi": {"Np": info.mpi_np, "IsNotOnRoot": info.not_on_root, "IsNotByJob": True},
        "Template": "",
        "Tables": [],
        "Microdata": {"IsToDb": False, "IsInternal": False, "Entity": []},
        "RunNotes": [],
        "Res": {
            "Cpu": processes * threads,
            "Mem": 0,
            "ProcessCount": processes,
            "ThreadCount": threads,
            "ProcessMemMb": 0,
            "ThreadMemMb": 0,
        },
        "IsOverLimit": False,
        "QueuePos": 0,
        "LogFileName": info.log_file_name,
        "LogPath": "",
        "BinDir": "",
        "WorkDir": "",
        "IniPath": "",
        "HostFilePath": "",
    }
