"""The simulated MPI Operator: pods, conditions and Events of each MPIJob, per :class:`Scenario`."""

from __future__ import annotations

import asyncio
import base64
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
    JOBS,
    MPIJOBS,
    PODS,
    SECRETS,
    SERVICES,
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
            self._create_service(job)
            self._create_ssh_secret(job)
            run.created = True
        if _suspend_requested(self._job(key)):  # the operator creates the launcher Job suspended
            self._launcher_job(self._job(key))
        await self._while_suspended(key, run)
        job = self._job(key)
        workers = [self._create_pod(job, "worker", i) for i in range(_worker_replicas(job))]
        # launcherCreationPolicy WaitForWorkersReady: the launcher Job only once every worker
        # is Ready; AtStartup (the default): at once.
        wait_for_workers = job["spec"].get("launcherCreationPolicy") == "WaitForWorkersReady"
        launcher = None if wait_for_workers else self._create_launcher(job)
        pods = [*workers] if launcher is None else [launcher, *workers]
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
        if launcher is None:
            launcher = self._create_launcher(self._job(key))
            self._schedule(launcher, len(pods))
            self._start_pod(launcher)
        batch_job = self._store["jobs"].get((key[0], f"{key[1]}-launcher"))
        if batch_job is not None:  # the job-controller counts its ready pod
            batch_job["status"]["ready"] = 1
            self._put(JOBS, batch_job, "MODIFIED")
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
        self._finish_launcher_job(key, failed)

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

    def _create_service(self, job: Json) -> None:
        """The headless Service ``<name>`` that gives the workers their DNS names."""
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        service: Json = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "labels": {"app": name},
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": {
                "clusterIP": "None",
                "clusterIPs": ["None"],
                "selector": {_OPERATOR_NAME: "mpi-operator", _JOB_NAME: name},
                "type": "ClusterIP",
                "sessionAffinity": "None",
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
                "internalTrafficPolicy": "Cluster",
            },
            "status": {"loadBalancer": {}},
        }
        if (ns, name) not in self._store["services"]:
            self._stamp(service, ns)
            self._put(SERVICES, service, "ADDED")

    def _create_ssh_secret(self, job: Json) -> None:
        """The ``<name>-ssh`` Secret (kubernetes.io/ssh-auth) the launcher and workers mount."""
        meta = job["metadata"]
        ns, name = meta["namespace"], f"{meta['name']}-ssh"
        key = base64.b64encode(secrets.token_bytes(96)).decode()
        private = f"-----BEGIN EC PRIVATE KEY-----\n{key}\n-----END EC PRIVATE KEY-----\n"
        public = f"ecdsa-sha2-nistp521 {base64.b64encode(secrets.token_bytes(64)).decode()}\n"
        secret: Json = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "labels": {"app": meta["name"]},
                "ownerReferences": [_owner_reference(job)],
            },
            "type": "kubernetes.io/ssh-auth",
            "data": {
                "ssh-privatekey": base64.b64encode(private.encode()).decode(),
                "ssh-publickey": base64.b64encode(public.encode()).decode(),
            },
        }
        if (ns, name) not in self._store["secrets"]:
            self._stamp(secret, ns)
            self._put(SECRETS, secret, "ADDED")

    def _launcher_job(self, job: Json) -> Json:
        """The batch/v1 Job ``<name>-launcher`` (mpi-operator's newLauncherJob, as the API
        server defaults it), created if missing; suspended while the MPIJob is."""
        meta = job["metadata"]
        ns, name = meta["namespace"], f"{meta['name']}-launcher"
        existing = self._store["jobs"].get((ns, name))
        if existing is not None:
            return existing
        run_policy = job["spec"].get("runPolicy") or {}
        spec: Json = {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": run_policy.get("backoffLimit", 6),
            "completionMode": "NonIndexed",
            "suspend": _suspend_requested(job),
            "podReplacementPolicy": "Failed",
            "manualSelector": False,
        }
        for field in ("activeDeadlineSeconds", "ttlSecondsAfterFinished"):
            if run_policy.get(field) is not None:
                spec[field] = run_policy[field]
        batch_job: Json = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "labels": {"app": meta["name"]},
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": spec,
            "status": {},
        }
        self._stamp(batch_job, ns)
        uid = batch_job["metadata"]["uid"]
        spec["selector"] = {"matchLabels": {_JOB_CONTROLLER_UID: uid}}
        spec["template"] = {"metadata": {"labels": _job_pod_labels(name, uid)}}
        if spec["suspend"]:
            self._set_job_condition(batch_job, "Suspended", "True", "JobSuspended", "Job suspended")
        self._put(JOBS, batch_job, "ADDED")
        if spec["suspend"]:
            self._event(batch_job, "Normal", "Suspended", "Job suspended", "job-controller")
        return batch_job

    def _create_launcher(self, job: Json) -> Json:
        """The launcher Job (un-suspended) and, as its job-controller does, its one pod."""
        batch_job = self._launcher_job(job)
        meta = batch_job["metadata"]
        status = batch_job["status"]
        resumed = batch_job["spec"]["suspend"]
        if resumed:
            batch_job["spec"]["suspend"] = False
            self._set_job_condition(batch_job, "Suspended", "False", "JobResumed", "Job resumed")
            self._event(batch_job, "Normal", "Resumed", "Job resumed", "job-controller")
        status.setdefault("startTime", _now())
        pod = self._create_pod(
            job,
            "launcher",
            owner=batch_job,
            labels=_job_pod_labels(meta["name"], meta["uid"]),
        )
        status |= {"active": 1, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}}
        self._put(JOBS, batch_job, "MODIFIED")
        created = f"Created pod: {pod['metadata']['name']}"
        self._event(batch_job, "Normal", "SuccessfulCreate", created, "job-controller")
        return pod

    def _set_job_condition(
        self, batch_job: Json, type_: str, status: str, reason: str, message: str
    ) -> None:
        conditions = batch_job["status"].setdefault("conditions", [])
        now = _now()
        condition = {"type": type_, "status": status, "reason": reason, "message": message}
        condition |= {"lastProbeTime": now, "lastTransitionTime": now}
        for index, old in enumerate(conditions):
            if old["type"] == type_:
                conditions[index] = condition
                return
        conditions.append(condition)

    def _suspend_launcher_job(self, job: Json) -> None:
        """Suspend the launcher Job: its job-controller deletes its pod."""
        meta = job["metadata"]
        batch_job = self._store["jobs"].get((meta["namespace"], f"{meta['name']}-launcher"))
        if batch_job is None or batch_job["spec"]["suspend"]:
            return
        for kind, obj in list(self._dependents(meta["namespace"], batch_job["metadata"]["uid"])):
            if kind is PODS:
                self._remove(PODS, meta["namespace"], obj["metadata"]["name"])
        batch_job["spec"]["suspend"] = True
        batch_job["status"] |= {"active": 0, "ready": 0}
        batch_job["status"].pop("startTime", None)
        self._set_job_condition(batch_job, "Suspended", "True", "JobSuspended", "Job suspended")
        self._put(JOBS, batch_job, "MODIFIED")
        self._event(batch_job, "Normal", "Suspended", "Job suspended", "job-controller")

    def _finish_launcher_job(self, key: tuple[str, str], failed: bool) -> None:
        """The job-controller's verdict on the launcher Job (backoffLimit 0: one failure ends
        it), and the TTL-after-finished controller's deletion of it later."""
        batch_job = self._store["jobs"].get((key[0], f"{key[1]}-launcher"))
        if batch_job is None:
            return
        status = batch_job["status"]
        status.pop("active", None)
        status["ready"] = 0
        if failed:
            status["failed"] = 1
            text = "Job has reached the specified backoff limit"
            for type_ in ("FailureTarget", "Failed"):
                self._set_job_condition(batch_job, type_, "True", "BackoffLimitExceeded", text)
        else:
            status["succeeded"] = 1
            status["completionTime"] = _now()
            text = "Reached expected number of succeeded pods"
            for type_ in ("SuccessCriteriaMet", "Complete"):
                self._set_job_condition(batch_job, type_, "True", "CompletionsReached", text)
        self._put(JOBS, batch_job, "MODIFIED")
        if failed:
            self._event(batch_job, "Warning", "BackoffLimitExceeded", text, "job-controller")
        else:
            self._event(batch_job, "Normal", "Completed", "Job completed", "job-controller")
        ttl = batch_job["spec"].get("ttlSecondsAfterFinished")
        if ttl is not None:
            self._spawn(self._expire_job(key[0], batch_job["metadata"]["name"], batch_job, ttl))

    async def _expire_job(self, namespace: str, name: str, batch_job: Json, ttl: float) -> None:
        """The TTL-after-finished controller: delete a finished Job (and so its pod)."""
        await asyncio.sleep(ttl)
        current = self._store["jobs"].get((namespace, name))
        if current is not None and current["metadata"]["uid"] == batch_job["metadata"]["uid"]:
            self._remove(JOBS, namespace, name)
            self._cascade(namespace, current["metadata"]["uid"])

    def _create_pod(
        self,
        job: Json,
        role: str,
        index: int = 0,
        *,
        owner: Json | None = None,
        labels: dict[str, str] | None = None,
    ) -> Json:
        """A launcher or worker pod, owned by ``owner`` (default: the MPIJob), with ``labels``
        added to the template's and the operator's."""
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        replica = job["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
        template = copy.deepcopy(replica.get("template") or {})
        template_meta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        pod_labels = {**template_meta.get("labels", {}), _OPERATOR_NAME: "mpi-operator"}
        pod_labels |= {_JOB_NAME: name, _JOB_ROLE: role, **(labels or {})}
        if role == "worker":
            pod_name = f"{name}-worker-{index}"
            pod_labels[_REPLICA_INDEX] = str(index)
            spec |= {"hostname": pod_name, "subdomain": name}
        else:
            pod_name = f"{name}-launcher-{_suffix()}"
            spec |= {"hostname": f"{name}-launcher", "subdomain": name}
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
                "labels": pod_labels,
                "annotations": template_meta.get("annotations", {}),
                "ownerReferences": [_owner_reference(owner or job)],
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
        message = _fit_error(
            _NODES, "Insufficient cpu", "No preemption victims found for incoming pod"
        )
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        condition |= {"message": message, "lastTransitionTime": _now()}
        condition |= _observed(pod)
        pod["status"]["conditions"] = [condition]
        self._put(PODS, pod, "MODIFIED")
        self._event(pod, "Warning", "FailedScheduling", message, "default-scheduler")

    def _schedule(self, pod: Json, index: int) -> None:
        node = f"fake-node-{index % _NODES}"
        pod["spec"]["nodeName"] = node
        now = _now()
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now} | _observed(pod)
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
            {"type": t, "status": "True", "lastTransitionTime": now} | _observed(pod)
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
        ]
        status["conditions"].append(
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now} | _observed(pod)
        )
        status |= _observed(pod)  # the kubelet's status.observedGeneration (1.35)
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
        self._suspend_launcher_job(job)
        for kind, obj in list(self._dependents(meta["namespace"], meta["uid"])):
            if kind is PODS:
                self._remove(PODS, meta["namespace"], obj["metadata"]["name"])


# --- small pure helpers about objects -----------------------------------------------------------

_NODES = 3
"""Nodes of the simulated cluster."""

_JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
"""The label that selects a Job's pods."""


def _job_pod_labels(job_name: str, uid: str) -> dict[str, str]:
    """The labels the Job API gives its pod template (and so its pods)."""
    return {
        _JOB_CONTROLLER_UID: uid,
        "batch.kubernetes.io/job-name": job_name,
        "controller-uid": uid,
        "job-name": job_name,
    }


"""Nodes of the simulated cluster."""


def _fit_error(nodes: int, reason: str, preemption: str) -> str:
    """kube-scheduler v1.35's FailedScheduling text when every node fails the filter with
    ``reason`` (``FitError.Error``), followed by its PostFilter plugins' verdicts: the
    DynamicResources plugin's and DefaultPreemption's, ``preemption`` for every node."""
    return (
        f"0/{nodes} nodes are available: {nodes} {reason}. no new claims to deallocate, "
        f"preemption: 0/{nodes} nodes are available: {nodes} {preemption}."
    )


def _observed(pod: Json) -> Json:
    """``observedGeneration`` as 1.35 writes it into pod conditions and status (the
    PodObservedGenerationTracking feature, GA): the pod's generation."""
    return {"observedGeneration": pod["metadata"].get("generation", 1)}


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
