"""`oms-mpijob-proxy demo` (what `make demo` runs) plays the UI's whole run flow and exits 0."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_the_whole_flow() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "demo"],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert '"oms": "ok", "kubernetes": "ok", "dry_run": "ok"' in out
    assert "POST /api/run  ->  200  Content-Location: /api/model/" in out
    assert "kind: MPIJob" in out
    assert "| Done." in out  # the launcher's last line reached the UI's log pages
    assert "IsFinal=True" in out
    assert "Status ['s']" in out
    assert "/true" in out  # the stop answer's Content-Location
    assert "run stopped: MPIJob" in out
    assert "Traceback" not in done.stderr
