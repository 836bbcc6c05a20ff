"""The Kubernetes stand-in, exercised only through the real kubernetes_asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from standins.kube import (
    DEFAULT_LOG_LINES,
    SCHEMA_CRD,
    FakeKube,
    Fault,
    Scenario,
    find_crd,
    running,
    write_kubeconfig,
)

G, V, NS, P = "kubeflow.org", "v2beta1", "default", "mpijobs"
JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"


def mpijob(name: str = "run-1", workers: int = 2, labels: dict[str, str] | None = None) -> Any:
    """A minimal valid v2beta1 MPIJob."""
    container = {"name": "model", "image": "ompp/model:1.0"}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "slotsPerWorker": 1,
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 0},
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {"spec": {"containers": [dict(container, command=["mpirun"])]}},
                },
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "Never",
                    "template": {"spec": {"containers": [container]}},
                },
            },
        },
    }


def status_of(err: ApiException) -> Any:
    return json.loads(err.body)


def condition(job: Any, type_: str) -> Any:
    return next(
        (c for c in job.get("status", {}).get("conditions", []) if c["type"] == type_), None
    )


def has_condition(kube: FakeKube, name: str, type_: str, status: str = "True") -> bool:
    job = kube.get_object("mpijobs", NS, name)
    found = condition(job, type_) if job else None
    return found is not None and found["status"] == status


async def watch_all(func: Any, *args: Any, **kwargs: Any) -> list[Any]:
    """Every event of a watch that ends by itself (give ``timeout_seconds``)."""
    async with watch.Watch() as w:
        return [event async for event in w.stream(func, *args, **kwargs)]


def launcher_of(kube: FakeKube, name: str) -> Any:
    pods = [
        p
        for p in kube.objects("pods", NS)
        if p["metadata"]["labels"].get(JOB_NAME) == name
        and p["metadata"]["labels"].get(JOB_ROLE) == "launcher"
    ]
    return pods[0] if pods else None


@pytest.fixture
def custom(kube_api: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api)


@pytest.fixture
def core(kube_api: Any) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api)


# --- create, get, list, admission ---------------------------------------------------------------


async def test_create_get_list_and_server_metadata(
    fake_kube: FakeKube, kube_api: Any, custom: client.CustomObjectsApi
) -> None:
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    body = mpijob()
    body["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    created = await custom.create_namespaced_custom_object(G, V, NS, P, body)
    meta = created["metadata"]
    assert meta["namespace"] == NS
    assert meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z")
    assert len(meta["uid"]) == 36
    assert "status" not in created  # the status subresource ignores it on create
    assert created["spec"]["mpiImplementation"] == "OpenMPI"  # CRD default applied
    fetched = await custom.get_namespaced_custom_object(G, V, NS, P, "run-1")
    assert fetched == created
    listing = await custom.list_namespaced_custom_object(G, V, NS, P)
    assert listing["kind"] == "MPIJobList"
    assert [i["metadata"]["name"] for i in listing["items"]] == ["run-1"]
    assert int(listing["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])

    version = await client.VersionApi(kube_api).get_code()
    assert (version.major, version.git_version) == ("1", "v1.35.4")  # as the e2e plane
    resources = await custom.get_api_resources(G, V)
    assert resources.resources[0].name == "mpijobs"


async def test_duplicate_name_is_409_already_exists(custom: client.CustomObjectsApi) -> None:
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    assert caught.value.status == 409
    assert status_of(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'mpijobs.kubeflow.org "run-1" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "run-1", "group": "kubeflow.org", "kind": "mpijobs"},
        "code": 409,
    }


def _with(path: list[str], value: Any, name: str = "bad") -> Any:
    body = mpijob(name)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("body", "field", "cause_reason", "fragment"),
    [
        (
            _with(["spec", "mpiReplicaSpecs", "Launcher", "replicas"], "x"),
            "spec.mpiReplicaSpecs.Launcher.replicas",
            "FieldValueTypeInvalid",
            "must be of type integer",
        ),
        (
            _with(["spec", "mpiImplementation"], "LAM"),
            "spec.mpiImplementation",
            "FieldValueNotSupported",
            'supported values: "OpenMPI", "Intel", "MPICH"',
        ),
        (
            _with(["spec", "mpiReplicaSpecs"], None),  # null is pruned, then missing
            "spec.mpiReplicaSpecs",
            "FieldValueRequired",
            "Required value",
        ),
        (
            _with(["spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers"], [{}]),
            "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].name",
            "FieldValueRequired",
            "Required value",
        ),
        (
            _with(["metadata", "name"], "Bad_Name", name="Bad_Name"),
            "metadata.name",
            "FieldValueInvalid",
            "a lowercase RFC 1123 subdomain",
        ),
        (
            _with(["metadata", "name"], "x" * 254, name="x" * 254),
            "metadata.name",
            "FieldValueInvalid",
            "must be no more than 253 characters",
        ),
        (
            _with(["metadata", "labels"], {"run": "not ok!"}),
            "metadata.labels",
            "FieldValueInvalid",
            "a valid label must be an empty string",
        ),
    ],
)
async def test_schema_and_metadata_violations_are_422(
    fake_kube: FakeKube,
    custom: client.CustomObjectsApi,
    body: Any,
    field: str,
    cause_reason: str,
    fragment: str,
) -> None:
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, NS, P, copy.deepcopy(body))
    assert caught.value.status == 422
    status = status_of(caught.value)
    name = body["metadata"]["name"]
    assert status["reason"] == "Invalid"
    assert status["message"].startswith(f'MPIJob.kubeflow.org "{name}" is invalid: {field}: ')
    assert status["details"]["kind"] == "mpijobs"
    causes = status["details"]["causes"]
    assert {c["field"] for c in causes} == {field}
    assert causes[0]["reason"] == cause_reason
    assert fragment in causes[0]["message"]
    assert fake_kube.objects("mpijobs") == []


async def test_missing_required_field_names_it(custom: client.CustomObjectsApi) -> None:
    body = mpijob()
    del body["spec"]["mpiReplicaSpecs"]
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, NS, P, body)
    cause = status_of(caught.value)["details"]["causes"][0]
    assert cause == {
        "reason": "FieldValueRequired",
        "message": "Required value",
        "field": "spec.mpiReplicaSpecs",
    }


async def test_unknown_fields_strict_warn_ignore(custom: client.CustomObjectsApi) -> None:
    body = mpijob()
    body["spec"]["foo"] = 1
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["bar"] = 2
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(
            G, V, NS, P, copy.deepcopy(body), field_validation="Strict"
        )
    assert caught.value.status == 400
    assert status_of(caught.value)["reason"] == "BadRequest"
    assert status_of(caught.value)["message"] == (
        'strict decoding error: unknown field "spec.foo", unknown field '
        '"spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].bar"'
    )

    created, code, headers = await custom.create_namespaced_custom_object_with_http_info(
        G, V, NS, P, copy.deepcopy(body)
    )
    assert code == 201
    assert "foo" not in created["spec"]
    assert headers.getall("Warning") == [
        '299 - "unknown field \\"spec.foo\\""',
        '299 - "unknown field \\"spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].bar\\""',
    ]

    body["metadata"]["name"] = "run-2"
    _, _, headers = await custom.create_namespaced_custom_object_with_http_info(
        G, V, NS, P, body, field_validation="Ignore"
    )
    assert "Warning" not in headers


async def test_dry_run_validates_but_persists_nothing(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    answer = await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(), dry_run="All")
    assert answer["metadata"]["uid"]
    assert "resourceVersion" not in answer["metadata"]
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, NS, P, _with(["spec"], 1), dry_run="All")
    assert caught.value.status == 422
    await asyncio.sleep(0.1)  # longer than the operator would take to react
    assert (await custom.list_namespaced_custom_object(G, V, NS, P))["items"] == []
    assert (await core.list_namespaced_event(NS)).items == []
    assert fake_kube.objects("pods") == []
    assert fake_kube.requests[0].query["dryRun"] == "All"


async def test_generate_name_and_core_configmap(
    custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    body = mpijob()
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "run-"
    created = await custom.create_namespaced_custom_object(G, V, NS, P, body)
    assert created["metadata"]["name"].startswith("run-")
    assert len(created["metadata"]["name"]) == len("run-") + 5

    cm = {"metadata": {"name": "ini"}, "data": {"run.ini": "[OpenM]\n"}, "extra": 1}
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_config_map(NS, cm, field_validation="Strict")
    assert status_of(caught.value)["message"] == 'strict decoding error: unknown field "extra"'
    del cm["extra"]
    made = await core.create_namespaced_config_map(NS, cm)
    assert made.kind == "ConfigMap"
    assert made.data == {"run.ini": "[OpenM]\n"}
    assert (await core.read_namespaced_config_map("ini", NS)).metadata.uid == made.metadata.uid
    await core.delete_namespaced_config_map("ini", NS)
    with pytest.raises(ApiException) as caught:
        await core.read_namespaced_config_map("ini", NS)
    assert status_of(caught.value)["details"] == {"name": "ini", "kind": "configmaps"}


# --- selectors, watch -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label_selector", "expected"),
    [
        ("app=a", ["j1", "j2"]),
        ("app==a", ["j1", "j2"]),
        ("app!=a", ["j3"]),
        ("tier", ["j1", "j3"]),
        ("!tier", ["j2"]),
        ("app in (a,b),tier", ["j1", "j3"]),
        ("app notin (a)", ["j3"]),
        ("app=a,tier=x", ["j1"]),
    ],
)
async def test_label_selector(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, label_selector: str, expected: list[str]
) -> None:
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    for name, labels in (
        ("j1", {"app": "a", "tier": "x"}),
        ("j2", {"app": "a"}),
        ("j3", {"app": "b", "tier": "y"}),
    ):
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(name, labels=labels))
    listing = await custom.list_namespaced_custom_object(G, V, NS, P, label_selector=label_selector)
    assert [i["metadata"]["name"] for i in listing["items"]] == expected


async def test_field_selector_and_bad_selectors(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    for name in ("j1", "j2"):
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(name))
    listing = await custom.list_namespaced_custom_object(
        G, V, NS, P, field_selector="metadata.name=j2"
    )
    assert [i["metadata"]["name"] for i in listing["items"]] == ["j2"]
    for kwargs in ({"field_selector": "spec.slotsPerWorker=1"}, {"label_selector": "a=(b"}):
        with pytest.raises(ApiException) as caught:
            await custom.list_namespaced_custom_object(G, V, NS, P, **kwargs)
        assert caught.value.status == 400


async def test_watch_sees_added_and_modified(
    custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "first"}})  # rv 0 is "any"
    start = (await custom.list_namespaced_custom_object(G, V, NS, P))["metadata"]["resourceVersion"]
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    seen: list[tuple[str, Any]] = []
    async with watch.Watch() as w:
        async for event in w.stream(
            custom.list_namespaced_custom_object,
            G,
            V,
            NS,
            P,
            resource_version=start,
            timeout_seconds=5,
            allow_watch_bookmarks=True,
        ):
            seen.append((event["type"], event["object"]))
            if condition(event["object"], "Created"):
                break
    assert seen[0][0] == "ADDED"
    assert seen[-1][0] == "MODIFIED"
    assert condition(seen[-1][1], "Created")["reason"] == "MPIJobCreated"
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in seen]
    assert versions == sorted(versions)


async def test_watch_without_resource_version_lists_first_then_ends_on_timeout(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    fake_kube.bookmark_interval = 0.2
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    events = await watch_all(
        custom.list_namespaced_custom_object,
        G,
        V,
        NS,
        P,
        timeout_seconds=3,  # bookmarks stop 2 s before the end
        allow_watch_bookmarks=True,
    )
    types = [event["type"] for event in events]
    assert types[0] == "ADDED"
    assert "BOOKMARK" in types


async def test_bookmarks_come_as_from_the_watch_cache(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    """By default, as kube-apiserver's watch cache: no bookmark every second, but one 2 s before
    ``timeoutSeconds`` ends (then one a minute); it carries the newest resourceVersion of the
    watched kind, which a change the selector leaves out moves on and another kind does not."""
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    mine = await custom.create_namespaced_custom_object(
        G, V, NS, P, mpijob("mine", labels={"team": "a"})
    )
    loop = asyncio.get_running_loop()
    began = loop.time()

    async def other_changes() -> str:
        await asyncio.sleep(0.3)
        theirs = mpijob("theirs", labels={"team": "b"})
        other = await custom.create_namespaced_custom_object(G, V, NS, P, theirs)
        await core.create_namespaced_config_map(NS, {"metadata": {"name": "newer"}})
        return str(other["metadata"]["resourceVersion"])

    changes = asyncio.create_task(other_changes())
    seen: list[tuple[str, float, str]] = []
    async with watch.Watch() as w:
        async for event in w.stream(
            custom.list_namespaced_custom_object,
            G,
            V,
            NS,
            P,
            label_selector="team=a",
            resource_version=mine["metadata"]["resourceVersion"],
            timeout_seconds=4,
            allow_watch_bookmarks=True,
        ):
            rv = event["object"]["metadata"]["resourceVersion"]
            seen.append((event["type"], loop.time() - began, rv))
    theirs_rv = await changes
    ((kind, at, rv),) = seen
    assert kind == "BOOKMARK"
    assert 1.5 <= at < 3.0, at  # 2 s before the 4 s timeout
    assert rv == theirs_rv  # not the ConfigMap's, which is newer


async def test_watch_from_a_compacted_version_is_410(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.set_scenario(Scenario(kind="no-operator"))
    created = await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob("run-2"))
    fake_kube.compact()
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob("run-3"))
    old = created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as caught:
        await watch_all(
            custom.list_namespaced_custom_object,
            G,
            V,
            NS,
            P,
            resource_version=old,
            timeout_seconds=2,
        )
    assert caught.value.status == 410
    assert caught.value.reason.startswith("Expired: too old resource version")


# --- the simulated operator -----------------------------------------------------------------


async def test_success_scenario_pods_labels_log_and_conditions(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    lines = [f"line {i}" for i in range(8)]
    fake_kube.set_scenario(Scenario(log_lines=lines, line_interval=0.05))
    job = await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=3))
    uid = job["metadata"]["uid"]
    await fake_kube.wait_until(lambda: fake_kube.launcher_log("run-1").count("\n") >= 2)

    pods = await core.list_namespaced_pod(NS, label_selector=f"{JOB_NAME}=run-1")
    by_name = {p.metadata.name: p for p in pods.items}
    workers = [f"run-1-worker-{i}" for i in range(3)]
    assert set(workers) <= set(by_name)
    launchers = await core.list_namespaced_pod(
        NS, label_selector=f"{JOB_NAME}=run-1,{JOB_ROLE}=launcher"
    )
    (launcher,) = launchers.items
    launcher = by_name[launcher.metadata.name]
    assert launcher.metadata.name.startswith("run-1-launcher-")
    assert len(launcher.metadata.name) == len("run-1-launcher-") + 5
    assert launcher.metadata.labels["training.kubeflow.org/operator-name"] == "mpi-operator"
    assert by_name["run-1-worker-2"].metadata.labels["training.kubeflow.org/replica-index"] == "2"
    launcher_job = await client.BatchV1Api(custom.api_client).read_namespaced_job(
        "run-1-launcher", NS
    )
    for pod in pods.items:
        (ref,) = pod.metadata.owner_references
        if pod is launcher:
            assert (ref.kind, ref.name, ref.uid) == (
                "Job",
                "run-1-launcher",
                launcher_job.metadata.uid,
            )
        else:
            assert (ref.kind, ref.name, ref.uid) == ("MPIJob", "run-1", uid)
        assert ref.controller
        assert ref.block_owner_deletion
        assert pod.status.phase == "Running"
        assert pod.spec.containers[0].image == "ompp/model:1.0"
    assert launcher.spec.containers[0].command == ["mpirun"]
    running_job = await custom.get_namespaced_custom_object(G, V, NS, P, "run-1")
    assert condition(running_job, "Running")["status"] == "True"
    assert running_job["status"]["replicaStatuses"] == {
        "Launcher": {"active": 1},
        "Worker": {"active": 3},
    }
    assert running_job["status"]["startTime"]

    partial = await core.read_namespaced_pod_log(launcher.metadata.name, NS)
    assert 2 <= partial.count("\n") < len(lines)
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Succeeded"))
    full = await core.read_namespaced_pod_log(launcher.metadata.name, NS)
    assert full == "".join(f"{line}\n" for line in lines)
    tail = await core.read_namespaced_pod_log(launcher.metadata.name, NS, tail_lines=2)
    assert tail == "line 6\nline 7\n"

    done = await custom.get_namespaced_custom_object(G, V, NS, P, "run-1")
    assert condition(done, "Succeeded")["reason"] == "MPIJobSucceeded"
    assert condition(done, "Running")["status"] == "False"
    assert done["status"]["completionTime"]
    finished = await core.read_namespaced_pod(launcher.metadata.name, NS)
    assert finished.status.phase == "Succeeded"
    assert finished.status.container_statuses[0].state.terminated.exit_code == 0
    hostfile = await core.read_namespaced_config_map("run-1-config", NS)
    assert hostfile.data["hostfile"].startswith("run-1-worker-0.run-1.default.svc slots=1\n")


async def test_follow_log_streams_until_the_launcher_ends(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Running"))
    launcher = launcher_of(fake_kube, "run-1")["metadata"]["name"]
    async with watch.Watch() as w:
        streamed = [line async for line in w.stream(core.read_namespaced_pod_log, launcher, NS)]
    assert "".join(streamed) == "".join(f"{line}\n" for line in DEFAULT_LOG_LINES)


async def test_pod_watch_reports_phases(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))
    phases: list[tuple[str, str]] = []
    async with watch.Watch() as w:
        async for event in w.stream(
            core.list_namespaced_pod,
            NS,
            label_selector=f"{JOB_ROLE}=launcher",
            resource_version="1",
            timeout_seconds=5,
        ):
            phases.append((event["type"], event["object"].status.phase))
            if event["object"].status.phase == "Succeeded":
                break
    assert phases[0] == ("ADDED", "Pending")
    assert ("MODIFIED", "Running") in phases


async def test_fail_scenario(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    fake_kube.set_scenario(Scenario(kind="fail", exit_code=3, log_lines=["boom"]))
    body = mpijob()
    launcher_container = body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    launcher_container["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    await custom.create_namespaced_custom_object(G, V, NS, P, body)
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Failed"))
    job = await custom.get_namespaced_custom_object_status(G, V, NS, P, "run-1")
    assert condition(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert condition(job, "Running")["status"] == "False"
    assert condition(job, "Succeeded") is None
    assert job["status"]["replicaStatuses"]["Launcher"] == {"failed": 1}
    pod = await core.read_namespaced_pod(launcher_of(fake_kube, "run-1")["metadata"]["name"], NS)
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason, terminated.message) == (3, "Error", "boom\n")
    events = await core.list_namespaced_event(
        NS, field_selector="involvedObject.kind=MPIJob,involvedObject.name=run-1,type=Warning"
    )
    assert [e.reason for e in events.items] == ["BackoffLimitExceeded"]


async def test_image_pull_scenario(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    fake_kube.set_scenario(Scenario(kind="image-pull"))
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))

    def backing_off() -> bool:
        pod = launcher_of(fake_kube, "run-1")
        return pod is not None and "containerStatuses" in pod["status"]

    await fake_kube.wait_until(backing_off)
    name = launcher_of(fake_kube, "run-1")["metadata"]["name"]
    pod = await core.read_namespaced_pod(name, NS)
    assert pod.status.phase == "Pending"
    waiting = pod.status.container_statuses[0].state.waiting
    assert waiting.reason == "ImagePullBackOff"
    assert waiting.message == 'Back-off pulling image "ompp/model:1.0"'
    events = await core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}")
    warnings = {(e.reason, e.type) for e in events.items if e.type == "Warning"}
    assert warnings == {("Failed", "Warning"), ("BackOff", "Warning")}
    with pytest.raises(ApiException) as caught:
        await core.read_namespaced_pod_log(name, NS)
    assert caught.value.status == 400
    assert status_of(caught.value)["message"] == (
        f'container "model" in pod "{name}" is waiting to start: trying and failing to pull image'
    )
    job = fake_kube.get_object("MPIJob", NS, "run-1")
    assert job is not None
    assert condition(job, "Created") is not None
    assert condition(job, "Running") is None


async def test_unschedulable_scenario(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    fake_kube.set_scenario(Scenario(kind="unschedulable"))
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=2))
    await fake_kube.wait_until(
        lambda: sum(e["reason"] == "FailedScheduling" for e in fake_kube.objects("events")) == 3
    )
    pods = (await core.list_namespaced_pod(NS, label_selector=f"{JOB_NAME}=run-1")).items
    assert len(pods) == 3
    for pod in pods:
        assert pod.status.phase == "Pending"
        (scheduled,) = pod.status.conditions
        assert (scheduled.type, scheduled.status, scheduled.reason) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
        assert scheduled.message == (  # kube-scheduler v1.35: filter, then PostFilter verdicts
            "0/3 nodes are available: 3 Insufficient cpu. no new claims to deallocate, "
            "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
        )
        assert scheduled.observed_generation == pod.metadata.generation == 1
    events = await core.list_namespaced_event(NS, field_selector="reason=FailedScheduling")
    assert len(events.items) == 3
    assert all(e.type == "Warning" and e.involved_object.kind == "Pod" for e in events.items)
    # an unscheduled pod has no log yet: the real API server answers 204 with no body
    assert await core.read_namespaced_pod_log(pods[0].metadata.name, NS) in (None, "")


async def test_operator_validation_error_is_only_an_event(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    body = mpijob()
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2  # the schema allows it
    await custom.create_namespaced_custom_object(G, V, NS, P, body)
    await fake_kube.wait_until(lambda: bool(fake_kube.objects("events")))
    (event,) = (await core.list_namespaced_event(NS)).items
    assert (event.type, event.reason) == ("Warning", "ValidationError")
    assert "spec.mpiReplicaSpecs[Launcher].replicas" in event.message
    job = await custom.get_namespaced_custom_object(G, V, NS, P, "run-1")
    assert "status" not in job
    assert fake_kube.objects("pods") == []


async def test_suspended_scenario_then_resume_by_merge_patch(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.set_scenario(Scenario(kind="suspended"))
    created = await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))
    assert created["spec"]["runPolicy"]["suspend"] is True  # as Kueue's webhook does
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Suspended"))
    assert condition(fake_kube.get_object("mpijobs", NS, "run-1"), "Created") is not None
    assert fake_kube.objects("pods") == []

    resume = {"spec": {"runPolicy": {"suspend": False}}}
    with pytest.raises(ApiException) as caught:  # a dict is sent as a JSON patch by default
        await custom.patch_namespaced_custom_object(G, V, NS, P, "run-1", resume)
    assert "cannot unmarshal object" in status_of(caught.value)["message"]
    merge = "application/merge-patch+json"
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, **resume}
    with pytest.raises(ApiException) as caught:  # the operator has changed the job since
        await custom.patch_namespaced_custom_object(
            G, V, NS, P, "run-1", stale, _content_type=merge
        )
    assert status_of(caught.value)["reason"] == "Conflict"
    patched = await custom.patch_namespaced_custom_object(
        G, V, NS, P, "run-1", resume, _content_type=merge
    )
    assert patched["metadata"]["generation"] == 2
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Succeeded"))
    job = fake_kube.get_object("mpijobs", NS, "run-1")
    assert condition(job, "Suspended")["status"] == "False"
    assert condition(job, "Suspended")["reason"] == "MPIJobResumed"


async def test_suspending_a_running_job_by_json_patch_removes_its_pods(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.set_scenario(Scenario(log_lines=["x"] * 100, line_interval=0.05))
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=2))
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Running"))
    suspend = [{"op": "replace", "path": "/spec/runPolicy/suspend", "value": True}]
    await custom.patch_namespaced_custom_object(G, V, NS, P, "run-1", suspend)
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Suspended"))
    assert fake_kube.objects("pods") == []
    assert has_condition(fake_kube, "run-1", "Running", "False")
    with pytest.raises(ApiException) as caught:
        await custom.patch_namespaced_custom_object(
            G, V, NS, P, "run-1", {}, _content_type="application/strategic-merge-patch+json"
        )
    assert caught.value.status == 415


async def test_clean_pod_policy_running_removes_workers_after_success(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    body = mpijob(workers=2)
    body["spec"]["runPolicy"]["cleanPodPolicy"] = "Running"
    await custom.create_namespaced_custom_object(G, V, NS, P, body)
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Succeeded"))
    roles = [p["metadata"]["labels"][JOB_ROLE] for p in fake_kube.objects("pods")]
    assert roles == ["launcher"]


async def test_launcher_is_a_batch_job_that_owns_its_pod(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    """As mpi-operator v0.8 and the job-controller: a batch/v1 Job ``<name>-launcher`` owned
    by the MPIJob owns the launcher pod; a headless Service and an SSH Secret for the job; the
    Job's Events (SuccessfulCreate, then Completed) as a real cluster records them."""
    batch = client.BatchV1Api(custom.api_client)
    body = mpijob(workers=2)
    body["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 3600
    job = await custom.create_namespaced_custom_object(G, V, NS, P, body)
    async with watch.Watch() as w:  # the Job is watched into being
        async for event in w.stream(batch.list_namespaced_job, NS, timeout_seconds=5):
            if event["object"].metadata.name == "run-1-launcher":
                assert event["type"] == "ADDED"
                break
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Succeeded"))

    launcher_job = await batch.read_namespaced_job("run-1-launcher", NS)
    (ref,) = launcher_job.metadata.owner_references
    assert (ref.kind, ref.name, ref.uid) == ("MPIJob", "run-1", job["metadata"]["uid"])
    spec = launcher_job.spec
    assert (spec.backoff_limit, spec.completions, spec.parallelism) == (0, 1, 1)
    assert spec.ttl_seconds_after_finished == 3600
    uid = launcher_job.metadata.uid
    assert spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert launcher_job.status.succeeded == 1
    assert {(c.type, c.status) for c in launcher_job.status.conditions} == {
        ("SuccessCriteriaMet", "True"),
        ("Complete", "True"),
    }
    (listed,) = (await batch.list_namespaced_job(NS)).items
    assert listed.metadata.name == "run-1-launcher"

    (pod,) = (await core.list_namespaced_pod(NS, label_selector="job-name=run-1-launcher")).items
    name = pod.metadata.name
    assert name.startswith("run-1-launcher-")
    assert len(name) == len("run-1-launcher-") + 5
    (ref,) = pod.metadata.owner_references
    assert (ref.api_version, ref.kind, ref.name, ref.uid) == (
        "batch/v1",
        "Job",
        "run-1-launcher",
        uid,
    )
    labels = pod.metadata.labels
    assert labels["batch.kubernetes.io/job-name"] == "run-1-launcher"
    assert labels["controller-uid"] == labels["batch.kubernetes.io/controller-uid"] == uid
    assert labels[JOB_ROLE] == "launcher"
    assert labels[JOB_NAME] == "run-1"
    assert labels["training.kubeflow.org/operator-name"] == "mpi-operator"
    assert (pod.spec.hostname, pod.spec.subdomain) == ("run-1-launcher", "run-1")

    service = await core.read_namespaced_service("run-1", NS)
    assert service.spec.cluster_ip == "None"
    assert service.spec.selector == {
        "training.kubeflow.org/operator-name": "mpi-operator",
        JOB_NAME: "run-1",
    }
    assert service.metadata.owner_references[0].name == "run-1"
    secret = await core.read_namespaced_secret("run-1-ssh", NS)
    assert secret.type == "kubernetes.io/ssh-auth"
    assert set(secret.data) == {"ssh-privatekey", "ssh-publickey"}

    events = await core.list_namespaced_event(
        NS, field_selector="involvedObject.kind=Job,involvedObject.name=run-1-launcher"
    )
    assert [(e.type, e.reason, e.message, e.source.component) for e in events.items] == [
        ("Normal", "SuccessfulCreate", f"Created pod: {name}", "job-controller"),
        ("Normal", "Completed", "Job completed", "job-controller"),
    ]

    await custom.delete_namespaced_custom_object(G, V, NS, P, "run-1")  # Background
    assert (await batch.list_namespaced_job(NS)).items == []
    assert (await core.list_namespaced_pod(NS)).items == []
    assert (await core.list_namespaced_service(NS)).items == []
    assert (await core.list_namespaced_secret(NS)).items == []
    assert (await core.list_namespaced_config_map(NS)).items == []


async def test_wait_for_workers_ready_creates_the_launcher_job_after_the_workers(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    """launcherCreationPolicy WaitForWorkersReady (our template's): no launcher Job while a
    worker is not Ready; once they all are, the Job and its pod."""
    fake_kube.set_scenario(Scenario(kind="unschedulable"), "stuck")
    for name in ("stuck", "run-1"):
        body = mpijob(name, workers=2)
        body["spec"]["launcherCreationPolicy"] = "WaitForWorkersReady"
        await custom.create_namespaced_custom_object(G, V, NS, P, body)
    seen: list[tuple[str, str, str]] = []
    async with watch.Watch() as w:
        async for event in w.stream(
            core.list_namespaced_pod,
            NS,
            label_selector=f"{JOB_NAME}=run-1",
            resource_version="1",
            timeout_seconds=5,
        ):
            pod = event["object"]
            seen.append((event["type"], pod.metadata.name, pod.status.phase))
            if pod.metadata.labels[JOB_ROLE] == "launcher" and pod.status.phase == "Succeeded":
                break
    launcher_added = next(i for i, (t, n, _) in enumerate(seen) if "-launcher-" in n)
    workers_running = [
        i for i, (t, n, ph) in enumerate(seen) if "-worker-" in n and ph == "Running"
    ]
    assert len(workers_running) == 2
    assert max(workers_running) < launcher_added
    assert fake_kube.get_object("jobs", NS, "stuck-launcher") is None
    assert launcher_of(fake_kube, "stuck") is None
    stuck = [p for p in fake_kube.objects("pods") if p["metadata"]["labels"][JOB_NAME] == "stuck"]
    assert [p["status"]["phase"] for p in stuck] == ["Pending", "Pending"]


async def test_failed_launcher_fails_its_job(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    fake_kube.set_scenario(Scenario(kind="fail", log_lines=["boom"]))
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Failed"))
    launcher_job = await client.BatchV1Api(custom.api_client).read_namespaced_job(
        "run-1-launcher", NS
    )
    assert launcher_job.status.failed == 1
    failed = {c.type: c for c in launcher_job.status.conditions}
    assert (failed["Failed"].status, failed["Failed"].reason) == ("True", "BackoffLimitExceeded")
    events = await core.list_namespaced_event(
        NS, field_selector="involvedObject.name=run-1-launcher,type=Warning"
    )
    assert [(e.reason, e.message) for e in events.items] == [
        ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    ]


async def test_ttl_after_finished_deletes_the_launcher_job_and_pod(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    """runPolicy.ttlSecondsAfterFinished reaches the Job: the TTL controller deletes the
    finished Job and the garbage collector its pod; the MPIJob and its workers stay."""
    body = mpijob(workers=1)
    body["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 0
    await custom.create_namespaced_custom_object(G, V, NS, P, body)
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Succeeded"))
    await fake_kube.wait_until(lambda: not fake_kube.objects("jobs"))
    assert launcher_of(fake_kube, "run-1") is None
    assert fake_kube.get_object("mpijobs", NS, "run-1") is not None
    assert [p["metadata"]["name"] for p in fake_kube.objects("pods")] == ["run-1-worker-0"]


async def test_suspending_suspends_the_launcher_job(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.set_scenario(Scenario(log_lines=["x"] * 100, line_interval=0.05))
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Running"))
    suspend = [{"op": "replace", "path": "/spec/runPolicy/suspend", "value": True}]
    await custom.patch_namespaced_custom_object(G, V, NS, P, "run-1", suspend)
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Suspended"))
    launcher_job = fake_kube.get_object("jobs", NS, "run-1-launcher")
    assert launcher_job is not None
    assert launcher_job["spec"]["suspend"] is True
    assert fake_kube.objects("pods") == []
    resume = {"spec": {"runPolicy": {"suspend": False}}}
    merge = "application/merge-patch+json"
    await custom.patch_namespaced_custom_object(G, V, NS, P, "run-1", resume, _content_type=merge)
    await fake_kube.wait_until(lambda: launcher_of(fake_kube, "run-1") is not None)
    reasons = [
        e["reason"]
        for e in fake_kube.objects("events")
        if e["involvedObject"]["name"] == "run-1-launcher"
    ]
    assert reasons == ["SuccessfulCreate", "Suspended", "Resumed", "SuccessfulCreate"]


async def test_pod_conditions_carry_observed_generation(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    """Kubernetes 1.35 (PodObservedGenerationTracking, GA): every pod condition and the pod's
    status carry observedGeneration."""
    fake_kube.set_scenario(Scenario(log_lines=["x"] * 100, line_interval=0.05))
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Running"))
    for pod in (await core.list_namespaced_pod(NS)).items:
        assert pod.status.observed_generation == pod.metadata.generation == 1
        types = [c.type for c in pod.status.conditions]
        assert "PodScheduled" in types
        assert "Ready" in types
        assert all(c.observed_generation == 1 for c in pod.status.conditions)


# --- deletion ------------------------------------------------------------------------------------


async def test_foreground_delete_cascades_then_removes_the_job(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    fake_kube.set_scenario(Scenario(log_lines=["x"] * 100, line_interval=0.05))
    job = await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=2))
    owner = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "name": "run-1",
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    ini = {"metadata": {"name": "run-1-ini", "ownerReferences": [owner]}, "data": {"a": "b"}}
    await core.create_namespaced_config_map(NS, ini)
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Running"))
    start = (await custom.list_namespaced_custom_object(G, V, NS, P))["metadata"]["resourceVersion"]

    answer = await custom.delete_namespaced_custom_object(
        G, V, NS, P, "run-1", propagation_policy="Foreground"
    )
    assert answer["metadata"]["deletionTimestamp"]
    assert answer["metadata"]["finalizers"] == ["foregroundDeletion"]
    events: list[str] = []
    async with watch.Watch() as w:
        async for event in w.stream(
            custom.list_namespaced_custom_object,
            G,
            V,
            NS,
            P,
            resource_version=start,
            timeout_seconds=5,
        ):
            events.append(event["type"])
            if event["type"] == "DELETED":
                break
    assert events[0] == "MODIFIED"
    assert events[-1] == "DELETED"
    assert (await core.list_namespaced_pod(NS)).items == []
    assert (await core.list_namespaced_config_map(NS)).items == []
    assert (await client.BatchV1Api(core.api_client).list_namespaced_job(NS)).items == []
    assert (await core.list_namespaced_service(NS)).items == []
    assert (await core.list_namespaced_secret(NS)).items == []
    with pytest.raises(ApiException) as caught:
        await custom.get_namespaced_custom_object(G, V, NS, P, "run-1")
    assert status_of(caught.value)["message"] == 'mpijobs.kubeflow.org "run-1" not found'
    assert status_of(caught.value)["details"] == {
        "name": "run-1",
        "group": "kubeflow.org",
        "kind": "mpijobs",
    }


async def test_background_delete_is_immediate_and_orphan_keeps_pods(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    fake_kube.set_scenario(Scenario(log_lines=["x"] * 100, line_interval=0.05))
    for name in ("bg", "orphan"):
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(name, workers=1))
    await fake_kube.wait_until(
        lambda: (
            has_condition(fake_kube, "bg", "Running")
            and has_condition(fake_kube, "orphan", "Running")
        )
    )
    answer = await custom.delete_namespaced_custom_object(G, V, NS, P, "bg")
    assert (answer["kind"], answer["status"]) == ("Status", "Success")
    assert answer["details"]["name"] == "bg"
    left = await core.list_namespaced_pod(NS, label_selector=f"{JOB_NAME}=bg")
    assert left.items == []
    assert fake_kube.get_object("configmaps", NS, "bg-config") is None

    await custom.delete_namespaced_custom_object(
        G, V, NS, P, "orphan", body={"propagationPolicy": "Orphan"}
    )
    kept = (await core.list_namespaced_pod(NS, label_selector=f"{JOB_NAME}=orphan")).items
    assert len(kept) == 2
    owners = {p.metadata.labels[JOB_ROLE]: p.metadata.owner_references for p in kept}
    assert not owners["worker"]
    assert [ref.name for ref in owners["launcher"]] == ["orphan-launcher"]  # the Job's, kept
    launcher_job = fake_kube.get_object("jobs", NS, "orphan-launcher")
    assert launcher_job is not None
    assert not launcher_job["metadata"]["ownerReferences"]


# --- failures -----------------------------------------------------------------------------------


async def test_fault_429_with_retry_after(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.add_fault(Fault("POST", "mpijobs", status=429, retry_after=2))
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    assert caught.value.status == 429
    assert caught.value.headers["Retry-After"] == "2"
    status = status_of(caught.value)
    assert (status["reason"], status["details"]) == ("TooManyRequests", {"retryAfterSeconds": 2})
    assert fake_kube.objects("mpijobs") == []
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())  # the fault was used up


@pytest.mark.parametrize(
    ("code", "reason"), [(500, "InternalError"), (503, "ServiceUnavailable"), (504, "Timeout")]
)
async def test_fault_server_errors(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, code: int, reason: str
) -> None:
    fake_kube.add_fault(Fault("GET", "mpijobs", status=code, times=2))
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            await custom.list_namespaced_custom_object(G, V, NS, P)
        assert (caught.value.status, status_of(caught.value)["reason"]) == (code, reason)
    await custom.list_namespaced_custom_object(G, V, NS, P)


async def test_fault_on_watch_only(fake_kube: FakeKube, custom: client.CustomObjectsApi) -> None:
    fake_kube.add_fault(Fault("GET", "mpijobs", verb="watch", status=500))
    await custom.list_namespaced_custom_object(G, V, NS, P)
    with pytest.raises(ApiException) as caught:
        await watch_all(custom.list_namespaced_custom_object, G, V, NS, P, timeout_seconds=1)
    assert caught.value.status == 500


async def test_fault_drop_before_applies_nothing(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.add_fault(Fault("POST", "mpijobs", drop_before=True))
    with pytest.raises(aiohttp.ClientError):
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    assert fake_kube.objects("mpijobs") == []


async def test_fault_drop_after_applies_the_create(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.add_fault(Fault("POST", "mpijobs", drop_after=True))
    with pytest.raises(aiohttp.ClientError):
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    assert [j["metadata"]["name"] for j in fake_kube.objects("mpijobs")] == ["run-1"]
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    assert caught.value.status == 409


async def test_fault_delay(fake_kube: FakeKube, custom: client.CustomObjectsApi) -> None:
    fake_kube.add_fault(Fault("GET", "mpijobs", delay=0.5))
    with pytest.raises(asyncio.TimeoutError):
        await custom.list_namespaced_custom_object(G, V, NS, P, _request_timeout=0.1)


async def test_down_drops_requests_and_open_watches_until_up(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    async def watch_until_it_ends() -> None:
        async with watch.Watch() as w:
            async for _ in w.stream(
                custom.list_namespaced_custom_object, G, V, NS, P, timeout_seconds=30
            ):
                pass

    watching = asyncio.create_task(watch_until_it_ends())
    await fake_kube.wait_until(lambda: any(r.verb == "watch" for r in fake_kube.requests))
    await asyncio.sleep(0.05)
    fake_kube.down()
    async with asyncio.timeout(2):
        with pytest.raises(aiohttp.ClientError):
            await custom.list_namespaced_custom_object(G, V, NS, P)
        with contextlib.suppress(aiohttp.ClientError):  # a cut chunked stream may raise
            await watching
    fake_kube.up()
    assert (await custom.list_namespaced_custom_object(G, V, NS, P))["items"] == []


async def test_bearer_token_is_required(kube_connect: Any) -> None:
    kube = FakeKube(token="s3cret")
    for token in (None, "wrong"):
        api = await kube_connect(kube, token=token)
        with pytest.raises(ApiException) as caught:
            await client.CustomObjectsApi(api).list_namespaced_custom_object(G, V, NS, P)
        assert caught.value.status == 401
        assert status_of(caught.value)["reason"] == "Unauthorized"
    api = await kube_connect(kube, token="s3cret")
    assert (await client.CustomObjectsApi(api).list_namespaced_custom_object(G, V, NS, P))[
        "items"
    ] == []


async def test_forbid_gives_rbac_403(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    fake_kube.forbid("create", "mpijobs")
    fake_kube.forbid("get", "pods/log")
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob())
    assert caught.value.status == 403
    status = status_of(caught.value)
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        'mpijobs.kubeflow.org is forbidden: User "system:serviceaccount:default:oms-mpijob-proxy" '
        'cannot create resource "mpijobs" in API group "kubeflow.org" in the namespace "default"'
    )
    with pytest.raises(ApiException) as caught:
        await core.read_namespaced_pod_log("p", NS)
    assert status_of(caught.value)["message"].startswith(
        'pods "p" is forbidden: User "system:serviceaccount:default:oms-mpijob-proxy" '
        'cannot get resource "pods/log" in API group ""'
    )
    await custom.list_namespaced_custom_object(G, V, NS, P)


async def test_quota_exceeded_is_403_even_in_dry_run(
    fake_kube: FakeKube, custom: client.CustomObjectsApi
) -> None:
    fake_kube.quota_exceeded = "mpijobs, requested: count/mpijobs.kubeflow.org=1"
    for dry_run in ("All", None):
        with pytest.raises(ApiException) as caught:
            await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(), dry_run=dry_run)
        assert caught.value.status == 403
        assert status_of(caught.value)["message"] == (
            'mpijobs.kubeflow.org "run-1" is forbidden: exceeded quota: '
            "mpijobs, requested: count/mpijobs.kubeflow.org=1"
        )


async def test_missing_crd_is_404_for_mpijobs_only(kube_connect: Any) -> None:
    api = await kube_connect(FakeKube(crd_installed=False))
    custom = client.CustomObjectsApi(api)
    for call in (
        custom.create_namespaced_custom_object(G, V, NS, P, mpijob()),
        custom.list_namespaced_custom_object(G, V, NS, P),
        custom.get_api_resources(G, V),
    ):
        with pytest.raises(ApiException) as caught:
            await call
        assert caught.value.status == 404
        body = caught.value.body
        assert (body.decode() if isinstance(body, bytes) else body) == "404 page not found\n"
    assert (await client.CoreV1Api(api).list_namespaced_pod(NS)).items == []


async def test_missing_namespace(custom: client.CustomObjectsApi) -> None:
    with pytest.raises(ApiException) as caught:
        await custom.create_namespaced_custom_object(G, V, "nope", P, mpijob())
    assert caught.value.status == 404
    status = status_of(caught.value)
    assert status["message"] == 'namespaces "nope" not found'
    assert status["details"] == {"name": "nope", "kind": "namespaces"}
    assert (await custom.list_namespaced_custom_object(G, V, "nope", P))["items"] == []


async def test_a_namespaced_service_account_is_forbidden_in_any_other_namespace(
    kube_connect: Any,
) -> None:
    """RBAC comes first: a token whose Role is bound in one namespace gets the real 403 in
    another one, whether it exists or not (an admin lists nothing and creates into a 404)."""
    kube = FakeKube(namespaces=("openmpp", "other"))
    kube.grant("sa-token", "openmpp")
    custom = client.CustomObjectsApi(await kube_connect(kube, token="sa-token"))
    user = "system:serviceaccount:openmpp:oms-mpijob-proxy"
    for namespace in ("other", "nope"):
        for verb, call in (
            ("list", custom.list_namespaced_custom_object(G, V, namespace, P)),
            ("create", custom.create_namespaced_custom_object(G, V, namespace, P, mpijob())),
        ):
            with pytest.raises(ApiException) as caught:
                await call
            assert caught.value.status == 403
            status = status_of(caught.value)
            assert status["reason"] == "Forbidden"
            assert status["message"] == (
                f'mpijobs.kubeflow.org is forbidden: User "{user}" cannot {verb} resource '
                f'"mpijobs" in API group "kubeflow.org" in the namespace "{namespace}"'
            )
    assert (await custom.list_namespaced_custom_object(G, V, "openmpp", P))["items"] == []
    await custom.create_namespaced_custom_object(G, V, "openmpp", P, mpijob())

    admin = client.CustomObjectsApi(await kube_connect(kube))
    assert (await admin.list_namespaced_custom_object(G, V, "nope", P))["items"] == []
    with pytest.raises(ApiException) as caught:
        await admin.create_namespaced_custom_object(G, V, "nope", P, mpijob())
    assert status_of(caught.value)["message"] == 'namespaces "nope" not found'


async def test_preload_content_false_does_not_raise_on_errors(core: client.CoreV1Api) -> None:
    """kubernetes_asyncio raises ApiException only when it preloads the body."""
    response = await core.read_namespaced_pod_log("missing", NS, _preload_content=False)
    assert response.status == 404
    assert json.loads(await response.read())["reason"] == "NotFound"
    response.release()


# --- events, recording, helpers ------------------------------------------------------------


async def test_events_by_field_selector(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    for name in ("run-1", "run-2"):
        await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(name, workers=1))
    await fake_kube.wait_until(
        lambda: (
            has_condition(fake_kube, "run-1", "Succeeded")
            and has_condition(fake_kube, "run-2", "Succeeded")
        )
    )
    events = await core.list_namespaced_event(
        NS, field_selector="involvedObject.kind=MPIJob,involvedObject.name=run-1"
    )
    assert [(e.type, e.reason) for e in events.items] == [
        ("Normal", "MPIJobCreated"),
        ("Normal", "MPIJobRunning"),
        ("Normal", "MPIJobSucceeded"),
    ]
    event = events.items[0]
    assert event.message == "MPIJob default/run-1 is created."
    assert event.count == 1
    assert event.first_timestamp == event.last_timestamp
    launcher = launcher_of(fake_kube, "run-1")
    by_uid = await core.list_namespaced_event(
        NS, field_selector=f"involvedObject.uid={launcher['metadata']['uid']}"
    )
    assert [e.reason for e in by_uid.items] == ["Scheduled", "Started"]
    with pytest.raises(ApiException) as caught:
        await core.list_namespaced_event(NS, field_selector="involvedObject.color=red")
    assert caught.value.status == 400


async def test_requests_are_recorded_with_rbac_attributes(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    await custom.create_namespaced_custom_object(G, V, NS, P, mpijob(workers=1))
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "ini"}})
    await custom.get_namespaced_custom_object(G, V, NS, P, "run-1")
    async with watch.Watch() as w:
        async for _ in w.stream(
            custom.list_namespaced_custom_object, G, V, NS, P, timeout_seconds=1
        ):
            break
    await fake_kube.wait_until(lambda: has_condition(fake_kube, "run-1", "Succeeded"))
    launcher = launcher_of(fake_kube, "run-1")["metadata"]["name"]
    await core.read_namespaced_pod_log(launcher, NS)
    await core.list_namespaced_pod(NS, label_selector=f"{JOB_NAME}=run-1")
    await core.list_namespaced_event(NS)
    await custom.delete_namespaced_custom_object(G, V, NS, P, "run-1")
    await client.VersionApi(custom.api_client).get_code()

    assert fake_kube.rbac_verbs() == {
        ("kubeflow.org", "mpijobs", "create"),
        ("kubeflow.org", "mpijobs", "get"),
        ("kubeflow.org", "mpijobs", "watch"),
        ("kubeflow.org", "mpijobs", "delete"),
        ("", "configmaps", "create"),
        ("", "pods/log", "get"),
        ("", "pods", "list"),
        ("", "events", "list"),
    }
    first = fake_kube.requests[0]
    assert (first.method, first.verb, first.namespace, first.name) == ("POST", "create", NS, "")
    assert first.body["metadata"]["name"] == "run-1"
    assert fake_kube.requests[-1].path == "/version/"


async def test_running_and_write_kubeconfig(tmp_path: Path) -> None:
    async with running(FakeKube(namespaces=("models",))) as url:
        path = write_kubeconfig(tmp_path / "config", url, token="t", namespace="models")
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["clusters"][0]["cluster"]["server"] == url
        assert doc["users"][0]["user"] == {"token": "t"}
        assert doc["contexts"][0]["context"]["namespace"] == "models"
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(path), client_configuration=cfg)
        async with client.ApiClient(configuration=cfg) as api:
            listing = await client.CoreV1Api(api).list_namespaced_pod("models")
    assert listing.items == []


def test_find_crd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = tmp_path / "crd.yaml"
    given.write_text("{}", encoding="utf-8")
    assert find_crd(given) == given
    monkeypatch.setenv("OMS_MPIJOB_PROXY_CRD", str(given))
    assert find_crd() == given
    monkeypatch.setenv("OMS_MPIJOB_PROXY_CRD", str(tmp_path / "absent.yaml"))
    with pytest.raises(FileNotFoundError, match=r"absent\.yaml"):
        find_crd()
    monkeypatch.delenv("OMS_MPIJOB_PROXY_CRD")
    assert find_crd() == SCHEMA_CRD
    assert SCHEMA_CRD.is_file()
    assert SCHEMA_CRD.resolve().is_relative_to(Path(__file__).resolve().parents[1])


# --- finalizers, and the ConfigMap size limit ----------------------------------------------------


@pytest.mark.parametrize("policy", ["Background", "Foreground"])
async def test_a_finalizer_holds_a_deleted_job_until_it_is_removed(
    fake_kube: FakeKube, custom: client.CustomObjectsApi, core: client.CoreV1Api, policy: str
) -> None:
    body = mpijob()
    body["metadata"]["finalizers"] = ["example.org/keep"]
    job = await custom.create_namespaced_custom_object(G, V, NS, P, body)
    owner = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "name": "run-1",
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    ini = {"metadata": {"name": "run-1-ini", "ownerReferences": [owner]}, "data": {"a": "b"}}
    await core.create_namespaced_config_map(NS, ini)
    await custom.delete_namespaced_custom_object(G, V, NS, P, "run-1", propagation_policy=policy)
    await asyncio.sleep(fake_kube.foreground_delay * 3)
    held = fake_kube.get_object("mpijobs", NS, "run-1")
    assert held is not None  # terminating, as on a real API server
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["finalizers"] == ["example.org/keep"]
    # Background: the dependents wait for the owner; Foreground: they went first.
    dependent = fake_kube.get_object("configmaps", NS, "run-1-ini")
    assert (dependent is None) == (policy == "Foreground")
    # No new finalizer on a terminating object.
    with pytest.raises(ApiException) as err:
        await custom.patch_namespaced_custom_object(
            G,
            V,
            NS,
            P,
            "run-1",
            {"metadata": {"finalizers": ["example.org/keep", "other/x"]}},
            _content_type="application/merge-patch+json",
        )
    assert err.value.status == 422
    rv = held["metadata"]["resourceVersion"]
    await custom.patch_namespaced_custom_object(
        G,
        V,
        NS,
        P,
        "run-1",
        {"metadata": {"resourceVersion": rv, "finalizers": []}},
        _content_type="application/merge-patch+json",
    )
    assert fake_kube.get_object("mpijobs", NS, "run-1") is None
    assert fake_kube.get_object("configmaps", NS, "run-1-ini") is None


async def test_a_configmap_over_1_mib_is_invalid(core: client.CoreV1Api) -> None:
    import base64

    big = base64.b64encode(b"\0" * ((1 << 20) + 1)).decode()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # aiohttp: a body over 1 MiB
        with pytest.raises(ApiException) as err:
            await core.create_namespaced_config_map(
                NS, {"metadata": {"name": "big"}, "binaryData": {"x": big}}
            )
    assert err.value.status == 422
    assert "must have at most 1048576 bytes" in status_of(err.value)["message"]
    ok = base64.b64encode(b"\0" * 1000).decode()
    await core.create_namespaced_config_map(
        NS, {"metadata": {"name": "small", "labels": {"k": "v"}}, "binaryData": {"x": ok}}
    )
    listed = await core.list_namespaced_config_map(NS, label_selector="k=v")
    assert [c.metadata.name for c in listed.items] == ["small"]
