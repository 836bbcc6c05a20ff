"""Regenerate ``config/proxy.yaml`` and the README's configuration reference from proxy/config.py.

    python tools/regen_config_docs.py

Both are generated from the config dataclasses (:mod:`proxy.configdoc`); ``tests/test_config.py``
fails when either is out of step. The README's part lies between the two
``config-reference`` markers.
"""

from __future__ import annotations

import re
from pathlib import Path

from proxy.configdoc import example_yaml, markdown_reference

ROOT = Path(__file__).resolve().parents[1]
_SECTION = re.compile(
    r"(<!-- config-reference:begin[^\n]*-->\n)(.*?)(<!-- config-reference:end -->)", re.DOTALL
)


def main() -> int:
    (ROOT / "config" / "proxy.yaml").write_text(example_yaml(), encoding="utf-8")
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new, count = _SECTION.subn(
        lambda m: m.group(1) + markdown_reference() + m.group(3), text, count=1
    )
    if count != 1:
        raise SystemExit(f"{readme}: the config-reference markers are missing")
    readme.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
