"""Typed configuration, grouped by concern, validated when it is loaded.

Each section is a frozen dataclass; each field carries its documentation in
``metadata["doc"]`` (the README's configuration reference and ``config/proxy.yaml``
describe the same keys). Loading and checking a file is :mod:`proxy.configload`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

ENV_CONFIG = "OMS_MPIJOB_PROXY_CONFIG"


class ConfigError(Exception):
    """A configuration problem, reported at start-up with file and key."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {problem}")


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


# Opts keys the OpenM++ UI and the R/Python clients send (shared/reference/oms-api.md §2, §5),
# plus the few run options a statistician sets by hand. `<LANG>.RunDescription` is allowed
# by pattern in runs.allowed_opts_patterns.
DEFAULT_ALLOWED_OPTS: tuple[str, ...] = (
    "OpenM.RunName",
    "OpenM.RunStamp",
    "OpenM.SetName",
    "OpenM.SetId",
    "OpenM.BaseRunDigest",
    "OpenM.BaseRunId",
    "OpenM.BaseRunName",
    "OpenM.SubValues",
    "OpenM.ProgressPercent",
    "OpenM.ProgressStep",
    "OpenM.ParamDir",
    "OpenM.IdCsv",
    "OpenM.IdParamDir",
    "OpenM.IniFile",
    "OpenM.IniAnyKey",
    "OpenM.Profile",
    "OpenM.SparseOutput",
    "OpenM.SparseNullValue",
    "OpenM.MessageLanguage",
    "OpenM.Threads",
    "OpenM.NotOnRoot",
    "OpenM.LogRank",
    "OpenM.LogNoMsgTime",
    "OpenM.LogUseTimeStamp",
    "OpenM.LogUsePidStamp",
    "OpenM.TraceToConsole",
    "OpenM.TraceToFile",
    "OpenM.TraceUseTimeStamp",
    "OpenM.Cases",
    "OpenM.TaskName",
    "OpenM.TaskId",
    "OpenM.TaskRunName",
    "OpenM.TaskRunId",
    "Parameter.SimulationCases",
    "Parameter.SimulationSeed",
    "Parameter.StartingSeed",
    "Microdata.ToDb",
    "Microdata.UseInternal",
    "Microdata.CsvDir",
    "EN.RunDescription",
    "FR.RunDescription",
)

DEFAULT_ALLOWED_OPTS_PATTERNS: tuple[str, ...] = (
    r"^[A-Za-z]{2}(_[A-Za-z]{2})?\.RunDescription$",
    r"^Parameter\.[A-Za-z_][A-Za-z0-9_]*$",
)

# Environment variables a model run may receive. Never LD_*, PATH, PYTHON*, OMPI_* and the like.
DEFAULT_ALLOWED_ENV: tuple[str, ...] = ("OM_USER_FILES", "TZ", "LANG", "LC_ALL", "OMP_NUM_THREADS")

FORBIDDEN_ENV_PATTERN = re.compile(
    r"^(LD_.*|DYLD_.*|PATH|HOME|SHELL|IFS|ENV|BASH_ENV|PYTHON.*|PERL.*|OMPI_.*|PRTE_.*|PMIX_.*"
    r"|HYDRA_.*|I_MPI_.*|K_MPI_.*|KUBERNETES_.*|.*PROXY|.*_proxy)$"
)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Where the proxy listens and how it treats its own clients."""

    host: str = dataclasses.field(default="0.0.0.0", metadata=_doc("Address to listen on."))
    port: int = dataclasses.field(default=8080, metadata=_doc("TCP port to listen on."))
    shutdown_grace_seconds: float = dataclasses.field(
        default=30.0,
        metadata=_doc(
            "On SIGTERM: stop accepting, then give in-flight requests this long to finish."
        ),
    )
    client_header_timeout_seconds: float = dataclasses.field(
        default=60.0,
        metadata=_doc(
            "Time a client has to send a request's line and headers, from connecting or from "
            "the previous answer on a kept-alive connection; past it the connection is closed."
        ),
    )
    client_body_timeout_seconds: float = dataclasses.field(
        default=60.0,
        metadata=_doc(
            "Longest pause while a client sends a request body (a POST /api/run body must "
            "arrive whole within it); past it: 408 and the connection is closed."
        ),
    )
    read_chunk_bytes: int = dataclasses.field(
        default=262144,
        metadata=_doc(
            "Size of each read when streaming an answer from oms, and about the most of it held "
            "per stream; uploads go on in the pieces they arrive in."
        ),
    )
    max_request_target_bytes: int = dataclasses.field(
        default=8190,
        metadata=_doc("Longest request target (path and query) a client may send; past it: 414."),
    )
    max_header_bytes: int = dataclasses.field(
        default=8190,
        metadata=_doc(
            "Longest request header line (name and value) a client may send; past it: 431."
        ),
    )
    max_headers: int = dataclasses.field(
        default=128,
        metadata=_doc("Most header lines in a client's request; past it: 431."),
    )
    identity_header: str = dataclasses.field(
        default="",
        metadata=_doc(
            "Request header carrying the authenticated user (e.g. kubeflow-userid); "
            "recorded on MPIJobs. Empty: none."
        ),
    )
    access_log_health: bool = dataclasses.field(
        default=False,
        metadata=_doc("Log /healthz, /readyz and /metrics requests too (normally left out)."),
    )
    event_loop: Literal["uvloop", "asyncio"] = dataclasses.field(
        default="uvloop",
        metadata=_doc(
            "Event loop of `serve`: uvloop (libuv-based: less CPU per request and lower latency "
            "than asyncio's) or asyncio (Python's own, for a platform without uvloop)."
        ),
    )


@dataclasses.dataclass(frozen=True)
class OmsConfig:
    """The oms (OpenM++ web service) behind the proxy."""

    url: str = dataclasses.field(
        default="http://127.0.0.1:4040",
        metadata=_doc("Base URL of oms (http or https, no path, query or fragment)."),
    )
    connect_timeout_seconds: float = dataclasses.field(
        default=5.0, metadata=_doc("Time to open a connection to oms; past it: 504.")
    )
    first_byte_timeout_seconds: float = dataclasses.field(
        default=600.0,
        metadata=_doc(
            "Time oms may take to start answering (and between two reads of a stream); "
            "past it: 504. oms can take minutes to prepare a download."
        ),
    )
    max_connections: int = dataclasses.field(
        default=0,
        metadata=_doc(
            "Connections the pass-through keeps to oms at most (its own lookups use a separate "
            "pool of the same size); 0 means no limit."
        ),
    )
    max_answer_head_bytes: int = dataclasses.field(
        default=65536,
        metadata=_doc(
            "Largest head (status line and header lines, 1xx answers included) of an oms answer "
            "the pass-through takes; past it: 502 at once, nothing more of it buffered."
        ),
    )
    max_answer_headers: int = dataclasses.field(
        default=100,
        metadata=_doc("Most header lines in an oms answer the pass-through takes; past it: 502."),
    )
    model_cache_seconds: float = dataclasses.field(
        default=30.0,
        metadata=_doc("How long a model looked up in oms for a run request is remembered."),
    )


@dataclasses.dataclass(frozen=True)
class KubernetesConfig:
    """The Kubernetes API the proxy submits MPIJobs to."""

    namespace: str = dataclasses.field(
        default="default",
        metadata=_doc("Namespace of every MPIJob and ConfigMap; never taken from a request."),
    )
    kubeconfig: str = dataclasses.field(
        default="",
        metadata=_doc(
            "kubeconfig file; empty: in-cluster config in a pod, else $KUBECONFIG, "
            "else ~/.kube/config."
        ),
    )
    request_timeout_seconds: float = dataclasses.field(
        default=20.0, metadata=_doc("Limit for one Kubernetes API call; past it: 504.")
    )
    retries: int = dataclasses.field(
        default=3, metadata=_doc("Retries of a call after 429, 5xx or a connection error.")
    )
    retry_backoff_seconds: float = dataclasses.field(
        default=0.2, metadata=_doc("First retry delay; doubled on each retry (Retry-After wins).")
    )
    dry_run_on_start: bool = dataclasses.field(
        default=True,
        metadata=_doc(
            "At start-up, create a rendered MPIJob with dryRun=All so a missing CRD, "
            "namespace or permission shows at once."
        ),
    )
    watch: bool = dataclasses.field(
        default=True,
        metadata=_doc("Keep MPIJob state from a watch (informer cache) instead of per-poll GETs."),
    )
    log_cache_seconds: float = dataclasses.field(
        default=1.0,
        metadata=_doc("How long a launcher log read is shared between pollers of one run."),
    )


@dataclasses.dataclass(frozen=True)
class RunsConfig:
    """Which run requests become MPIJobs, and the limits they must respect."""

    intercept: Literal["mpi", "all", "none"] = dataclasses.field(
        default="mpi",
        metadata=_doc("mpi: MPI runs become MPIJobs; all: every run does; none: pass all to oms."),
    )
    max_body_bytes: int = dataclasses.field(
        default=1048576, metadata=_doc("Largest POST /api/run body accepted; larger: 413.")
    )
    max_processes: int = dataclasses.field(
        default=64, metadata=_doc("Largest MPI process count (Mpi.Np) a run may ask for.")
    )
    max_threads: int = dataclasses.field(
        default=16, metadata=_doc("Largest thread count per process a run may ask for.")
    )
    allowed_opts: tuple[str, ...] = dataclasses.field(
        default=DEFAULT_ALLOWED_OPTS,
        metadata=_doc("Opts keys a run may set (matched case-insensitively, leading '-' ignored)."),
    )
    allowed_opts_patterns: tuple[str, ...] = dataclasses.field(
        default=DEFAULT_ALLOWED_OPTS_PATTERNS,
        metadata=_doc("Regular expressions for further allowed Opts keys."),
    )
    allowed_env: tuple[str, ...] = dataclasses.field(
        default=DEFAULT_ALLOWED_ENV,
        metadata=_doc("Env names a run may set; LD_*, PATH and the like are always refused."),
    )
    allow_microdata: bool = dataclasses.field(
        default=False,
        metadata=_doc(
            "Set as oms's -oms.AllowMicrodata: if false, Microdata.* run options are refused "
            "and a request's Microdata is ignored, as oms does."
        ),
    )
    user_files_dir: str = dataclasses.field(
        default="",
        metadata=_doc(
            "oms's user files directory (OM_USER_FILES, -oms.FilesDir) as mounted in the MPI "
            "pods (absolute); empty: paths starting with OM_USER_FILES are refused."
        ),
    )
    max_concurrent_submissions: int = dataclasses.field(
        default=64,
        metadata=_doc("Submissions handled at once; more: 429 with Retry-After."),
    )
    start_deadline_seconds: float = dataclasses.field(
        default=900.0,
        metadata=_doc(
            "A run that is not Running this long after submission (after its admission, for a "
            "run queued suspended, e.g. by Kueue: queue time does not count) is reported final "
            "(failed)."
        ),
    )
    finished_retention_seconds: float = dataclasses.field(
        default=3600.0,
        metadata=_doc("Finished MPIJobs are kept this long (logs stay readable), then deleted."),
    )


@dataclasses.dataclass(frozen=True)
class MpiJobConfig:
    """How an MPIJob is rendered from the template."""

    template: str = dataclasses.field(
        default="mpijob-template.yaml",
        metadata=_doc("MPIJob template file, relative to the config file's directory."),
    )
    name_prefix: str = dataclasses.field(
        default="ompp", metadata=_doc("First part of every MPIJob name (DNS-1035).")
    )
    models_bin_dir: str = dataclasses.field(
        default="/opt/openmpp/models/bin",
        metadata=_doc("Model executables and databases inside the MPI pods (absolute)."),
    )
    models_log_dir: str = dataclasses.field(
        default="/opt/openmpp/models/log",
        metadata=_doc("oms's model log directory inside the MPI pods (absolute)."),
    )
    mpirun_args: tuple[str, ...] = dataclasses.field(
        default=("--bind-to", "none"),
        metadata=_doc("Extra mpirun arguments, one argv element each."),
    )
    slots_per_worker: int = dataclasses.field(
        default=1, metadata=_doc("MPI processes per worker pod (spec.slotsPerWorker).")
    )
    cpu_per_thread: str = dataclasses.field(
        default="1", metadata=_doc("CPU request per modelling thread of a process.")
    )
    memory_per_process: str = dataclasses.field(
        default="1Gi", metadata=_doc("Memory request per MPI process.")
    )
    clean_pod_policy: Literal["None", "Running", "All"] = dataclasses.field(
        default="Running", metadata=_doc("spec.runPolicy.cleanPodPolicy.")
    )
    active_deadline_seconds: int = dataclasses.field(
        default=86400, metadata=_doc("spec.runPolicy.activeDeadlineSeconds (> 0).")
    )
    ttl_seconds_after_finished: int = dataclasses.field(
        default=86400,
        metadata=_doc("spec.runPolicy.ttlSecondsAfterFinished (the proxy deletes sooner)."),
    )
    ini_mount_dir: str = dataclasses.field(
        default="/etc/openmpp-run",
        metadata=_doc("Where the per-run ConfigMap (generated ini, run notes) is mounted."),
    )
    queue_name: str = dataclasses.field(
        default="",
        metadata=_doc(
            "Kueue LocalQueue (in kubernetes.namespace) for every MPIJob, set as its label "
            "kueue.x-k8s.io/queue-name; Kueue then keeps each MPIJob suspended until it admits "
            "it. Empty: no label."
        ),
    )


@dataclasses.dataclass(frozen=True)
class FollowConfig:
    """How the proxy follows its runs: watch cache, Events, tombstones. Defaults suit production."""

    settle_seconds: float = dataclasses.field(
        default=2.0,
        metadata=_doc(
            "An Event is shown once its timestamp is this much older than the list that had it, "
            "so every replica shows the same log lines."
        ),
    )
    events_refresh_seconds: float = dataclasses.field(
        default=5.0, metadata=_doc("How often the Events are listed while some run waits to start.")
    )
    tombstone_seconds: float = dataclasses.field(
        default=600.0,
        metadata=_doc("How long a deleted MPIJob is still answered for (final state)."),
    )
    sweep_seconds: float = dataclasses.field(
        default=30.0,
        metadata=_doc(
            "How often tombstones expire, start deadlines are recorded and finished MPIJobs "
            "deleted."
        ),
    )
    watch_timeout_seconds: int = dataclasses.field(
        default=300, metadata=_doc("timeoutSeconds of one watch request before it is renewed.")
    )
    backoff_first_seconds: float = dataclasses.field(
        default=0.5, metadata=_doc("First wait before a failed list or watch is tried again.")
    )
    backoff_max_seconds: float = dataclasses.field(
        default=10.0, metadata=_doc("Longest wait between list or watch retries (doubling).")
    )
    direct_cache_seconds: float = dataclasses.field(
        default=1.0,
        metadata=_doc(
            "Without a synced watch: how long a direct list of MPIJobs and pods is reused."
        ),
    )
    record_retry_seconds: float = dataclasses.field(
        default=5.0,
        metadata=_doc("Wait before a failed recording (annotation patch) on an MPIJob is retried."),
    )
    record_attempts: int = dataclasses.field(
        default=5,
        metadata=_doc("How many times a recording on an MPIJob is tried before giving up."),
    )


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Log output."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = dataclasses.field(
        default="INFO", metadata=_doc("Log level.")
    )


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole configuration."""

    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    oms: OmsConfig = dataclasses.field(default_factory=OmsConfig)
    kubernetes: KubernetesConfig = dataclasses.field(default_factory=KubernetesConfig)
    runs: RunsConfig = dataclasses.field(default_factory=RunsConfig)
    mpijob: MpiJobConfig = dataclasses.field(default_factory=MpiJobConfig)
    follow: FollowConfig = dataclasses.field(default_factory=FollowConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    source: str = dataclasses.field(
        default="<built-in defaults>",
        metadata=_doc("Where this configuration came from (not a YAML key)."),
    )
    base_dir: str = dataclasses.field(
        default=str(Path(__file__).resolve().parent / "data"),
        metadata=_doc("Directory relative paths are resolved against (not a YAML key)."),
    )

    def template_path(self) -> Path:
        """The MPIJob template file, resolved against the config file's directory."""
        path = Path(self.mpijob.template)
        if not path.is_absolute():
            path = Path(self.base_dir) / path
        return path
