"""Session fixtures of the e2e tier: a real control plane, the stand-in oms, real ``serve`` proxies.

``control_plane`` is usable on its own (e.g. for server-side dry-run applies of the manifests):
``.admin_kubeconfig``, ``.server``, ``.namespace``, ``.kubectl(*args, input=None)``.
The proxies authenticate with a TokenRequest token of our own ServiceAccount, bound by our own
``k8s/base/rbac`` Role: a verb missing there fails here.
Everything runs under ``.e2e/run`` (logs in ``.e2e/run/logs``); a failing test's report ends
with the tail of every component's log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import _common as c
from tests.e2e import cluster
from tests.e2e.cluster import REPO, ControlPlane

TEMPLATE = REPO / "config" / "mpijob-template.yaml"
RETENTION_SECONDS = 20.0  # every proxy sweeps every MPIJob of the namespace: one value for all


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(300))


_PLANE: list[ControlPlane] = []
_PROXIES: list[c.Server] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and _PLANE:
        report.sections.append(("control plane logs", _PLANE[0].logs()))
        for proxy in _PROXIES:
            report.sections.append((f"{proxy.name} log", proxy.log_tail(60)))
    return report


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, controller-manager, scheduler, MPI Operator, kwok; namespace+RBAC."""
    missing = cluster.missing_binaries()
    if missing:
        pytest.fail(f"e2e binaries missing ({', '.join(missing)}): run e2e/build.sh (make e2e)")
    plane = cluster.new_control_plane(REPO / ".e2e" / "run")
    _PLANE.append(plane)
    print(f"control plane up: {plane.timings}")  # noqa: T201 - shown with -s
    try:
        yield plane
    finally:
        _PLANE.clear()
        plane.stop()


@pytest.fixture(scope="session")
def oms(control_plane: ControlPlane) -> Iterator[c.Server]:
    """The stand-in oms (oms is not what these tests are about), in its own process."""
    server = c.start_oms(control_plane.workdir / "logs", max_seconds=3600)
    yield server
    server.stop()


ProxyFactory = Callable[..., c.Server]


@pytest.fixture(scope="session")
def start_proxy(control_plane: ControlPlane, oms: c.Server) -> Iterator[ProxyFactory]:
    """``start_proxy(name, kubeconfig=, template=, code=, **sections)``: a ``serve`` process.

    Defaults: the run namespace, our ServiceAccount's token, config/mpijob-template.yaml, MPI
    runs intercepted, INFO logs. Every proxy started is stopped at the end of the session.
    """
    workdir = control_plane.workdir / "proxies"
    workdir.mkdir(exist_ok=True)
    tokens: dict[str, Path] = {}

    def start(
        name: str,
        *,
        service_account: str = cluster.SERVICE_ACCOUNT,
        kubeconfig: Path | None = None,
        template: Path = TEMPLATE,
        code: str | None = None,
        **sections: dict[str, Any],
    ) -> c.Server:
        if kubeconfig is None:
            if service_account not in tokens:
                tokens[service_account] = control_plane.kubeconfig_for(
                    service_account, workdir / f"{service_account}.kubeconfig"
                )
            kubeconfig = tokens[service_account]
        config: dict[str, Any] = {
            "runs": {"intercept": "mpi", "finished_retention_seconds": RETENTION_SECONDS},
            "kubernetes": {"namespace": control_plane.namespace, "kubeconfig": str(kubeconfig)},
            "mpijob": {"template": str(template)},
            "logging": {"level": "INFO"},
        }
        for section, values in sections.items():
            config.setdefault(section, {}).update(values)
        server = c.start_proxy(oms.url, workdir, name=name, extra_config=config, code=code)
        _PROXIES.append(server)
        return server

    yield start
    for server in _PROXIES:
        server.stop()
    _PROXIES.clear()


@pytest.fixture(scope="session")
def proxy(start_proxy: ProxyFactory) -> c.Server:
    """The proxy as deployed: our ServiceAccount and Role, the shipped template."""
    return start_proxy("proxy")


@pytest.fixture(scope="session")
def failing_template(control_plane: ControlPlane) -> Path:
    """The shipped template whose launcher pod kwok fails (exit code 3, our kwok Stage)."""
    doc = yaml.safe_load(TEMPLATE.read_text())
    launcher = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"]
    launcher.setdefault("annotations", {})[cluster.OUTCOME_KEY] = "failed"
    path = control_plane.workdir / "mpijob-template-failing.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


UI_MPI: dict[str, Any] = json.loads((REPO / "tests" / "requests" / "ui-mpi.json").read_text())
