"""``make mutation``: mutmut over the modules in ``[tool.mutmut] only_mutate``, and the score.

    python tools/mutation.py [--every N]

mutmut copies the package into ``mutants/`` (gitignored), runs the selected tests once to learn
which tests reach which function, then runs only those tests against each mutant. On the
2-core development machine the whole set takes hours, so ``--every N`` checks a deterministic
sample: every N-th mutant of each module, by name (``errors`` and ``headers`` are always
checked whole). The score is killed / (killed + survived + no tests), per module and in all;
timeouts count as killed, as mutmut counts them. Kept out of ``make test`` and CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = [sys.executable, "-m", "mutmut"]
ALWAYS_WHOLE = ("errors.py", "headers.py")
KILLED = {1, 3, 36, 24, -24, 152, 255}
UNKILLED = {0: "survived", 5: "no tests", 33: "no tests"}


def _metas() -> list[Path]:
    return sorted((ROOT / "mutants").rglob("*.py.meta"))


def _names(meta: Path) -> list[str]:
    return sorted(json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="check every N-th mutant (1: all)")
    args = parser.parse_args(argv)
    if not _metas():  # generate the mutants (and the test map) without checking any
        subprocess.run([*MUTMUT, "run", "no-such-mutant"], cwd=ROOT, check=False)
    chosen: list[str] = []
    for meta in _metas():
        names = _names(meta)
        step = 1 if meta.name.removesuffix(".meta").endswith(ALWAYS_WHOLE) else args.every
        chosen += names[::step]
    subprocess.run([*MUTMUT, "run", *chosen], cwd=ROOT, check=False)
    wanted = set(chosen)
    total: Counter[str] = Counter()
    print(f"\n{'module':45} {'killed':>7} {'survived':>9} {'no tests':>9} {'score':>7}")
    for meta in _metas():
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        counts: Counter[str] = Counter()
        for name, code in codes.items():
            if name not in wanted or code is None:
                continue
            counts["killed" if code in KILLED else UNKILLED.get(code, "survived")] += 1
        total += counts
        _row(str(meta.relative_to(ROOT / "mutants")).removesuffix(".meta"), counts)
    _row("all", total)
    return 0


def _row(label: str, c: Counter[str]) -> None:
    n = c["killed"] + c["survived"] + c["no tests"]
    score = f"{100 * c['killed'] / n:.1f}%" if n else "-"
    print(f"{label:45} {c['killed']:7} {c['survived']:9} {c['no tests']:9} {score:>7}")


if __name__ == "__main__":
    raise SystemExit(main())
