"""Typed configuration, grouped by concern, validated when it is loaded.

Each section is a frozen dataclass; each field carries its documentation in
``metadata["doc"]`` (the README's configuration reference and ``config/proxy.yaml``
describe the same keys). :func:`load_config` reads one YAML file, rejects unknown
keys, wrong types and bad values with a :class:`ConfigError` that names the file,
the dotted key and what was expected, then applies command-line overrides.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin
from urllib.parse import urlsplit

import yaml

ENV_CONFIG = "OMS_MPIJOB_PROXY_CONFIG"

T = TypeVar("T")


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
            "A run that is not Running this long after submission is reported final (failed)."
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


_NOT_KEYS = {"source", "base_dir"}

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_PREFIX = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    return str(tp)


def _coerce(value: Any, tp: Any, source: str, key: str) -> Any:
    origin = get_origin(tp)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
        return value
    if origin is tuple:
        (item_tp, _ellipsis) = get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
        return tuple(_coerce(v, item_tp, source, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(source, key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(source, key, f"unsupported type {tp}")  # pragma: no cover


def _build(cls: type[T], data: Any, source: str, prefix: str) -> T:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, prefix, f"expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in _NOT_KEYS}  # type: ignore[arg-type]
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise ConfigError(source, key, f"unknown key; known keys here: {', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            kwargs[name] = _build(tp, value, source, key)
        else:
            kwargs[name] = _coerce(value, tp, source, key)
    return cls(**kwargs)


def _check(config: Config) -> None:
    """Semantic checks the types alone do not catch."""
    src = config.source

    def need(ok: bool, key: str, problem: str) -> None:
        if not ok:
            raise ConfigError(src, key, problem)

    s, o, k, r, m = config.server, config.oms, config.kubernetes, config.runs, config.mpijob
    need(0 <= s.port <= 65535, "server.port", "expected a TCP port 0..65535")
    need(s.shutdown_grace_seconds >= 0, "server.shutdown_grace_seconds", "expected >= 0")
    need(
        s.client_header_timeout_seconds > 0, "server.client_header_timeout_seconds", "expected > 0"
    )
    need(s.client_body_timeout_seconds > 0, "server.client_body_timeout_seconds", "expected > 0")
    for key in ("max_request_target_bytes", "max_header_bytes"):
        need(getattr(s, key) >= 256, f"server.{key}", "expected >= 256")
    need(s.max_headers >= 1, "server.max_headers", "expected >= 1")
    need(4096 <= s.read_chunk_bytes <= 16 << 20, "server.read_chunk_bytes", "expected 4096..16 MiB")
    need(
        s.event_loop != "uvloop" or importlib.util.find_spec("uvloop") is not None,
        "server.event_loop",
        "uvloop is not installed here: install it, or set asyncio",
    )
    need(
        s.identity_header == "" or re.fullmatch(r"[A-Za-z0-9-]+", s.identity_header) is not None,
        "server.identity_header",
        "expected an HTTP header name (letters, digits, '-') or empty",
    )
    parts = urlsplit(o.url)
    need(
        parts.scheme in ("http", "https") and bool(parts.hostname),
        "oms.url",
        f"expected an http:// or https:// URL with a host, got {o.url!r}",
    )
    need(
        parts.path in ("", "/") and not parts.query and not parts.fragment,
        "oms.url",
        f"expected a base URL without path, query or fragment, got {o.url!r}",
    )
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        need(False, "oms.url", f"bad port in {o.url!r}")
    need(o.connect_timeout_seconds > 0, "oms.connect_timeout_seconds", "expected > 0")
    need(o.first_byte_timeout_seconds > 0, "oms.first_byte_timeout_seconds", "expected > 0")
    need(o.max_connections >= 0, "oms.max_connections", "expected >= 0 (0: no limit)")
    need(o.max_answer_head_bytes >= 1024, "oms.max_answer_head_bytes", "expected >= 1024")
    need(o.max_answer_headers >= 1, "oms.max_answer_headers", "expected >= 1")
    need(o.model_cache_seconds >= 0, "oms.model_cache_seconds", "expected >= 0")
    need(
        _DNS1123_LABEL.match(k.namespace) is not None and len(k.namespace) <= 63,
        "kubernetes.namespace",
        f"expected a DNS-1123 label (lower-case, <= 63 chars), got {k.namespace!r}",
    )
    need(k.request_timeout_seconds > 0, "kubernetes.request_timeout_seconds", "expected > 0")
    need(0 <= k.retries <= 20, "kubernetes.retries", "expected 0..20")
    need(k.retry_backoff_seconds >= 0, "kubernetes.retry_backoff_seconds", "expected >= 0")
    need(k.log_cache_seconds >= 0, "kubernetes.log_cache_seconds", "expected >= 0")
    need(1024 <= r.max_body_bytes <= 64 << 20, "runs.max_body_bytes", "expected 1 KiB..64 MiB")
    need(r.max_processes >= 1, "runs.max_processes", "expected >= 1")
    need(r.max_threads >= 1, "runs.max_threads", "expected >= 1")
    need(r.max_concurrent_submissions >= 1, "runs.max_concurrent_submissions", "expected >= 1")
    need(r.start_deadline_seconds > 0, "runs.start_deadline_seconds", "expected > 0")
    need(r.finished_retention_seconds >= 0, "runs.finished_retention_seconds", "expected >= 0")
    for i, pattern in enumerate(r.allowed_opts_patterns):
        try:
            re.compile(pattern)
        except re.error as e:
            need(False, f"runs.allowed_opts_patterns[{i}]", f"not a regular expression: {e}")
    for i, name in enumerate(r.allowed_env):
        need(
            re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None,
            f"runs.allowed_env[{i}]",
            f"expected an environment variable name, got {name!r}",
        )
        need(
            FORBIDDEN_ENV_PATTERN.match(name) is None,
            f"runs.allowed_env[{i}]",
            f"{name!r} can change how programs load or run and is never allowed",
        )
    need(
        r.user_files_dir == ""
        or (r.user_files_dir.startswith("/") and ".." not in r.user_files_dir.split("/")),
        "runs.user_files_dir",
        "expected an absolute path or empty",
    )
    need(
        _DNS1035_PREFIX.match(m.name_prefix) is not None and len(m.name_prefix) <= 20,
        "mpijob.name_prefix",
        f"expected a DNS-1035 label of at most 20 chars, got {m.name_prefix!r}",
    )
    for key, value in (
        ("mpijob.models_bin_dir", m.models_bin_dir),
        ("mpijob.models_log_dir", m.models_log_dir),
        ("mpijob.ini_mount_dir", m.ini_mount_dir),
    ):
        need(
            value.startswith("/") and ".." not in value.split("/"), key, "expected an absolute path"
        )
    need(1 <= m.slots_per_worker <= 1024, "mpijob.slots_per_worker", "expected 1..1024")
    need(
        _QUANTITY.match(m.cpu_per_thread) is not None,
        "mpijob.cpu_per_thread",
        f"expected a Kubernetes quantity such as '1' or '500m', got {m.cpu_per_thread!r}",
    )
    need(
        _QUANTITY.match(m.memory_per_process) is not None,
        "mpijob.memory_per_process",
        f"expected a Kubernetes quantity such as '2Gi', got {m.memory_per_process!r}",
    )
    need(m.active_deadline_seconds > 0, "mpijob.active_deadline_seconds", "expected > 0")
    need(m.ttl_seconds_after_finished >= 0, "mpijob.ttl_seconds_after_finished", "expected >= 0")


@dataclasses.dataclass(frozen=True)
class Overrides:
    """Command-line flags that override the file."""

    host: str | None = None
    port: int | None = None
    oms_url: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    log_level: str | None = None


def config_from_dict(data: Any, source: str, base_dir: str | None = None) -> Config:
    """Build and validate a :class:`Config` from parsed YAML.

    Relative paths resolve against ``base_dir`` (default: the built-in template's directory).
    """
    config = _build(Config, data, source, "")
    config = dataclasses.replace(
        config, source=source, base_dir=base_dir or str(default_config_dir())
    )
    _check(config)
    return config


def apply_overrides(config: Config, ov: Overrides) -> Config:
    """Apply command-line overrides, then validate again."""
    server = dataclasses.replace(
        config.server,
        host=ov.host if ov.host is not None else config.server.host,
        port=ov.port if ov.port is not None else config.server.port,
    )
    oms = dataclasses.replace(config.oms, url=ov.oms_url or config.oms.url)
    kube = dataclasses.replace(
        config.kubernetes,
        namespace=ov.namespace or config.kubernetes.namespace,
        kubeconfig=ov.kubeconfig if ov.kubeconfig is not None else config.kubernetes.kubeconfig,
    )
    logging_cfg = config.logging
    if ov.log_level is not None:
        level = ov.log_level.upper()
        if level not in get_args(typing.get_type_hints(LoggingConfig)["level"]):
            raise ConfigError("--log-level", "logging.level", f"unknown level {ov.log_level!r}")
        logging_cfg = LoggingConfig(level=typing.cast(Any, level))
    result = dataclasses.replace(
        config, server=server, oms=oms, kubernetes=kube, logging=logging_cfg
    )
    try:
        _check(result)
    except ConfigError as e:
        raise ConfigError(f"{config.source} (with command-line flags)", e.key, e.problem) from e
    return result


def load_config(path: str | os.PathLike[str] | None, overrides: Overrides | None = None) -> Config:
    """Load the configuration: ``path``, else $OMS_MPIJOB_PROXY_CONFIG, else built-in defaults."""
    if path is None:
        path = os.environ.get(ENV_CONFIG) or None
    if path is None:
        config = config_from_dict({}, "<built-in defaults>", base_dir=str(default_config_dir()))
    else:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(str(p), "", f"cannot read the file: {e.strerror or e}") from e
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(str(p), "", f"not valid YAML: {e}") from e
        config = config_from_dict(data, str(p), base_dir=str(p.resolve().parent))
    if overrides is not None:
        config = apply_overrides(config, overrides)
    return config


def default_config_dir() -> Path:
    """Where the built-in template lives when no config file is given."""
    return Path(__file__).resolve().parent / "data"


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Field name → documentation, for the README and `check-config --explain`."""
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(cls)}
