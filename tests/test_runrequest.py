"""Parsing ``POST /api/run`` like oms (Go encoding/json), the checks, stamps and ini values."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import RunsConfig
from proxy.configload import config_from_dict
from proxy.stamps import (
    StampSource,
    clean_file_name,
    clean_file_path,
    is_stamp,
    make_datetime,
    make_stamp,
)
from proxy.submit.decode import (
    MicrodataEntity,
    MicrodataRequest,
    ModelInfo,
    MpiOptions,
    RunNote,
    RunRequest,
    RunRequestError,
    parse_run_request,
)
from proxy.submit.validate import (
    MicrodataSettings,
    ValidatedRun,
    choose_run_stamp,
    ini_quote,
    ini_read_value,
    is_mpi,
    validate_run,
)

REQUESTS = Path(__file__).resolve().parent / "requests"
MODEL = ModelInfo(name="RiskPaths", digest="d90e1e9a49a06d972ecf1d50e684c62b")
DN = "Model start failed: d90e1e9a49a06d972ecf1d50e684c62b"


def runs(**values: Any) -> RunsConfig:
    return config_from_dict({"runs": values}, "<test>").runs


def parse(body: str | bytes) -> RunRequest:
    return parse_run_request(body.encode() if isinstance(body, str) else body)


def error(body: str | bytes) -> str:
    with pytest.raises(RunRequestError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value.message


def check(body: dict[str, Any], config: RunsConfig | None = None) -> ValidatedRun:
    req = parse(json.dumps({"ModelDigest": MODEL.digest, **body}))
    return validate_run(req, MODEL, config or runs())


def refusal(body: dict[str, Any], config: RunsConfig | None = None) -> str:
    with pytest.raises(RunRequestError) as info:
        check(body, config)
    assert info.value.status == 400
    assert info.value.message.startswith(DN + ": ")
    return info.value.message[len(DN) + 2 :]


# --- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b" ", b"\n\t\r\n "])
def test_empty_body(body: bytes) -> None:
    assert error(body) == "Invalid (empty) json at /api/run"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("{", "Expecting property name enclosed in double quotes at line 1 column 2"),
        ('{"ModelName": "a"', "Expecting ',' delimiter at line 1 column 18"),
        ("{'ModelName': 'a'}", "Expecting property name"),
        ('\ufeff{"ModelName": "a"}', "Expecting value at line 1 column 1"),
        ('{"Threads": NaN}', "invalid value NaN"),
        ('{"Threads": Infinity}', "invalid value Infinity"),
        ('{"ModelName": "a\x01"}', "Invalid control character"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        # Wrong types, with the field's path:
        ("[]", "expected a JSON object, got an array"),
        ('"RiskPaths"', 'expected a JSON object, got "RiskPaths"'),
        ("42", "expected a JSON object, got 42"),
        ("true", "expected a JSON object, got true"),
        ('{"Mpi": {"Np": "x"}}', 'Mpi.Np: expected an integer, got "x"'),
        ('{"Mpi": {"Np": 1.5}}', "Mpi.Np: expected an integer, got 1.5"),
        ('{"Mpi": {"Np": 1e2}}', "Mpi.Np: expected an integer, got 1e2"),
        ('{"Mpi": {"Np": 2.0}}', "Mpi.Np: expected an integer, got 2.0"),
        ('{"Mpi": {"Np": true}}', "Mpi.Np: expected an integer, got true"),
        ('{"Mpi": 4}', "Mpi: expected an object, got 4"),
        ('{"Mpi": {"IsNotOnRoot": "true"}}', 'Mpi.IsNotOnRoot: expected true or false, got "true"'),
        ('{"Mpi": {"IsNotOnRoot": 1}}', "Mpi.IsNotOnRoot: expected true or false, got 1"),
        ('{"Threads": 9223372036854775808}', "Threads: number 9223372036854775808 does not fit"),
        ('{"Threads": -9223372036854775809}', "does not fit a 64-bit integer"),
        ('{"Threads": ' + "9" * 5000 + "}", "does not fit a 64-bit integer"),
        ('{"Threads": "4"}', 'Threads: expected an integer, got "4"'),
        ('{"IsMpi": "yes"}', 'IsMpi: expected true or false, got "yes"'),
        ('{"ModelName": 7}', "ModelName: expected a string, got 7"),
        ('{"Opts": {"OpenM.Threads": 4}}', 'Opts["OpenM.Threads"]: expected a string, got 4'),
        ('{"Opts": {"A": true}}', 'Opts["A"]: expected a string, got true'),
        ('{"Opts": {"A": ["x"]}}', 'Opts["A"]: expected a string, got an array'),
        ('{"Opts": []}', "Opts: expected an object, got an array"),
        ('{"Env": {"TZ": {}}}', 'Env["TZ"]: expected a string, got an object'),
        ('{"Tables": "T01"}', 'Tables: expected an array, got "T01"'),
        ('{"Tables": ["T01", 2]}', "Tables[1]: expected a string, got 2"),
        ('{"RunNotes": [{"LangCode": 1}]}', "RunNotes[0].LangCode: expected a string, got 1"),
        ('{"Microdata": {"Entity": [{"Attr": [null, 3]}]}}', "Microdata.Entity[0].Attr[1]"),
        ('{"Template": ' + "1" * 100 + "}", "Template: expected a string, got 1111"),
        ('{"Template": [' + json.dumps("x" * 100) + "]}", "Template: expected a string, got an"),
    ],
)
def test_malformed_bodies_say_what_is_wrong(body: str, detail: str) -> None:
    message = error(body)
    assert message.startswith("Json decode error at /api/run: ")
    assert detail in message


def test_long_values_are_cut_in_messages() -> None:
    message = error('{"Threads": "' + "x" * 500 + '"}')
    assert len(message) < 120


def test_the_whole_oms_request_shape() -> None:
    req = parse((REQUESTS / "ini-settings.json").read_bytes())
    assert req == RunRequest(
        model_digest="d90e1e9a49a06d972ecf1d50e684c62b",
        dir="",
        opts={
            "OpenM.RunName": "Two tables and microdata",
            "OpenM.MessageLanguage": "fr",
            "OpenM.Threads": "1",
            "EN.RunDescription": 'Retain two tables; keep "Person" microdata',
            "FR.RunDescription": "Deux tableaux, microdonnées",
        },
        threads=1,
        is_mpi=True,
        mpi=MpiOptions(np=2, is_not_on_root=False, is_not_by_job=True),
        template="mpi.ModelRun.template.txt",
        tables=("T01_LifeExpectancy", "T02_TotalPopulationByYear"),
        microdata=MicrodataRequest(
            is_to_db=True,
            is_internal=True,
            entity=(MicrodataEntity("Person", ("age", "union_status")),),
        ),
        run_notes=(
            RunNote("EN", "# Notes\n\nTwo *tables*, `Person` microdata.\n"),
            RunNote("FR", "Notes en français"),
        ),
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Keys match case-insensitively; unknown keys are ignored.
        (
            '{"modelname": "a", "MODELDIGEST": "d", "threads": 3}',
            {"model_name": "a", "model_digest": "d", "threads": 3},
        ),
        ('{"mPi": {"np": 2, "isnotonroot": true}}', {"mpi": MpiOptions(2, True, False)}),
        ('{"Unknown": {"deep": [1, 2]}, "ModelName": "a"}', {"model_name": "a"}),
        ('{"Model_Name": "a", "Model Name": "b"}', {}),
        # Go folds U+017F (long s) to S and U+212A (Kelvin) to K.
        ('{"Table\u017f": ["T"]}', {"tables": ("T",)}),
        ('{"\u212aeep": 1, "ModelName": "a"}', {"model_name": "a"}),
        ('{"Ta\u212ables": ["T"]}', {}),
        # Duplicates: the last one wins; maps and structs are merged; lists element by element.
        ('{"ModelName": "a", "modelname": "b"}', {"model_name": "b"}),
        ('{"Threads": 3, "Threads": 5}', {"threads": 5}),
        ('{"Mpi": {"Np": 2}, "mpi": {"IsNotOnRoot": true}}', {"mpi": MpiOptions(2, True)}),
        ('{"Opts": {"a": "1", "b": "2"}, "opts": {"b": "3"}}', {"opts": {"a": "1", "b": "3"}}),
        ('{"Opts": {"a": "1", "a": "2"}}', {"opts": {"a": "2"}}),
        ('{"Tables": ["a", "b"], "Tables": ["c"]}', {"tables": ("c",)}),
        (
            '{"RunNotes": [{"LangCode": "EN", "Note": "x"}], "RunNotes": [{"Note": "y"}, {}]}',
            {"run_notes": (RunNote("EN", "y"), RunNote())},
        ),
        # null: no change for scalars and structs, empty for maps and lists, "" in a map.
        ('{"Threads": null}', {}),
        ('{"Threads": 3, "Threads": null}', {"threads": 3}),
        ('{"Mpi": null, "Microdata": null, "ModelName": null}', {}),
        ('{"Opts": {"a": "1"}, "Opts": null}', {"opts": {}}),
        ('{"Opts": {"a": null}}', {"opts": {"a": ""}}),
        ('{"Tables": ["a"], "Tables": null}', {"tables": ()}),
        ('{"Tables": [null, "b"]}', {"tables": ("", "b")}),
        ('{"RunNotes": [null]}', {"run_notes": (RunNote(),)}),
        ("null", {}),
        ("{}", {}),
        # Numbers: -0 is 0, negatives are kept (oms clamps Np later).
        ('{"Mpi": {"Np": -0}}', {}),
        ('{"Mpi": {"Np": -3}}', {"mpi": MpiOptions(np=-3)}),
        ('{"Threads": 9223372036854775807}', {"threads": 9223372036854775807}),
        # Only the first JSON value counts (json.Decoder); text after it is ignored.
        ('{"ModelName": "a"} trailing', {"model_name": "a"}),
        ('{"ModelName": "a"}{"ModelName": "b"}', {"model_name": "a"}),
        # Lone surrogates and invalid UTF-8 become U+FFFD, as in Go.
        ('{"ModelName": "\\ud800x"}', {"model_name": "\ufffdx"}),
        (b'{"ModelName": "a\xffb"}', {"model_name": "a\ufffdb"}),
        ('{"ModelName": "\\ud83d\\ude00"}', {"model_name": "\U0001f600"}),
    ],
)
def test_parsing_like_go(body: str | bytes, expected: dict[str, Any]) -> None:
    assert parse(body) == dataclasses.replace(RunRequest(), **expected)


# --- the exact bodies real clients send (shared/reference/oms-api.md §2, §5) ------------------


def test_ui_mpi_request() -> None:
    req = parse((REQUESTS / "ui-mpi.json").read_bytes())
    assert is_mpi(req)
    run = validate_run(req, MODEL, runs())
    assert (run.np, run.process_count, run.mpi_np, run.not_on_root) == (4, 3, 4, True)
    assert run.threads == 2
    assert run.template == "mpi.ModelRun.template.txt"
    assert run.run_name == "RiskPaths on 4 processes"
    assert run.descriptions == (("EN", "Four processes; the root one only coordinates"),)
    assert run.model_opts == (
        ("-OpenM.LogRank", "true"),
        ("-OpenM.MessageLanguage", "en"),
        ("-OpenM.RunName", "RiskPaths on 4 processes"),
        ("-OpenM.SubValues", "8"),
    )
    assert run.microdata is None
    assert choose_run_stamp(req, datetime(2025, 1, 2, 3, 4, 5, 6000)) == "2025_01_02_03_04_05_006"


def test_r_script_request() -> None:
    req = parse((REQUESTS / "r-script.json").read_bytes())
    assert not req.is_mpi
    assert req.mpi.np == 5
    assert is_mpi(req)  # Np > 0 makes it an MPI run
    config = runs()
    run = validate_run(req, MODEL, config)
    assert (run.np, run.process_count, run.mpi_np, run.threads) == (5, 4, 5, 4)
    assert choose_run_stamp(req, datetime(2030, 1, 1)) == "2025_01_28_21_00_48_385"
    assert [k for k, _ in run.model_opts] == [
        "-OpenM.BaseRunDigest",
        "-OpenM.ProgressPercent",
        "-OpenM.SubValues",
        "-OpenM.TaskName",
        "-Parameter.SimulationCases",
    ]
    # Without OpenM.TaskName in the allow-list, it is refused by name.
    strict = runs(allowed_opts=["OpenM.SubValues"], allowed_opts_patterns=[])
    with pytest.raises(RunRequestError, match=r'Opts\["OpenM.TaskName"\]: this run option'):
        validate_run(req, MODEL, strict)


def test_python_script_request() -> None:
    req = parse((REQUESTS / "python-script.json").read_bytes())
    assert req.model_name == "NewCaseBased"
    assert req.model_digest == ""
    assert not is_mpi(req)
    model = ModelInfo("NewCaseBased", "649f17f26d67c37b78dde94f79772445")
    run = validate_run(req, model, runs())
    assert (run.is_mpi, run.np, run.mpi_np, run.not_on_root, run.threads) == (False, 0, 1, False, 4)
    strict = runs(allowed_opts_patterns=[])
    with pytest.raises(
        RunRequestError,
        match=r'^Model start failed: NewCaseBased: Opts\["Parameter.MortalityHazard"\]: this',
    ):
        validate_run(req, model, strict)


def test_mattwarkentin_request() -> None:
    req = parse((REQUESTS / "mattwarkentin.json").read_bytes())
    assert req.run_stamp == req.opts["OpenM.RunStamp"] == "2025_01_28_21_00_48_385"
    # OpenM.LogToConsole is one of the options oms drops: not an allow-list matter.
    run = validate_run(req, MODEL, runs())
    assert ("-OpenM.LogToConsole", "true") not in run.model_opts
    assert [k for k, _ in run.model_opts] == [
        "-OpenM.BaseRunDigest",
        "-OpenM.RunName",
        "-OpenM.SetName",
        "-OpenM.SubValues",
        "-Parameter.SimulationCases",
    ]
    assert choose_run_stamp(req, datetime(2030, 1, 1)) == "2025_01_28_21_00_48_385"


def test_user_ini_request() -> None:
    req = parse((REQUESTS / "user-ini.json").read_bytes())
    run = validate_run(req, MODEL, runs(user_files_dir="/opt/openmpp/home/io"))
    assert run.ini_file == "/opt/openmpp/home/io/RiskPaths.ini"
    assert ("-OpenM.ParamDir", "/opt/openmpp/home/io/csv/scenario-a") in run.model_opts
    assert run.work_dir == "runs/scenario-a"
    assert run.env == (("OM_USER_FILES", "/opt/openmpp/home/io"), ("TZ", "America/Toronto"))
    assert run.has_generated_settings()
    # Without runs.user_files_dir, OM_USER_FILES paths cannot be resolved.
    with pytest.raises(RunRequestError, match="OM_USER_FILES is not available"):
        validate_run(req, MODEL, runs())


# --- MPI processes and threads, as oms computes them ------------------------------------------


@pytest.mark.parametrize(
    ("body", "np", "processes", "mpi_np", "not_on_root"),
    [
        ({}, 0, 1, 1, False),
        ({"IsMpi": True}, 1, 1, 1, False),
        ({"Mpi": {"Np": 1}}, 1, 1, 1, False),
        ({"Mpi": {"Np": 1, "IsNotOnRoot": True}}, 1, 1, 2, True),
        ({"Mpi": {"Np": 2, "IsNotOnRoot": True}}, 2, 1, 2, True),
        ({"Mpi": {"Np": 4, "IsNotOnRoot": True}}, 4, 3, 4, True),
        ({"Mpi": {"Np": 4}, "Opts": {"OpenM.NotOnRoot": "true"}}, 4, 3, 4, True),
        ({"Mpi": {"Np": 4}, "Opts": {"-openm.notonroot": "TRUE"}}, 4, 3, 4, True),
        ({"Mpi": {"Np": 4}, "Opts": {"OpenM.NotOnRoot": "1"}}, 4, 3, 4, True),
        ({"Mpi": {"Np": 4}, "Opts": {"OpenM.NotOnRoot": "yes"}}, 4, 3, 4, True),
        ({"Mpi": {"Np": 4}, "Opts": {"OpenM.NotOnRoot": ""}}, 4, 3, 4, True),
        ({"Mpi": {"Np": 4}, "Opts": {"OpenM.NotOnRoot": "false"}}, 4, 4, 4, False),
        ({"Mpi": {"Np": 4, "IsNotOnRoot": True}, "Opts": {"OpenM.NotOnRoot": "no"}}, 4, 3, 4, True),
        ({"Mpi": {"Np": -5}}, 0, 1, 1, False),
        ({"Mpi": {"Np": -5}, "IsMpi": True}, 1, 1, 1, False),
        ({"IsMpi": True, "Mpi": {"IsNotOnRoot": True}}, 1, 1, 2, True),
        # Not MPI: NotOnRoot has no effect.
        ({"Mpi": {"IsNotOnRoot": True}}, 0, 1, 1, False),
    ],
)
def test_processes(
    body: dict[str, Any], np: int, processes: int, mpi_np: int, not_on_root: bool
) -> None:
    run = check(body)
    assert (run.np, run.process_count, run.mpi_np, run.not_on_root) == (
        np,
        processes,
        mpi_np,
        not_on_root,
    )
    assert run.is_mpi is (np > 0)


@pytest.mark.parametrize(
    ("body", "threads"),
    [
        ({}, 1),
        ({"Threads": 0}, 1),
        ({"Threads": -4}, 1),
        ({"Threads": 3}, 3),
        ({"Threads": 3, "Opts": {"OpenM.Threads": "8"}}, 3),
        ({"Threads": 1, "Opts": {"OpenM.Threads": "8"}}, 8),
        ({"Opts": {"-OpenM.Threads": "6"}}, 6),
        ({"Opts": {"openm.threads": "+2"}}, 2),
        ({"Opts": {"OpenM.Threads": "007"}}, 7),
        ({"Threads": 16}, 16),
    ],
)
def test_threads(body: dict[str, Any], threads: int) -> None:
    assert check(body).threads == threads


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"Opts": {"OpenM.Threads": "1.5"}},
            "Opts[\"OpenM.Threads\"]: expected a whole number >= 1, got '1.5'",
        ),
        ({"Opts": {"OpenM.Threads": "0"}}, "expected a whole number >= 1, got '0'"),
        ({"Opts": {"OpenM.Threads": "-2"}}, "expected a whole number >= 1"),
        ({"Opts": {"OpenM.Threads": ""}}, "expected a whole number >= 1"),
        ({"Opts": {"OpenM.Threads": "4 "}}, "expected a whole number >= 1"),
        ({"Opts": {"OpenM.Threads": "9" * 30}}, "expected a whole number >= 1"),
        ({"Threads": 17}, "Threads: 17 threads per process requested, at most 16 allowed"),
        ({"Opts": {"OpenM.Threads": "99"}}, "Threads: 99 threads per process requested"),
        (
            {"Mpi": {"Np": 4}, "Opts": {"OpenM.NotOnRoot": "maybe"}},
            "Opts[\"OpenM.NotOnRoot\"]: expected true or false, got 'maybe'",
        ),
        ({"Mpi": {"Np": 65}}, "Mpi.Np: 65 MPI processes requested, at most 64 allowed"),
        ({"Mpi": {"Np": 10**18}}, "Mpi.Np: 1000000000000000000 MPI processes requested"),
        ({"Mpi": {"Np": 64, "IsNotOnRoot": True}}, None),
        ({"Mpi": {"Np": 1, "IsNotOnRoot": True}}, None),
    ],
)
def test_process_and_thread_limits(body: dict[str, Any], message: str | None) -> None:
    if message is None:
        check(body)
    else:
        assert message in refusal(body)


def test_limits_come_from_the_config() -> None:
    config = runs(max_processes=2, max_threads=2)
    assert "at most 2 allowed" in refusal({"Mpi": {"Np": 3}}, config)
    assert "at most 2 allowed" in refusal({"Mpi": {"Np": 1}, "Threads": 3}, config)
    assert check({"Mpi": {"Np": 1, "IsNotOnRoot": True}}, config).mpi_np == 2


# --- Opts, Env and paths ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"OpenM.Profile": "p", "LD_PRELOAD": "x"}, 'Opts["LD_PRELOAD"]: this run option is not'),
        ({"OpenM.SetNam": "x"}, 'Opts["OpenM.SetNam"]: this run option is not allowed'),
        ({"": "x"}, 'Opts[""]: this run option is not allowed'),
        ({"-": "x"}, 'Opts["-"]: this run option is not allowed'),
        ({"OpenM.RunName": "a", "openm.runname": "b"}, "keys differ only in case"),
        ({"OpenM.RunName": "a", "-OpenM.RunName": "b"}, "given twice"),
        ({"OpenM.RunName": "-OpenM.Database"}, "may not start with '-'"),
        ({"OpenM.RunName": "a\x00b"}, "NUL characters are not allowed"),
        ({"OpenM.Run\x00Name": "a"}, "NUL characters are not allowed"),
        ({"Microdata.CsvDir": "csv"}, 'Opts["Microdata.CsvDir"]: microdata is not allowed'),
        ({"EN.RunDescription": "two\nlines"}, "one line without control characters"),
        ({"EN.RunDescription": "tab\there"}, "one line without control characters"),
        ({"E.RunDescription": "x"}, "this run option is not allowed"),
    ],
)
def test_opts_rules(opts: dict[str, str], message: str) -> None:
    assert message in refusal({"Opts": opts})


def test_allowed_opts_match_case_insensitively_without_the_dash() -> None:
    run = check({"Opts": {"-openm.runname": "a", "OPENM.SETNAME": "s", "EN.RunDescription": "d"}})
    assert run.model_opts == (("-OPENM.SETNAME", "s"), ("-openm.runname", "a"))
    assert run.run_name == "a"
    config = runs(allowed_opts=["-OpenM.RunName"], allowed_opts_patterns=[r"Parameter\.[A-Z]\w*"])
    assert check({"Opts": {"OpenM.RunName": "a", "Parameter.X": "1"}}, config).model_opts == (
        ("-OpenM.RunName", "a"),
        ("-Parameter.X", "1"),
    )
    # Patterns match the whole key.
    assert "not allowed" in refusal({"Opts": {"Parameter.X.Y": "1"}}, config)


def test_options_oms_drops_are_dropped_before_the_allow_list() -> None:
    dropped = {
        "OpenM.RunStamp": "s",
        "-OpenM.Threads": "2",
        "OpenM.NotOnRoot": "false",
        "OpenM.LogToConsole": "false",
        "OpenM.LogToFile": "true",
        "OpenM.LogFilePath": "/etc/passwd",
        "OpenM.Database": "Database=/tmp/x.sqlite",
        "db": "x",
        "OpenM.SQLite": "x",
        "OpenM.SqliteFromBin": "true",
        "ImportDb.Database": "x",
        "importdb.anything": "x",
    }
    run = check({"Opts": {**dropped, "OpenM.RunName": "r"}})
    assert run.model_opts == (("-OpenM.RunName", "r"),)


def test_microdata_options_when_allowed() -> None:
    config = runs(allow_microdata=True)
    run = check({"Opts": {"Microdata.CsvDir": "out/micro"}}, config)
    assert run.model_opts == (("-Microdata.CsvDir", "out/micro"),)
    assert "set this in the request's Microdata" in refusal(
        {"Opts": {"Microdata.ToDb": "true"}}, config
    )
    assert "set this in the request's Microdata" in refusal(
        {"Opts": {"-microdata.UseInternal": "true"}}, config
    )


@pytest.mark.parametrize("key", ["OpenM.IniFile", "OpenM.ParamDir", "Microdata.CsvDir", "Dir"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/etc", "expected a relative path, got the absolute path '/etc'"),
        ("../models", "'..' is not allowed"),
        ("a/../../b", "'..' is not allowed"),
        ("a/..", "'..' is not allowed"),
        ("a\\b", "use '/'"),
        ("..\\x", "use '/'"),
        ("a\nb", "control characters"),
        ("", "expected a relative path, got an empty value"),
    ],
)
def test_directories_must_be_local(key: str, value: str, message: str) -> None:
    config = runs(allow_microdata=True, allowed_opts=["OpenM.IniFile", "OpenM.ParamDir"])
    config = dataclasses.replace(config, allowed_opts=(*config.allowed_opts, "Microdata.CsvDir"))
    body: dict[str, Any] = {"Dir": value} if key == "Dir" else {"Opts": {key: value}}
    if key == "Dir" and value == "":
        assert check(body, config).work_dir == ""
        return
    field = "Dir" if key == "Dir" else f'Opts["{key}"]'
    assert refusal(body, config) == f"{field}: {message}" or message in refusal(body, config)
    assert refusal(body, config).startswith(field + ": ")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("dir", "dir"),
        ("./a/./b/", "a/b"),
        ("a/b/..c", "a/b/..c"),
        ("my $dir%", "my _dir_"),
        ("OM_USER_FILES/csv", "/home/io/csv"),
        ("$OM_USER_FILES/csv", "/home/io/csv"),
        ("{OM_USER_FILES}/csv", "/home/io/csv"),
        ("${OM_USER_FILES}/csv", "/home/io/csv"),
        ("%OM_USER_FILES%/csv", "/home/io/csv"),
        ("OM_USER_FILES", "/home/io"),
        ("OM_USER_FILESX/csv", "OM_USER_FILESX/csv"),
    ],
)
def test_directory_values_as_oms_rewrites_them(value: str, expected: str) -> None:
    run = check({"Opts": {"OpenM.ParamDir": value}}, runs(user_files_dir="/home/io"))
    if expected.startswith("/") or value.startswith(("my", "dir", "OM_USER_FILESX")):
        assert run.model_opts == (("-OpenM.ParamDir", expected),)
    else:
        assert run.model_opts == (("-OpenM.ParamDir", value),)


def test_dir_is_normalised() -> None:
    assert check({"Dir": "./runs//a/"}).work_dir == "runs/a"
    assert check({"Dir": "."}).work_dir == ""


def test_ini_file_option_spellings() -> None:
    config = runs(allowed_opts=["ini", "OpenM.IniFile"])
    assert check({"Opts": {"-ini": "my.ini"}}, config).ini_file == "my.ini"
    assert check({"Opts": {"openm.inifile": "x/my.ini"}}, config).ini_file == "x/my.ini"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LD_PRELOAD": "/tmp/x.so"}, 'Env["LD_PRELOAD"]: this variable can change how programs'),
        ({"PATH": "/tmp"}, 'Env["PATH"]: this variable can change'),
        ({"OMPI_MCA_plm_rsh_agent": "x"}, "never allowed"),
        ({"http_proxy": "x"}, "never allowed"),
        ({"MY_VAR": "x"}, 'Env["MY_VAR"]: this environment variable is not allowed here'),
        ({"tz": "UTC"}, 'Env["tz"]: this environment variable is not allowed'),
        ({"TZ": "a\x00b"}, 'Env["TZ"]: NUL characters are not allowed'),
    ],
)
def test_env_rules(env: dict[str, str], message: str) -> None:
    assert message in refusal({"Env": env})


def test_env_values_are_free_text_and_empty_entries_are_skipped() -> None:
    run = check({"Env": {"TZ": "a b;$(x)\n", "LANG": "", "": "x", "OM_USER_FILES": "/u"}})
    assert run.env == (("OM_USER_FILES", "/u"), ("TZ", "a b;$(x)\n"))


# --- names in the ini file, notes, template, model ---------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"Tables": ["T01", "bad name"]}, "Tables[1]: expected a table or group name, got 'bad"),
        ({"Tables": ["1T"]}, "Tables[0]: expected a table or group name"),
        ({"Tables": [""]}, "Tables[0]"),
        ({"Tables": ["T\nRetain = x"]}, "Tables[0]"),
        ({"Tables": ["a" * 256]}, "Tables[0]"),
        (
            {"Microdata": {"IsToDb": True, "Entity": [{"Name": "Per son", "Attr": ["age"]}]}},
            "Microdata.Entity[0].Name: expected an entity name",
        ),
        (
            {"Microdata": {"IsToDb": True, "Entity": [{"Name": "Person", "Attr": ["a", "b;c"]}]}},
            "Microdata.Entity[0].Attr[1]: expected an attribute name, got 'b;c'",
        ),
        (
            {"Microdata": {"IsToDb": True, "Entity": [{"Name": "Person", "Attr": []}]}},
            "Microdata.Entity[0].Attr: expected attribute names (or All), got none",
        ),
        (
            {"RunNotes": [{"LangCode": "EN]\n[x", "Note": "n"}]},
            "RunNotes[0].LangCode: expected a language code",
        ),
        ({"RunNotes": [{"LangCode": "", "Note": "n"}]}, "RunNotes[0].LangCode"),
        ({"RunNotes": [{"LangCode": "E", "Note": "n"}]}, "RunNotes[0].LangCode"),
        ({"RunNotes": [{"LangCode": "EN", "Note": "a\x00"}]}, "RunNotes[0].Note: NUL"),
        ({"RunNotes": [{"LangCode": "EN", "Note": "x" * 900_001}]}, "RunNotes: run notes and"),
        (
            {"Template": "../etc/passwd"},
            "Template: expected a plain file name, got '../etc/passwd'",
        ),
        ({"Template": "a/b.txt"}, "Template: expected a plain file name"),
        ({"Template": ".."}, "Template: expected a plain file name"),
        ({"Template": "a\\b"}, "Template: expected a plain file name"),
        (
            {"Opts": {"EN.RunDescription": "a;\";';"}},
            'Opts["EN.RunDescription"]: cannot be written to an ini file as it is',
        ),
    ],
)
def test_ini_names_notes_and_template(body: dict[str, Any], message: str) -> None:
    assert message in refusal(body, runs(allow_microdata=True))


def test_valid_ini_settings_and_notes() -> None:
    run = check(
        {
            "Tables": ["T01_LifeExpectancy", "_g2"],
            "Microdata": {
                "IsToDb": True,
                "IsInternal": False,
                "Entity": [
                    {"Name": "Person", "Attr": ["age"]},
                    {"Name": "Other", "Attr": ["All"]},
                    {"Name": "Person", "Attr": ["age", "sex"]},
                ],
            },
            "RunNotes": [
                {"LangCode": "EN", "Note": "first"},
                {"LangCode": "fr-CA", "Note": "note"},
                {"LangCode": "bad code", "Note": ""},
                {"LangCode": "EN", "Note": "second"},
            ],
            "Opts": {"EN.RunDescription": "", "FR.RunDescription": "d"},
            "Template": "mpi.RiskPaths.template.txt",
        },
        runs(allow_microdata=True),
    )
    assert run.tables == ("T01_LifeExpectancy", "_g2")
    assert run.microdata == MicrodataSettings(
        is_internal=False, entities=(("Person", ("age", "sex")), ("Other", ("All",)))
    )
    assert run.run_notes == (("EN", "second"), ("fr-CA", "note"))
    assert run.descriptions == (("FR", "d"),)
    assert run.template == "mpi.RiskPaths.template.txt"


def test_microdata_is_ignored_unless_allowed_and_asked_for() -> None:
    body = {"Microdata": {"IsToDb": True, "Entity": [{"Name": "Person", "Attr": ["age"]}]}}
    assert check(body).microdata is None
    assert (
        check({"Microdata": {"IsToDb": False, "Entity": [{"Name": "P", "Attr": ["a"]}]}}).microdata
        is None
    )
    assert check(body, runs(allow_microdata=True)).microdata is not None


def test_descriptions_given_with_a_user_ini_need_no_ini_quoting() -> None:
    config = runs(allowed_opts=["OpenM.IniFile"])
    body = {"Opts": {"OpenM.IniFile": "my.ini", "EN.RunDescription": "both \" and ' and ;"}}
    assert check(body, config).descriptions == (("EN", "both \" and ' and ;"),)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("RiskPaths", True),
        ("OncoSimX-lung", True),
        ("model.v2", True),
        ("_m", True),
        ("a:b", True),  # CleanFileName makes it a_b
        ("a/b", True),  # ... and a_b here too
        (".hidden", False),
        ("-dash", False),
        ("with space", False),
        ("Modèle", False),
        ("", False),
        ("m" * 129, False),
    ],
)
def test_model_name_must_make_a_safe_executable_name(name: str, ok: bool) -> None:
    req = parse('{"ModelName": "x"}')
    model = ModelInfo(name=name, digest="d")
    if ok:
        assert validate_run(req, model, runs()).exe_stem == clean_file_name(name)
    else:
        with pytest.raises(RunRequestError, match=r"ModelName: the model name .* cannot be used"):
            validate_run(req, model, runs())


def test_errors_name_the_model_as_the_request_did() -> None:
    req = parse('{"ModelName": "RiskPaths", "Threads": 99}')
    with pytest.raises(RunRequestError, match=r"^Model start failed: RiskPaths: Threads: "):
        validate_run(req, MODEL, runs())


# --- run stamps -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "stamp"),
    [
        ({"RunStamp": "my-run.1"}, "my-run.1"),
        ({"RunStamp": "a:b/c"}, "a_b_c"),
        ({"RunStamp": "top", "Opts": {"OpenM.RunStamp": "opt"}}, "top"),
        ({"Opts": {"OpenM.RunStamp": "opt"}}, "opt"),
        ({"Opts": {"OpenM.RunStamp": "2024_05_06_07_08_09_010"}}, "2024_05_06_07_08_09_010"),
        ({"Opts": {"openm.runstamp": "ignored"}}, "2025_01_02_03_04_05_678"),
        ({"Opts": {"-OpenM.RunStamp": "ignored"}}, "2025_01_02_03_04_05_678"),
        ({"RunStamp": ""}, "2025_01_02_03_04_05_678"),
        ({}, "2025_01_02_03_04_05_678"),
    ],
)
def test_choose_run_stamp(body: dict[str, Any], stamp: str) -> None:
    req = parse(json.dumps(body))
    assert choose_run_stamp(req, datetime(2025, 1, 2, 3, 4, 5, 678901)) == stamp


@pytest.mark.parametrize("value", ["has space", "x" * 65, ".hidden", "-x", "a#b", "é"])
def test_unusable_client_stamps_are_refused(value: str) -> None:
    req = parse(json.dumps({"ModelName": "m", "RunStamp": value}))
    with pytest.raises(RunRequestError, match=r"^Model start failed: m: RunStamp: .* run stamp"):
        choose_run_stamp(req, datetime(2025, 1, 1))
    req = parse(json.dumps({"ModelName": "m", "Opts": {"OpenM.RunStamp": value}}))
    with pytest.raises(RunRequestError, match=r'Opts\["OpenM.RunStamp"\]'):
        choose_run_stamp(req, datetime(2025, 1, 1))


def test_choose_run_stamp_from_a_stamp_source() -> None:
    source = StampSource(clock=lambda: datetime(2025, 1, 2, 3, 4, 5, 6000))
    req = parse("{}")
    assert choose_run_stamp(req, source) == "2025_01_02_03_04_05_006"
    assert choose_run_stamp(req, source) == "2025_01_02_03_04_05_007"
    at = datetime(2026, 1, 1)
    assert choose_run_stamp(req, source, at) == "2026_01_01_00_00_00_000"
    assert choose_run_stamp(parse('{"RunStamp": "r"}'), source) == "r"


def test_stamp_formats() -> None:
    dt = datetime(2022, 7, 8, 23, 3, 27, 555999)
    assert make_stamp(dt) == "2022_07_08_23_03_27_555"
    assert make_datetime(dt) == "2022-07-08 23:03:27.555"
    assert is_stamp("2022_07_08_23_03_27_555")
    assert not is_stamp("2022-07-08 23:03:27.555")
    assert not is_stamp("2022_07_08_23_03_27_55")


def test_stamp_source_never_repeats() -> None:
    times = iter(
        [
            datetime(2025, 1, 1, 0, 0, 0, 1000),
            datetime(2025, 1, 1, 0, 0, 0, 1999),  # same millisecond
            datetime(2025, 1, 1, 0, 0, 0, 1500),  # same again
            datetime(2024, 12, 31, 23, 59, 59),  # the clock stepped back
            datetime(2025, 1, 1, 0, 0, 1),
        ]
    )
    source = StampSource(clock=lambda: next(times))
    stamps = [source.next() for _ in range(5)]
    assert stamps == [
        "2025_01_01_00_00_00_001",
        "2025_01_01_00_00_00_002",
        "2025_01_01_00_00_00_003",
        "2025_01_01_00_00_00_004",
        "2025_01_01_00_00_01_000",
    ]
    assert source.next(datetime(2025, 1, 1, 0, 0, 1)) == "2025_01_01_00_00_01_001"


def test_stamp_source_compares_wall_clock_of_aware_times() -> None:
    source = StampSource()
    utc = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    first = source.next_datetime(utc)
    second = source.next_datetime(utc.astimezone(timezone(timedelta(hours=-5))))
    assert make_stamp(first) == "2025_01_01_12_00_00_000"
    assert make_stamp(second) == "2025_01_01_12_00_00_001"


def test_stamp_source_default_clock_is_increasing() -> None:
    source = StampSource()
    stamps = [source.next() for _ in range(50)]
    assert len(set(stamps)) == 50
    assert stamps == sorted(stamps)


def test_clean_file_name_and_path() -> None:
    assert clean_file_name("a\"'`:*?><|$}{@&^;%/\\b") == "a" + "_" * 19 + "b"
    assert clean_file_name("ok-name_1.2 #=") == "ok-name_1.2 #="
    assert clean_file_path("a/b\\c:d") == "a/b\\c_d"


# --- ini values as the OpenM++ reader reads them ----------------------------------------------


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("plain text", "plain text"),
        ("T01, T02", "T01, T02"),
        ("a; b", '"a; b"'),
        ("#1 run", '"#1 run"'),
        (" padded ", '" padded "'),
        ('say "hi"; ok', '"say "hi"; ok"'),  # the reader has no escapes, only quote toggling
        ("it's; fine", "it's; fine"),  # an unbalanced quote protects the rest of the line
        ('"quoted"', '""quoted""'),
        ("a;b 'c'", "\"a;b 'c'\""),
        ("'single'", "\"'single'\""),
        ("ends with \\", '"ends with \\"'),
        ("a = b", "a = b"),
        ("", ""),
        ("both \" and ' ; here", "both \" and ' ; here"),
        ("a;\";';", None),
        ('";\';"', None),
        ("line\nbreak", None),
    ],
)
def test_ini_quote(value: str, written: str | None) -> None:
    assert ini_quote(value) == written
    if written is not None:
        assert ini_read_value(written) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("abc ; comment", "abc"),
        ("abc # comment", "abc"),
        ('"a;b" ; c', "a;b"),
        ("'a#b'", "a#b"),
        ('"unbalanced', '"unbalanced'),
        ("x \\", None),
        ("  spaced  ", "spaced"),
    ],
)
def test_ini_read_value(text: str, value: str | None) -> None:
    assert ini_read_value(text) == value


# --- properties -------------------------------------------------------------------------------


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_ini_quote_reads_back_exactly_or_refuses(value: str) -> None:
    written = ini_quote(value)
    if written is not None:
        assert ini_read_value(written) == value
        assert "\n" not in written
        assert "\r" not in written


def _outcome(body: bytes) -> RunRequest | RunRequestError:
    try:
        return parse_run_request(body)
    except RunRequestError as e:
        return e


@settings(deadline=None)
@given(st.binary(max_size=300))
def test_any_body_parses_or_is_a_400(body: bytes) -> None:
    outcome = _outcome(body)
    assert isinstance(outcome, RunRequest) or outcome.status == 400


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["ModelName", "Mpi", "Opts", "Env", "Threads", "Tables", "RunNotes", "Microdata", "Np", "x"]
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_keys, _json_values, max_size=6))
def test_any_json_object_parses_or_names_the_field(body: dict[str, Any]) -> None:
    outcome = _outcome(json.dumps(body).encode())
    if isinstance(outcome, RunRequestError):
        assert outcome.message.startswith("Json decode error at /api/run: ")
        field = outcome.message.removeprefix("Json decode error at /api/run: ").split(":")[0]
        assert field.split(".")[0].split("[")[0] in body


def test_values_and_option_counts_are_bounded() -> None:
    """One argv element must stay under Linux's per-argument limit; option count is capped."""
    from proxy.submit.validate import MAX_OPTS, MAX_VALUE_BYTES

    long_value = "x" * (MAX_VALUE_BYTES + 1)
    assert "longer than" in refusal({"Opts": {"OpenM.RunName": long_value}})
    assert "longer than" in refusal({"Env": {"TZ": long_value}}, runs(allowed_env=["TZ"]))
    assert check({"Opts": {"OpenM.RunName": "x" * MAX_VALUE_BYTES}}).run_name
    many = {f"Parameter.P{i}": "1" for i in range(MAX_OPTS + 1)}
    assert f"at most {MAX_OPTS} allowed" in refusal({"Opts": many})
