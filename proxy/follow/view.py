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
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal

from proxy.follow.launcherlog import (
    LauncherLog,
    LauncherState,
    first_launcher,
    launcher_state,
    log_lines,
)
from proxy.follow.runinfo import (
    Obj,
    RunInfo,
    annotations_of,
    clean_text,
    condition,
    condition_true,
    conditions_of,
    end_time_of,
    line_time,
    object_meta,
    run_info,
    time_of,
)
from proxy.names import KUEUE_QUEUE_NAME_KEY

PREFIX = "[oms-mpijob-proxy] "
"""Start of every line the proxy adds to a run's log (model output never has it)."""

FINAL_MESSAGE_KEY = "openmpp.org/final-message"
"""MPIJob annotation: JSON ``{"reason", "time", "deadlineSeconds", "details"}`` written once by
the replica that first saw the start deadline pass."""

PRELUDE_KEY = "openmpp.org/prelude"
"""MPIJob annotation: JSON list of the frozen prelude's event lines (without the first line)."""

DEADLINE_REASON = "StartDeadlineExceeded"

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
MAX_DETAILS = 12
_WAITING_NORMAL = frozenset({"ContainerCreating", "PodInitializing"})


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
    return str(object_meta(event).get("creationTimestamp") or "")


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
        at, end = time_of(raw), end_time_of(raw)
        if at is None or end is None or at < created_second:
            continue
        inv = ev.get("involvedObject") if isinstance(ev.get("involvedObject"), Mapping) else {}
        assert isinstance(inv, Mapping)
        text = clean_text(
            f"{PREFIX}{line_time(at, tz)} {ev.get('type') or 'Normal'} {ev.get('reason') or ''} "
            f"{inv.get('kind') or '?'}/{inv.get('name') or '?'}: {ev.get('message') or ''}"
        )
        out.append(_Entry(at, end, f"e:{object_meta(ev).get('name') or ''}", text))
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
    for c in conditions_of(job):
        label = _CONDITION_TEXT.get((str(c.get("type")), str(c.get("status"))))
        raw = c.get("lastTransitionTime")
        at, end = time_of(raw), end_time_of(raw)
        if label is None or at is None or end is None or str(c.get("reason") or "") in reported:
            continue
        detail = f" ({c.get('reason')}: {c.get('message')})" if c.get("reason") else ""
        text = clean_text(f"{PREFIX}{line_time(at, tz)} {label}{detail}")
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
    return clean_text(
        f"{PREFIX}{line_time(info.created, tz)} submitted as MPIJob {info.name}: model "
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
        moment = time_of(doc.get("time"))
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
            details=tuple(clean_text(d) for d in details if isinstance(d, str)),
        )


def _group(found: dict[str, list[str]], text: str, pod: str) -> None:
    found.setdefault(clean_text(text), []).append(pod)


def stuck_reasons(job: Obj, pods: Sequence[Obj], events: Iterable[Obj]) -> tuple[str, ...]:
    """Why a run has not started: pod waiting states, scheduling failures, warning events."""
    info = run_info(job)
    out: list[str] = []
    if not conditions_of(job):
        out.append("the MPI operator has not accepted the MPIJob (it has no status)")
    if condition_true(job, "Suspended"):
        out.append("the MPIJob is still queued (suspended)")
    found: dict[str, list[str]] = {}
    for pod in pods:
        pod_name = str(object_meta(pod).get("name") or "?")
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
    if not pods and conditions_of(job) and not condition_true(job, "Suspended"):
        out.append("no pods were created")
    if info is not None:
        warnings = [
            e
            for e in events
            if _belongs(e, info) and e.get("type") == "Warning" and time_of(_event_time(e))
        ]
        warnings.sort(key=lambda e: (_event_time(e), str(object_meta(e).get("name") or "")))
        seen: set[str] = set()
        picked: list[str] = []
        for e in reversed(warnings):
            inv = e.get("involvedObject") or {}
            text = clean_text(f"{e.get('reason')}: {e.get('message')}")
            if text in seen or any(text in o for o in out):
                continue
            seen.add(text)
            picked.append(f"{text} ({inv.get('kind')}/{inv.get('name')})")
            if len(picked) == 3:
                break
        out.extend(reversed(picked))
    if not out:
        out.append("no reason reported by Kubernetes")
    return tuple(clean_text(o) for o in out[:MAX_DETAILS])


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
    raw = annotations_of(job).get(PRELUDE_KEY)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, list):
        return None
    return tuple(clean_text(x) for x in doc if isinstance(x, str))


def recorded_final(job: Obj) -> FinalMessage | None:
    """The final message a replica recorded on the MPIJob, if any."""
    raw = annotations_of(job).get(FINAL_MESSAGE_KEY)
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
    if condition_true(job, "Succeeded"):
        return "succeeded"
    if condition_true(job, "Failed"):
        return "failed"
    if deleted or object_meta(job).get("deletionTimestamp"):
        return "stopped"
    started = launcher is not None and launcher.started_at is not None
    if started or condition_true(job, "Running"):
        return "running"
    if deadline_passed:
        return "deadline"
    if is_queued(job):
        return "queued"
    if conditions_of(job):
        return "pending"
    return "submitted"


def is_queued(job: Obj) -> bool:
    """The MPIJob waits for admission: suspended (e.g. by Kueue), never resumed yet."""
    run_policy = (job.get("spec") or {}).get("runPolicy") or {}
    suspended = condition(job, "Suspended")
    if suspended is not None and suspended.get("status") == "False":
        return False  # it was resumed (admitted)
    return bool(run_policy.get("suspend")) or condition_true(job, "Suspended")


def deadline_start(job: Obj) -> datetime | None:
    """From when ``runs.start_deadline_seconds`` counts: the creation, or the admission (the
    Suspended condition turning False) of a job that was queued; None while it is queued."""
    if is_queued(job):
        return None
    suspended = condition(job, "Suspended")
    resumed = time_of(suspended.get("lastTransitionTime")) if suspended is not None else None
    created = time_of(object_meta(job).get("creationTimestamp"))
    moments = [m for m in (resumed, created) if m is not None]
    return max(moments) if moments else None


def queue_name(job: Obj) -> str:
    """The Kueue LocalQueue the MPIJob is labelled for ('' if none)."""
    labels = object_meta(job).get("labels")
    value = labels.get(KUEUE_QUEUE_NAME_KEY) if isinstance(labels, Mapping) else None
    return str(value or "")


def _final_time(
    job: Obj,
    phase: str,
    since: datetime,
    recorded: FinalMessage | None,
    deleted_at: datetime | None,
    deadline: float,
) -> datetime | None:
    if phase == "deadline":
        return recorded.time if recorded else since + timedelta(seconds=deadline)
    if phase in ("succeeded", "failed"):
        c = condition(job, "Succeeded" if phase == "succeeded" else "Failed")
        status = job.get("status") if isinstance(job.get("status"), Mapping) else {}
        assert isinstance(status, Mapping)
        return (
            time_of(c.get("lastTransitionTime") if c else None)
            or time_of(status.get("completionTime"))
            or since
        )
    if phase == "stopped":
        return time_of(object_meta(job).get("deletionTimestamp")) or deleted_at or since
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
    when = line_time(final_at, tz)
    name = object_meta(job).get("name")
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
    return [clean_text(x) for x in out]


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
    prelude: tuple[str, ...] | None = None,
    final_message: FinalMessage | None = None,
    unreadable: Sequence[str] = (),
) -> RunView | None:
    """The view of the run in MPIJob ``job`` (None if ``job`` is not a launched run).

    ``pods`` are the job's current pods; ``launcher_pod`` the launcher to follow (default: the
    earliest in ``pods``); ``deleted_at`` is set for a tombstone (the MPIJob is gone).
    ``prelude`` and ``final_message`` are what this replica froze itself and has not seen
    recorded on the MPIJob yet (a recording can fail or be slow): they are shown as if
    recorded, so a page never changes once shown, and are still offered for recording.
    ``unreadable`` says what could not be read from the Kubernetes API and why; the lines say
    it in one line of their own (until it can be read again).
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
    recorded_here = recorded_final(job)
    recorded = recorded_here or final_message
    deleted = deleted_at is not None
    running_cond = condition(job, "Running")
    # Running=False/MPIJobSuspended is also set on jobs that were only ever queued.
    ever_running = running_cond is not None and (
        running_cond.get("status") == "True" or running_cond.get("reason") != "MPIJobSuspended"
    )
    since = deadline_start(job)
    deadline_passed = (
        since is not None
        and now - since > timedelta(seconds=deadline)
        and not started
        and not ever_running
    )
    phase = _phase(job, deleted, launcher, recorded, deadline_passed)
    final = phase in FINAL_PHASES
    final_at = (
        _final_time(job, phase, since or info.created, recorded, deleted_at, deadline)
        if final
        else None
    )
    event_items = events.items if events is not None else ()

    # When the prelude freezes: the launcher's start, else the end of the run.
    freeze_raw: str | None = None
    if started and phase != "deadline" and launcher is not None:
        freeze_raw = launcher.started_at
    elif final and final_at is not None:
        freeze_raw = final_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    freeze_at, freeze_end = time_of(freeze_raw), end_time_of(freeze_raw)

    recorded_prelude = _recorded_prelude(job)
    prelude_to_record: tuple[str, ...] | None = None
    needs_events: datetime | None = None
    if recorded_prelude is not None:
        event_lines = list(recorded_prelude)
        frozen = True
    elif prelude is not None:
        event_lines = list(prelude)
        frozen = True
        prelude_to_record = prelude
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

    lines: list[str] = [submission_line(info, tz)]
    queue = queue_name(job)
    if queue:
        lines.append(
            clean_text(
                f"{PREFIX}{line_time(info.created, tz)} queued: waits for admission by Kueue "
                f"(LocalQueue {queue}); the run starts once Kueue admits it"
            )
        )
    lines.extend(event_lines)
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
    elif recorded_here is None and final_message is not None:
        final_to_record = final_message

    is_final = final and frozen and (not started or phase == "deadline" or log_complete)
    if unreadable:
        lines.append(clean_text(f"{PREFIX}could not read {'; '.join(unreadable)}"))
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
        events_live=recorded_prelude is None and prelude is None and freeze_at is None,
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
    for c in conditions_of(job):
        moments.append(time_of(c.get("lastTransitionTime")))
    if launcher is not None:
        moments.append(time_of(launcher.started_at))
        if launcher.terminated is not None:
            moments.append(time_of(launcher.terminated.get("finishedAt")))
    return max(m for m in moments if m is not None)
