"""The committed MPIJob schema is what our script makes of the MPI Operator module's own CRD."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from standins.kube import SCHEMA_CRD
from tools.mpijob_schema import render

pytestmark = pytest.mark.e2e

MODULE = "github.com/kubeflow/mpi-operator@v0.8.2"
UPSTREAM_PATH = "manifests/base/kubeflow.org_mpijobs.yaml"
UPSTREAM_BLOB = "e7c24a6a51d0d741243c5c0dd002cac8fb26ea29"


def test_the_schema_is_derived_from_the_operators_module() -> None:
    go = shutil.which("go")
    assert go, "the e2e tier needs the Go toolchain (go) on PATH"
    out = subprocess.run(
        [go, "mod", "download", "-json", MODULE],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    upstream = Path(json.loads(out)["Dir"]) / UPSTREAM_PATH
    blob = subprocess.run(
        ["git", "hash-object", "--no-filters", str(upstream)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert blob == UPSTREAM_BLOB, "the module's CRD is not the one the provenance names"
    assert render(upstream.read_text(encoding="utf-8")) == SCHEMA_CRD.read_text(encoding="utf-8")
