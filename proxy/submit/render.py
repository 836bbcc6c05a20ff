"""Render one checked run into its MPIJob and ConfigMap: pure (no I/O, no clock).

The renderer deep-copies the parsed template and writes values into the tree (never into YAML
text). These are the documented places it writes; everything else, including image, volumes,
securityContext, nodeSelector, tolerations and limits, comes from the template unchanged and
cannot be influenced by a request:

MPIJob (``kubeflow.org/v2beta1``)
  * ``metadata.name``: :func:`proxy.names.mpijob_name` (``<mpijob.name_prefix>-<model>-<hash>``,
    at most 54 characters, fewer when ``<name>-worker-<i>`` needs it);
    ``metadata.namespace``: ``kubernetes.namespace`` (always from config).
  * ``metadata.labels``: the template's plus ours (:mod:`proxy.names`: managed-by, model name,
    model digest, run stamp, submit stamp, request id, user), values made label-safe with
    :func:`proxy.names.label_value`; ``metadata.annotations``: the same keys with the full
    values, plus ``openmpp.org/submitted-at``. The same labels and annotations are merged into
    both pod templates' metadata (so the template's ``sidecar.istio.io/inject: "false"`` stays).
    With ``mpijob.queue_name`` set, the MPIJob (only) also gets the label
    ``kueue.x-k8s.io/queue-name`` and is created with ``spec.runPolicy.suspend: true``; Kueue
    un-suspends it when the queue admits it.
  * ``spec.slotsPerWorker``: ``mpijob.slots_per_worker``.
  * ``spec.runPolicy``: ``cleanPodPolicy`` (``mpijob.clean_pod_policy``), ``backoffLimit: 0``,
    ``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished`` (config); other runPolicy fields
    (``suspend`` unless ``mpijob.queue_name`` is set, ``schedulingPolicy``, ``managedBy``)
    stay as in the template.
  * ``spec.mpiReplicaSpecs.Launcher``: ``replicas: 1``, ``restartPolicy: Never``; its first
    container's ``command`` is the whole mpirun argv (below). When the run has generated
    settings (ini file, run notes), a ``configMap`` volume ``openmpp-run`` for the ConfigMap is
    added to the pod and mounted read-only at ``mpijob.ini_mount_dir`` in that container.
  * ``spec.mpiReplicaSpecs.Worker``: ``replicas: ceil(np / slotsPerWorker)`` (written
    explicitly: the operator's default of 0 is invalid), ``restartPolicy: Never`` unless the
    template gives one; its first container's ``resources.requests.cpu`` = threads * slots *
    ``mpijob.cpu_per_thread`` and ``resources.requests.memory`` = slots *
    ``mpijob.memory_per_process`` (the template's limits must not be lower).

The launcher command (an argv list; no shell anywhere)::

    mpirun -n <np> --hostfile /etc/mpi/hostfile <mpijob.mpirun_args...>
           -wdir <models_bin_dir>[/<Dir>] [-x NAME=value ...]
           <models_bin_dir>/<CleanFileName(model)>_mpi <model args...>

Model args follow oms's ``makeRunArgsIni``: ``-OpenM.RunStamp <stamp> -OpenM.LogToConsole true
-OpenM.LogToFile false``, then the run options as ``-Key value`` pairs in sorted key order (oms:
random map order) without the ones oms drops, then ``-ini <file>`` when there is one, then
``-OpenM.Threads N`` if N > 1 and a bare ``-OpenM.NotOnRoot`` for MPI runs that keep the root
process free.

Generated settings (oms writes them into ``<RunStamp>.<Model>.ini``): ``[Tables] Retain = a, b``;
``[Microdata] ToDb = true``, ``UseInternal = true``, ``<Entity> = a,b``; ``[<LANG>]
RunDescription = ...`` and ``RunNotesPath = <ini_mount_dir>/<RunStamp>.run_notes.<LANG>.md``.
They go into the ConfigMap ``<name>-run`` (not ``<name>-config``, which the operator owns) as
``<RunStamp>.<Model>.ini``, passed as ``-ini <ini_mount_dir>/<RunStamp>.<Model>.ini``, with the
run notes files beside it. If the request also names its own ini file (``OpenM.IniFile``), that
file is passed as ``-ini <its path>`` and the generated settings as the equivalent argv pairs
(``-Tables.Retain a, b``, ``-EN.RunDescription ...``, ``-EN.RunNotesPath ...``,
``-Microdata.ToDb true``, ...): command-line options override the ini file, which is what oms's
merge (generated settings win) amounts to. The ConfigMap carries no ownerReference: whoever
creates the MPIJob adds one pointing at it.

Before returning, the MPI operator's own rules are checked (:func:`check_operator_rules`); a
violation raises :class:`RenderError` instead of leaving a job that would never start.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import posixpath
from datetime import datetime
from fractions import Fraction

from proxy import names
from proxy.config import Config
from proxy.submit.decode import ModelInfo
from proxy.submit.template import QUANTITY_RE, RUN_VOLUME, JsonObject, JsonValue, Template
from proxy.submit.validate import RUN_STAMP_RE, ValidatedRun, ini_quote

HOSTFILE = "/etc/mpi/hostfile"
CONFIGMAP_SUFFIX = "-run"
MAX_CONFIGMAP_BYTES = 1_000_000


class RenderError(ValueError):
    """The run cannot be rendered into a valid MPIJob (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Stamps:
    """Identity and time of one submission (all passed in: the renderer reads no clock)."""

    run_stamp: str
    submit_stamp: str
    request_id: str
    user: str | None
    submitted_at: datetime


@dataclasses.dataclass(frozen=True)
class RenderedRun:
    """The objects to create for one run."""

    name: str
    mpijob: JsonObject
    configmap: JsonObject | None
    argv: tuple[str, ...]
    """The launcher command (also at ``Launcher...containers[0].command``)."""


@dataclasses.dataclass(frozen=True)
class _Setting:
    section: str
    key: str
    value: str


def render(
    run: ValidatedRun, model: ModelInfo, config: Config, template: Template, stamps: Stamps
) -> RenderedRun:
    """Build the MPIJob (and, if needed, the ConfigMap) for a run; see the module docstring."""
    if run.model != model:
        raise RenderError(f"the run was checked for model {run.model}, not {model}")
    if not RUN_STAMP_RE.fullmatch(stamps.run_stamp):
        raise RenderError(f"run stamp {stamps.run_stamp!r} cannot be used in names and files")
    mj = config.mpijob
    namespace = config.kubernetes.namespace
    slots = mj.slots_per_worker
    workers = math.ceil(run.mpi_np / slots)
    # <name>-worker-<workers-1> must stay a 63-character DNS label (pod name).
    max_len = min(names.MAX_NAME, 63 - len(f"-worker-{workers - 1}"))
    name = names.mpijob_name(
        mj.name_prefix, model.name, stamps.run_stamp, model.digest, max_len=max_len
    )
    labels = _labels(model, stamps)
    annotations = _annotations(model, stamps)

    settings = _settings(run, stamps, mj.ini_mount_dir)
    files: dict[str, str] = {}
    ini_name = f"{stamps.run_stamp}.{run.exe_stem}.ini"
    if settings and run.ini_file is None:
        files[ini_name] = _ini_text(settings, stamps)
    for lang, note in run.run_notes:
        files[_notes_file(stamps, lang)] = note
    argv = launcher_argv(run, config, stamps, settings, ini_name)

    cpu = Fraction(run.threads * slots) * parse_quantity(mj.cpu_per_thread)
    memory = slots * parse_quantity(mj.memory_per_process)

    job = copy.deepcopy(template.manifest)
    job_labels = dict(labels)
    if mj.queue_name:
        # Kueue reads the queue from the job's own labels only (not the pod templates').
        job_labels[names.KUEUE_QUEUE_NAME_KEY] = mj.queue_name
    job_meta = _metadata(job.get("metadata"), name, namespace, job_labels, annotations)
    if config.history.enabled and config.history.finalizer:
        # Removed by the run cache once the run is archived (proxy/follow/archive.py).
        kept = job_meta.get("finalizers") or []
        if not isinstance(kept, list):
            raise RenderError("template: metadata.finalizers is not a list")
        job_meta["finalizers"] = [*kept, names.RUN_RECORD_FINALIZER]
    job["metadata"] = job_meta
    spec = _first(job, "spec", slotsPerWorker=slots)
    policy = _obj(spec, "runPolicy")
    policy["cleanPodPolicy"] = mj.clean_pod_policy
    policy["backoffLimit"] = 0
    policy["activeDeadlineSeconds"] = mj.active_deadline_seconds
    policy["ttlSecondsAfterFinished"] = mj.ttl_seconds_after_finished
    if mj.queue_name:
        # Created suspended, as Kueue's webhook would make it anyway: no pod starts before
        # the queue admits the job (Kueue then sets suspend to false).
        policy["suspend"] = True
    replica_specs = _obj(spec, "mpiReplicaSpecs")

    launcher = _first(replica_specs, "Launcher", replicas=1, restartPolicy="Never")
    pod = _pod_template(launcher, labels, annotations)
    container = _first_container(pod, "Launcher")
    container["command"] = list(argv)
    configmap_name = name + CONFIGMAP_SUFFIX
    if files:
        mounts = _list(container, "volumeMounts")
        for mount in mounts:
            if isinstance(mount, dict) and mount.get("mountPath") == mj.ini_mount_dir:
                raise RenderError(
                    f"the template already mounts something at {mj.ini_mount_dir} "
                    "(mpijob.ini_mount_dir) in the launcher"
                )
        mounts.append({"name": RUN_VOLUME, "mountPath": mj.ini_mount_dir, "readOnly": True})
        _list(pod, "volumes").append({"name": RUN_VOLUME, "configMap": {"name": configmap_name}})

    worker = _obj(replica_specs, "Worker")
    worker = _first(
        replica_specs,
        "Worker",
        replicas=workers,
        restartPolicy=worker.get("restartPolicy", "Never"),
    )
    pod = _pod_template(worker, labels, annotations)
    container = _first_container(pod, "Worker")
    resources = _obj(container, "resources")
    requests = _obj(resources, "requests")
    requests["cpu"] = format_cpu(cpu)
    requests["memory"] = format_memory(memory, mj.memory_per_process)
    limits = resources.get("limits") or {}
    if not isinstance(limits, dict):
        raise RenderError("template: Worker resources.limits is not a mapping")
    _check_limits(limits, cpu, memory)

    check_operator_rules(job, run.mpi_np)

    configmap: JsonObject | None = None
    if files:
        size = sum(len(k) + len(v.encode("utf-8", "surrogatepass")) for k, v in files.items())
        if size > MAX_CONFIGMAP_BYTES:
            raise RenderError(f"the run's ini and notes files are too large ({size} bytes)")
        data: JsonObject = dict(files)
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(None, configmap_name, namespace, labels, annotations),
            "immutable": True,
            "data": data,
        }
    return RenderedRun(name=name, mpijob=job, configmap=configmap, argv=argv)


def launcher_argv(
    run: ValidatedRun,
    config: Config,
    stamps: Stamps,
    settings: list[_Setting] | None = None,
    ini_name: str | None = None,
) -> tuple[str, ...]:
    """The launcher's mpirun command, one argv element per token."""
    mj = config.mpijob
    if settings is None:
        settings = _settings(run, stamps, mj.ini_mount_dir)
    if ini_name is None:
        ini_name = f"{stamps.run_stamp}.{run.exe_stem}.ini"
    wdir = posixpath.join(mj.models_bin_dir, run.work_dir) if run.work_dir else mj.models_bin_dir
    argv = ["mpirun", "-n", str(run.mpi_np), "--hostfile", HOSTFILE, *mj.mpirun_args]
    argv += ["-wdir", wdir]
    for env_name, value in run.env:
        argv += ["-x", f"{env_name}={value}"]
    argv.append(f"{mj.models_bin_dir}/{run.exe_stem}_mpi")
    argv += ["-OpenM.RunStamp", stamps.run_stamp]
    argv += ["-OpenM.LogToConsole", "true", "-OpenM.LogToFile", "false"]
    for key, value in run.model_opts:
        argv += [key, value]
    if settings and run.ini_file is None:
        argv += ["-ini", f"{mj.ini_mount_dir}/{ini_name}"]
    elif run.ini_file is not None:
        argv += ["-ini", run.ini_file]
        for s in settings:
            argv += [f"-{s.section}.{s.key}", s.value]
    if run.threads > 1:
        argv += ["-OpenM.Threads", str(run.threads)]
    if run.not_on_root:
        argv.append("-OpenM.NotOnRoot")
    return tuple(argv)


def _notes_file(stamps: Stamps, lang: str) -> str:
    return f"{stamps.run_stamp}.run_notes.{lang}.md"


def _settings(run: ValidatedRun, stamps: Stamps, mount_dir: str) -> list[_Setting]:
    """What oms would write into the generated ini file, in a fixed order."""
    out: list[_Setting] = []
    if run.tables:
        out.append(_Setting("Tables", "Retain", ", ".join(run.tables)))
    if run.microdata is not None:
        out.append(_Setting("Microdata", "ToDb", "true"))
        if run.microdata.is_internal:
            out.append(_Setting("Microdata", "UseInternal", "true"))
        for entity, attrs in run.microdata.entities:
            out.append(_Setting("Microdata", entity, ",".join(attrs)))
    descriptions = dict(run.descriptions)
    notes = dict(run.run_notes)
    for lang in sorted(descriptions.keys() | notes.keys()):
        if lang in descriptions:
            out.append(_Setting(lang, "RunDescription", descriptions[lang]))
        if lang in notes:
            path = f"{mount_dir}/{_notes_file(stamps, lang)}"
            out.append(_Setting(lang, "RunNotesPath", path))
    return out


def _ini_text(settings: list[_Setting], stamps: Stamps) -> str:
    lines = [f"; model run settings for run {stamps.run_stamp}, written by oms-mpijob-proxy"]
    section = ""
    for s in settings:
        if s.section != section:
            section = s.section
            lines.append(f"[{section}]")
        quoted = ini_quote(s.value)
        if quoted is None:
            raise RenderError(f"{s.section}.{s.key} cannot be written to an ini file")
        lines.append(f"{s.key} = {quoted}")
    return "\n".join(lines) + "\n"


def _labels(model: ModelInfo, stamps: Stamps) -> dict[str, str]:
    labels = {
        names.MANAGED_BY_KEY: names.MANAGED_BY_VALUE,
        names.MODEL_NAME_KEY: names.label_value(model.name),
        names.MODEL_DIGEST_KEY: names.label_value(model.digest),
        names.RUN_STAMP_KEY: names.label_value(stamps.run_stamp),
        names.SUBMIT_STAMP_KEY: names.label_value(stamps.submit_stamp),
        names.REQUEST_ID_KEY: names.label_value(stamps.request_id),
    }
    if stamps.user is not None:
        labels[names.USER_KEY] = names.label_value(stamps.user)
    return labels


def _annotations(model: ModelInfo, stamps: Stamps) -> dict[str, str]:
    annotations = {
        names.MODEL_NAME_KEY: model.name,
        names.MODEL_DIGEST_KEY: model.digest,
        names.RUN_STAMP_KEY: stamps.run_stamp,
        names.SUBMIT_STAMP_KEY: stamps.submit_stamp,
        names.REQUEST_ID_KEY: stamps.request_id,
        names.SUBMITTED_AT_KEY: stamps.submitted_at.isoformat(timespec="milliseconds"),
    }
    if stamps.user is not None:
        annotations[names.USER_KEY] = stamps.user
    return annotations


def _metadata(
    current: JsonValue,
    name: str | None,
    namespace: str | None,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> JsonObject:
    """Object metadata: name, namespace, then the template's labels/annotations plus ours."""
    if current is not None and not isinstance(current, dict):
        raise RenderError("template: metadata is not a mapping")
    current = current or {}
    meta: JsonObject = {}
    if name is not None:
        meta["name"] = name
    if namespace is not None:
        meta["namespace"] = namespace
    for key, ours in (("labels", labels), ("annotations", annotations)):
        theirs = current.get(key) or {}
        if not isinstance(theirs, dict):
            raise RenderError(f"template: metadata.{key} is not a mapping")
        merged: JsonObject = dict(theirs)
        merged.update(ours)
        meta[key] = merged
    for key, value in current.items():
        meta.setdefault(key, value)
    return meta


def _pod_template(
    replica: JsonObject, labels: dict[str, str], annotations: dict[str, str]
) -> JsonObject:
    template = _obj(replica, "template")
    template["metadata"] = _metadata(template.get("metadata"), None, None, labels, annotations)
    return _obj(template, "spec")


def _first_container(pod: JsonObject, role: str) -> JsonObject:
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], dict):
        raise RenderError(f"template: the {role} has no container")
    return containers[0]


def _first(parent: JsonObject, key: str, **values: JsonValue) -> JsonObject:
    """Set ``values`` in the mapping ``parent[key]``, placed first (for people reading it)."""
    current = _obj(parent, key)
    merged: JsonObject = dict(values)
    merged.update((k, v) for k, v in current.items() if k not in values)
    parent[key] = merged
    return merged


def _obj(parent: JsonObject, key: str) -> JsonObject:
    value = parent.get(key)
    if value is None:
        value = {}
        parent[key] = value
    if not isinstance(value, dict):
        raise RenderError(f"template: {key} is not a mapping")
    return value


def _list(parent: JsonObject, key: str) -> list[JsonValue]:
    value = parent.get(key)
    if value is None:
        value = []
        parent[key] = value
    if not isinstance(value, list):
        raise RenderError(f"template: {key} is not a list")
    return value


# --- quantities -------------------------------------------------------------------------------

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def parse_quantity(value: str | int | float) -> Fraction:
    """A Kubernetes quantity (``500m``, ``2``, ``1.5Gi``, ``1e3``) as an exact number."""
    if isinstance(value, int | float):
        return Fraction(value)
    m = QUANTITY_RE.fullmatch(value)
    if m is None:
        raise RenderError(f"not a quantity: {value!r}")
    number = Fraction(m.group("number"))
    suffix = m.group("suffix") or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1 and suffix != "Ei":
        return number * Fraction(10) ** int(suffix[1:])
    if suffix == "m":
        return number / 1000
    return number * (_BINARY.get(suffix) or _DECIMAL.get(suffix) or 1)


def format_cpu(cores: Fraction) -> str:
    """Whole cores as ``N``, else millicores ``Nm`` (rounded up to a whole millicore)."""
    if cores.denominator == 1:
        return str(cores.numerator)
    return f"{math.ceil(cores * 1000)}m"


def format_memory(size: Fraction, like: str = "Gi") -> str:
    """Bytes with the largest suffix that keeps a whole number, binary first if ``like`` is.

    ``like`` is the configured quantity: ``1536Mi`` * 2 gives ``3Gi``; ``1G`` * 3 gives ``3G``.
    """
    total = math.ceil(size)
    binary = like.endswith("i") or not any(like.endswith(s) for s in _DECIMAL)
    families = (_BINARY, _DECIMAL) if binary else (_DECIMAL, _BINARY)
    for family in families:
        for suffix, factor in reversed(family.items()):
            if total and total % factor == 0:
                return f"{total // factor}{suffix}"
    return str(total)


def _check_limits(limits: JsonObject, cpu: Fraction, memory: Fraction) -> None:
    for resource, need in (("cpu", cpu), ("memory", memory)):
        limit = limits.get(resource)
        if limit is None:
            continue
        if not isinstance(limit, str | int | float) or isinstance(limit, bool):
            raise RenderError(f"template: Worker limits.{resource} is not a quantity")
        if parse_quantity(limit) < need:
            shown = format_cpu(need) if resource == "cpu" else format_memory(need)
            raise RenderError(
                f"each worker needs {shown} {resource} for this run but the template limits "
                f"workers to {limit}: ask for fewer threads or change the template"
            )


# --- the MPI operator's own rules -------------------------------------------------------------


def check_operator_rules(mpijob: JsonObject, np: int) -> None:
    """The checks the MPI operator makes only after creation (validation.go), plus np fitting.

    A violation would leave the MPIJob without any status for ever; raise :class:`RenderError`.
    """
    meta = mpijob.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise RenderError("the MPIJob has no name")
    spec = mpijob.get("spec")
    if not isinstance(spec, dict):
        raise RenderError("the MPIJob has no spec")
    slots = spec.get("slotsPerWorker", 1)
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise RenderError(f"spec.slotsPerWorker must be >= 1, got {slots!r}")
    policy = spec.get("runPolicy") or {}
    if not isinstance(policy, dict):
        raise RenderError("spec.runPolicy is not a mapping")
    if policy.get("cleanPodPolicy") not in ("None", "Running", "All"):
        raise RenderError(
            f"spec.runPolicy.cleanPodPolicy must be None, Running or All, "
            f"got {policy.get('cleanPodPolicy')!r}"
        )
    for field, low in (("ttlSecondsAfterFinished", 0), ("backoffLimit", 0)):
        value = policy.get(field, low)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise RenderError(f"spec.runPolicy.{field} must be >= {low}, got {value!r}")
    deadline = policy.get("activeDeadlineSeconds")
    if not isinstance(deadline, int) or isinstance(deadline, bool) or deadline <= 0:
        raise RenderError(f"spec.runPolicy.activeDeadlineSeconds must be > 0, got {deadline!r}")
    replica_specs = spec.get("mpiReplicaSpecs")
    if not isinstance(replica_specs, dict) or not isinstance(replica_specs.get("Launcher"), dict):
        raise RenderError("spec.mpiReplicaSpecs.Launcher is missing")
    workers = 0
    for role, replica in replica_specs.items():
        if role not in ("Launcher", "Worker") or not isinstance(replica, dict):
            raise RenderError(f"spec.mpiReplicaSpecs.{role}: unexpected replica spec")
        count = replica.get("replicas")
        if not isinstance(count, int) or isinstance(count, bool):
            raise RenderError(f"spec.mpiReplicaSpecs.{role}.replicas must be written")
        if role == "Launcher" and count != 1:
            raise RenderError(f"spec.mpiReplicaSpecs.Launcher.replicas must be 1, got {count}")
        if role == "Worker":
            if count < 1:
                raise RenderError(f"spec.mpiReplicaSpecs.Worker.replicas must be >= 1, got {count}")
            workers = count
        if replica.get("restartPolicy") not in ("Never", "OnFailure"):
            raise RenderError(
                f"spec.mpiReplicaSpecs.{role}.restartPolicy must be Never or OnFailure, "
                f"got {replica.get('restartPolicy')!r}"
            )
        template = replica.get("template")
        pod = template.get("spec") if isinstance(template, dict) else None
        containers = pod.get("containers") if isinstance(pod, dict) else None
        if not isinstance(containers, list) or not containers:
            raise RenderError(f"spec.mpiReplicaSpecs.{role} has no container")
    last_worker = f"{name}-worker-{workers - 1}"
    if workers and not names.is_dns1035_label(last_worker):
        raise RenderError(
            f"worker pod name {last_worker!r} is not a DNS-1035 label of at most 63 characters "
            f"({workers} workers are too many for the name {name!r})"
        )
    launcher_name = f"{name}-launcher"
    if not names.is_label_value(launcher_name):
        raise RenderError(f"launcher name {launcher_name!r} is longer than 63 characters")
    capacity = workers * slots + (slots if spec.get("runLauncherAsWorker") is True else 0)
    if np > capacity:
        raise RenderError(
            f"{np} MPI processes do not fit {workers} workers with {slots} slots each"
        )
