"""Kueue (``sigs.k8s.io/kueue``, built by ``e2e/build.sh``) as a process beside the control plane.

It runs with the admin kubeconfig, leader election off, only the ``kubeflow.org/mpijob``
integration, health and metrics on free loopback ports, and its webhooks for real: the API server
runs on loopback, where a Service cannot be reached, so Kueue's own webhook configurations (from
its module) are registered with ``url: https://127.0.0.1:<port>/<path>`` and a CA made here. Its
internal certificate management stays on (with it off, v0.17 insists on metrics certificates at a
fixed ``/etc/kueue`` path) and finds our CA and serving certificate already in its Secret, valid
for both the Service name it expects and 127.0.0.1; the same files are in its ``certDir``. The
CRDs' conversion webhooks point at the same URL (``/convert``).
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench import _common as c
from tests.e2e import cluster
from tests.e2e.cluster import LOOPBACK, REPO, ControlPlane

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"  # Kueue's default: the certificate's DNS name comes from it
SECRET = "kueue-webhook-server-cert"
API = "kueue.x-k8s.io/v1beta2"
# The CRDs whose conversion webhook Kueue's certificate manager keeps up to date (and waits for).
CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
DAYS = "400"  # the certificate manager renews anything valid for less than 90 days


def crd_dir() -> Path:
    """Kueue's CRDs, copied by e2e/build.sh from Kueue's Go module."""
    return REPO / ".e2e" / "bin" / "kueue-crds"


def webhooks_path() -> Path:
    """Kueue's webhook configurations (config/components/webhook/manifests.yaml of its module)."""
    return REPO / ".e2e" / "bin" / "kueue-webhooks.yaml"


def missing() -> list[str]:
    """What e2e/build.sh did not provide."""
    out = [] if cluster.binary("kueue").is_file() else ["kueue"]
    if not any(crd_dir().glob("*.yaml")):
        out.append("kueue-crds")
    if not webhooks_path().is_file():
        out.append("kueue-webhooks.yaml")
    return out


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certs(pki: Path) -> None:
    """A CA (named as Kueue's certificate manager names its own) and a serving certificate for
    Kueue's Service name and 127.0.0.1; RSA keys in PKCS#1, as that manager reads them."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = pki / "ca.key", pki / "ca.crt"
    _openssl("genrsa", "-traditional", "-out", str(ca_key), "2048")
    _openssl(
        "req", "-x509", "-new", "-key", str(ca_key), "-subj", "/O=kueue/CN=kueue-ca",
        "-addext", "subjectAltName=DNS:kueue-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
        "-days", DAYS, "-sha256", "-out", str(ca_crt),
    )  # fmt: skip
    key, csr, crt, ext = (pki / f"tls.{s}" for s in ("key", "csr", "crt", "ext"))
    _openssl("genrsa", "-traditional", "-out", str(key), "2048")
    dns = f"{SERVICE}.{NAMESPACE}.svc"
    _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={dns}", "-out", str(csr))
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{dns},IP:{LOOPBACK}\n"
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", DAYS, "-sha256", "-extfile", str(ext), "-out", str(crt),
    )  # fmt: skip


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def webhook_configurations(url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, as its kustomization names them, with a URL in place of
    the Service; only the webhooks of Kueue's own objects and of MPIJobs (the others belong to
    integrations that are off)."""
    docs = [d for d in yaml.safe_load_all(webhooks_path().read_text()) if d]
    for doc in docs:
        doc["metadata"] = {"name": "kueue-" + doc["metadata"]["name"]}
        kept = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if "-kueue-x-k8s-io-" in path or "-mpijob" in path:
                hook["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
                kept.append(hook)
        doc["webhooks"] = kept
    return docs


def configuration(workdir: Path, webhook_port: int) -> dict[str, Any]:
    """Kueue's Configuration file."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{c.free_port()}"},
        "metrics": {"bindAddress": f"{LOOPBACK}:{c.free_port()}"},
        "webhook": {"host": LOOPBACK, "port": webhook_port, "certDir": str(workdir / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        "integrations": {"frameworks": ["kubeflow.org/mpijob"]},
    }


def start(plane: ControlPlane) -> c.Server:
    """Install Kueue's CRDs and webhooks, start Kueue, wait until it is ready and serving."""
    workdir = plane.workdir / "kueue"
    pki = workdir / "certs"
    make_certs(pki)
    port = c.free_port()
    url = f"https://{LOOPBACK}:{port}"
    ca_bundle = _b64(pki / "ca.crt")
    for path in sorted(crd_dir().glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": url + "/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"],
                },
            }
        plane.apply(crd)
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in crd_dir().glob("*.yaml")]

    def established() -> bool:
        done = plane.kubectl(
            "wait", "--for=condition=Established", *(f"crd/{n}" for n in names), "--timeout=5s"
        )
        return done.returncode == 0

    cluster.wait_until("Kueue's CRDs Established", established, 60)
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    plane.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": {n: _b64(pki / n) for n in ("ca.crt", "ca.key", "tls.crt", "tls.key")},
        }
    )
    for doc in webhook_configurations(url, ca_bundle):
        plane.apply(doc)
    config = configuration(workdir, port)
    config_path = workdir / "kueue.yaml"
    config_path.write_text(yaml.safe_dump(config))
    proc = plane._start(
        "kueue",
        [
            str(cluster.binary("kueue")), "--config", str(config_path),
            "--kubeconfig", str(plane.admin_kubeconfig),
            "--visibility-server-port", str(c.free_port()), "--zap-log-level=2",
        ],
    )  # fmt: skip
    health = "http://" + config["health"]["healthProbeBindAddress"] + "/readyz"

    def ready() -> bool:
        with urllib.request.urlopen(health, timeout=2) as r:
            return bool(r.status == 200)

    cluster.wait_until("Kueue ready (webhooks serving)", ready, 120, procs=[proc])
    return proc


def workloads(plane: ControlPlane, job_name: str) -> list[dict[str, Any]]:
    """Kueue's Workloads owned by the MPIJob ``job_name``."""
    items: list[dict[str, Any]] = json.loads(
        plane.kubectl_ok("get", "workloads.kueue.x-k8s.io", "-n", plane.namespace, "-o", "json")
    )["items"]
    return [
        w
        for w in items
        if any(
            o.get("kind") == "MPIJob" and o.get("name") == job_name
            for o in w["metadata"].get("ownerReferences") or []
        )
    ]
