"""Two real ``serve`` processes (replicas) against one stand-in Kubernetes API, as behind a
round-robin balancer (issue 12 items 1, 2, 6).

The stand-in oms, the stand-in Kubernetes API (``python -m standins.serve_kube``) and two proxies
(``python -m proxy serve``) each run in their own process. Both proxies make their stamps from
the same fixed instant (the only change to ``serve``: ``Submitter.new_stamp`` is given a fixed
``now``), so every stamp one replica makes the other makes too: only the reservation at the
API server keeps them apart. The clients send the UI's requests (oms-api.md §2): POST /api/run
without a RunStamp, log pages, status lists, the service-state page.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench import _common as c

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "config" / "mpijob-template.yaml"
MODEL, DIGEST = "modelOne", "_201208171604590148_"
N = 20  # submissions, 10 to each replica
MPIJOBS = "/apis/kubeflow.org/v2beta1/namespaces/default/mpijobs"
FIXED_CLOCK = (
    "import sys, datetime\n"
    "import proxy.submit.handler as h\n"
    "_new = h.Submitter.new_stamp\n"
    "_at = datetime.datetime(2026, 3, 4, 5, 6, 7, 890000)\n"
    "h.Submitter.new_stamp = lambda self, now: _new(self, _at)\n"
    "from proxy.cli import main\n"
    "sys.exit(main())\n"
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[c.Server, list[c.Server]]]:
    """The stand-in API and two proxy replicas in front of one stand-in oms; all stopped after."""
    oms = c.start_oms(tmp_path, max_seconds=300)
    servers = [oms]
    try:
        kube, kubeconfig = c.start_kube(
            tmp_path, ["--scenario", "succeed", "--log-lines", "5", "--line-interval", "0.05"]
        )
        servers.append(kube)
        config = {
            "runs": {"intercept": "mpi"},
            "kubernetes": {"kubeconfig": str(kubeconfig), "dry_run_on_start": False},
            "mpijob": {"template": str(TEMPLATE)},
        }
        replicas = []
        for name in ("replica-a", "replica-b"):
            proxy = c.start_proxy(
                oms.url, tmp_path, name=name, extra_config=config, code=FIXED_CLOCK
            )
            servers.append(proxy)
            replicas.append(proxy)
        yield kube, replicas
    finally:
        for server in reversed(servers):
            server.stop()


def post_run(url: str, i: int) -> tuple[int, Any]:
    body = {
        "ModelName": MODEL,
        "ModelDigest": DIGEST,
        "Mpi": {"Np": 2},
        "Template": "",
        "Opts": {"OpenM.RunName": f"run-{i:02d}"},
    }
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/api/run", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        return resp.status, data.decode(errors="replace")  # plain text, as oms's
    return resp.status, json.loads(data)


def log_page(url: str) -> Any:
    """A log page that names a run. Until a replica's watch has brought it a run created on the
    other replica (milliseconds), it passes the stamp to oms, which answers an empty page (the
    UI accepts up to 5 in a row); a page never names another run."""
    deadline = time.monotonic() + 10
    while True:
        page = c.get_json(url)
        if page["RunStamp"] or time.monotonic() > deadline:
            return page
        assert page["Lines"] == []  # oms's empty page, not another run's
        time.sleep(0.05)


def test_twenty_ui_submissions_on_two_replicas_name_twenty_runs(
    cluster: tuple[c.Server, list[c.Server]],
) -> None:
    kube, replicas = cluster
    with ThreadPoolExecutor(N) as pool:
        results = list(pool.map(lambda i: post_run(replicas[i % 2].url, i), range(N)))
    assert [status for status, _ in results] == [200] * N, results
    states = [doc for _, doc in results]
    assert len({s["RunStamp"] for s in states}) == N
    assert all(s["RunStamp"] == s["SubmitStamp"] for s in states)
    jobs = c.get_json(kube.url + MPIJOBS)["items"]
    assert len(jobs) == N
    name_of = {j["metadata"]["annotations"]["openmpp.org/run-stamp"]: j for j in jobs}
    for i, state in enumerate(states):
        job = name_of[state["RunStamp"]]
        assert job["metadata"]["annotations"]["openmpp.org/submit-stamp"] == state["SubmitStamp"]
        for proxy in replicas:
            url = f"{proxy.url}/api/run/log/model/{DIGEST}/stamp/{state['SubmitStamp']}"
            page = log_page(url + "/start/0/count/0")
            assert (page["RunStamp"], page["RunName"]) == (state["RunStamp"], f"run-{i:02d}")
            assert f"MPIJob {job['metadata']['name']}:" in page["Lines"][0]
            [item] = c.get_json(
                f"{proxy.url}/api/model/{DIGEST}/run/{state['RunStamp']}/status/list"
            )
            assert (item["RunStamp"], item["Name"]) == (state["RunStamp"], f"run-{i:02d}")
    # The jobs page of both replicas lists each run once, under its own stamp and name.
    pages = [c.get_json(proxy.url + "/api/service/state") for proxy in replicas]
    for doc in pages:
        entries = [
            (j["SubmitStamp"], j["RunStamp"], j.get("Opts", {}).get("OpenM.RunName"))
            for j in (*doc["Queue"], *doc["Active"])
        ] + [(j["SubmitStamp"], j["RunStamp"], j["RunTitle"]) for j in doc["History"]]
        assert sorted(entries) == sorted(
            (s["SubmitStamp"], s["RunStamp"], f"run-{i:02d}") for i, s in enumerate(states)
        )
