"""Kubernetes API I/O: the one kubernetes_asyncio ApiClient, calls with retries, error classes.

Every call goes through :meth:`KubeClient._call`, which bounds it by
``kubernetes.request_timeout_seconds`` (retries included), retries 429, 5xx and connection
failures with backoff (``Retry-After`` wins), and turns every failure into a
:class:`proxy.errors.KubeError` subclass raised ``from`` the original. Every answer is read
raw (``_preload_content=False``) and passes :func:`_checked_body`, the one check of its status,
so no call can take an error answer (a 403 Status) for data. No kubernetes_asyncio or aiohttp
exception leaves this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp import web
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from yarl import URL

from proxy import __version__
from proxy.config import Config, ConfigError
from proxy.errors import (
    KubeAlreadyExists,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeObjectNotFound,
    KubeQuotaExceeded,
    KubeResourceMissing,
    KubeServerError,
    KubeTimeout,
    KubeUnavailable,
    truncate,
)

_LOGGER = logging.getLogger(__name__)

GROUP = "kubeflow.org"
VERSION = "v2beta1"
PLURAL = "mpijobs"
FIELD_MANAGER = "oms-mpijob-proxy"
USER_AGENT = f"oms-mpijob-proxy/{__version__}"

Obj = dict[str, Any]


# --- error classification -------------------------------------------------------------------


def _decode_status(body: Any) -> dict[str, Any]:
    """The Kubernetes ``Status`` object in an error body, or {} if the body is something else."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str):
        return {}
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else {}


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# Statuses whose message the API server builds from names, namespaces and permissions only.
# Other messages (400/422 causes, 5xx text, anything from a proxy in between) may quote the
# submitted object, so logs get the status, reason and cause fields without them.
_MESSAGE_SAFE_TO_LOG = frozenset({401, 403, 404, 409, 410})


def _without_body(e: ApiException) -> ApiException:
    """``e`` without its body, once classified: it is chained to the KubeError raised, and a
    logged traceback would print the body, which can be megabytes and can echo the submitted
    object. Status, reason and headers stay."""
    cast(Any, e).body = None
    return e


def classify_api_exception(e: ApiException, what: str) -> KubeError:
    """Map an ApiException to the project's error class by status and ``Status.reason``."""
    status_doc = _decode_status(e.body)
    code = int(e.status or 0)
    reason = str(status_doc.get("reason") or "")
    message = truncate(str(status_doc.get("message") or e.reason or "no message"), 500)
    details = status_doc.get("details") if isinstance(status_doc.get("details"), dict) else {}
    assert isinstance(details, dict)
    causes = tuple(
        truncate(f"{c.get('field', '')}: {c.get('message', '')}".strip(": "), 300)
        for c in details.get("causes") or ()
        if isinstance(c, dict)
    )[:20]
    retry_after = _retry_after(e.headers)
    kw: dict[str, Any] = {"k8s_status": code, "reason": reason, "causes": causes}
    if code not in _MESSAGE_SAFE_TO_LOG:
        fields = sorted(
            {str(c.get("field")) for c in details.get("causes") or () if isinstance(c, dict)}
            - {"", "None"}
        )[:20]
        kw["log_message"] = f"{what}: the Kubernetes API answered {code} {reason}".rstrip() + (
            f" (fields: {', '.join(fields)})" if fields else ""
        )
    if code == 409 and reason == "AlreadyExists":
        return KubeAlreadyExists(f"{what}: already exists: {message}", **kw)
    if code == 409:
        return KubeConflict(f"{what}: changed meanwhile (409 {reason}): {message}", **kw)
    if code in (400, 422):
        detail = "; ".join(causes) if causes else message
        return KubeInvalid(f"{what}: the Kubernetes API rejected the MPIJob: {detail}", **kw)
    if code == 403 and "exceeded quota" in message:
        return KubeQuotaExceeded(
            f"{what}: the namespace's resource quota is exhausted, try again later: {message}",
            retry_after=retry_after,
            **kw,
        )
    if code == 403:
        # A namespaced Role grants nothing in another namespace, even one that does not exist:
        # the RBAC authorizer answers 403 there before anything looks for the namespace.
        missing = ", or the namespace does not exist" if "in the namespace" in message else ""
        return KubeForbidden(
            f"{what}: the proxy's service account lacks a permission "
            f"(check its Role/RoleBinding{missing}): {message}",
            **kw,
        )
    if code == 401:
        return KubeForbidden(
            f"{what}: the Kubernetes API refused the proxy's credentials (401): {message}", **kw
        )
    if code == 404:
        kind = str(details.get("kind") or "")
        if kind == "namespaces":
            return KubeResourceMissing(f"{what}: the namespace does not exist: {message}", **kw)
        if details.get("name") and kind:
            return KubeObjectNotFound(f"{what}: not found: {message}", **kw)
        return KubeResourceMissing(
            f"{what}: the MPIJob CRD (mpijobs.kubeflow.org/v2beta1) is not installed: {message}",
            **kw,
        )
    if code == 429 or code == 503:
        return KubeUnavailable(
            f"{what}: the Kubernetes API is overloaded or unavailable ({code}): {message}",
            retry_after=retry_after,
            **kw,
        )
    if code == 504:
        return KubeTimeout(f"{what}: the Kubernetes API timed out: {message}", **kw)
    return KubeServerError(f"{what}: the Kubernetes API failed ({code} {reason}): {message}", **kw)


async def _checked_body(result: Any) -> bytes:
    """The body of an answer, read whole; an error status is raised as ApiException.

    Every call is made with ``_preload_content=False``: kubernetes_asyncio then hands back the
    aiohttp response without looking at its status, so this is the one place that does, for
    every request the proxy sends (:meth:`KubeClient._attempts` calls it on every answer).
    """
    data: bytes = await result.read()
    if result.status >= 400:
        exc = ApiException(status=result.status, reason=result.reason)
        exc.body = data
        exc.headers = result.headers
        raise exc
    return data


def _json_object(data: bytes, what: str) -> Obj:
    """A 2xx answer's JSON object; anything else is the API's failure (a broken answer)."""
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise KubeServerError(f"{what}: the Kubernetes API answered something that is not JSON")
    return doc


def _items_and_version(doc: Obj) -> tuple[list[Obj], str]:
    """A list answer's items (plain dicts) and the list's resourceVersion."""
    items = [i for i in doc.get("items") or () if isinstance(i, dict)]
    return items, str((doc.get("metadata") or {}).get("resourceVersion") or "")


def _raw(timeout: float) -> dict[str, Any]:
    """The arguments of every request: its time limit, and its answer handed back unread."""
    return {"_request_timeout": timeout, "_preload_content": False}


def _retryable(err: KubeError) -> bool:
    return err.k8s_status is None or err.k8s_status == 429 or err.k8s_status >= 500


# --- the client ------------------------------------------------------------------------------


def _kubeconfig_path(kubeconfig: str) -> str:
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    path = path or str(Path.home() / ".kube" / "config")
    if not Path(path).is_file():
        raise ConfigError(
            path, "kubernetes.kubeconfig", "no such kubeconfig file (and not in a pod)"
        )
    return path


async def load_api_client(kubeconfig: str) -> k8s_client.ApiClient:
    """One ApiClient: in-cluster config in a pod, else kubeconfig / $KUBECONFIG / ~/.kube/config."""
    cfg = k8s_client.Configuration()
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not kubeconfig
    try:
        if in_pod:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            path = _kubeconfig_path(kubeconfig)
            await k8s_config.load_kube_config(config_file=path, client_configuration=cfg)
    except ConfigException as e:
        raise ConfigError(
            kubeconfig or "<kubernetes config>", "kubernetes.kubeconfig", f"unusable: {e}"
        ) from e
    api = k8s_client.ApiClient(configuration=cfg)
    api.user_agent = USER_AGENT  # tells the proxy's calls apart in API audit logs
    _resolve_env_proxy_once(api)
    return api


def _resolve_env_proxy_once(api: k8s_client.ApiClient) -> None:
    """Read the proxy environment once, instead of on every Kubernetes API request.

    kubernetes_asyncio's session trusts the environment, so aiohttp looked up
    HTTP(S)_PROXY/NO_PROXY and read ~/.netrc twice per request, each time in a worker thread:
    about a third of the proxy's CPU time per submission (bench/submit.py). The proxy for the
    API server (if any) is now looked up here, once, and set as the client's explicit proxy,
    which is what the environment would have given on every request. Credentials from
    ~/.netrc are never used for the API server: the client sends its own Authorization
    header, which aiohttp refuses to combine with netrc credentials anyway.
    """
    rest = api.rest_client
    host = api.configuration.host
    if host and not rest.proxy:
        try:
            proxy, proxy_auth = get_env_proxy_for_url(URL(host))
        except LookupError:
            pass  # no proxy for this host (none set, or NO_PROXY matches)
        else:
            rest.proxy = str(proxy)
            if proxy_auth is not None:
                headers = dict(rest.proxy_headers or {})
                headers["Proxy-Authorization"] = proxy_auth.encode()
                rest.proxy_headers = headers
    rest.pool_manager._trust_env = False


class KubeClient:
    """Typed, error-classified access to the few API calls the proxy makes (see k8s/ RBAC)."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        config: Config,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self.api = api
        self._observe = observe  # (operation, seconds) of each call, retries included
        self.namespace = config.kubernetes.namespace
        self._timeout = config.kubernetes.request_timeout_seconds
        self._retries = config.kubernetes.retries
        self._backoff = config.kubernetes.retry_backoff_seconds
        self.custom = k8s_client.CustomObjectsApi(api)
        self.core = k8s_client.CoreV1Api(api)
        self.api_calls = 0  # requests sent, for the polling benchmark

    async def close(self) -> None:
        """Close the ApiClient's connection pool."""
        await self.api.close()

    async def _call(
        self, what: str, fn: Callable[[float], Awaitable[Any]], *, retry: bool = True
    ) -> bytes:
        """Send ``fn(remaining_seconds)`` with retries, all within the configured timeout.

        ``fn`` makes one request with ``_preload_content=False`` and returns the raw answer;
        its body is returned once :func:`_checked_body` found its status fine. Every failure
        leaves as a :class:`~proxy.errors.KubeError` (classified by status and Status.reason).
        """
        if self._observe is None:
            return await self._attempts(what, fn, retry)
        start = time.perf_counter()
        try:
            return await self._attempts(what, fn, retry)
        finally:
            # "create MPIJob <name>" -> "create MPIJob": the operation, never an object name
            self._observe(" ".join(what.split()[:2]), time.perf_counter() - start)

    async def _call_json(
        self, what: str, fn: Callable[[float], Awaitable[Any]], *, retry: bool = True
    ) -> Obj:
        """:meth:`_call`, for an answer that is one JSON object."""
        return _json_object(await self._call(what, fn, retry=retry), what)

    async def _attempts(
        self, what: str, fn: Callable[[float], Awaitable[Any]], retry: bool
    ) -> bytes:
        deadline = time.monotonic() + self._timeout
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KubeTimeout(
                    f"{what}: no answer from the Kubernetes API in {self._timeout:g} s"
                )
            attempt += 1
            self.api_calls += 1
            cause: BaseException
            try:
                async with asyncio.timeout(remaining):
                    return await _checked_body(await fn(remaining))
            except ApiException as e:
                err, cause = classify_api_exception(e, what), _without_body(e)
            except TimeoutError as e:
                raise KubeTimeout(
                    f"{what}: no answer from the Kubernetes API in {self._timeout:g} s"
                ) from e
            except (aiohttp.ClientError, OSError) as e:
                err = KubeUnavailable(
                    f"{what}: cannot reach the Kubernetes API ({type(e).__name__})"
                )
                cause = e
            if not retry or not _retryable(err) or attempt > self._retries:
                raise err from cause
            delay = (
                err.retry_after
                if err.retry_after is not None and err.k8s_status == 429
                else (self._backoff * 2 ** (attempt - 1))
            )
            budget = max(0.0, deadline - time.monotonic() - 0.05)
            if err.k8s_status == 429 and delay > budget:
                raise err from cause  # its Retry-After is past the deadline: say so at once
            delay = min(delay, budget)
            _LOGGER.info("%s: retry %d/%d in %.2f s: %s", what, attempt, self._retries, delay, err)
            await asyncio.sleep(delay)

    # MPIJobs -----------------------------------------------------------------------------------

    async def create_mpijob(self, body: Obj, *, dry_run: bool = False) -> Obj:
        """Create an MPIJob (strict field validation); 409 is raised as KubeAlreadyExists."""
        name = body.get("metadata", {}).get("name", "?")
        kwargs: dict[str, Any] = {"field_validation": "Strict", "field_manager": FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"

        def go(t: float) -> Awaitable[Any]:
            return self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body, **kwargs, **_raw(t)
            )

        return await self._call_json(f"create MPIJob {name}", go)

    async def get_mpijob(self, name: str) -> Obj:
        """Read one MPIJob."""

        def go(t: float) -> Awaitable[Any]:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, **_raw(t)
            )

        return await self._call_json(f"get MPIJob {name}", go)

    async def list_mpijobs(self, label_selector: str) -> tuple[list[Obj], str]:
        """MPIJobs matching ``label_selector`` and the list's resourceVersion."""

        def go(t: float) -> Awaitable[Any]:
            return self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, label_selector=label_selector, **_raw(t)
            )

        doc = await self._call_json("list MPIJobs", go)
        return _items_and_version(doc)

    async def watch_mpijobs(
        self, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Stream (event type, object) from ``resource_version``; raises KubeError on failure.

        A 410 Gone (resource version too old) arrives as :class:`KubeError` with
        ``k8s_status == 410``; the caller re-lists.
        """
        stream = self._watch(
            "watch MPIJobs",
            self.custom.list_namespaced_custom_object,
            (GROUP, VERSION, self.namespace, PLURAL),
            label_selector,
            resource_version,
            timeout_seconds,
        )
        async for item in stream:
            yield item

    async def _watch(
        self,
        what: str,
        list_fn: Callable[..., Any],
        args: tuple[Any, ...],
        label_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """One watch request: (event type, raw object) until the server ends it.

        The answer passes the same status check as every other call (:func:`_checked_body`),
        and an ``ERROR`` event (a Status in the stream, e.g. 410 Gone) is classified like an
        error answer.
        """
        self.api_calls += 1
        resp: Any = None
        try:
            resp = await list_fn(
                *args,
                label_selector=label_selector,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=True,
                watch=True,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self._timeout, sock_read=timeout_seconds + 30
                ),
            )
            if resp.status >= 400:
                await _checked_body(resp)
            async for line in resp.content:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line that is not JSON
                if not isinstance(event, dict):
                    continue
                obj = event.get("object")
                if event.get("type") == "ERROR":
                    status = obj if isinstance(obj, dict) else {}
                    exc = ApiException(status=int(status.get("code") or 500), reason="ERROR")
                    exc.body = json.dumps(status).encode()
                    raise exc
                if isinstance(obj, dict):
                    yield str(event.get("type")), obj
        except ApiException as e:
            raise classify_api_exception(e, what) from _without_body(e)
        except TimeoutError as e:
            raise KubeTimeout(f"{what}: the stream stalled") from e
        except (aiohttp.ClientError, OSError) as e:
            raise KubeUnavailable(f"{what}: connection lost ({type(e).__name__})") from e
        except ValueError as e:  # a line longer than aiohttp's line limit
            raise KubeServerError(f"{what}: unreadable event: {truncate(str(e), 200)}") from e
        finally:
            if resp is not None:
                resp.release()

    async def patch_mpijob(self, name: str, patch: Obj) -> Obj:
        """JSON merge patch (RFC 7386) of an MPIJob; returns the patched object.

        Put ``metadata.resourceVersion`` into ``patch`` to make it conditional: a stale one is
        answered 409 Conflict, raised as :class:`~proxy.errors.KubeConflict`.
        """

        # A dict body would be sent as a JSON patch unless the content type is forced.
        kwargs: dict[str, Any] = {"_content_type": "application/merge-patch+json"}

        def go(t: float) -> Awaitable[Any]:
            return self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                patch,
                field_manager=FIELD_MANAGER,
                **kwargs,
                **_raw(t),
            )

        return await self._call_json(f"patch MPIJob {name}", go, retry=False)

    async def delete_mpijob(self, name: str, propagation: str = "Foreground") -> None:
        """Delete an MPIJob; its pods, ConfigMaps and Services go with it."""

        def go(t: float) -> Awaitable[Any]:
            return self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                propagation_policy=propagation,
                **_raw(t),
            )

        await self._call(f"delete MPIJob {name}", go)

    # Core objects ------------------------------------------------------------------------------

    async def create_configmap(self, body: Obj) -> Obj:
        """Create a ConfigMap (the per-run ini files)."""
        name = body.get("metadata", {}).get("name", "?")

        def go(t: float) -> Awaitable[Any]:
            return self.core.create_namespaced_config_map(
                self.namespace,
                cast(Any, body),
                field_validation="Strict",
                field_manager=FIELD_MANAGER,
                **_raw(t),
            )

        return await self._call_json(f"create ConfigMap {name}", go)

    async def list_configmaps(self, label_selector: str) -> tuple[list[Obj], str]:
        """ConfigMaps matching ``label_selector`` (plain dicts) and the list's resourceVersion."""

        def go(t: float) -> Awaitable[Any]:
            return self.core.list_namespaced_config_map(
                self.namespace, label_selector=label_selector, **_raw(t)
            )

        doc = await self._call_json("list ConfigMaps", go)
        return _items_and_version(doc)

    async def watch_configmaps(
        self, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Like :meth:`watch_mpijobs`, for ConfigMaps (the run records)."""
        stream = self._watch(
            "watch ConfigMaps",
            self.core.list_namespaced_config_map,
            (self.namespace,),
            label_selector,
            resource_version,
            timeout_seconds,
        )
        async for item in stream:
            yield item

    async def delete_configmap(self, name: str) -> None:
        """Delete a ConfigMap (an expired run record)."""

        def go(t: float) -> Awaitable[Any]:
            return self.core.delete_namespaced_config_map(name, self.namespace, **_raw(t))

        await self._call(f"delete ConfigMap {name}", go)

    async def list_pods(self, label_selector: str) -> list[Obj]:
        """Pods matching ``label_selector`` as plain dicts."""
        items, _rv = await self.list_pods_rv(label_selector)
        return items

    async def list_pods_rv(self, label_selector: str) -> tuple[list[Obj], str]:
        """Pods matching ``label_selector`` (plain dicts) and the list's resourceVersion."""

        def go(t: float) -> Awaitable[Any]:
            return self.core.list_namespaced_pod(
                self.namespace, label_selector=label_selector, **_raw(t)
            )

        doc = await self._call_json("list pods", go)
        return _items_and_version(doc)

    async def watch_pods(
        self, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Like :meth:`watch_mpijobs`, for pods."""
        stream = self._watch(
            "watch pods",
            self.core.list_namespaced_pod,
            (self.namespace,),
            label_selector,
            resource_version,
            timeout_seconds,
        )
        async for item in stream:
            yield item

    async def read_pod_log(
        self,
        name: str,
        container: str | None = None,
        *,
        timestamps: bool = False,
        tail_lines: int | None = None,
    ) -> str:
        """The log of a pod's container (text): all of it, or its last ``tail_lines`` lines.

        ``timestamps`` prefixes each line with its RFC 3339 time (``kubectl logs --timestamps``).
        """

        kwargs: dict[str, Any] = {}
        if container:
            kwargs["container"] = container
        if timestamps:
            kwargs["timestamps"] = True
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines

        def go(t: float) -> Awaitable[Any]:
            return self.core.read_namespaced_pod_log(name, self.namespace, **kwargs, **_raw(t))

        data = await self._call(f"read log of pod {name}", go)
        return data.decode("utf-8", "replace")

    async def list_events(self, field_selector: str) -> list[Obj]:
        """Events matching ``field_selector`` (e.g. involvedObject.name=X) as dicts."""

        def go(t: float) -> Awaitable[Any]:
            return self.core.list_namespaced_event(
                self.namespace, field_selector=field_selector, **_raw(t)
            )

        doc = await self._call_json("list events", go)
        return [i for i in doc.get("items") or () if isinstance(i, dict)]


KUBE: web.AppKey[KubeClient | None] = web.AppKey("kube")
"""The Kubernetes client; None when runs are not intercepted (``runs.intercept: none``)."""
