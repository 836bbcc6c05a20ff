"""The simulated MPI Operator: pods, conditions and Events of each MPIJob, per :class:`Scenario`."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import secrets
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from standins.kube.selectors import _labels_of
from standins.kube.store import (
    _JOB_NAME,
    _JOB_ROLE,
    _OPERATOR_NAME,
    _REPLICA_INDEX,
    CONFIGMAPS,
    EVENTS,
    MPIJOBS,
    PODS,
    Json,
    Scenario,
    Store,
    _LogLine,
    _now,
    _Run,
    _stamp_precise,
    _suffix,
)

if TYPE_CHECKING:
    pass

# --- the operator ---------------------------------------------------------------------------


class Operator(Store):
    """The store plus the simulated mpi-operator (and the kubelet and scheduler it needs)."""

    # -- the simulated operator ------------------------------------------------------------------

    def _start_operator(self, namespace: str, name: str, scenario: Scenario) -> None:
        run = _Run(scenario)
        self._runs[(namespace, name)] = run
        run.task = self._spawn(self._operate((namespace, name), run))

    def _stop_operator(self, key: tuple[str, str]) -> None:
        run = self._runs.pop(key, None)
        if run is not None and run.task is not None:
            run.task.cancel()

    def _on_suspend_change(self, key: tuple[str, str], suspend: bool) -> None:
        run = self._runs.get(key)
        job = self._store["mpijobs"][key]
        if run is None or _finished(job):
            return
        if not suspend:
            run.resumed.set()
            return
        if run.task is not None:
            run.task.cancel()
        self._delete_pods(job)
        run.task = self._spawn(self._operate(key, run))

    def _job(self, key: tuple[str, str]) -> Json:
        return self._store["mpijobs"][key]

    def _set_condition(self, job: Json, type_: str, status: str, reason: str, message: str) -> None:
        conditions = job.setdefault("status", {}).setdefault("conditions", [])
        now = _now()
        for condition in conditions:
            if condition["type"] == type_:
                if condition["status"] != status:
                    condition["lastTransitionTime"] = now
                condition.update(status=status, reason=reason, message=message, lastUpdateTime=now)
                return
        conditions.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            }
        )

    def _event(
        self,
        obj: Json,
        type_: str,
        reason: str,
        message: str,
        component: str = "mpi-job-controller",
    ) -> None:
        meta = obj["metadata"]
        now = _now()
        event: Json = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{self._event_clock():x}"},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": "",
        }
        if component == "default-scheduler":
            # The scheduler records through events.k8s.io/v1: seen through core/v1, such an
            # Event has only eventTime (microseconds), no source, timestamps or count.
            event.update(
                source={},
                firstTimestamp=None,
                lastTimestamp=None,
                count=None,
                eventTime=_stamp_precise(datetime.now(UTC)),
                action="Binding" if reason == "Scheduled" else "Scheduling",
                reportingInstance="default-scheduler-standin",
            )
        self._stamp(event, meta["namespace"])
        self._put(EVENTS, event, "ADDED")

    def _event_clock(self) -> int:
        """Nanoseconds for Event names, strictly increasing so names sort as events happened."""
        self._last_event_ns = max(time.time_ns(), self._last_event_ns + 1)
        return self._last_event_ns

    def _job_event(self, job: Json, type_: str, reason: str, text: str) -> None:
        meta = job["metadata"]
        self._event(job, type_, reason, f"MPIJob {meta['namespace']}/{meta['name']} {text}")

    async def _operate(self, key: tuple[str, str], run: _Run) -> None:
        """Drive one MPIJob through its scenario, as the operator, scheduler and kubelet would."""
        scenario = run.scenario
        if not run.created:
            await asyncio.sleep(scenario.created_after)
            job = self._job(key)
            problems = _operator_problems(job)
            if problems:  # the operator only reports this, as an Event (mpijob.md section 1)
                text = f"Found validation errors: [{', '.join(problems)}]"
                self._event(job, "Warning", "ValidationError", text)
                return
            message = f"MPIJob {key[0]}/{key[1]} is created."
            self._set_condition(job, "Created", "True", "MPIJobCreated", message)
            self._put(MPIJOBS, job, "MODIFIED")
            self._job_event(job, "Normal", "MPIJobCreated", "is created.")
            self._create_hostfile(job)
            run.created = True
        await self._while_suspended(key, run)
        job = self._job(key)
        launcher = self._create_pod(job, "launcher")
        workers = [self._create_pod(job, "worker", i) for i in range(_worker_replicas(job))]
        pods = [launcher, *workers]
        if scenario.kind == "unschedulable":
            for pod in pods:
                self._unschedulable(pod)
            return
        for index, pod in enumerate(pods):
            self._schedule(pod, index)
        if scenario.kind == "image-pull":
            for pod in pods:
                self._image_pull_backoff(pod)
            return
        await asyncio.sleep(scenario.running_after)
        for pod in pods:
            self._start_pod(pod)
        job = self._job(key)
        status = job.setdefault("status", {})
        status["startTime"] = _now()
        status["replicaStatuses"] = {"Launcher": {"active": 1}}
        if workers:
            status["replicaStatuses"]["Worker"] = {"active": len(workers)}
        self._set_condition(
            job, "Running", "True", "MPIJobRunning", f"MPIJob {key[0]}/{key[1]} is running."
        )
        self._put(MPIJOBS, job, "MODIFIED")
        self._job_event(job, "Normal", "MPIJobRunning", "is running")
        container = launcher["spec"]["containers"][0]["name"]
        for text in scenario.log_lines:
            await asyncio.sleep(scenario.line_interval)
            log_key = (key[0], launcher["metadata"]["name"], container)
            self._logs.setdefault(log_key, []).append(_LogLine(datetime.now(UTC), text))
            self._notify()
        failed = scenario.kind == "fail"
        self._finish(key, launcher, workers, scenario.exit_code if failed else None)

    async def _while_suspended(self, key: tuple[str, str], run: _Run) -> None:
        suspended = False
        while _suspend_requested(self._job(key)):
            job = self._job(key)
            if not _condition_true(job, "Suspended"):
                text = f"MPIJob {key[0]}/{key[1]} is suspended."
                if _condition_true(job, "Running"):
                    self._set_condition(job, "Running", "False", "MPIJobSuspended", text)
                self._set_condition(job, "Suspended", "True", "MPIJobSuspended", text)
                job.get("status", {}).pop("startTime", None)
                self._put(MPIJOBS, job, "MODIFIED")
                self._job_event(job, "Normal", "MPIJobSuspended", "is suspended.")
            suspended = True
            run.resumed.clear()
            await run.resumed.wait()
        if suspended:
            job = self._job(key)
            text = f"MPIJob {key[0]}/{key[1]} is resumed."
            self._set_condition(job, "Suspended", "False", "MPIJobResumed", text)
            self._put(MPIJOBS, job, "MODIFIED")
            self._job_event(job, "Normal", "MPIJobResumed", "is resumed.")

    def _finish(
        self, key: tuple[str, str], launcher: Json, workers: list[Json], exit_code: int | None
    ) -> None:
        """End the job: succeeded if ``exit_code`` is None, else failed with that exit code."""
        failed = exit_code is not None
        now = _now()
        container = launcher["spec"]["containers"][0]
        state = launcher["status"]["containerStatuses"][0]
        terminated: Json = {
            "exitCode": exit_code or 0,
            "reason": "Error" if failed else "Completed",
            "startedAt": state["state"]["running"]["startedAt"],
            "finishedAt": now,
            "containerID": state["containerID"],
        }
        if failed and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            log_key = (key[0], launcher["metadata"]["name"], container["name"])
            tail = "".join(f"{line.text}\n" for line in self._logs.get(log_key, [])[-80:])
            terminated["message"] = tail[-2048:]
        state.update(ready=False, started=False, state={"terminated": terminated})
        launcher["status"]["phase"] = "Failed" if failed else "Succeeded"
        for condition in launcher["status"]["conditions"]:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition.update(status="False", reason="PodFailed" if failed else "PodCompleted")
        self._put(PODS, launcher, "MODIFIED")

        job = self._job(key)
        status = job["status"]
        status["completionTime"] = now
        status["replicaStatuses"]["Launcher"] = {"failed": 1} if failed else {"succeeded": 1}
        if failed:
            reason, text = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            self._set_condition(job, "Failed", "True", reason, text)
        else:
            reason, text = "MPIJobSucceeded", f"MPIJob {key[0]}/{key[1]} successfully completed."
            self._set_condition(job, "Succeeded", "True", reason, text)
        for condition in status["conditions"]:  # as the operator does: only the status flips
            if condition["type"] == "Running":
                condition["status"] = "False"
        policy = job["spec"].get("runPolicy", {}).get("cleanPodPolicy", "None")
        if workers and policy in ("Running", "All"):
            status["replicaStatuses"]["Worker"] = {}
            for worker in workers:
                self._remove(PODS, key[0], worker["metadata"]["name"])
        self._put(MPIJOBS, job, "MODIFIED")
        if failed:
            self._event(job, "Warning", reason, text)
        else:
            self._job_event(job, "Normal", reason, "successfully completed.")

    def _create_hostfile(self, job: Json) -> None:
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        slots = job["spec"].get("slotsPerWorker", 1)
        hosts = "".join(
            f"{name}-worker-{i}.{name}.{ns}.svc slots={slots}\n"
            for i in range(_worker_replicas(job))
        )
        config_map: Json = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{name}-config",
                "labels": {"app": name},
                "ownerReferences": [_owner_reference(job)],
            },
            "data": {"hostfile": hosts},
        }
        if (ns, f"{name}-config") not in self._store["configmaps"]:
            self._stamp(config_map, ns)
            self._put(CONFIGMAPS, config_map, "ADDED")

    def _create_pod(self, job: Json, role: str, index: int = 0) -> Json:
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        replica = job["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
        template = copy.deepcopy(replica.get("template") or {})
        template_meta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        labels = {**template_meta.get("labels", {}), _OPERATOR_NAME: "mpi-operator"}
        labels |= {_JOB_NAME: name, _JOB_ROLE: role}
        if role == "worker":
            pod_name = f"{name}-worker-{index}"
            labels[_REPLICA_INDEX] = str(index)
            spec |= {"hostname": pod_name, "subdomain": name}
        else:
            pod_name = f"{name}-launcher-{_suffix()}"
        default_restart = "OnFailure" if role == "launcher" else "Never"
        spec["restartPolicy"] = replica.get("restartPolicy") or default_restart
        containers = spec.get("containers") or []
        if containers:
            env = containers[0].setdefault("env", [])
            env.append({"name": "K_MPI_JOB_ROLE", "value": role})
        pod: Json = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": labels,
                "annotations": template_meta.get("annotations", {}),
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": []},
        }
        self._stamp(pod, ns)
        self._put(PODS, pod, "ADDED")
        return pod

    def _container_statuses(self, pod: Json, state: Json, ready: bool) -> list[Json]:
        return [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                "state": copy.deepcopy(state),
            }
            for c in pod["spec"].get("containers", [])
        ]

    def _unschedulable(self, pod: Json) -> None:
        message = "0/3 nodes are available: 3 Insufficient cpu."
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        condition |= {"message": message, "lastTransitionTime": _now()}
        pod["status"]["conditions"] = [condition]
        self._put(PODS, pod, "MODIFIED")
        self._event(pod, "Warning", "FailedScheduling", message, "default-scheduler")

    def _schedule(self, pod: Json, index: int) -> None:
        node = f"fake-node-{index % 3}"
        pod["spec"]["nodeName"] = node
        now = _now()
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
        ]
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        pod["status"]["containerStatuses"] = self._container_statuses(pod, waiting, False)
        self._put(PODS, pod, "MODIFIED")
        meta = pod["metadata"]
        text = f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"
        self._event(pod, "Normal", "Scheduled", text, "default-scheduler")

    def _image_pull_backoff(self, pod: Json) -> None:
        image = pod["spec"]["containers"][0].get("image", "")
        back_off = f'Back-off pulling image "{image}"'
        waiting = {"waiting": {"reason": "ImagePullBackOff", "message": back_off}}
        pod["status"]["containerStatuses"] = self._container_statuses(pod, waiting, False)
        self._put(PODS, pod, "MODIFIED")
        pull_error = (
            f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and '
            f'unpack image "{image}": not found'
        )
        self._event(pod, "Warning", "Failed", pull_error, "kubelet")
        self._event(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet")
        self._event(pod, "Warning", "BackOff", back_off, "kubelet")

    def _start_pod(self, pod: Json) -> None:
        now = _now()
        self._pod_ips += 1
        status = pod["status"]
        status |= {"phase": "Running", "startTime": now, "hostIP": "10.0.0.1"}
        status["podIP"] = f"10.244.{self._pod_ips // 250}.{self._pod_ips % 250 + 2}"
        status["conditions"] = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        running = {"running": {"startedAt": now}}
        status["containerStatuses"] = self._container_statuses(pod, running, True)
        for container_status in status["containerStatuses"]:
            container_status["containerID"] = f"containerd://{secrets.token_hex(32)}"
        self._put(PODS, pod, "MODIFIED")
        self._event(pod, "Normal", "Started", "Started container", "kubelet")

    def _pods_of_job(self, namespace: str, name: str, role: str | None = None) -> list[Json]:
        return [
            pod
            for (ns, _), pod in sorted(self._store["pods"].items())
            if ns == namespace
            and _labels_of(pod).get(_JOB_NAME) == name
            and role in (None, _labels_of(pod).get(_JOB_ROLE))
        ]

    def _delete_pods(self, job: Json) -> None:
        meta = job["metadata"]
        for kind, obj in list(self._dependents(meta["namespace"], meta["uid"])):
            if kind is PODS:
                self._remove(PODS, meta["namespace"], obj["metadata"]["name"])


# --- small pure helpers about objects -----------------------------------------------------------


def _event_line(change_type: str, obj: Json) -> bytes:
    return json.dumps({"type": change_type, "object": obj}).encode() + b"\n"


def _owner_reference(owner: Json) -> Json:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _container_state(pod: Json, container: str) -> Json:
    for status in pod.get("status", {}).get("containerStatuses", []):
        if status["name"] == container:
            state: Json = status.get("state", {})
            return state
    return {"waiting": {"reason": "ContainerCreating"}}


def _operator_problems(job: Json) -> list[str]:
    """What the operator's own validation rejects (pkg/apis/kubeflow/validation), abridged."""
    specs = job.get("spec", {}).get("mpiReplicaSpecs")
    specs = specs if isinstance(specs, dict) else {}
    problems = []
    launcher = specs.get("Launcher")
    if not isinstance(launcher, dict):
        problems.append("spec.mpiReplicaSpecs[Launcher]: Required value: must have Launcher")
    else:
        if launcher.get("replicas", 1) != 1:
            replicas = launcher.get("replicas")
            problems.append(
                f"spec.mpiReplicaSpecs[Launcher].replicas: Invalid value: {replicas}: must be 1"
            )
        if not ((launcher.get("template") or {}).get("spec") or {}).get("containers"):
            problems.append(
                "spec.mpiReplicaSpecs[Launcher].template.spec.containers: Required value: "
                "must define at least one container"
            )
    worker = specs.get("Worker")
    if isinstance(worker, dict) and not (
        isinstance(worker.get("replicas"), int) and worker["replicas"] >= 1
    ):
        problems.append(
            f"spec.mpiReplicaSpecs[Worker].replicas: Invalid value: {worker.get('replicas', 0)}: "
            "must be greater than or equal to 1"
        )
    for role, spec in specs.items():
        policy = spec.get("restartPolicy") if isinstance(spec, dict) else None
        if policy not in (None, "Never", "OnFailure"):
            problems.append(
                f'spec.mpiReplicaSpecs[{role}].restartPolicy: Unsupported value: "{policy}": '
                'supported values: "Never", "OnFailure"'
            )
    last_worker = f"{job['metadata']['name']}-worker-{max(_worker_replicas(job) - 1, 0)}"
    if len(last_worker) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", last_worker):
        problems.append(
            f'metadata.name: Invalid value: "{job["metadata"]["name"]}": will not able to create '
            "pod and service with invalid DNS label"
        )
    return problems


def _worker_replicas(job: Json) -> int:
    worker = (job.get("spec", {}).get("mpiReplicaSpecs") or {}).get("Worker") or {}
    replicas = worker.get("replicas", 0) if isinstance(worker, dict) else 0
    return replicas if isinstance(replicas, int) else 0


def _suspend_requested(job: Json) -> bool:
    return bool((job.get("spec", {}).get("runPolicy") or {}).get("suspend"))


def _condition_true(job: Json, type_: str) -> bool:
    conditions = job.get("status", {}).get("conditions", [])
    return any(c["type"] == type_ and c["status"] == "True" for c in conditions)


def _finished(job: Json) -> bool:
    return _condition_true(job, "Succeeded") or _condition_true(job, "Failed")
