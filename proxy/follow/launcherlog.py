"""The launcher pod and its log (pure): which pod is the launcher, its state, its log lines.

The launcher's output (mpirun's and the model's) is read by the run cache in pieces; a
:class:`LogBuffer` joins the pieces (whole reads and tails) so that lines only ever get appended.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from datetime import datetime

from proxy.follow.runinfo import Obj, labels_of, object_meta, time_of

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"


# --- the launcher --------------------------------------------------------------------------------


def is_launcher_of(pod: Obj, job_name: str) -> bool:
    """The pod is the launcher of MPIJob ``job_name`` (by the operator's labels)."""
    labels = labels_of(pod)
    return labels.get(JOB_NAME_LABEL) == job_name and labels.get(JOB_ROLE_LABEL) == "launcher"


def first_launcher(pods: Iterable[Obj], job_name: str) -> Obj | None:
    """The earliest launcher pod of the job, by (creationTimestamp, name)."""
    launchers = [p for p in pods if is_launcher_of(p, job_name)]
    if not launchers:
        return None
    return min(
        launchers,
        key=lambda p: (
            str(object_meta(p).get("creationTimestamp") or ""),
            str(object_meta(p).get("name")),
        ),
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
        pod=str(object_meta(pod).get("name") or ""),
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
            raw, at = raw[m.end() :], time_of(m[1])
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
    cut: bool = False
    """Complete because the pod went before its container ended: the rest was never read."""

    @classmethod
    def parse(cls, text: str, *, timestamped: bool = False, complete: bool = False) -> LauncherLog:
        """A whole log as read (``kubectl logs [--timestamps]``)."""
        buf = LogBuffer(timestamped=timestamped)
        buf.add_full(text)
        return buf.snapshot(complete=complete)

    def finished(self, *, cut: bool = False) -> LauncherLog:
        """The same output, marked complete (``cut``: the pod went, nothing more can be read)."""
        return dataclasses.replace(self, complete=True, cut=cut)


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
