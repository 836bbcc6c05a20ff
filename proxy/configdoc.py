"""Documentation of the configuration, generated from the dataclasses (one source of truth).

``config/proxy.yaml`` is :func:`example_yaml` and the README's configuration reference is
:func:`markdown_reference`; tests keep both in step with :mod:`proxy.config`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import yaml

from proxy.config import Config

_HEADER = """\
# oms-mpijob-proxy configuration: every key with its default value.
# Generated from proxy/config.py (proxy.configdoc.example_yaml); unknown keys, wrong types and
# bad values stop start-up with a message naming this file and the key.
# `oms-mpijob-proxy check-config --config FILE` validates a file without starting anything.
"""


def _sections() -> list[tuple[str, type[Any], str]]:
    hints = typing.get_type_hints(Config)
    out = []
    for f in dataclasses.fields(Config):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            out.append((f.name, tp, (tp.__doc__ or "").strip()))
    return out


def _yaml_value(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text: str = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def example_yaml() -> str:
    """The documented example config: every key, its default and its meaning."""
    lines = [_HEADER]
    for name, cls, doc in _sections():
        lines.append(f"# {doc}")
        lines.append(f"{name}:")
        defaults = cls()
        for f in dataclasses.fields(cls):
            lines.append(f"  # {f.metadata.get('doc', '')}")
            lines.append(f"  {f.name}: {_yaml_value(getattr(defaults, f.name))}")
        lines.append("")
    return "\n".join(lines)


def markdown_reference() -> str:
    """A Markdown table per section: key, default, meaning."""
    out = []
    for name, cls, doc in _sections():
        out.append(f"**`{name}`** — {doc}\n")
        out.append("| key | default | meaning |")
        out.append("|---|---|---|")
        defaults = cls()
        for f in dataclasses.fields(cls):
            value = _yaml_value(getattr(defaults, f.name)).replace("|", "\\|")
            if len(value) > 60:
                value = value[:57] + "..."
            out.append(f"| `{name}.{f.name}` | `{value}` | {f.metadata.get('doc', '')} |")
        out.append("")
    return "\n".join(out)
