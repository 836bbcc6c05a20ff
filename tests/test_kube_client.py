"""Every KubeClient call against the wire: one choke point classifies every answer.

A fake Kubernetes API server on loopback (an aiohttp app, not the stand-in) answers each request
with a canned status and ``Status`` body, or drops the connection. Each of the client's methods
is called through the real kubernetes_asyncio ApiClient (loaded from a kubeconfig) and must
raise the project's error class for the answer, never hand an error body back as data.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.clients.kube import KubeClient, load_api_client
from proxy.errors import (
    KubeAlreadyExists,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeObjectNotFound,
    KubeResourceMissing,
    KubeServerError,
    KubeUnavailable,
)
from standins.kube import write_kubeconfig
from tests.conftest import make_config

NS = "openmpp"
DROP = "drop"


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A Kubernetes ``Status`` as the API server sends with an error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeApi:
    """Answers every request with ``answer`` (or drops it); records what was asked."""

    answer: Answer | str = DROP
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.query)))
        await request.read()
        if self.answer == DROP:
            assert request.transport is not None
            request.transport.abort()  # the connection is lost before any answer
            await asyncio.sleep(0.05)
            return web.Response()
        assert isinstance(self.answer, Answer)
        body = self.answer.body
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        return web.Response(
            status=self.answer.status,
            body=data,
            content_type="application/json" if not isinstance(body, str) else "text/plain",
            headers=self.answer.headers,
        )


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, KubeClient]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.make_url("")), token="t")
    config = make_config(
        "http://127.0.0.1:9",
        kubernetes={
            "namespace": NS,
            "retries": 1,
            "retry_backoff_seconds": 0.05,
            "request_timeout_seconds": 3.0,
        },
    )
    client = KubeClient(await load_api_client(str(kubeconfig)), config)
    try:
        yield fake, client
    finally:
        await client.close()
        await server.close()


async def _drain(stream: AsyncIterator[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(kind, obj["metadata"]["name"]) async for kind, obj in stream]


MPIJOB = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "ompp-x-1", "namespace": NS, "resourceVersion": "7"},
}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ompp-x-1-launcher"}}
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ompp-x-1-run"}}
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "ompp-x-1.17"}}


def _list(kind: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"resourceVersion": "42"}, "items": list(items)}


def _events(*objs: dict[str, Any]) -> str:
    return "".join(json.dumps({"type": "ADDED", "object": o}) + "\n" for o in objs)


Call = Callable[[KubeClient], Awaitable[Any]]

# name: (call, what a 200 answer carries, what the call returns for it, retried?, a collection?)
METHODS: dict[str, tuple[Call, Any, Any, bool, bool]] = {
    "create_mpijob": (lambda k: k.create_mpijob(MPIJOB), MPIJOB, MPIJOB, True, False),
    "get_mpijob": (lambda k: k.get_mpijob("ompp-x-1"), MPIJOB, MPIJOB, True, False),
    "list_mpijobs": (
        lambda k: k.list_mpijobs("a=b"),
        _list("MPIJobList", MPIJOB),
        ([MPIJOB], "42"),
        True,
        True,
    ),
    "watch_mpijobs": (
        lambda k: _drain(k.watch_mpijobs("a=b", "42", 5)),
        _events(MPIJOB),
        [("ADDED", "ompp-x-1")],
        False,
        True,
    ),
    "patch_mpijob": (
        lambda k: k.patch_mpijob("ompp-x-1", {"metadata": {"resourceVersion": "7"}}),
        MPIJOB,
        MPIJOB,
        False,
        False,
    ),
    "delete_mpijob": (
        lambda k: k.delete_mpijob("ompp-x-1"),
        status_body(200, "", "")
        | {"status": "Success", "details": {"name": "ompp-x-1", "kind": "mpijobs"}},
        None,
        True,
        False,
    ),
    "create_configmap": (
        lambda k: k.create_configmap(CONFIGMAP),
        CONFIGMAP,
        CONFIGMAP,
        True,
        False,
    ),
    "list_configmaps": (
        lambda k: k.list_configmaps("a=b"),
        _list("ConfigMapList", CONFIGMAP),
        ([CONFIGMAP], "42"),
        True,
        True,
    ),
    "watch_configmaps": (
        lambda k: _drain(k.watch_configmaps("a=b", "42", 5)),
        _events(CONFIGMAP),
        [("ADDED", "ompp-x-1-run")],
        False,
        True,
    ),
    "delete_configmap": (
        lambda k: k.delete_configmap("ompp-x-1-run"),
        status_body(200, "", "")
        | {"status": "Success", "details": {"name": "ompp-x-1-run", "kind": "configmaps"}},
        None,
        True,
        False,
    ),
    "list_pods": (lambda k: k.list_pods("a=b"), _list("PodList", POD), [POD], True, True),
    "list_pods_rv": (
        lambda k: k.list_pods_rv("a=b"),
        _list("PodList", POD),
        ([POD], "42"),
        True,
        True,
    ),
    "watch_pods": (
        lambda k: _drain(k.watch_pods("a=b", "42", 5)),
        _events(POD),
        [("ADDED", "ompp-x-1-launcher")],
        False,
        True,
    ),
    "read_pod_log": (
        lambda k: k.read_pod_log("ompp-x-1-launcher", "mpi", timestamps=True),
        "2026-01-01T00:00:00Z line one\n",
        "2026-01-01T00:00:00Z line one\n",
        True,
        False,
    ),
    "list_events": (lambda k: k.list_events(""), _list("EventList", EVENT), [EVENT], True, True),
}


def test_every_kube_client_method_is_covered() -> None:
    public = {
        n
        for n in vars(KubeClient)
        if not n.startswith("_") and callable(getattr(KubeClient, n)) and n != "close"
    }
    assert public == set(METHODS)


@pytest.mark.parametrize("method", sorted(METHODS))
async def test_200_is_the_data(api: tuple[FakeApi, KubeClient], method: str) -> None:
    fake, kube = api
    call, body, expected, _, _ = METHODS[method]
    fake.answer = Answer(200, body)
    assert await call(kube) == expected
    assert len(fake.requests) == 1
    assert fake.requests[0][1].startswith(("/api/v1/namespaces/openmpp/", "/apis/kubeflow.org/"))


# (name, answer, error class, retried when the call retries)
ERROR_CASES: list[tuple[str, Answer | str, type[KubeError], bool]] = [
    ("401", Answer(401, status_body(401, "Unauthorized", "Unauthorized")), KubeForbidden, False),
    (
        "403",
        Answer(403, status_body(403, "Forbidden", 'pods "x" is forbidden: User cannot get')),
        KubeForbidden,
        False,
    ),
    (
        "409 AlreadyExists",
        Answer(409, status_body(409, "AlreadyExists", "already exists", name="x", kind="mpijobs")),
        KubeAlreadyExists,
        False,
    ),
    (
        "409 Conflict",
        Answer(409, status_body(409, "Conflict", "the object has been modified", name="x")),
        KubeConflict,
        False,
    ),
    ("410", Answer(410, status_body(410, "Expired", "too old resource version")), KubeError, False),
    (
        "422",
        Answer(
            422,
            status_body(
                422,
                "Invalid",
                "is invalid",
                causes=[{"field": "spec.x", "message": "Unsupported value"}],
            ),
        ),
        KubeInvalid,
        False,
    ),
    ("500", Answer(500, status_body(500, "InternalError", "etcd")), KubeServerError, True),
    ("500 text", Answer(500, "<html>bad gateway</html>"), KubeServerError, True),
    ("503", Answer(503, status_body(503, "ServiceUnavailable", "later")), KubeUnavailable, True),
    ("dropped connection", DROP, KubeUnavailable, True),
]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize(("case", "answer", "error", "retried"), ERROR_CASES, ids=lambda x: x)
async def test_an_error_answer_raises_its_class(
    api: tuple[FakeApi, KubeClient],
    method: str,
    case: str,
    answer: Answer | str,
    error: type[KubeError],
    retried: bool,
) -> None:
    fake, kube = api
    call, _, _, retries, _ = METHODS[method]
    fake.answer = answer
    with pytest.raises(error) as caught:
        await call(kube)
    err = caught.value
    assert err.k8s_status == (None if answer == DROP else int(case[:3]))
    if isinstance(answer, Answer) and isinstance(answer.body, dict):
        assert err.reason == answer.body["reason"]
    if answer == DROP:  # aiohttp itself sends an idempotent request once more on a new connection
        assert len(fake.requests) >= (2 if retries else 1)
    else:
        assert len(fake.requests) == (2 if retried and retries else 1), "retries: 1"
    if case == "422":
        assert err.causes == ("spec.x: Unsupported value",)


@pytest.mark.parametrize("method", sorted(METHODS))
async def test_404_of_an_object_and_of_a_collection(
    api: tuple[FakeApi, KubeClient], method: str
) -> None:
    """A named object that is not there, vs. a resource (CRD) or namespace that is not there."""
    fake, kube = api
    call, _, _, _, collection = METHODS[method]
    fake.answer = Answer(
        404, status_body(404, "NotFound", 'mpijobs "x" not found', name="x", kind="mpijobs")
    )
    if collection:  # a list or watch names no object: a 404 means the resource is missing
        fake.answer = Answer(404, status_body(404, "NotFound", "the server could not find it"))
        with pytest.raises(KubeResourceMissing, match="CRD"):
            await call(kube)
    else:
        with pytest.raises(KubeObjectNotFound):
            await call(kube)
    fake.requests.clear()
    fake.answer = Answer(
        404, status_body(404, "NotFound", 'namespaces "openmpp" not found', kind="namespaces")
    )
    with pytest.raises(KubeResourceMissing, match="namespace does not exist"):
        await call(kube)


@pytest.mark.parametrize("method", sorted(METHODS))
async def test_429_is_retried_after_its_retry_after(
    api: tuple[FakeApi, KubeClient], method: str
) -> None:
    fake, kube = api
    call, _, _, retries, _ = METHODS[method]
    fake.answer = Answer(
        429, status_body(429, "TooManyRequests", "slow down"), headers={"Retry-After": "1"}
    )
    started = asyncio.get_running_loop().time()
    with pytest.raises(KubeUnavailable) as caught:
        await call(kube)
    took = asyncio.get_running_loop().time() - started
    assert caught.value.k8s_status == 429
    assert caught.value.retry_after == 1.0
    if retries:
        assert len(fake.requests) == 2
        assert took >= 0.95, "the retry waited for Retry-After"
    else:
        assert len(fake.requests) == 1


async def test_a_watch_error_event_is_classified(api: tuple[FakeApi, KubeClient]) -> None:
    """410 Gone arrives inside a 200 stream, after the events before it."""
    fake, kube = api
    gone = status_body(410, "Expired", "too old resource version: 1 (42)")
    fake.answer = Answer(200, _events(MPIJOB) + json.dumps({"type": "ERROR", "object": gone}))
    seen: list[str] = []

    async def watch() -> None:
        async for kind, _obj in kube.watch_mpijobs("a=b", "1", 5):
            seen.append(kind)

    with pytest.raises(KubeError) as caught:
        await watch()
    assert seen == ["ADDED"]
    assert caught.value.k8s_status == 410
    assert caught.value.reason == "Expired"


async def test_a_forbidden_log_is_never_read_as_the_log(api: tuple[FakeApi, KubeClient]) -> None:
    """The 403 Status JSON is not model output (it was, before the one status check)."""
    fake, kube = api
    fake.answer = Answer(403, status_body(403, "Forbidden", 'pods "x" is forbidden: pods/log'))
    with pytest.raises(KubeForbidden, match="lacks a permission"):
        await kube.read_pod_log("ompp-x-1-launcher")
    fake.answer = Answer(403, status_body(403, "Forbidden", "pods is forbidden: list"))
    with pytest.raises(KubeForbidden):
        await kube.list_pods_rv("a=b")  # not an empty list


async def test_a_200_that_is_not_json_is_the_apis_failure(api: tuple[FakeApi, KubeClient]) -> None:
    fake, kube = api
    fake.answer = Answer(200, "<html>a proxy's login page</html>")
    with pytest.raises(KubeServerError, match="not JSON"):
        await kube.get_mpijob("ompp-x-1")
