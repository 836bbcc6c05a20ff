"""The repository stands alone: a copy with nothing beside it passes the CRD-dependent tests.

The copy holds exactly the files git would clone (tracked, plus new files not ignored) in a folder
that has no siblings, so no path that leaves the repository (a sibling reference folder or any
other) can be satisfied. A fresh clone in CI is checked the same way by ``.ci/run``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The tests that read the MPIJob schema: the stand-in API's admission, the renderer's CRD checks,
# the submit path through the stand-in, and the schema's own tests.
CRD_DEPENDENT = [
    "tests/test_schema.py",
    "tests/test_render.py",
    "tests/test_standin_kube.py",
    "tests/test_submit.py",
]


def _repo_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def test_a_copy_with_nothing_beside_it_passes_the_crd_dependent_tests(tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    copy = alone / "repo"
    for name in _repo_files():
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    assert sorted(p.name for p in alone.iterdir()) == ["repo"]  # no shared/, nothing else
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMS_MPIJOB_PROXY", "PYTEST"))}
    # The copy's own modules are imported (the working directory comes first on sys.path).
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import proxy, tests.crd, standins.kube as k; "
            "print(proxy.__file__); print(tests.crd.CRD_PATH); print(k.find_crd())",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(where) == 3
    for path in where:
        assert Path(path).resolve().is_relative_to(copy.resolve()), path
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *CRD_DEPENDENT],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    assert " passed" in tail, tail
    assert " failed" not in tail, tail
    assert "error" not in tail.lower(), tail
