"""Rendering: whole manifests against reviewed goldens, CRD validity, and the renderer's rules.

The goldens in tests/golden/ are the specification: a change to the renderer or the template
shows up as a diff there. After an intended change, write them anew with
``UPDATE_GOLDEN=1 pytest tests/test_render.py`` and review the diff by eye.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy import names
from proxy.config import Config, ConfigError
from proxy.configload import config_from_dict
from proxy.submit.decode import ModelInfo, RunRequest, parse_run_request
from proxy.submit.render import (
    RenderedRun,
    RenderError,
    Stamps,
    check_operator_rules,
    format_cpu,
    format_memory,
    parse_quantity,
    render,
)
from proxy.submit.template import Template, check_template, load_template, parse_template
from proxy.submit.validate import choose_run_stamp, validate_run
from tests.crd import validate_mpijob

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_PATH = ROOT / "config" / "mpijob-template.yaml"
BUILTIN_TEMPLATE_PATH = ROOT / "proxy" / "data" / "mpijob-template.yaml"
REQUESTS = Path(__file__).resolve().parent / "requests"
GOLDEN = Path(__file__).resolve().parent / "golden"

RISKPATHS = ModelInfo(name="RiskPaths", digest="d90e1e9a49a06d972ecf1d50e684c62b")
NEWCASEBASED = ModelInfo(name="NewCaseBased", digest="649f17f26d67c37b78dde94f79772445")
SUBMITTED_AT = datetime(2025, 1, 28, 21, 0, 48, 380000)


@dataclasses.dataclass(frozen=True)
class Case:
    request: str
    model: ModelInfo
    config: dict[str, Any]
    user: str | None = "alice@example.org"


CASES: dict[str, Case] = {
    # The OpenM++ UI: MPI with 4 processes, root not modelling, 2 threads, a description.
    "ui-mpi": Case("ui-mpi.json", RISKPATHS, {}),
    # R script: Np without IsMpi, explicit OpenM.RunStamp, threads only in Opts; 2 slots.
    "r-script": Case(
        "r-script.json",
        RISKPATHS,
        {
            "mpijob": {
                "slots_per_worker": 2,
                "cpu_per_thread": "500m",
                "memory_per_process": "1536Mi",
            },
        },
        user=None,
    ),
    # Python script: ModelName only, not MPI, intercepted because runs.intercept is "all".
    "python-script": Case("python-script.json", NEWCASEBASED, {"runs": {"intercept": "all"}}),
    # Tables, run notes, descriptions and microdata: a generated ini file in the ConfigMap.
    "ini-settings": Case(
        "ini-settings.json",
        RISKPATHS,
        {"runs": {"allow_microdata": True}, "mpijob": {"slots_per_worker": 2}},
    ),
    # The UI's request with Kueue: the MPIJob carries the LocalQueue's name as a label.
    "ui-mpi-kueue": Case("ui-mpi.json", RISKPATHS, {"mpijob": {"queue_name": "openmpp-runs"}}),
    # The user's own ini file plus Tables: `-ini <theirs>` and the settings as argv pairs.
    "user-ini": Case(
        "user-ini.json",
        RISKPATHS,
        {"runs": {"user_files_dir": "/opt/openmpp/home/io"}},
    ),
}


def make_config(**sections: dict[str, Any]) -> Config:
    data: dict[str, Any] = {"kubernetes": {"namespace": "openmpp"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data, "<test>")


@pytest.fixture(scope="module")
def template() -> Template:
    return load_template(TEMPLATE_PATH)


def stamps_for(req: RunRequest, user: str | None = None) -> Stamps:
    return Stamps(
        run_stamp=choose_run_stamp(req, datetime(2025, 1, 28, 21, 0, 48, 391000)),
        submit_stamp="2025_01_28_21_00_48_380",
        request_id="0f5c2a3e-8d41-4b7e-9a51-3c2f1e6d7b90",
        user=user,
        submitted_at=SUBMITTED_AT,
    )


def render_case(case: Case, template: Template) -> RenderedRun:
    config = make_config(**case.config)
    req = parse_run_request((REQUESTS / case.request).read_bytes())
    run = validate_run(req, case.model, config.runs)
    return render(run, case.model, config, template, stamps_for(req, case.user))


def render_body(
    body: dict[str, Any], template: Template, config: Config | None = None
) -> RenderedRun:
    config = config or make_config()
    req = parse_run_request(json.dumps(body).encode())
    run = validate_run(req, RISKPATHS, config.runs)
    return render(run, RISKPATHS, config, template, stamps_for(req))


def documents(rendered: RenderedRun) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [rendered.mpijob]
    if rendered.configmap is not None:
        docs.append(rendered.configmap)
    return docs


class _GoldenDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so ini and notes files read as they are."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_GoldenDumper.add_representer(str, _str)


def write_golden(path: Path, docs: list[dict[str, Any]]) -> None:
    """Write the expected manifests (only with UPDATE_GOLDEN=1)."""
    header = "# Expected rendering; regenerate with UPDATE_GOLDEN=1, then review the diff.\n"
    text = yaml.dump_all(docs, Dumper=_GoldenDumper, sort_keys=False, width=100, allow_unicode=True)
    path.write_text(header + text, encoding="utf-8")


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_manifests_match_the_goldens(name: str, template: Template) -> None:
    rendered = render_case(CASES[name], template)
    docs = documents(rendered)
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        write_golden(path, docs)
    expected = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    assert docs == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_mpijobs_are_valid_for_the_crd(name: str, template: Template) -> None:
    rendered = render_case(CASES[name], template)
    validate_mpijob(rendered.mpijob)
    assert rendered.argv == tuple(launcher(rendered.mpijob)["command"])


def test_kueue_queue_label_only_on_the_mpijob_and_only_when_configured(
    template: Template,
) -> None:
    plain = render_case(CASES["ui-mpi"], template)
    queued = render_case(CASES["ui-mpi-kueue"], template)
    assert names.KUEUE_QUEUE_NAME_KEY not in plain.mpijob["metadata"]["labels"]
    assert queued.mpijob["metadata"]["labels"][names.KUEUE_QUEUE_NAME_KEY] == "openmpp-runs"
    # Kueue reads the job's label; pods and the run ConfigMap are not queued objects.
    for role in ("Launcher", "Worker"):
        pod = queued.mpijob["spec"]["mpiReplicaSpecs"][role]["template"]
        assert names.KUEUE_QUEUE_NAME_KEY not in pod["metadata"]["labels"]
    if queued.configmap is not None:
        assert names.KUEUE_QUEUE_NAME_KEY not in queued.configmap["metadata"]["labels"]
    # Created suspended: nothing starts before Kueue admits the job and un-suspends it.
    assert plain.mpijob["spec"]["runPolicy"]["suspend"] is False
    assert queued.mpijob["spec"]["runPolicy"]["suspend"] is True
    without = copy.deepcopy(queued.mpijob)
    del without["metadata"]["labels"][names.KUEUE_QUEUE_NAME_KEY]
    without["spec"]["runPolicy"]["suspend"] = False
    assert without == plain.mpijob, "the label and suspend are the only differences"


@pytest.mark.parametrize(
    "bad", ["Openmpp", "-runs", "runs-", "a" * 64, "runs/one", "runs_one", " runs"]
)
def test_kueue_queue_name_must_be_a_localqueue_name(bad: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_config(mpijob={"queue_name": bad})
    assert e.value.key == "mpijob.queue_name"
    assert "LocalQueue" in str(e.value)


def test_the_crd_validator_rejects_what_the_api_server_would(template: Template) -> None:
    import jsonschema

    rendered = render_case(CASES["ui-mpi"], template)
    bad = copy.deepcopy(rendered.mpijob)
    bad["spec"]["mpiImplementation"] = "LAM"
    with pytest.raises(jsonschema.ValidationError):
        validate_mpijob(bad)
    bad = copy.deepcopy(rendered.mpijob)
    launcher(bad)["imagePullPolicyy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        validate_mpijob(bad)


def pod_spec(mpijob: dict[str, Any], role: str) -> dict[str, Any]:
    spec: dict[str, Any] = mpijob["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    return spec


def launcher(mpijob: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod_spec(mpijob, "Launcher")["containers"][0]
    return container


def worker(mpijob: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod_spec(mpijob, "Worker")["containers"][0]
    return container


# --- what a request can and cannot change ----------------------------------------------------

HOSTILE = [
    "a b; rm -rf / $(id) `id` 'q' \"dq\" | & > < * ?",
    "line1\nnamespace: kube-system\nimage: evil",
    '{"metadata": {"namespace": "kube-system"}}',
    "x --allow-run-as-root",
    "x=y -x LD_PRELOAD=/tmp/evil.so",
    "${IFS}cat${IFS}/etc/passwd",
    "\u202eevil\u202c",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_request_strings_stay_whole_argv_elements(value: str, template: Template) -> None:
    rendered = render_body(
        {
            "ModelDigest": RISKPATHS.digest,
            "Mpi": {"Np": 2},
            "Opts": {"OpenM.RunName": value, "OpenM.SetName": "x " + value},
            "Env": {"TZ": value},
        },
        template,
    )
    argv = rendered.argv
    assert value in argv
    assert "x " + value in argv
    assert f"TZ={value}" in argv
    inside = [a for a in argv if value in a]
    assert sorted(inside) == sorted([value, "x " + value, f"TZ={value}"])
    assert argv[: argv.index("-wdir")] == (
        "mpirun",
        "-n",
        "2",
        "--hostfile",
        "/etc/mpi/hostfile",
        "--bind-to",
        "none",
    )


def test_namespace_image_and_pod_settings_come_only_from_config_and_template(
    template: Template,
) -> None:
    body: dict[str, Any] = {
        "ModelDigest": RISKPATHS.digest,
        "ModelName": "evil",
        "Dir": "namespace/kube-system",
        "Mpi": {"Np": 3},
        "Template": "image.txt",
        "Tables": ["namespace"],
        "Opts": {
            "OpenM.RunName": "image: evil",
            "EN.RunDescription": "namespace: kube-system",
        },
        "Env": {"TZ": "UTC"},
        "RunNotes": [{"LangCode": "EN", "Note": "metadata:\n  namespace: kube-system\n"}],
        "metadata": {"namespace": "kube-system"},
        "spec": {"mpiReplicaSpecs": {}},
        "Namespace": "kube-system",
        "Image": "evil",
    }
    rendered = render_body(body, template)
    job = rendered.mpijob
    assert job["metadata"]["namespace"] == "openmpp"
    assert rendered.configmap is not None
    assert rendered.configmap["metadata"]["namespace"] == "openmpp"
    for role in ("Launcher", "Worker"):
        ours = pod_spec(job, role)
        theirs = pod_spec(dict(template.manifest), role)
        assert [c["image"] for c in ours["containers"]] == [
            c["image"] for c in theirs["containers"]
        ]
        for key in ("securityContext", "nodeSelector", "tolerations"):
            assert ours[key] == theirs[key]
        assert (
            ours["containers"][0]["securityContext"] == theirs["containers"][0]["securityContext"]
        )
        assert (
            ours["containers"][0]["resources"]["limits"]
            == (theirs["containers"][0]["resources"]["limits"])
        )
    # Only the renderer's own volume is added, and only to the launcher.
    launcher_volumes = [v["name"] for v in pod_spec(job, "Launcher")["volumes"]]
    assert launcher_volumes == ["models", "openmpp-run"]
    assert [v["name"] for v in pod_spec(job, "Worker")["volumes"]] == ["models"]


def test_same_run_same_name_different_stamp_different_name(template: Template) -> None:
    body: dict[str, Any] = {"ModelDigest": RISKPATHS.digest, "Mpi": {"Np": 2}}
    a = render_body({**body, "RunStamp": "run-1"}, template)
    b = render_body({**body, "RunStamp": "run-1"}, template)
    c = render_body({**body, "RunStamp": "run-2"}, template)
    assert a.name == b.name != c.name
    assert a.name.startswith("ompp-riskpaths-")


def test_no_configmap_and_no_volume_without_generated_settings(template: Template) -> None:
    rendered = render_body({"ModelDigest": RISKPATHS.digest, "Mpi": {"Np": 1}}, template)
    assert rendered.configmap is None
    assert "-ini" not in rendered.argv
    assert [v["name"] for v in pod_spec(rendered.mpijob, "Launcher")["volumes"]] == ["models"]
    validate_mpijob(rendered.mpijob)


def test_template_is_not_changed_by_rendering(template: Template) -> None:
    before = copy.deepcopy(template.manifest)
    render_case(CASES["ini-settings"], template)
    assert template.manifest == before


# --- sizes, names and the operator's rules ----------------------------------------------------


@pytest.mark.parametrize(
    ("np", "not_on_root", "slots", "mpi_np", "workers"),
    [
        (1, False, 1, 1, 1),
        (1, True, 1, 2, 2),  # oms: Np=1 with NotOnRoot starts 2 processes
        (4, True, 1, 4, 4),
        (5, True, 2, 5, 3),
        (8, False, 4, 8, 2),
        (9, False, 4, 9, 3),
    ],
)
def test_processes_and_workers(
    np: int, not_on_root: bool, slots: int, mpi_np: int, workers: int, template: Template
) -> None:
    config = make_config(mpijob={"slots_per_worker": slots})
    body = {"ModelDigest": RISKPATHS.digest, "Mpi": {"Np": np, "IsNotOnRoot": not_on_root}}
    rendered = render_body(body, template, config)
    spec = rendered.mpijob["spec"]
    assert rendered.argv[1:3] == ("-n", str(mpi_np))
    assert spec["slotsPerWorker"] == slots
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == workers
    assert spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    assert ("-OpenM.NotOnRoot" in rendered.argv) is not_on_root
    validate_mpijob(rendered.mpijob)


@pytest.mark.parametrize(
    ("threads", "slots", "cpu_per_thread", "memory", "cpu_request", "memory_request"),
    [
        (1, 1, "1", "1Gi", "1", "1Gi"),
        (2, 1, "500m", "512Mi", "1", "512Mi"),
        (3, 1, "250m", "1536Mi", "750m", "1536Mi"),
        (3, 2, "0.5", "1536Mi", "3", "3Gi"),
        (1, 3, "100m", "1G", "300m", "3G"),
        (1, 1, "1.5", "1.5Gi", "1500m", "1536Mi"),
    ],
)
def test_worker_requests_are_computed_exactly(
    threads: int,
    slots: int,
    cpu_per_thread: str,
    memory: str,
    cpu_request: str,
    memory_request: str,
    template: Template,
) -> None:
    config = make_config(
        mpijob={
            "slots_per_worker": slots,
            "cpu_per_thread": cpu_per_thread,
            "memory_per_process": memory,
        }
    )
    body = {"ModelDigest": RISKPATHS.digest, "Mpi": {"Np": slots}, "Threads": threads}
    rendered = render_body(body, template, config)
    requests = worker(rendered.mpijob)["resources"]["requests"]
    assert requests == {"cpu": cpu_request, "memory": memory_request}


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("500m", 0.5), ("1.5Gi", 1.5 * 2**30), ("2k", 2000), ("1e3", 1000), (2, 2)],
)
def test_parse_quantity(text: str | int, value: float) -> None:
    assert parse_quantity(text) == value


def test_format_quantities() -> None:
    from fractions import Fraction

    assert format_cpu(Fraction(1, 3)) == "334m"
    assert format_cpu(Fraction(16)) == "16"
    assert format_memory(Fraction(3 * 2**30)) == "3Gi"
    assert format_memory(Fraction(1000), "1k") == "1k"
    assert format_memory(Fraction(1001)) == "1001"


def test_requests_above_the_template_limits_are_refused(template: Template) -> None:
    config = make_config(runs={"max_threads": 64})
    body = {"ModelDigest": RISKPATHS.digest, "Mpi": {"Np": 2}, "Threads": 17}
    with pytest.raises(RenderError, match=r"each worker needs 17 cpu .* limits workers to 16"):
        render_body(body, template, config)


@pytest.mark.parametrize("np", [9, 10, 11, 99, 100, 101, 1000])
def test_names_shrink_to_fit_many_workers(np: int, template: Template) -> None:
    model = ModelInfo(name="A_Very_Long_Model_Name_" * 5, digest="f" * 32)
    config = make_config(mpijob={"name_prefix": "a" * 20}, runs={"max_processes": 1000})
    req = parse_run_request(json.dumps({"ModelDigest": "x", "Mpi": {"Np": np}}).encode())
    run = validate_run(req, model, config.runs)
    rendered = render(run, model, config, template, stamps_for(req))
    assert len(rendered.name) <= names.MAX_NAME
    assert len(f"{rendered.name}-worker-{np - 1}") <= 63
    assert rendered.name.startswith("a" * 20 + "-a-very-long")
    assert rendered.mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == np
    validate_mpijob(rendered.mpijob)


def _valid_job(template: Template) -> dict[str, Any]:
    return render_case(CASES["ui-mpi"], template).mpijob


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2), "must be 1"),
        (lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"].pop("replicas"), "must be written"),
        (lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=0), "must be >= 1"),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Always"),
            "Never or OnFailure",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"].update(restartPolicy="ExitCode"),
            "Never or OnFailure",
        ),
        (lambda j: j["spec"]["runPolicy"].update(cleanPodPolicy="Some"), "cleanPodPolicy"),
        (lambda j: j["spec"]["runPolicy"].update(activeDeadlineSeconds=0), "must be > 0"),
        (lambda j: j["spec"]["runPolicy"].update(backoffLimit=-1), "must be >= 0"),
        (lambda j: j["spec"]["mpiReplicaSpecs"].pop("Launcher"), "Launcher is missing"),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"].update(
                containers=[]
            ),
            "has no container",
        ),
        (lambda j: j["metadata"].update(name="n" * 60), "not a DNS-1035 label"),
        (
            lambda j: (
                j["metadata"].update(name="n" * 56),
                j["spec"]["mpiReplicaSpecs"].pop("Worker"),
            ),
            "longer than 63",
        ),
        (lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=3), "do not fit"),
    ],
)
def test_operator_rules(change: Any, message: str, template: Template) -> None:
    job = _valid_job(template)
    check_operator_rules(job, 4)
    change(job)
    with pytest.raises(RenderError, match=message):
        check_operator_rules(job, 4)


def test_model_mismatch_and_unsafe_stamp_are_render_errors(template: Template) -> None:
    config = make_config()
    req = parse_run_request(b'{"ModelDigest": "x", "Mpi": {"Np": 1}}')
    run = validate_run(req, RISKPATHS, config.runs)
    with pytest.raises(RenderError, match="was checked for model"):
        render(run, NEWCASEBASED, config, template, stamps_for(req))
    bad = dataclasses.replace(stamps_for(req), run_stamp="../x")
    with pytest.raises(RenderError, match="cannot be used in names"):
        render(run, RISKPATHS, config, template, bad)


# --- the template -----------------------------------------------------------------------------


def test_builtin_template_is_identical_to_the_config_one() -> None:
    assert BUILTIN_TEMPLATE_PATH.read_bytes() == TEMPLATE_PATH.read_bytes()


def test_template_is_a_valid_mpijob_once_rendered_and_loads_cleanly(template: Template) -> None:
    assert template.source == str(TEMPLATE_PATH)
    assert template.manifest["kind"] == "MPIJob"


W = "spec.mpiReplicaSpecs.Worker"
L = "spec.mpiReplicaSpecs.Launcher"


def _edit(manifest: dict[str, Any], dotted: str, value: Any) -> None:
    """Set a dotted path (with [i] list indexes) in a manifest."""
    parts = dotted.replace("[", ".[").split(".")
    node: Any = manifest
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node.setdefault(part, {})
    last = parts[-1]
    if last.startswith("["):
        node[int(last[1:-1])] = value
    else:
        node[last] = value


LABELS = f"{W}.template.metadata.labels"


@pytest.mark.parametrize(
    ("dotted", "value", "key", "problem"),
    [
        (f"{W}.template.spec.nodeSelektor", {}, "", "unknown field (did you mean 'nodeSelector'?)"),
        (
            f"{W}.template.spec.containers[0].imagePullPolicyy",
            "Always",
            "",
            "unknown field (did you mean 'imagePullPolicy'?)",
        ),
        (
            f"{L}.template.spec.containers[0].env",
            [{"name": "A", "value": True}],
            f"{L}.template.spec.containers[0].env[0].value",
            "expected a string (quote it), got True",
        ),
        (
            f"{L}.template.spec.volumes[0].persistentVolumeClaim",
            {"claimNme": "x"},
            f"{L}.template.spec.volumes[0].persistentVolumeClaim.claimNme",
            "unknown field (did you mean 'claimName'?)",
        ),
        (f"{W}.template.spec.containers[0].resources.limits.cpu", "lots", "", "quantity"),
        (f"{W}.template.spec.containers[0].ports[0].containerPort", "22", "", "an integer"),
        (f"{W}.template.metadata.generateName", "x", "", "unknown field"),
        ("spec.slotsPerWorkers", 2, "", "unknown field (did you mean 'slotsPerWorker'?)"),
        ("spec.runPolicy.cleanPodPolicyy", "All", "", "unknown field"),
        ("spec.mpiReplicaSpecs.Launchr", {}, "", "unknown field"),
        ("spec.extra", 1, "", "unknown field"),
        ("status", {}, "", "unknown field"),
        # Written by the renderer:
        ("metadata.name", "fixed", "", "written by the proxy"),
        ("metadata.namespace", "kube-system", "", "written by the proxy"),
        ("spec.slotsPerWorker", 2, "", "mpijob.slots_per_worker"),
        ("spec.runPolicy.cleanPodPolicy", "All", "", "mpijob.clean_pod_policy"),
        ("spec.runPolicy.activeDeadlineSeconds", 60, "", "mpijob.active_deadline_seconds"),
        ("spec.runPolicy.backoffLimit", 3, "", "always writes 0"),
        (f"{L}.replicas", 2, "", "always writes 1"),
        (f"{L}.restartPolicy", "OnFailure", "", "always writes 'Never'"),
        (f"{W}.replicas", 4, "", "computes it"),
        (f"{W}.restartPolicy", "Always", "", "expected Never or OnFailure"),
        (f"{L}.template.spec.containers[0].command", ["sh"], "", "mpirun command"),
        (f"{L}.template.spec.containers[0].args", ["-x"], "", "mpirun command"),
        (f"{L}.template.spec.restartPolicy", "Never", "", "the operator sets it"),
        (
            f"{W}.template.spec.containers[0].resources.requests",
            {"cpu": "1"},
            f"{W}.template.spec.containers[0].resources.requests.cpu",
            "cpu_per_thread",
        ),
        (f"{L}.template.spec.volumes[0].name", "openmpp-run", "", "reserved"),
        (
            LABELS,
            {names.RUN_STAMP_KEY: "x"},
            f"{LABELS}.{names.RUN_STAMP_KEY}",
            "written by the proxy",
        ),
        ("spec.mpiImplementation", "MPICH", "", "expected OpenMPI"),
        ("spec.runLauncherAsWorker", True, "", "not supported"),
        ("spec.launcherCreationPolicy", "Later", "", "expected one of"),
        ("apiVersion", "kubeflow.org/v1", "", "expected kubeflow.org/v2beta1"),
        ("kind", "PyTorchJob", "", "expected MPIJob"),
    ],
)
def test_template_problems_name_the_file_and_the_dotted_key(
    dotted: str, value: Any, key: str, problem: str, template: Template
) -> None:
    manifest = copy.deepcopy(template.manifest)
    _edit(manifest, dotted, value)
    with pytest.raises(ConfigError) as info:
        check_template(manifest, "my-template.yaml")
    assert info.value.source == "my-template.yaml"
    assert info.value.key == (key or dotted)
    assert problem in info.value.problem
    assert str(info.value).startswith(f"my-template.yaml: {key or dotted}: ")


def test_template_with_a_typo_reports_the_exact_key(template: Template) -> None:
    manifest = copy.deepcopy(template.manifest)
    _edit(manifest, f"{W}.template.spec.containers[0].imagePullPolicyy", "Always")
    with pytest.raises(ConfigError) as info:
        check_template(manifest, "t.yaml")
    assert info.value.key == f"{W}.template.spec.containers[0].imagePullPolicyy"


def test_template_missing_parts() -> None:
    base: dict[str, Any] = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob"}
    with pytest.raises(ConfigError, match="spec: missing"):
        check_template(base, "t.yaml")
    with pytest.raises(ConfigError, match="Launcher: missing"):
        check_template({**base, "spec": {"mpiReplicaSpecs": {}}}, "t.yaml")
    pod = {"containers": [{"name": "c"}]}
    spec = {"mpiReplicaSpecs": {r: {"template": {"spec": pod}} for r in ("Launcher", "Worker")}}
    with pytest.raises(ConfigError, match=r"containers\[0\]\.image: missing"):
        check_template({**base, "spec": spec}, "t.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        check_template(["not", "a", "mapping"], "t.yaml")


def test_template_text_rejects_repeated_keys_and_bad_yaml() -> None:
    text = TEMPLATE_PATH.read_text(encoding="utf-8")
    with pytest.raises(ConfigError, match="kind: given twice"):
        parse_template(text + "kind: MPIJob\n", "t.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_template("a: [", "t.yaml")


def test_missing_template_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read the MPIJob template"):
        load_template(ROOT / "config" / "no-such-template.yaml")


def test_launcher_mount_conflict_with_ini_mount_dir(template: Template) -> None:
    manifest = copy.deepcopy(template.manifest)
    mounts = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    mounts["volumeMounts"].append({"name": "models", "mountPath": "/etc/openmpp-run"})
    conflicting = check_template(manifest, "t.yaml")
    config = make_config()
    req = parse_run_request(b'{"ModelDigest": "x", "Mpi": {"Np": 1}, "Tables": ["T1"]}')
    run = validate_run(req, RISKPATHS, config.runs)
    with pytest.raises(RenderError, match="already mounts something at /etc/openmpp-run"):
        render(run, RISKPATHS, config, conflicting, stamps_for(req))
