"""Loading the configuration: one YAML file, checked whole, then command-line overrides.

:func:`load_config` reads one YAML file, rejects unknown keys, wrong types and bad values with a
:class:`~proxy.config.ConfigError` that names the file, the dotted key and what was expected,
then applies command-line overrides. The groups themselves are in :mod:`proxy.config`.
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

from proxy.config import ENV_CONFIG, FORBIDDEN_ENV_PATTERN, Config, ConfigError, LoggingConfig

T = TypeVar("T")


_NOT_KEYS = {"source", "base_dir"}

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_PREFIX = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# A LocalQueue name that is also a label value: a DNS-1123 subdomain of at most 63 characters.
_QUEUE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
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
    need(o.model_cache_seconds >= 0, "oms.model_cache_seconds", "expected >= 0")
    for key in ("max_request_target_bytes", "max_header_bytes"):
        need(getattr(s, key) >= 256, f"server.{key}", "expected >= 256")
    need(s.max_headers >= 1, "server.max_headers", "expected >= 1")
    need(o.max_answer_head_bytes >= 1024, "oms.max_answer_head_bytes", "expected >= 1024")
    need(o.max_answer_headers >= 1, "oms.max_answer_headers", "expected >= 1")
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
    need(
        m.queue_name == "" or _QUEUE_NAME.fullmatch(m.queue_name) is not None,
        "mpijob.queue_name",
        "expected a LocalQueue name (lower-case letters, digits, '-' and '.', at most 63 "
        f"characters, starting and ending with a letter or digit) or empty, got {m.queue_name!r}",
    )
    f = config.follow
    for name in (
        "settle_seconds",
        "events_refresh_seconds",
        "tombstone_seconds",
        "sweep_seconds",
        "backoff_first_seconds",
        "backoff_max_seconds",
        "direct_cache_seconds",
        "record_retry_seconds",
    ):
        need(getattr(f, name) > 0, f"follow.{name}", "expected > 0")
    need(f.watch_timeout_seconds >= 1, "follow.watch_timeout_seconds", "expected >= 1")
    need(f.record_attempts >= 1, "follow.record_attempts", "expected >= 1")
    need(
        f.backoff_max_seconds >= f.backoff_first_seconds,
        "follow.backoff_max_seconds",
        "expected >= follow.backoff_first_seconds",
    )

    h = config.history
    need(h.retention_days >= 0, "history.retention_days", "expected >= 0 (0: never)")
    need(h.max_runs >= 1, "history.max_runs", "expected >= 1")
    need(h.max_total_bytes >= 1 << 20, "history.max_total_bytes", "expected >= 1048576")
    need(h.max_log_bytes >= 4096, "history.max_log_bytes", "expected >= 4096")


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
