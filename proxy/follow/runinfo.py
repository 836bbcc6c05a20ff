"""A launched run's identity read from its MPIJob (pure): model, stamps, size, times.

Kubernetes timestamps without a fraction (most of them) stand for their whole second.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from proxy import names, runstate
from proxy.stamps import make_datetime

Obj = Mapping[str, Any]

MAX_LINE_CHARS = 1000
"""Longest log line the proxy writes (a longer Event message or reason is cut)."""


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


def time_of(value: Any) -> datetime | None:
    parsed = parse_time(value)
    return parsed[0] if parsed else None


def end_time_of(value: Any) -> datetime | None:
    """The latest moment a timestamp may stand for (a whole second unless it has a fraction)."""
    parsed = parse_time(value)
    if parsed is None:
        return None
    moment, precise = parsed
    return moment if precise else moment + timedelta(seconds=1)


def format_time(moment: datetime, tz: tzinfo | None = None) -> str:
    """``YYYY-MM-DD hh:mm:ss.SSS`` in local time (or ``tz``), as oms's ``UpdateDateTime``."""
    return make_datetime(moment.astimezone(tz).replace(tzinfo=None))


def line_time(moment: datetime, tz: tzinfo | None) -> str:
    return format_time(moment, tz)[:19]


def clean_text(text: Any) -> str:
    """One line of text: no line breaks, no trailing blanks, bounded length."""
    s = " ".join(str(text or "").split("\n")).replace("\r", " ").rstrip()
    return s if len(s) <= MAX_LINE_CHARS else s[: MAX_LINE_CHARS - 3] + "..."


def object_meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def resource_version(obj: Obj) -> str:
    """``metadata.resourceVersion`` of a Kubernetes object ('' when it has none)."""
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def annotations_of(obj: Obj) -> Mapping[str, str]:
    ann = object_meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def labels_of(obj: Obj) -> Mapping[str, str]:
    labels = object_meta(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def conditions_of(job: Obj) -> list[Obj]:
    status = job.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conds or () if isinstance(c, Mapping)]


def condition(job: Obj, type_: str) -> Obj | None:
    """The MPIJob condition of ``type_``, if any."""
    for c in conditions_of(job):
        if c.get("type") == type_:
            return c
    return None


def condition_true(job: Obj, type_: str) -> bool:
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
    opts: dict[str, str] = dataclasses.field(default_factory=dict)
    """The run options as the request gave them to the model (``-Key value`` in the argv)."""
    process_mem_mb: int = 0
    """Memory requested per MPI process in MiB (the worker's request / slots), 0 if unknown."""

    @property
    def process_count(self) -> int:
        """Modelling processes (oms ``Res.ProcessCount``)."""
        return max(1, self.mpi_np - 1) if self.not_on_root else max(1, self.mpi_np)

    @property
    def log_file_name(self) -> str:
        """``<Model>.<RunStamp>.console.log``, as oms names it."""
        return runstate.log_file_name(self.model_name, self.run_stamp)

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


# Options the proxy adds to every model argv itself, as oms does (not the request's Opts).
_OWN_OPTS = frozenset(
    {"openm.runstamp", "openm.logtoconsole", "openm.logtofile", "openm.threads", "ini"}
)
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?")
_UNIT: dict[str, float] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3}
_UNIT |= {"M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}


def _model_opts(argv: Sequence[str]) -> dict[str, str]:
    """The ``-Key value`` pairs after the model executable, without the proxy's own."""
    exe = next((i for i, t in enumerate(argv) if t.endswith("_mpi") or t.endswith("/mpi")), -1)
    out: dict[str, str] = {}
    i = exe + 1 if exe >= 0 else len(argv)
    while i < len(argv):
        token = argv[i]
        key = token[1:] if token.startswith("-") else token
        if key.lower() == "openm.notonroot":  # a bare flag
            i += 1
            continue
        if i + 1 < len(argv) and key.lower() not in _OWN_OPTS:
            out[key] = argv[i + 1]
        i += 2
    return out


def _memory_mb(value: Any) -> int:
    """A Kubernetes memory quantity in MiB (rounded up), 0 if it is not one."""
    m = _QUANTITY.fullmatch(str(value or ""))
    if m is None:
        return 0
    return math.ceil(float(m[1]) * _UNIT.get(m[2] or "", 1) / 2**20)


def _process_mem_mb(worker: Obj, slots: int) -> int:
    try:
        container = worker["template"]["spec"]["containers"][0]
        memory = container["resources"]["requests"]["memory"]
    except (KeyError, IndexError, TypeError):
        return 0
    return math.ceil(_memory_mb(memory) / max(1, slots))


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
    ann = annotations_of(job)
    meta = object_meta(job)
    run_stamp = ann.get(names.RUN_STAMP_KEY)
    created = time_of(meta.get("creationTimestamp"))
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
        opts=_model_opts(argv),
        process_mem_mb=_process_mem_mb(worker, slots),
    )
