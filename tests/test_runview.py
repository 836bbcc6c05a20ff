"""proxy.follow.view: phases, status letters, log lines (append-only, deterministic), oms shapes."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from proxy import names
from proxy.follow.launcherlog import LauncherLog, LogBuffer, log_lines
from proxy.follow.omsshapes import PagingError, lines_page, log_page, parse_go_int, run_job, run_pub
from proxy.follow.runinfo import format_time, parse_time, run_info
from proxy.follow.view import (
    FINAL_MESSAGE_KEY,
    PREFIX,
    PRELUDE_KEY,
    EventsSnapshot,
    FinalMessage,
    RunView,
    ViewSettings,
    compute_view,
    stuck_reasons,
)
from tests.oms_shapes import PROGRESS_KEYS, RUN_STATE_KEYS

T0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
SETTINGS = ViewSettings(start_deadline_seconds=60.0, settle_seconds=2.0, tz=UTC)
NAME = "ompp-modelone-1a2b3c4d"
STAMP = "2026_01_01_10_00_00_000"


def ts(seconds: float) -> str:
    """A Kubernetes timestamp ``seconds`` after T0 (whole seconds, as most of them are)."""
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def make_job(
    *,
    conditions: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    deletion: str | None = None,
    rv: str = "10",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": NAME,
        "namespace": "default",
        "uid": "uid-1",
        "resourceVersion": rv,
        "creationTimestamp": ts(0),
        "labels": {
            names.MANAGED_BY_KEY: names.MANAGED_BY_VALUE,
            names.RUN_STAMP_KEY: STAMP,
            names.SUBMIT_STAMP_KEY: "2026_01_01_09_59_59_999",
        },
        "annotations": {
            names.MODEL_NAME_KEY: "modelOne",
            names.MODEL_DIGEST_KEY: "_201208171604590148_",
            names.RUN_STAMP_KEY: STAMP,
            names.SUBMIT_STAMP_KEY: "2026_01_01_09_59_59_999",
            **(annotations or {}),
        },
    }
    if deletion:
        meta["deletionTimestamp"] = deletion
    argv = ["mpirun", "-n", "3", "--hostfile", "/etc/mpi/hostfile", "/m/modelOne_mpi"]
    argv += ["-OpenM.RunStamp", STAMP, "-OpenM.RunName", "hello", "-OpenM.SubValues", "4"]
    argv += ["-OpenM.Threads", "2", "-OpenM.NotOnRoot"]
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": meta,
        "spec": {
            "slotsPerWorker": 1,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {"spec": {"containers": [{"name": "launcher", "command": argv}]}},
                },
                "Worker": {
                    "replicas": 3,
                    "template": {"spec": {"containers": [{"name": "worker"}]}},
                },
            },
        },
        "status": {"conditions": conditions or []},
    }


def cond(
    type_: str, status: str, seconds: float, reason: str = "", message: str = ""
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason or f"MPIJob{type_}",
        "message": message or f"{type_} {status}",
        "lastTransitionTime": ts(seconds),
        "lastUpdateTime": ts(seconds),
    }


def launcher(
    *, started: float | None = None, exit_code: int | None = None, ended: float = 0
) -> dict[str, Any]:
    state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
    if started is not None and exit_code is None:
        state = {"running": {"startedAt": ts(started)}}
    if started is not None and exit_code is not None:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": ts(started),
                "finishedAt": ts(ended),
            }
        }
    return {
        "metadata": {
            "name": f"{NAME}-launcher-abcde",
            "creationTimestamp": ts(1),
            "labels": {
                "training.kubeflow.org/job-name": NAME,
                "training.kubeflow.org/job-role": "launcher",
            },
        },
        "spec": {"containers": [{"name": "launcher"}]},
        "status": {"containerStatuses": [{"name": "launcher", "state": state}]},
    }


def worker(i: int, *, waiting: str | None = None, unschedulable: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending", "conditions": [], "containerStatuses": []}
    if unschedulable:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu.",
            }
        ]
    if waiting:
        status["containerStatuses"] = [
            {"name": "worker", "state": {"waiting": {"reason": waiting, "message": "Back-off"}}}
        ]
    return {
        "metadata": {
            "name": f"{NAME}-worker-{i}",
            "labels": {
                "training.kubeflow.org/job-name": NAME,
                "training.kubeflow.org/job-role": "worker",
            },
        },
        "status": status,
    }


def event(
    n: int,
    seconds: float,
    reason: str,
    obj: str = NAME,
    kind: str = "MPIJob",
    type_: str = "Normal",
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{obj}.{n:04d}"},
        "involvedObject": {"kind": kind, "name": obj, "uid": "uid-1" if kind == "MPIJob" else ""},
        "reason": reason,
        "message": f"{reason} happened",
        "type": type_,
        "firstTimestamp": ts(seconds),
        "lastTimestamp": ts(seconds),
    }


def snapshot(events: list[dict[str, Any]], fetched: float) -> EventsSnapshot:
    return EventsSnapshot(tuple(events), at(fetched))


def log_text(lines: list[tuple[float, str]], partial: str = "") -> str:
    out = "".join(
        f"{(T0 + timedelta(seconds=s)).strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {text}\n"
        for s, text in lines
    )
    return out + partial


def view(job: dict[str, Any], now: float, **kw: Any) -> RunView:
    v = compute_view(job, now=at(now), settings=SETTINGS, **kw)
    assert v is not None
    return v


# --- identity ------------------------------------------------------------------------------------


def test_run_info_reads_the_mpijob() -> None:
    info = run_info(make_job())
    assert info is not None
    assert (info.model_name, info.model_digest, info.run_stamp) == (
        "modelOne",
        "_201208171604590148_",
        STAMP,
    )
    assert info.submit_stamp == "2026_01_01_09_59_59_999"
    assert (info.run_name, info.mpi_np, info.workers, info.slots) == ("hello", 3, 3, 1)
    assert (info.threads, info.not_on_root, info.sub_values, info.process_count) == (2, True, 4, 2)
    assert info.log_file_name == f"modelOne.{STAMP}.console.log"
    assert info.matches_model("modelOne")
    assert info.matches_model("_201208171604590148_")
    assert not info.matches_model("RiskPaths")


def test_a_job_without_our_annotations_is_not_a_run() -> None:
    job = make_job()
    del job["metadata"]["annotations"][names.RUN_STAMP_KEY]
    assert run_info(job) is None
    assert compute_view(job, now=at(1), settings=SETTINGS) is None


# --- phases and status letters -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conditions", "pods", "deleted", "now", "phase", "status"),
    [
        ([], [], False, 1, "submitted", "i"),
        ([cond("Created", "True", 0)], [], False, 1, "pending", "i"),
        ([cond("Created", "True", 0), cond("Suspended", "True", 0)], [], False, 1, "queued", "i"),
        ([cond("Created", "True", 0)], [launcher(started=3)], False, 5, "running", "p"),
        (
            [cond("Created", "True", 0), cond("Succeeded", "True", 9)],
            [launcher(started=3, exit_code=0, ended=8)],
            False,
            10,
            "succeeded",
            "s",
        ),
        (
            [cond("Created", "True", 0), cond("Failed", "True", 9, "BackoffLimitExceeded")],
            [launcher(started=3, exit_code=3, ended=8)],
            False,
            10,
            "failed",
            "e",
        ),
        ([cond("Created", "True", 0)], [launcher(started=3)], True, 10, "stopped", "x"),
        (
            [cond("Created", "True", 0)],
            [worker(0, waiting="ImagePullBackOff")],
            False,
            61,
            "deadline",
            "e",
        ),
        # Time spent queued (suspended, not admitted) does not count towards the deadline ...
        (
            [cond("Created", "True", 0), cond("Suspended", "True", 0)],
            [],
            False,
            610,
            "queued",
            "i",
        ),
        # ... it counts from the admission (Suspended turning False).
        (
            [cond("Created", "True", 0), cond("Suspended", "False", 30)],
            [],
            False,
            85,
            "pending",
            "i",
        ),
        (
            [cond("Created", "True", 0), cond("Suspended", "False", 30)],
            [],
            False,
            91,
            "deadline",
            "e",
        ),
    ],
)
def test_phase_and_status(
    conditions: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    deleted: bool,
    now: float,
    phase: str,
    status: str,
) -> None:
    job = make_job(conditions=conditions)
    v = view(job, now, pods=pods, deleted_at=at(now) if deleted else None)
    assert (v.phase, v.status) == (phase, status)


def test_deletion_timestamp_means_stopped_but_a_success_stays_a_success() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)], deletion=ts(7))
    assert view(job, 8).phase == "stopped"
    done = make_job(
        conditions=[cond("Created", "True", 0), cond("Succeeded", "True", 6)], deletion=ts(7)
    )
    assert view(done, 8, deleted_at=at(8)).phase == "succeeded"


def test_a_recorded_deadline_wins_everywhere() -> None:
    final = FinalMessage("StartDeadlineExceeded", at(60), 60.0, ("ImagePullBackOff: x (pod p)",))
    job = make_job(
        conditions=[cond("Created", "True", 0)], annotations={FINAL_MESSAGE_KEY: final.to_json()}
    )
    v = view(job, 30, pods=[launcher(started=29)], events=snapshot([], 64))
    assert v.phase == "deadline"
    assert v.final_to_record is None


def test_running_once_means_no_start_deadline() -> None:
    job = make_job(conditions=[cond("Created", "True", 0), cond("Running", "True", 5)])
    assert view(job, 600).phase == "running"


# --- the log lines -------------------------------------------------------------------------------


def test_waiting_run_shows_settled_events_and_no_log() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    evs = [
        event(1, 0, "MPIJobCreated"),
        event(2, 2, "FailedScheduling", f"{NAME}-worker-0", "Pod", "Warning"),
    ]
    v = view(job, 4, pods=[worker(0, unschedulable=True)], events=snapshot(evs, 4))
    # Fetched at 4 s, settle 2 s: the event of second 2 (ends at 3) is not settled yet.
    assert len(v.lines) == 2
    assert v.lines[0].startswith(f"{PREFIX}2026-01-01 10:00:00 submitted as MPIJob {NAME}")
    assert "MPIJobCreated" in v.lines[1]
    assert not v.is_final
    assert v.events_live
    assert not v.prelude_frozen
    later = view(job, 6, pods=[worker(0, unschedulable=True)], events=snapshot(evs, 6))
    assert later.lines[:2] == v.lines
    assert "FailedScheduling" in later.lines[2]


def test_the_created_condition_shows_when_the_operator_sends_no_event() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    v = view(job, 4, events=snapshot([], 4))
    assert v.lines[1].endswith("MPIJob accepted by the MPI operator (MPIJobCreated: Created True)")


def test_log_lines_follow_a_frozen_prelude() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    pods = [launcher(started=3)]
    evs = [event(1, 0, "MPIJobCreated"), event(2, 3, "Started", f"{NAME}-launcher-abcde", "Pod")]
    log = LauncherLog.parse(log_text([(3.5, "hello"), (3.6, "world")]), timestamped=True)
    early = view(job, 4, pods=pods, events=snapshot(evs, 4), log=log)
    # Started at second 3: the prelude freezes once Events are listed after 3+1+2 = 6 s.
    assert not early.prelude_frozen
    assert early.needs_events == at(6)
    assert "hello" not in early.lines
    assert early.wants_log
    frozen = view(job, 6, pods=pods, events=snapshot(evs, 6), log=log)
    assert frozen.prelude_frozen
    assert frozen.prelude_to_record is not None
    assert list(frozen.lines[-2:]) == ["hello", "world"]
    assert frozen.lines[1:-2] == frozen.prelude_to_record
    assert frozen.updated == at(3.6)  # the log's last timestamp


def test_the_recorded_prelude_is_used_without_events() -> None:
    prelude = [f"{PREFIX}recorded line"]
    job = make_job(
        conditions=[cond("Created", "True", 0)], annotations={PRELUDE_KEY: json.dumps(prelude)}
    )
    log = LauncherLog.parse(log_text([(3.5, "hello")]), timestamped=True)
    v = view(job, 5, pods=[launcher(started=3)], log=log)
    assert v.lines[1:] == (f"{PREFIX}recorded line", "hello")
    assert v.prelude_frozen
    assert v.prelude_to_record is None
    assert v.needs_events is None


def test_succeeded_run_ends_with_an_epilogue_once_the_log_is_complete() -> None:
    job = make_job(conditions=[cond("Created", "True", 0), cond("Succeeded", "True", 9)])
    pods = [launcher(started=3, exit_code=0, ended=8)]
    text = log_text([(4, "a"), (5, "b")], partial="c")
    open_log = view(
        job, 12, pods=pods, events=snapshot([], 12), log=LauncherLog.parse(text, timestamped=True)
    )
    assert not open_log.is_final
    assert open_log.lines[-2:] == ("a", "b")
    done = view(
        job,
        12,
        pods=pods,
        events=snapshot([], 12),
        log=LauncherLog.parse(text, timestamped=True, complete=True),
    )
    assert done.is_final
    assert done.status == "s"
    assert done.lines[-5:-2] == ("a", "b", "c")
    assert done.lines[-2].endswith(f"run succeeded: MPIJob {NAME} completed")
    assert done.lines[-1] == f"{PREFIX}launcher exit code 0 (Completed)"
    assert done.final_at == at(9)


def test_failed_run_says_why() -> None:
    job = make_job(
        conditions=[
            cond("Created", "True", 0),
            cond("Failed", "True", 9, "BackoffLimitExceeded", "Job has reached the limit"),
        ]
    )
    pods = [launcher(started=3, exit_code=3, ended=8)]
    v = view(job, 12, pods=pods, events=snapshot([], 12), log=LauncherLog(complete=True))
    assert v.is_final
    assert v.status == "e"
    assert v.lines[-2].endswith("run failed: BackoffLimitExceeded: Job has reached the limit")
    assert v.lines[-1] == f"{PREFIX}launcher exit code 3 (Error)"


def test_start_deadline_explains_and_asks_to_be_recorded() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    pods = [worker(0, waiting="ImagePullBackOff"), worker(1, waiting="ImagePullBackOff")]
    evs = [event(1, 5, "Failed", f"{NAME}-worker-0", "Pod", "Warning")]
    v = view(job, 61, pods=pods, events=snapshot(evs, 61))
    assert v.phase == "deadline"
    assert not v.is_final
    v = view(job, 64, pods=pods, events=snapshot(evs, 64))
    assert v.is_final
    assert v.final_to_record is not None
    assert v.prelude_to_record is not None
    assert (
        v.final_to_record.details[0]
        == f"ImagePullBackOff: Back-off (pod {NAME}-worker-0, {NAME}-worker-1)"
    )
    assert "did not start within 60 s" in v.lines[-1 - len(v.final_to_record.details)]
    # Another replica renders the same from the annotations alone.
    recorded = make_job(
        conditions=[cond("Created", "True", 0)],
        annotations={
            FINAL_MESSAGE_KEY: v.final_to_record.to_json(),
            PRELUDE_KEY: json.dumps(list(v.prelude_to_record)),
        },
    )
    other = view(recorded, 500, pods=[], events=None)
    assert other.lines == v.lines
    assert other.is_final
    assert other.updated == v.updated


def test_unschedulable_reasons() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    reasons = stuck_reasons(job, [worker(0, unschedulable=True)], [])
    assert reasons == (
        f"Unschedulable: 0/3 nodes are available: 3 Insufficient cpu. (pod {NAME}-worker-0)",
    )
    assert stuck_reasons(make_job(), [], [])[0].startswith("the MPI operator has not accepted")


def test_stopped_before_start() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    v = view(job, 20, deleted_at=at(10), events=snapshot([event(1, 0, "MPIJobCreated")], 20))
    assert v.is_final
    assert v.status == "x"
    assert v.lines[-1].endswith(f"run stopped: MPIJob {NAME} deleted")


def test_lines_are_append_only_and_deterministic_over_a_run() -> None:
    """Replay a run as a sequence of observations; every answer extends the previous one."""
    rng = random.Random(7)  # noqa: S311 - a reproducible shuffle
    evs_all = [
        event(1, 0, "MPIJobCreated"),
        event(2, 1, "Scheduled", f"{NAME}-launcher-abcde", "Pod"),
        event(3, 1, "Scheduled", f"{NAME}-worker-0", "Pod"),
        event(4, 2, "Pulling", f"{NAME}-worker-0", "Pod"),
        event(5, 3, "Started", f"{NAME}-launcher-abcde", "Pod"),
        event(6, 9, "MPIJobSucceeded"),
    ]
    log_all = [(3.1 + i * 0.5, f"line {i}") for i in range(10)]
    previous: tuple[str, ...] = ()
    for step in range(0, 30):
        now = step * 0.5
        conditions = [cond("Created", "True", 0)]
        pods = [launcher()]
        if now >= 3:
            pods = [launcher(started=3)]
        if now >= 9:
            pods = [launcher(started=3, exit_code=0, ended=8)]
            conditions.append(cond("Succeeded", "True", 9))
        visible = [e for e in evs_all if parse_time(e["firstTimestamp"])[0] <= at(now)]  # type: ignore[index]
        rng.shuffle(visible)  # the order of a list answer must not matter
        lines = [x for x in log_all if x[0] <= now]
        log = (
            LauncherLog.parse(log_text(lines), timestamped=True, complete=now >= 9.5)
            if now >= 3
            else None
        )
        v = view(
            make_job(conditions=conditions), now, pods=pods, events=snapshot(visible, now), log=log
        )
        assert v.lines[: len(previous)] == previous, f"not append-only at {now} s"
        previous = v.lines
    assert v.is_final
    assert [x for x in v.lines if not x.startswith(PREFIX)] == [t for _, t in log_all]


def test_log_buffer_joins_tail_reads() -> None:
    full = log_text([(1 + i * 0.1, f"l{i}") for i in range(10)])
    buf = LogBuffer(timestamped=True)
    assert not buf.add_tail(full, 5)  # the first read must see everything
    assert buf.empty
    buf.add_full(full)
    more = log_text([(1 + i * 0.1, f"l{i}") for i in range(6, 14)])  # overlaps l6..l9
    assert buf.add_tail(more, 8)
    assert buf.lines == [f"l{i}" for i in range(14)]
    gap = log_text([(3 + i * 0.1, f"m{i}") for i in range(8)])  # l14.. were never seen
    assert not buf.add_tail(gap, 8)
    assert buf.lines == [f"l{i}" for i in range(14)]
    partial = log_text([(1 + i * 0.1, f"l{i}") for i in range(7, 14)], partial="tail")
    assert buf.add_tail(partial, 8)
    assert buf.snapshot(complete=False).lines[-1] == "l13"
    assert log_lines(buf.snapshot(complete=True))[0][-1] == "tail"
    assert buf.last_time == at(2.3)


# --- log parsing and paging ----------------------------------------------------------------------


def test_log_lines_like_oms_read_log_file() -> None:
    text = "one  \r\n\n  two\t\nthree"
    assert log_lines(LauncherLog.parse(text)) == (("one", "  two"), None)
    assert log_lines(LauncherLog.parse(text, complete=True))[0] == ("one", "  two", "three")
    stamped = "2026-01-01T10:00:01.5Z first\n2026-01-01T10:00:02.25Z second\n"
    lines, last = log_lines(LauncherLog.parse(stamped, timestamped=True))
    assert lines == ("first", "second")
    assert last == at(2.25)


@pytest.mark.parametrize(
    ("start", "count", "expected"),
    [
        (0, 0, (0, 5, ["a", "b", "c", "d", "e"])),
        (1, 2, (1, 2, ["b", "c"])),
        (3, 200, (3, 2, ["d", "e"])),
        (5, 200, (5, 0, [])),
        (9, 0, (9, 0, [])),
        (-4, 1, (0, 1, ["a"])),
        (2, -1, (2, 3, ["c", "d", "e"])),
    ],
)
def test_lines_page_is_getlinespage(
    start: int, count: int, expected: tuple[int, int, list[str]]
) -> None:
    assert lines_page(start, count, ["a", "b", "c", "d", "e"]) == expected


def test_lines_page_of_nothing() -> None:
    assert lines_page(7, 3, []) == (0, 0, [])


@pytest.mark.parametrize("text", ["", "x", "1.5", "0x10", " 1", str(2**63)])
def test_parse_go_int_refuses_what_atoi_refuses(text: str) -> None:
    with pytest.raises(PagingError):
        parse_go_int(text)


def test_parse_go_int() -> None:
    assert (parse_go_int("+12"), parse_go_int("-3"), parse_go_int("007")) == (12, -3, 7)


# --- oms shapes ----------------------------------------------------------------------------------


def test_log_page_has_what_the_ui_requires() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    page = log_page(view(job, 4, events=snapshot([], 4)), 0, 200, UTC)
    assert all(k in page for k in [*RUN_STATE_KEYS, "Offset", "Size", "TotalSize", "Lines"])
    assert page["UpdateDateTime"] == "2026-01-01 10:00:00.000"
    assert page["LogFileName"] == f"modelOne.{STAMP}.console.log"
    assert (page["RunName"], page["IsLog"], page["TaskRunName"]) == ("hello", True, "")


def test_run_pub_has_every_key_the_ui_checks() -> None:
    job = make_job(conditions=[cond("Created", "True", 0)])
    item = run_pub(view(job, 4), UTC)
    assert all(k in item for k in PROGRESS_KEYS)
    assert item["Progress"] == []
    assert (item["Status"], item["SubCount"], item["Name"]) == ("i", 4, "hello")
    assert item["CreateDateTime"] == "2026-01-01 10:00:00.000"
    for key in ("SubStarted", "Txt", "Opts", "Param", "Table", "Entity"):
        assert key in item


def test_run_job_passes_the_ui_is_run_job_check() -> None:
    job = run_job(view(make_job(conditions=[cond("Created", "True", 0)]), 4))
    for key in ("SubmitStamp", "ModelName", "ModelDigest", "RunStamp", "Opts", "Template"):
        assert isinstance(job[key], str | dict)
    assert isinstance(job["Threads"], int)
    assert job["IsMpi"] is True
    assert job["Mpi"] == {"Np": 3, "IsNotOnRoot": True, "IsNotByJob": False}  # as oms's own
    assert job["Res"] == {
        "Cpu": 4,
        "Mem": 0,
        "ProcessCount": 2,
        "ThreadCount": 2,
        "ProcessMemMb": 0,
        "ThreadMemMb": 0,
    }
    assert job["Microdata"] == {"IsToDb": False, "IsInternal": False, "Entity": []}
    assert (job["IsOverLimit"], job["QueuePos"], job["Tables"], job["RunNotes"]) == (
        False,
        0,
        [],
        [],
    )
    assert job["LogFileName"] == f"modelOne.{STAMP}.console.log"


def test_final_message_round_trip() -> None:
    msg = FinalMessage("StartDeadlineExceeded", at(60.25), 60.0, ("a", "b\nc"))
    back = FinalMessage.from_json(msg.to_json())
    assert back == FinalMessage("StartDeadlineExceeded", at(60.25), 60.0, ("a", "b c"))
    assert FinalMessage.from_json("not json") is None


def test_format_time_is_oms_update_date_time() -> None:
    assert format_time(at(1.2345), UTC) == "2026-01-01 10:00:01.234"
