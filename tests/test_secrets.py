"""Secrets stay out of logs and out of error answers, and Kubernetes error bodies are bounded.

Planted secrets: the service-account bearer token in the kubeconfig, the values of the
Authorization, Cookie and X-Api-Key headers, a secret in the query string, and one inside the
request body (in Opts and RunNotes). Traffic covers successes and every kind of error; ALL log
records are captured (caplog at DEBUG in-process; the stderr of a ``serve`` process at DEBUG).

What a client may see: the answers to its own request can quote its own body, as oms does
("Model not found: <name>") and as the Kubernetes API does in a 422 or 5xx Status message that
echoes the submitted object; that is the client's own data going back to it, truncated. The
token, header values and query never appear in any answer from the proxy itself (oms's answers
pass through untouched: the stand-in's /test/echo echoes headers by design, so it is not used
here), and nothing from the body, the headers, the query or the token appears in a log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import traceback
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.accesslog import JsonFormatter
from proxy.app import create_app
from proxy.clients.kube import KubeClient, load_api_client
from proxy.config import Config
from proxy.errors import KubeError
from standins.kube import FakeKube, Fault, Scenario, find_crd
from standins.oms import FakeOms
from tests.conftest import KubeconfigFor, make_config
from tests.test_faults import proxy_process
from tests.test_faults import served as served  # a fixture

Client = TestClient[web.Request, web.Application]
UI_MPI = json.loads((Path(__file__).parent / "requests" / "ui-mpi.json").read_text())

TOKEN = "sa-token-" + secrets.token_hex(8)
AUTHORIZATION = "auth-secret-" + secrets.token_hex(8)
COOKIE = "cookie-secret-" + secrets.token_hex(8)
API_KEY = "apikey-secret-" + secrets.token_hex(8)
QUERY = "query-secret-" + secrets.token_hex(8)
BODY = "body-secret-" + secrets.token_hex(8)
NOT_THE_CLIENTS = (TOKEN, AUTHORIZATION, COOKIE, API_KEY, QUERY)
EVERY_SECRET = (*NOT_THE_CLIENTS, BODY)

HEADERS = {
    "Authorization": f"Bearer {AUTHORIZATION}",
    "Cookie": f"jwt_token={COOKIE}",
    "X-Api-Key": API_KEY,
}

MAX_CLIENT_MESSAGE = 2000
HUGE = "x" * (1 << 20)  # a 1 MB Status message


def secret_body(i: int) -> dict[str, Any]:
    body = json.loads(json.dumps(UI_MPI))
    body["Opts"]["OpenM.RunStamp"] = f"2031_01_01_00_00_00_{i:03d}"
    body["Opts"]["OpenM.RunName"] = f"run with {BODY}"
    body["Opts"]["EN.RunDescription"] = f"description with {BODY}"
    body["RunNotes"] = [{"LangCode": "EN", "Note": f"notes with {BODY}"}]
    return body


def proxy_records(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The proxy's records, without the in-process stand-ins': their default aiohttp access log
    quotes each request line, query included (the ``serve`` test has only the proxy's)."""
    return [
        r
        for r in records
        if not r.name.startswith("standins")
        and not (r.name == "aiohttp.access" and not hasattr(r, "fields"))
    ]


def log_text(records: list[logging.LogRecord]) -> str:
    """Everything a handler could write for ``records``: message, extra fields, traceback."""
    formatter = JsonFormatter()
    return "\n".join(formatter.format(r) + repr(r.__dict__) for r in records)


def assert_no_secrets(text: str, secrets_: tuple[str, ...] = EVERY_SECRET) -> None:
    found = [s for s in secrets_ if s in text]
    if found:
        at = text.index(found[0])
        raise AssertionError(f"secrets {found} in: ...{text[max(0, at - 1500) : at + 200]}...")


@pytest.fixture
async def kube() -> FakeKube:
    """A stand-in Kubernetes API that wants the planted service-account token."""
    crd = find_crd()
    assert crd is not None
    fake = FakeKube(crd_schema_path=crd, token=TOKEN)
    fake.set_scenario(Scenario(kind="no-operator"))
    return fake


def _config_dict(oms: FakeOms, kubeconfig: Path) -> dict[str, Any]:
    return {
        "oms": {"url": oms.url, "model_cache_seconds": 0, "first_byte_timeout_seconds": 0.5},
        "runs": {"intercept": "mpi"},
        "kubernetes": {
            "kubeconfig": str(kubeconfig),
            "dry_run_on_start": False,
            "watch": False,
            "retry_backoff_seconds": 0.01,
            "request_timeout_seconds": 1.0,
        },
    }


async def send_malformed(port: int) -> None:
    """A malformed request carrying an Authorization header (aiohttp quotes the bad line)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET /x HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer "
        + AUTHORIZATION.encode()
        + b"\x01\r\n\r\n"
    )
    assert (await asyncio.wait_for(reader.readline(), 2)).split()[1] == b"400"
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.05)


# The exchanges driven against the proxy; each returns (status, text) of the client's answer.


async def _drive(post: Any, get: Any, kube: FakeKube, oms: FakeOms) -> list[tuple[str, int, str]]:
    """Successes and every kind of error, all carrying the planted secrets."""
    answers: list[tuple[str, int, str]] = []

    async def submit(what: str, i: int) -> None:
        status, text = await post(secret_body(i))
        answers.append((what, status, text))

    await submit("created", 1)
    kube.add_fault(Fault("POST", "mpijobs", status=500, message=f"echo {BODY}", times=100))
    await submit("kube-500-echo", 2)
    kube._faults.clear()
    kube.add_fault(Fault("POST", "mpijobs", status=422, message=f"Invalid value: {BODY}"))
    await submit("kube-422-echo", 3)
    kube.add_fault(Fault("POST", "mpijobs", status=500, message=HUGE + BODY, times=100))
    await submit("kube-500-huge", 4)
    kube._faults.clear()
    kube.add_fault(Fault("POST", "mpijobs", status=422, message=HUGE + BODY))
    await submit("kube-422-huge", 5)
    kube.add_fault(Fault("POST", "configmaps", status=503, message=f"echo {BODY}", times=100))
    await submit("configmap-503-echo", 6)
    kube._faults.clear()
    kube.forbid("create", "mpijobs")
    await submit("kube-403", 7)
    kube._forbidden.clear()
    oms.drop = True
    await submit("oms-dropped", 8)
    oms.drop, oms.delay = False, 1.0
    await submit("oms-slow", 9)
    oms.delay = 0.0
    status, text = await post(b'{"ModelName": "' + BODY.encode() + b'", "Mpi": {"Np": 2}')
    answers.append(("bad-json", status, text))
    status, text = await post({"ModelName": "RiskPaths", "Mpi": {"Np": 2}, "Opts": {BODY: "1"}})
    answers.append(("refused-opts-key", status, text))
    status, text = await post({"ModelName": BODY, "Mpi": {"Np": 2}})
    answers.append(("unknown-model", status, text))
    status, text = await get(f"/api/model/RiskPaths/run/x/status?token={QUERY}")
    answers.append(("pass-through", status, text))
    oms.drop = True
    status, text = await get(f"/api/service/config?token={QUERY}")
    answers.append(("pass-through-oms-dropped", status, text))
    oms.drop = False
    return answers


def _check_answers(answers: list[tuple[str, int, str]]) -> None:
    statuses = {what: status for what, status, _ in answers}
    assert statuses["created"] == 200
    assert statuses["kube-500-echo"] == 502
    assert statuses["kube-422-echo"] == 422
    assert statuses["kube-403"] == 502
    assert statuses["oms-dropped"] == 502
    assert statuses["oms-slow"] == 504
    assert statuses["bad-json"] == 400
    for what, status, text in answers:
        assert_no_secrets(text, NOT_THE_CLIENTS)
        if status != 200:
            assert len(text) <= MAX_CLIENT_MESSAGE, (what, len(text))


async def test_no_secret_in_logs_or_answers_in_process(
    oms: FakeOms,
    kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    served: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    kubeconfig = await kubeconfig_for(kube, token=TOKEN)
    data = _config_dict(oms, kubeconfig)
    config = make_config(oms.url, oms=data["oms"], runs=data["runs"], kubernetes=data["kubernetes"])
    client: Client = await served(config)

    async def post(body: Any) -> tuple[int, str]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = await client.post(
            "/api/run",
            data=data,
            headers={**HEADERS, "Content-Type": "application/json"},
        )
        return resp.status, await resp.text()

    async def get(path: str) -> tuple[int, str]:
        resp = await client.get(path, headers=HEADERS)
        return resp.status, await resp.text()

    answers = await _drive(post, get, kube, oms)
    _check_answers(answers)
    assert client.server.port is not None
    await send_malformed(client.server.port)

    records = proxy_records(caplog.records)
    assert any(r.name == "aiohttp.access" for r in records), "no access log"
    assert any("malformed request" in r.getMessage() for r in records)
    assert any(r.levelno >= logging.WARNING for r in records)  # the 5xx were logged
    assert_no_secrets(log_text(records))
    for record in records:  # a 1 MB Kubernetes message reaches no log whole
        assert len(record.getMessage()) < 4000, record.getMessage()[:200]


async def test_no_secret_in_the_logs_of_a_serve_process(
    tmp_path: Path, oms: FakeOms, kube: FakeKube, kubeconfig_for: KubeconfigFor
) -> None:
    kubeconfig = await kubeconfig_for(kube, token=TOKEN)
    config = _config_dict(oms, kubeconfig)
    config["mpijob"] = {"template": str(Config().template_path())}
    async with proxy_process(tmp_path, config, log_level="DEBUG") as proxy:
        async with aiohttp.ClientSession() as session:

            async def post(body: Any) -> tuple[int, str]:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                async with session.post(
                    proxy.url + "/api/run",
                    data=data,
                    headers={**HEADERS, "Content-Type": "application/json"},
                ) as resp:
                    return resp.status, await resp.text()

            async def get(path: str) -> tuple[int, str]:
                async with session.get(proxy.url + path, headers=HEADERS) as resp:
                    return resp.status, await resp.text()

            answers = await _drive(post, get, kube, oms)
        _check_answers(answers)
        await send_malformed(int(proxy.url.rsplit(":", 1)[1]))
        log = proxy.log()
    assert '"level": "DEBUG"' in log or '"level": "INFO"' in log
    assert "created MPIJob" in log
    assert "malformed request" in log
    assert_no_secrets(log)
    assert max(len(line) for line in log.splitlines()) < 4000


async def test_wrong_token_is_reported_without_it(
    oms: FakeOms,
    kube: FakeKube,
    kubeconfig_for: KubeconfigFor,
    aiohttp_client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-token-" + secrets.token_hex(8)
    kubeconfig = await kubeconfig_for(kube, token=wrong)
    config = make_config(
        oms.url,
        runs={"intercept": "mpi"},
        kubernetes={"kubeconfig": str(kubeconfig), "dry_run_on_start": False, "watch": False},
    )
    client: Client = await aiohttp_client(create_app(config))
    resp = await client.post("/api/run", json=secret_body(1), headers=HEADERS)
    text = await resp.text()
    assert resp.status == 502
    assert "credentials" in text
    assert_no_secrets(text + log_text(proxy_records(caplog.records)), (*EVERY_SECRET, wrong))


async def test_kubernetes_errors_keep_the_echo_out_of_str_repr_and_tracebacks(
    oms: FakeOms, kube: FakeKube, kubeconfig_for: KubeconfigFor
) -> None:
    """A Status message that echoes the object, 1 MB long: the client's message has the start
    of it, bounded; str(), repr() and a logged traceback (chained ApiException included) have
    none of it."""
    kubeconfig = await kubeconfig_for(kube, token=TOKEN)
    config = make_config(
        oms.url,
        kubernetes={
            "kubeconfig": str(kubeconfig),
            "request_timeout_seconds": 1.0,
            "retry_backoff_seconds": 0.01,
        },
    )
    client = KubeClient(await load_api_client(str(kubeconfig)), config)
    job = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "x"}}
    try:
        for status in (500, 422, 503, 400):
            kube.add_fault(Fault("POST", "mpijobs", status=status, message=BODY + HUGE, times=9))
            with pytest.raises(KubeError) as info:
                await client.create_mpijob(job)
            kube._faults.clear()
            err = info.value
            assert BODY in err.message  # the client's own object, echoed back to it
            assert len(err.message) <= 1000
            logged = str(err) + repr(err) + "".join(traceback.format_exception(err))
            assert_no_secrets(logged)
            assert len(logged) < 20_000
    finally:
        await client.close()
