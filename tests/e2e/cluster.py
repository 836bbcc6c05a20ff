"""A real Kubernetes control plane on loopback, for the e2e tests (``make e2e``).

Processes (binaries built by ``e2e/build.sh`` into ``.e2e/bin``, or taken from ``$OMS_E2E_BIN`` /
``$KUBEBUILDER_ASSETS``): etcd, kube-apiserver (RBAC, audit log of the proxy's service accounts),
kube-controller-manager (all default controllers: garbage collector, Job, namespace,
service-account tokens, resource quota, PV binder...), kube-scheduler, the Kubeflow MPI Operator
and kwok (fake nodes; pod phases from our own Stages; container logs from a file). Certificates
and service-account keys are made with ``openssl``. Every process gets SIGTERM when the test
process dies (PR_SET_PDEATHSIG) and is stopped by :meth:`ControlPlane.stop`.

Nothing here is a stand-in: every answer the tests look at comes from the real components.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench import _common as c

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
NAMESPACE = "openmpp"  # the run namespace k8s/base's kustomization uses
OPERATOR_NAMESPACE = "mpi-operator"  # the MPI Operator's leader-election lock lives here
SERVICE_ACCOUNT = "oms-mpijob-proxy"
OPERATOR_HEALTH_PORT = 8080  # fixed in the MPI Operator (cmd/mpi-operator/app/server.go)
KWOK_NODES = ("kwok-node-0", "kwok-node-1")
OUTCOME_KEY = "e2e.openmpp.org/outcome"  # a launcher pod annotated "failed" fails (kwok Stage)
RUN_FOR_KEY = "e2e.openmpp.org/run-for"  # how long a launcher pod runs, e.g. "15s" (kwok)
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "mpi-operator",
    "kwok",
)


class ControlPlaneError(RuntimeError):
    """A component did not start or answer; the message carries its log's tail."""


def binary(name: str) -> Path:
    """Where a binary is: ``$OMS_E2E_BIN``, ``$KUBEBUILDER_ASSETS``, else ``.e2e/bin``."""
    for var in ("OMS_E2E_BIN", "KUBEBUILDER_ASSETS"):
        folder = os.environ.get(var)
        if folder and os.access(Path(folder) / name, os.X_OK):
            return Path(folder) / name
    return REPO / ".e2e" / "bin" / name


def missing_binaries() -> list[str]:
    """Names of the binaries that are nowhere to be found."""
    missing = [n for n in BINARIES if not os.access(binary(n), os.X_OK)]
    if not (REPO / ".e2e" / "bin" / "mpijob-crd.yaml").is_file():
        missing.append("mpijob-crd.yaml")
    return missing


def crd_path() -> Path:
    """The MPIJob CRD, copied by e2e/build.sh from the MPI Operator's Go module."""
    return REPO / ".e2e" / "bin" / "mpijob-crd.yaml"


# --- certificates ---------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _cert(pki: Path, name: str, subject: str, *, san: str = "", client: bool = False) -> None:
    """A key and a certificate signed by ``pki/ca``."""
    key, csr, crt, ext = (pki / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}",
    ]
    if san:
        lines.append(f"subjectAltName={san}")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-CAcreateserial", "-days", "2", "-sha256", "-extfile", str(ext), "-out", str(crt),
    )  # fmt: skip


def make_pki(pki: Path) -> None:
    """CA, API server and kwok serving certificates, an admin client certificate, SA keys."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", str(pki / "ca.key"), "2048")
    _openssl(
        "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=oms-e2e-ca",
        "-days", "2", "-sha256", "-out", str(pki / "ca.crt"),
    )  # fmt: skip
    _cert(pki, "apiserver", "/CN=kube-apiserver", san="IP:127.0.0.1,DNS:localhost")
    _cert(pki, "kwok", "/CN=kwok", san="IP:127.0.0.1,DNS:localhost")
    _cert(pki, "admin", "/O=system:masters/CN=e2e-admin", client=True)
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def write_kubeconfig(
    path: Path, server: str, ca: Path, *, token: str | None = None, cert: Path | None = None,
    key: Path | None = None, namespace: str = "default",
) -> Path:  # fmt: skip
    """A kubeconfig for ``server`` with a bearer token or a client certificate."""
    user: dict[str, str] = {}
    if token is not None:
        user["token"] = token
    if cert is not None and key is not None:
        user["client-certificate"] = str(cert)
        user["client-key"] = str(key)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [
            {"name": "e2e", "context": {"cluster": "e2e", "user": "e2e", "namespace": namespace}}
        ],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


# --- kwok's configuration: our Stages and the launcher's log ----------------------------------

_POD_READY = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: e2e-pod-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: DoesNotExist}
    - {key: .status.podIP, operator: DoesNotExist}
  delay: {durationMilliseconds: 1500}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Ready}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: ContainersReady}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        started: true
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace
        | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
"""

_POD_END = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: e2e-launcher-__OUTCOME__}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: DoesNotExist}
    - {key: .status.phase, operator: In, values: [Running]}
    - {key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}
    - __SELECT__
  delay:
    durationMilliseconds: 8000
    durationFrom: {expressionFrom: '.metadata.annotations["__RUN_MS__"]'}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", type: Ready}
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", type: ContainersReady}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: __EXIT__
            reason: __REASON__
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
      phase: __PHASE__
"""

_POD_DELETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: e2e-pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
  next:
    finalizers: {empty: true}
    delete: true
"""


def kwok_config(log_file: Path, port: int, pki: Path) -> str:
    """kwok's --config: options, pod Stages (ready, succeed / fail, delete), the launcher log."""
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "nodeIP": LOOPBACK,
            "nodePort": port,
            "serverAddress": f"{LOOPBACK}:{port}",
            "tlsCertFile": str(pki / "kwok.crt"),
            "tlsPrivateKeyFile": str(pki / "kwok.key"),
            "manageNodesWithLabelSelector": "type=kwok",
            "enableDebuggingHandlers": True,
        },
    }
    outcome = f"'.metadata.annotations[\"{OUTCOME_KEY}\"]'"

    def end(kind: str, select: str, exit_code: int, reason: str, phase: str) -> str:
        text = _POD_END
        for key, value in [
            ("__OUTCOME__", kind), ("__SELECT__", select), ("__EXIT__", str(exit_code)),
            ("__REASON__", reason), ("__PHASE__", phase), ("__RUN_MS__", RUN_FOR_KEY),
        ]:  # fmt: skip
            text = text.replace(key, value)
        return text

    ok = f"{{key: {outcome}, operator: DoesNotExist}}"
    succeed = end("succeed", ok, 0, "Completed", "Succeeded")
    failed = f"{{key: {outcome}, operator: In, values: [failed]}}"
    fail = end("fail", failed, 3, "Error", "Failed")
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": {"name": "e2e-launcher-log"},
        "spec": {
            "selector": {"matchNamespaces": [NAMESPACE]},
            "logs": [{"containers": ["launcher"], "logsFile": str(log_file), "follow": True}],
        },
    }
    docs = [
        yaml.safe_dump(options),
        _POD_READY,
        succeed,
        fail,
        _POD_DELETE,
        yaml.safe_dump(logs),
    ]
    return "---\n".join(docs)


def kwok_node(name: str) -> dict[str, Any]:
    """A Node that kwok manages (label type=kwok): room for a few MPI runs."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
        },
    }


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # The proxy's MPIJob creates and patches with their bodies: what we sent, as the server got it.
  - level: Request
    userGroups: ["system:serviceaccounts:openmpp"]
    verbs: [create, patch]
    resources: [{group: kubeflow.org, resources: [mpijobs]}]
  # Every other request of the proxy's service accounts: URI, verb, answer code.
  - level: Metadata
    userGroups: ["system:serviceaccounts:openmpp"]
  - level: None
"""


# --- processes ------------------------------------------------------------------------------


def _spawn(name: str, argv: Sequence[str], workdir: Path) -> c.Server:
    log = workdir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            preexec_fn=c._die_with_parent,
        )
    return c.Server(name, popen, "", log)


def wait_until(
    what: str, check: Callable[[], bool], timeout: float, interval: float = 0.25,
    procs: Sequence[c.Server] = (),
) -> None:  # fmt: skip
    """Poll ``check`` until true; raise with the processes' log tails at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            if p.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n"
                    + p.log_tail(40)
                )
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.log_tail(30)}" for p in procs)
            raise ControlPlaneError(f"{what}: not within {timeout:g} s\n{tails}")
        time.sleep(interval)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@dataclasses.dataclass
class ControlPlane:
    """The running control plane: its URL, credentials, processes and helpers."""

    workdir: Path
    server: str = ""
    etcd_url: str = ""
    uncached_url: str = ""
    pki: Path = dataclasses.field(init=False)
    admin_kubeconfig: Path = dataclasses.field(init=False)
    audit_log: Path = dataclasses.field(init=False)
    launcher_log: Path = dataclasses.field(init=False)
    namespace: str = NAMESPACE
    procs: dict[str, c.Server] = dataclasses.field(default_factory=dict)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pki = self.workdir / "pki"
        self.admin_kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit_log = self.workdir / "logs" / "audit.log"
        self.launcher_log = self.workdir / "launcher.log"

    # -- clients --------------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 120.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run the built kubectl with the admin kubeconfig (not checked: look at returncode)."""
        argv = [str(binary("kubectl")), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig)]
        return subprocess.run(
            [*argv, *args], input=input, capture_output=True, text=True, timeout=timeout
        )

    def kubectl_ok(self, *args: str, input: str | None = None) -> str:
        """kubectl that must succeed; its stdout."""
        done = self.kubectl(*args, input=input)
        if done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def get_json(self, *args: str) -> Any:
        """``kubectl get ... -o json`` parsed."""
        return json.loads(self.kubectl_ok("get", *args, "-o", "json"))

    def apply(self, doc: dict[str, Any] | str) -> str:
        """Server-side apply of one object or a YAML text (as the e2e admin)."""
        text = doc if isinstance(doc, str) else json.dumps(doc)
        return self.kubectl_ok(
            "apply", "--server-side", "--force-conflicts", "--field-manager=e2e", "-f", "-",
            input=text,
        )  # fmt: skip

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def raw(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` on the API server as admin: (status, body)."""
        try:
            with urllib.request.urlopen(  # noqa: S310 - our own https URL on loopback
                self.server + path, context=self._ssl(), timeout=10
            ) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def etcd(self, path: str, body: dict[str, Any]) -> Any:
        """POST to etcd's JSON gateway (``/v3/kv/range``, ``/v3/kv/compaction``...)."""
        req = urllib.request.Request(  # noqa: S310 - our own etcd on loopback
            self.etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            return json.loads(resp.read())

    def etcd_revision(self) -> int:
        """etcd's current revision."""
        head = self.etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        return int(head["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd up to its current revision (older resourceVersions become 410 Gone)."""
        revision = self.etcd_revision()
        self.etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def token(self, service_account: str, namespace: str = NAMESPACE) -> str:
        """A token for a ServiceAccount through the TokenRequest API (kubectl create token)."""
        return self.kubectl_ok(
            "create", "token", service_account, "-n", namespace, "--duration=4h"
        ).strip()

    def kubeconfig_for(self, service_account: str, path: Path) -> Path:
        """A kubeconfig that authenticates as ``service_account`` with a requested token."""
        return write_kubeconfig(
            path, self.server, self.pki / "ca.crt", token=self.token(service_account),
            namespace=self.namespace,
        )  # fmt: skip

    def audit_events(self) -> list[dict[str, Any]]:
        """The API server's audit log so far (the proxy's service accounts only)."""
        if not self.audit_log.exists():
            return []
        events = []
        for line in self.audit_log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    def logs(self, lines: int = 40) -> str:
        """The tail of every component's log, for a failing test's report."""
        return "\n".join(
            f"----- {name} ({p.log})\n{p.log_tail(lines)}" for name, p in self.procs.items()
        )

    # -- start and stop --------------------------------------------------------------------------

    def _start(self, name: str, argv: Sequence[str]) -> c.Server:
        proc = _spawn(name, argv, self.workdir)
        self.procs[name] = proc
        return proc

    def _timed(self, what: str, began: float) -> None:
        self.timings[what] = round(time.monotonic() - began, 2)

    def start(self) -> None:
        """Start every component and prepare the run namespace (about 30-60 s)."""
        t0 = time.monotonic()
        make_pki(self.pki)
        self._start_etcd()
        self._start_apiserver()
        write_kubeconfig(
            self.admin_kubeconfig, self.server, self.pki / "ca.crt",
            cert=self.pki / "admin.crt", key=self.pki / "admin.key", namespace=self.namespace,
        )  # fmt: skip
        self._timed("etcd+apiserver", t0)
        self.install_crd()
        for ns in (self.namespace, OPERATOR_NAMESPACE):
            self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self._start_controllers()
        self._start_kwok()
        self._storage()
        self._rbac()
        self._timed("control plane ready", t0)

    def _start_etcd(self) -> None:
        client, peer = c.free_port(), c.free_port()
        self.etcd_url = f"http://{LOOPBACK}:{client}"
        peer_url = f"http://{LOOPBACK}:{peer}"
        etcd = self._start(
            "etcd",
            [
                str(binary("etcd")), "--name", "e2e", "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"e2e={peer_url}", "--unsafe-no-fsync",
                "--log-level", "warn",
            ],
        )  # fmt: skip

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as r:  # noqa: S310
                return bool(json.loads(r.read()).get("health") == "true")

        wait_until("etcd healthy", healthy, 30, procs=[etcd])

    def _start_apiserver(self) -> None:
        self.server = self._apiserver("kube-apiserver", "/registry", audit=True)

    def _apiserver(self, name: str, prefix: str, *, audit: bool, extra: Sequence[str] = ()) -> str:
        port = c.free_port()
        url = f"https://{LOOPBACK}:{port}"
        pki = self.pki
        argv = [
            str(binary("kube-apiserver")),
            "--etcd-servers", self.etcd_url, "--etcd-prefix", prefix,
            "--bind-address", LOOPBACK, "--advertise-address", LOOPBACK,
            "--secure-port", str(port),
            "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--requestheader-client-ca-file", str(pki / "ca.crt"),
            "--requestheader-allowed-names", "front-proxy-client",
            "--requestheader-username-headers", "X-Remote-User",
            "--requestheader-group-headers", "X-Remote-Group",
            "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--authorization-mode", "RBAC",
            "--kubelet-preferred-address-types", "InternalIP",
            "--profiling=false", "--v=1", *extra,
        ]  # fmt: skip
        if audit:
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text(AUDIT_POLICY)
            argv += [
                "--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_log),
                "--audit-log-format", "json", "--audit-log-mode", "blocking",
            ]  # fmt: skip
        api = self._start(name, argv)

        def ready() -> bool:
            saved, self.server = self.server, url
            try:
                return self.raw("/readyz")[0] == 200
            finally:
                self.server = saved

        wait_until(f"{name} /readyz", ready, 90, procs=[api])
        return url

    def bare_apiserver(self) -> Path:
        """A second kube-apiserver on the same etcd, under its own prefix: a cluster without
        the MPIJob CRD. Returns an admin kubeconfig for it (started once)."""
        path = self.workdir / "bare-admin.kubeconfig"
        if "kube-apiserver-bare" not in self.procs:
            url = self._apiserver("kube-apiserver-bare", "/bare", audit=False)
            write_kubeconfig(
                path, url, self.pki / "ca.crt", cert=self.pki / "admin.crt",
                key=self.pki / "admin.key",
            )  # fmt: skip
        return path

    def uncached_apiserver(self) -> str:
        """A second kube-apiserver replica of the same cluster (same etcd, same prefix) with the
        watch cache off, as some clusters run: its watches are served by etcd itself, so a watch
        from a resourceVersion that etcd compacted is answered 410 Gone (the cached replica
        keeps a window of its own and would not notice). Returns its URL (started once)."""
        if "kube-apiserver-uncached" not in self.procs:
            self.uncached_url = self._apiserver(
                "kube-apiserver-uncached", "/registry", audit=False,
                extra=["--watch-cache=false", "--endpoint-reconciler-type=none"],
            )  # fmt: skip
        return self.uncached_url

    def install_crd(self) -> None:
        """Apply the MPIJob CRD from the MPI Operator's module and wait until it is served."""
        self.kubectl_ok("apply", "--server-side", "--field-manager=e2e", "-f", str(crd_path()))

        def established() -> bool:
            crd = self.get_json("crd", "mpijobs.kubeflow.org")
            return any(
                cond["type"] == "Established" and cond["status"] == "True"
                for cond in crd.get("status", {}).get("conditions") or []
            )

        wait_until("MPIJob CRD Established", established, 60, procs=list(self.procs.values()))

    def _start_controllers(self) -> None:
        kc, pki = str(self.admin_kubeconfig), self.pki
        self._start(
            "kube-controller-manager",
            [
                str(binary("kube-controller-manager")), "--kubeconfig", kc,
                "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
                "--bind-address", LOOPBACK, "--secure-port", str(c.free_port()),
                "--leader-elect=false", "--use-service-account-credentials=false",
                "--service-account-private-key-file", str(pki / "sa.key"),
                "--root-ca-file", str(pki / "ca.crt"),
                "--controllers", "*", "--concurrent-gc-syncs", "5",
                "--v=1",
            ],
        )  # fmt: skip
        self._start(
            "kube-scheduler",
            [
                str(binary("kube-scheduler")), "--kubeconfig", kc,
                "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
                "--bind-address", LOOPBACK, "--secure-port", str(c.free_port()),
                "--leader-elect=false", "--v=1",
            ],
        )  # fmt: skip
        if not _port_free(OPERATOR_HEALTH_PORT):
            raise ControlPlaneError(
                f"port {OPERATOR_HEALTH_PORT} is taken: the MPI Operator always listens there "
                "for its health check (not configurable in v0.8); free it and run again"
            )
        self._start(
            "mpi-operator",
            [
                str(binary("mpi-operator")), "--kubeConfig", kc,
                "--lock-namespace", OPERATOR_NAMESPACE, "--threadiness", "2",
                "--kube-api-qps", "50", "--kube-api-burst", "100", "--v=2",
            ],
        )  # fmt: skip
        procs = list(self.procs.values())
        wait_until(
            "the default ServiceAccount (controller-manager up)",
            lambda: self.kubectl("get", "sa", "default", "-n", self.namespace).returncode == 0,
            90,
            procs=procs,
        )
        wait_until(
            "the MPI Operator leading",
            lambda: self.kubectl("get", "lease", "-n", OPERATOR_NAMESPACE).stdout.count("\n") >= 2,
            90,
            procs=procs,
        )

    def _start_kwok(self) -> None:
        port = c.free_port()
        self.launcher_log.write_text("")
        config = self.workdir / "kwok.yaml"
        config.write_text(kwok_config(self.launcher_log, port, self.pki))
        kwok = self._start(
            "kwok",
            [
                str(binary("kwok")), "--kubeconfig", str(self.admin_kubeconfig),
                "--config", str(config),
            ],
        )  # fmt: skip
        for name in KWOK_NODES:
            self.kubectl_ok("create", "-f", "-", input=json.dumps(kwok_node(name)))

        def nodes_ready() -> bool:
            nodes = self.get_json("nodes")["items"]
            ready = [
                n
                for n in nodes
                if any(
                    cond["type"] == "Ready" and cond["status"] == "True"
                    for cond in n.get("status", {}).get("conditions", [])
                )
            ]
            return len(ready) == len(KWOK_NODES)

        wait_until("kwok's nodes Ready", nodes_ready, 60, procs=[kwok])

    def _storage(self) -> None:
        """The template's models volume (PVC openmpp-models), bound by the real PV controller."""
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "e2e-openmpp-models"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(self.workdir / "models")},
            },
        }
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "openmpp-models", "namespace": self.namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": "e2e-openmpp-models",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        self.apply(pv)
        self.apply(pvc)
        wait_until(
            "PVC openmpp-models Bound",
            lambda: (
                self.get_json("pvc", "openmpp-models", "-n", self.namespace)["status"].get("phase")
                == "Bound"
            ),
            60,
            procs=list(self.procs.values()),
        )

    def _rbac(self) -> None:
        """Our own k8s/base/rbac, unchanged, into the run namespace."""
        self.kubectl_ok("apply", "-k", str(REPO / "k8s" / "base" / "rbac"), "-n", self.namespace)

    def stop(self) -> None:
        """Stop every process (the reverse of the start order)."""
        for proc in reversed(list(self.procs.values())):
            proc.stop(grace=10)


def new_control_plane(workdir: Path) -> ControlPlane:
    """A started control plane in ``workdir`` (which is emptied first)."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    plane = ControlPlane(workdir)
    try:
        plane.start()
    except BaseException:
        plane.stop()
        raise
    return plane
