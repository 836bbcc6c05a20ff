"""The stand-in's HTTP side: the REST API, watches, logs, RBAC and faults (:class:`FakeKube`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import json
import logging
import os
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
)
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from standins.kube.admission import (
    _CONFIGMAP_SCHEMA,
    _OBJECT_META_SCHEMA,
    _cause,
    _json_patch,
    _json_type,
    _load_crd,
    _merge_patch,
    _metadata_causes,
    _name_causes,
    _normalize,
    _schema_causes,
)
from standins.kube.operator import Operator, _container_state, _event_line, _suspend_requested
from standins.kube.selectors import (
    _is_true,
    _parse_field_selector,
    _parse_label_selector,
    _request_attributes,
)
from standins.kube.store import (
    _IDLE_CHECK_SECONDS,
    _KINDS,
    CONFIGMAPS,
    ENV_CRD,
    MPIJOBS,
    PODS,
    SCHEMA_CRD,
    Fault,
    Json,
    RecordedRequest,
    Scenario,
    _ApiError,
    _bad_request,
    _Change,
    _details,
    _fault_error,
    _Handler,
    _invalid,
    _Kind,
    _kind_named,
    _LogLine,
    _no_such_resource,
    _not_found,
    _now,
    _Predicate,
    _stamp_precise,
    _status_body,
    _suffix,
    _Watcher,
)

if TYPE_CHECKING:
    pass

# --- helpers: files, kubeconfig, serving ----------------------------------------------------

_LOGGER = logging.getLogger(__name__)


def find_crd(path: str | Path | None = None) -> Path:
    """The MPIJob CRD file: ``path``, else ``$OMS_MPIJOB_PROXY_CRD``, else :data:`SCHEMA_CRD`.

    A path that is given (argument or environment) must exist: a typo is an error, never a silent
    fall-back to another schema.
    """
    chosen = path or os.environ.get(ENV_CRD)
    if not chosen:
        return SCHEMA_CRD
    if not Path(chosen).is_file():
        raise FileNotFoundError(f"the MPIJob CRD file does not exist: {chosen}")
    return Path(chosen)


def write_kubeconfig(
    path: Path, server_url: str, token: str | None = None, namespace: str = "default"
) -> Path:
    """Write a kubeconfig whose current context points at ``server_url``; returns ``path``."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake-kube", "cluster": {"server": server_url}}],
        "users": [{"name": "fake-kube-user", "user": {"token": token} if token else {}}],
        "contexts": [
            {
                "name": "fake-kube",
                "context": {
                    "cluster": "fake-kube",
                    "user": "fake-kube-user",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "fake-kube",
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


async def serve(
    kube: FakeKube, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve ``kube`` on ``host:port`` (0 picks a free port); returns the runner and base URL.

    Call ``await runner.cleanup()`` to stop it.
    """
    runner = web.AppRunner(kube.app, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{shown}:{bound_port}"


@contextlib.asynccontextmanager
async def running(kube: FakeKube, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``kube`` for the duration of an ``async with`` block, which receives the base URL."""
    runner, url = await serve(kube, host, port)
    try:
        yield url
    finally:
        await runner.cleanup()


CONFIGMAP_MAX_BYTES = 1 << 20
"""What the API server accepts in one ConfigMap: ``data`` values plus decoded ``binaryData``."""


def _configmap_bytes(body: Json) -> int:
    total = 0
    for key, value in (body.get("data") or {}).items():
        total += len(str(key)) + len(str(value).encode("utf-8"))
    for key, value in (body.get("binaryData") or {}).items():
        try:
            total += len(str(key)) + len(base64.b64decode(str(value)))
        except ValueError:
            total += len(str(value))
    return total


# --- the server -------------------------------------------------------------------------------


class FakeKube(Operator):
    """A stand-in Kubernetes API server plus a simulated mpi-operator (see the module docstring).

    Public attributes may be changed at any time: ``namespaces``, ``crd_installed``, ``token``,
    ``quota_exceeded`` (the text after "exceeded quota: " of a 403 on MPIJob create),
    ``scenario_for`` (picks the :class:`Scenario` of each created MPIJob), ``foreground_delay``
    (seconds a Foreground-deleted MPIJob lingers after its dependents are gone),
    ``bookmark_interval`` (seconds between the BOOKMARK events of a watch that asked for them,
    one minute as in the API server's watch cache; a watch also gets one 2 s before its
    ``timeoutSeconds`` end),
    ``history_limit`` (changes kept for watches that resume from a resourceVersion) and ``user``
    (named in 403 messages). ``requests`` records every request.
    """

    def __init__(
        self,
        *,
        namespaces: Iterable[str] = ("default",),
        crd_schema_path: str | Path | None = None,
        crd_installed: bool = True,
        token: str | None = None,
        scenario_for: Callable[[Json], Scenario] | None = None,
        foreground_delay: float = 0.05,
    ) -> None:
        super().__init__(
            namespaces=namespaces,
            crd_installed=crd_installed,
            token=token,
            scenario_for=scenario_for,
            foreground_delay=foreground_delay,
        )
        if crd_schema_path is not None:
            self._schema, self._validator = _load_crd(str(Path(crd_schema_path).resolve()))
        self._grants: dict[str, tuple[str, str]] = {}
        self._app = self._make_app()

    # -- public API ------------------------------------------------------------------------------

    @property
    def app(self) -> web.Application:
        """The aiohttp application; serve it once (:func:`serve`, :func:`running`, a TestServer)."""
        return self._app

    def set_scenario(self, scenario: Scenario, name: str | None = None) -> None:
        """Use ``scenario`` for the MPIJob called ``name``, or for all others if ``name`` is None.

        Only has an effect while ``scenario_for`` is the default.
        """
        if name is None:
            self.default_scenario = scenario
        else:
            self._scenarios[name] = scenario

    def grant(self, token: str, namespace: str, service_account: str = "oms-mpijob-proxy") -> None:
        """Accept bearer ``token`` as ServiceAccount ``namespace``/``service_account`` whose Role
        is bound in ``namespace`` only (as ``k8s/base/rbac`` ships it).

        The RBAC authorizer comes before everything else, so any request of that token in
        another namespace, existing or not, is 403 Forbidden naming that user (not 404 or an
        empty list, as with ``token`` or no token: an administrator's credentials).
        :meth:`forbid` applies to it too.
        """
        self._grants[token] = (f"system:serviceaccount:{namespace}:{service_account}", namespace)

    def forbid(self, verb: str, resource: str) -> None:
        """Answer 403 to ``verb`` (``"*"``: any) on ``resource`` (``"mpijobs"``, ``"pods/log"``)."""
        self._forbidden.add((verb, resource))

    def add_fault(self, fault: Fault) -> None:
        """Queue ``fault``; the first queued fault that matches a request applies to it."""
        self._faults.append(fault)

    def down(self) -> None:
        """Drop every connection (open streams now, new requests as they come) until :meth:`up`."""
        self._down = True
        for transport in list(self._streams):
            transport.close()
        self._wake_streams()

    def up(self) -> None:
        """Answer requests again after :meth:`down`."""
        self._down = False

    def compact(self) -> None:
        """Forget the change history, so watches from any older resourceVersion get 410 Expired."""
        self._history.clear()
        self._compacted_rv = self._rv

    def rbac_verbs(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource[/subresource], verb) of every recorded resource request."""
        return {
            (r.api_group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource, r.verb)
            for r in self.requests
            if r.resource
        }

    def get_object(self, kind: str, namespace: str, name: str) -> Json | None:
        """A copy of a stored object; ``kind`` is a plural or a Kind (``"pods"``, ``"MPIJob"``)."""
        obj = self._store[_kind_named(kind).resource].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: str, namespace: str | None = None) -> list[Json]:
        """Copies of the stored objects of ``kind``, by namespace and name."""
        store = self._store[_kind_named(kind).resource]
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(store.items())
            if namespace is None or ns == namespace
        ]

    def launcher_log(self, name: str, namespace: str = "default") -> str:
        """The log of the first container of MPIJob ``name``'s launcher pod ("" if none)."""
        for pod in self._pods_of_job(namespace, name, role="launcher"):
            container = pod["spec"]["containers"][0]["name"]
            lines = self._logs.get((namespace, pod["metadata"]["name"], container), [])
            return "".join(f"{line.text}\n" for line in lines)
        return ""

    async def wait_until(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        """Wait until ``predicate()`` holds; it is re-checked after every change of state.

        Raises TimeoutError after ``within`` seconds.
        """
        async with asyncio.timeout(within):
            while not predicate():
                await self._wake.wait()

    # -- application and middleware ----------------------------------------------------------------

    def _make_app(self) -> web.Application:
        @web.middleware
        async def kube_api(request: web.Request, handler: _Handler) -> web.StreamResponse:
            return await self._dispatch(request, handler)

        # The API server takes request bodies up to 3 MiB (etcd's limit is about 1.5 MiB).
        app = web.Application(middlewares=[kube_api], client_max_size=3 << 20)
        router = app.router
        router.add_get("/version", self._version)
        router.add_get("/version/", self._version)  # as VersionApi asks
        router.add_get("/apis/kubeflow.org/v2beta1", self._guard(MPIJOBS, self._discovery))
        for kind in _KINDS.values():
            prefix = f"/apis/{kind.api_version}" if kind.group else "/api/v1"
            base = f"{prefix}/namespaces/{{namespace}}/{kind.resource}"
            router.add_get(base, self._guard(kind, functools.partial(self._list, kind)))
            item = self._guard(kind, functools.partial(self._get, kind))
            router.add_get(base + "/{name}", item)
            if kind in (MPIJOBS, CONFIGMAPS):
                router.add_post(base, self._guard(kind, functools.partial(self._create, kind)))
                delete = self._guard(kind, functools.partial(self._delete, kind))
                router.add_delete(base + "/{name}", delete)
            if kind is MPIJOBS:
                router.add_get(base + "/{name}/status", item)
                router.add_patch(base + "/{name}", self._guard(kind, self._patch))
            if kind is PODS:
                router.add_get(base + "/{name}/log", self._guard(kind, self._pod_log))
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def _guard(self, kind: _Kind, handler: _Handler) -> _Handler:
        """``handler``, answering 404 for MPIJob paths while the CRD is not installed."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            if kind is MPIJOBS and not self.crd_installed:
                raise _no_such_resource()
            return await handler(request)

        return guarded

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing = True
        self._wake_streams()

    async def _on_cleanup(self, app: web.Application) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _wake_streams(self) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._notify()

    async def _record(self, request: web.Request) -> RecordedRequest:
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        query = dict(request.query)
        self._notify()
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            query=query,
            body=body,
            user_agent=request.headers.get("User-Agent", ""),
            **_request_attributes(request.method, request.path, query),
        )
        self.requests.append(recorded)
        return recorded

    def _take_fault(self, request: RecordedRequest) -> Fault | None:
        for fault in self._faults:
            if fault.matches(request):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    @staticmethod
    def _drop(request: web.Request) -> web.Response:
        """Close the connection; the response returned is never sent."""
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)

    def _authorize(self, request: RecordedRequest, grant: tuple[str, str] | None) -> None:
        resource = request.resource
        full = f"{resource}/{request.subresource}" if request.subresource else resource
        user = self.user if grant is None else grant[0]
        outside = grant is not None and request.namespace != grant[1]
        if not outside and not ({(request.verb, full), ("*", full)} & self._forbidden):
            return
        kind = _KINDS.get(resource)
        qualified = kind.qualified_resource if kind else resource
        target = f'{qualified} "{request.name}"' if request.name else qualified
        message = (
            f'{target} is forbidden: User "{user}" cannot {request.verb} resource "{full}" '
            f'in API group "{request.api_group}" in the namespace "{request.namespace}"'
        )
        details: Json = {"name": request.name} if request.name else {}
        if request.api_group:
            details["group"] = request.api_group
        details["kind"] = resource
        raise _ApiError(403, "Forbidden", message, details)

    async def _dispatch(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        recorded = await self._record(request)
        if self._down:
            return self._drop(request)
        fault: Fault | None = None
        try:
            bearer = request.headers.get("Authorization") or ""
            grant = self._grants.get(bearer.removeprefix("Bearer ")) if bearer else None
            if grant is None and self.token is not None and bearer != f"Bearer {self.token}":
                raise _ApiError(401, "Unauthorized", "Unauthorized")
            fault = self._take_fault(recorded)
            if fault is not None:
                await asyncio.sleep(fault.delay)
                if fault.drop_before:
                    return self._drop(request)
                if fault.status is not None:
                    raise _fault_error(fault, fault.status)
            if recorded.resource:
                self._authorize(recorded, grant)
            response = await handler(request)
        except _ApiError as err:
            return err.response()
        except web.HTTPNotFound:
            return _no_such_resource().response()
        except web.HTTPMethodNotAllowed:
            message = "the server does not allow this method on the requested resource"
            return _ApiError(405, "MethodNotAllowed", message, {}).response()
        if fault is not None and fault.drop_after:
            return self._drop(request)
        return response

    # -- request helpers ---------------------------------------------------------------------------

    def _require_namespace(self, namespace: str) -> None:
        if namespace not in self.namespaces:
            message = f'namespaces "{namespace}" not found'
            raise _ApiError(404, "NotFound", message, {"name": namespace, "kind": "namespaces"})

    @staticmethod
    async def _json_body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise _bad_request(f"couldn't get version/kind; json parse error: {err}") from err

    @staticmethod
    def _dry_run(request: web.Request) -> bool:
        value = request.query.get("dryRun")
        if value not in (None, "All"):
            raise _bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
        return value == "All"

    @staticmethod
    def _field_validation(request: web.Request) -> str:
        value = request.query.get("fieldValidation", "Warn")
        if value not in ("Strict", "Warn", "Ignore"):
            raise _bad_request(
                f"fieldValidation must be one of Ignore, Warn, or Strict, got {value!r}"
            )
        return value

    def _lookup(self, kind: _Kind, namespace: str, name: str) -> Json:
        obj = self._store[kind.resource].get((namespace, name))
        if obj is None:
            raise _not_found(kind, name)
        return obj

    def _admit(self, kind: _Kind, namespace: str, body: Any, validation: str) -> list[str]:
        """Check and normalise a new or patched object in place; returns Warning texts."""
        if not isinstance(body, dict):
            raise _bad_request(f"the body of a {kind.kind} must be a JSON object")
        if kind.group and not (body.get("kind") and body.get("apiVersion")):
            raise _bad_request(f"Object 'Kind' is missing in '{json.dumps(body)[:200]}'")
        if body.setdefault("apiVersion", kind.api_version) != kind.api_version:
            raise _bad_request(
                f"the API version in the data ({body['apiVersion']}) does not match the expected "
                f"API version ({kind.api_version})"
            )
        if body.setdefault("kind", kind.kind) != kind.kind:
            raise _bad_request(
                f"the kind in the data ({body['kind']}) does not match the expected kind "
                f"({kind.kind})"
            )
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _bad_request("metadata must be a JSON object")
        if meta.get("namespace") not in (None, "", namespace):
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        meta.pop("managedFields", None)  # the server keeps its own

        unknown: list[str] = []
        schema = self._schema if kind is MPIJOBS else _CONFIGMAP_SCHEMA
        if schema is not None:
            pruning = {**schema, "properties": {**schema["properties"]}}
            pruning["properties"]["metadata"] = _OBJECT_META_SCHEMA
            _normalize(body, pruning, "", unknown)
        if unknown and validation == "Strict":
            listed = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise _bad_request(f"strict decoding error: {listed}")

        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["name"] = f"{meta['generateName']}{_suffix()}"
        causes = (
            _name_causes(name)
            if name
            else [
                _cause(
                    "FieldValueRequired",
                    "metadata.name",
                    "Required value: name or generateName is required",
                )
            ]
        )
        causes += _metadata_causes(meta)
        if kind is CONFIGMAPS and _configmap_bytes(body) > CONFIGMAP_MAX_BYTES:
            causes.append(
                _cause(
                    "FieldValueTooLong",
                    "[]",
                    f"Too long: must have at most {CONFIGMAP_MAX_BYTES} bytes",
                )
            )
        if kind is MPIJOBS and self._validator is not None:
            for error in self._validator.iter_errors(body):
                causes += [c for c in _schema_causes(error) if c not in causes]
        if causes:
            raise _invalid(kind, name, sorted(causes, key=lambda c: str(c["field"])))
        return [f'unknown field "{path}"' for path in unknown] if validation == "Warn" else []

    @staticmethod
    def _json(body: Json, status: int = 200, warnings: Iterable[str] = ()) -> web.Response:
        response = web.json_response(body, status=status)
        for warning in warnings:
            response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        return response

    def _filter(self, kind: _Kind, namespace: str, query: Mapping[str, str]) -> _Predicate:
        predicates = _parse_label_selector(query.get("labelSelector", ""))
        predicates += _parse_field_selector(kind, query.get("fieldSelector", ""))

        def accepts(obj: Json) -> bool:
            return obj["metadata"]["namespace"] == namespace and all(p(obj) for p in predicates)

        return accepts

    # -- handlers --------------------------------------------------------------------------------

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "major": "1",
                "minor": "35",
                "emulationMajor": "1",
                "emulationMinor": "35",
                "minCompatibilityMajor": "1",
                "minCompatibilityMinor": "34",
                "gitVersion": "v1.35.4",
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25.0",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def _discovery(self, request: web.Request) -> web.Response:
        verbs = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
        resource = {"name": "mpijobs", "singularName": "mpijob", "namespaced": True}
        status = {"name": "mpijobs/status", "singularName": "", "namespaced": True}
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": MPIJOBS.api_version,
                "resources": [
                    resource | {"kind": "MPIJob", "verbs": verbs},
                    status | {"kind": "MPIJob", "verbs": ["get", "patch", "update"]},
                ],
            }
        )

    async def _create(self, kind: _Kind, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        dry_run = self._dry_run(request)
        validation = self._field_validation(request)
        body = await self._json_body(request)
        self._require_namespace(namespace)
        meta = body.get("metadata") if isinstance(body, dict) else None
        if isinstance(meta, dict) and meta.get("resourceVersion"):
            raise _bad_request("resourceVersion should not be set on objects to be created")
        warnings = self._admit(kind, namespace, body, validation)
        name = body["metadata"]["name"]
        if kind is MPIJOBS and self.quota_exceeded is not None:
            message = (
                f'{kind.qualified_resource} "{name}" is forbidden: '
                f"exceeded quota: {self.quota_exceeded}"
            )
            raise _ApiError(403, "Forbidden", message, _details(kind, name))
        if (namespace, name) in self._store[kind.resource]:
            message = f'{kind.qualified_resource} "{name}" already exists'
            raise _ApiError(409, "AlreadyExists", message, _details(kind, name))
        scenario: Scenario | None = None
        if kind is MPIJOBS:
            body.pop("status", None)  # the status subresource ignores it
            scenario = self.scenario_for(body)
            if scenario.kind == "suspended":  # Kueue's webhook queues the job
                body.setdefault("spec", {}).setdefault("runPolicy", {})["suspend"] = True
        self._stamp(body, namespace)
        if not dry_run:
            self._put(kind, body, "ADDED")
            if scenario is not None and scenario.kind != "no-operator":
                self._start_operator(namespace, name, scenario)
        return self._json(body, 201, warnings)

    async def _get(self, kind: _Kind, request: web.Request) -> web.Response:
        info = request.match_info
        return web.json_response(self._lookup(kind, info["namespace"], info["name"]))

    async def _list(self, kind: _Kind, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        accepts = self._filter(kind, namespace, request.query)
        if _is_true(request.query.get("watch")):
            return await self._watch(kind, accepts, request)
        items = []
        for obj in (o for _, o in sorted(self._store[kind.resource].items()) if accepts(o)):
            item = copy.deepcopy(obj)
            if kind is not MPIJOBS:  # built-in lists leave kind and apiVersion off their items
                del item["kind"], item["apiVersion"]
            items.append(item)
        return web.json_response(
            {
                "apiVersion": kind.api_version,
                "kind": f"{kind.kind}List",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    async def _watch(
        self, kind: _Kind, accepts: _Predicate, request: web.Request
    ) -> web.StreamResponse:
        query = request.query
        try:
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
            since = int(query.get("resourceVersion") or 0)
        except ValueError as err:
            raise _bad_request(f"invalid watch parameter: {err}") from err
        bookmarks = _is_true(query.get("allowWatchBookmarks"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if 0 < since < self._compacted_rv:
            message = f"too old resource version: {since} ({self._compacted_rv + 1})"
            await response.prepare(request)
            await response.write(_event_line("ERROR", _status_body(410, "Expired", message)))
            return response
        # From here to the first await, nothing may change, or the watcher would miss it.
        if since == 0:
            store = self._store[kind.resource]
            initial = [
                _Change(self._rv, kind, "ADDED", copy.deepcopy(o)) for _, o in sorted(store.items())
            ]
        else:
            initial = [c for c in self._history if c.rv > since and c.kind is kind]
        watcher = _Watcher(kind, accepts, asyncio.Queue())
        cache_rv = since or self._rv
        for change in initial:
            watcher.queue.put_nowait(change)
        self._watchers.add(watcher)
        transport = request.transport
        if transport is not None:
            self._streams.add(transport)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            await response.prepare(request)
            await self._pump(watcher, request, response, deadline, bookmarks, cache_rv)
        except ConnectionError:
            _LOGGER.debug("watch client of %s went away", kind.resource)
        finally:
            self._watchers.discard(watcher)
            if transport is not None:
                self._streams.discard(transport)
        return response

    async def _pump(
        self,
        watcher: _Watcher,
        request: web.Request,
        response: web.StreamResponse,
        deadline: float | None,
        bookmarks: bool,
        cache_rv: int,
    ) -> None:
        """Send a watcher's changes until its deadline, shutdown, down() or the client leaves.

        BOOKMARKs come as from the API server's watch cache: 2 s before the deadline and about
        every ``bookmark_interval`` seconds otherwise, carrying the newest resourceVersion among
        the changes of the watched kind (``cache_rv`` at first): a change of another kind does
        not move it on.
        """
        loop = asyncio.get_running_loop()
        next_bookmark = self._next_bookmark(loop.time(), deadline)
        while not self._closing and not self._down:
            if request.transport is None or request.transport.is_closing():
                return
            now = loop.time()
            wait = _IDLE_CHECK_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - now)
                if wait <= 0:
                    return
            if bookmarks and next_bookmark is not None:
                if now >= next_bookmark:
                    kind = watcher.kind
                    meta = {"resourceVersion": str(cache_rv)}
                    bookmark = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta}
                    await response.write(_event_line("BOOKMARK", bookmark))
                    next_bookmark = self._next_bookmark(loop.time(), deadline)
                    continue
                wait = min(wait, next_bookmark - now)
            try:
                change = await asyncio.wait_for(watcher.queue.get(), max(wait, 0.0))
            except TimeoutError:
                continue
            if change is None:
                return
            cache_rv = max(cache_rv, change.rv)
            if watcher.accepts(change.obj):
                await response.write(_event_line(change.type, change.obj))

    def _next_bookmark(self, now: float, deadline: float | None) -> float | None:
        """When the watch cache sends its next bookmark (cacheWatcher.nextBookmarkTime): in
        ``bookmark_interval`` seconds, or 2 s before the deadline if that is sooner; None when
        that moment has passed."""
        at = now + self.bookmark_interval
        if deadline is not None:
            at = min(at, deadline - 2.0)
        return at if at >= now else None

    async def _delete(self, kind: _Kind, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        dry_run = self._dry_run(request)
        options = await self._json_body(request)
        options = options if isinstance(options, dict) else {}
        policy = request.query.get("propagationPolicy") or options.get("propagationPolicy")
        if policy is None:
            orphan = request.query.get("orphanDependents", options.get("orphanDependents"))
            policy = "Orphan" if _is_true(str(orphan)) else "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            message = (
                f'propagationPolicy: Unsupported value: "{policy}": supported values: '
                '"Foreground", "Background", "Orphan"'
            )
            raise _ApiError(422, "Invalid", message, {"causes": []})
        obj = self._lookup(kind, namespace, name)
        meta = obj["metadata"]
        success: Json = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {**_details(kind, name), "uid": meta["uid"]},
        }
        if dry_run:
            return web.json_response(obj if policy == "Foreground" else success)
        if meta.get("deletionTimestamp"):
            return web.json_response(obj)
        if policy != "Foreground" and meta.get("finalizers"):
            # Finalizers hold the object (terminating) until their owners remove them; the
            # dependents are deleted (or orphaned) only then.
            meta["deletionTimestamp"] = _now()
            meta["deletionGracePeriodSeconds"] = 0
            self._pending_deletes[(kind.resource, namespace, name)] = policy
            if kind is MPIJOBS:
                self._stop_operator((namespace, name))  # the operator ignores terminating jobs
            self._put(kind, obj, "MODIFIED")
            return web.json_response(obj)
        if policy == "Foreground":
            meta["deletionTimestamp"] = _now()
            meta["deletionGracePeriodSeconds"] = 0
            meta["finalizers"] = [*meta.get("finalizers", []), "foregroundDeletion"]
            if kind is MPIJOBS:
                self._stop_operator((namespace, name))  # the operator ignores terminating jobs
            self._put(kind, obj, "MODIFIED")
            self._spawn(self._finish_foreground(kind, namespace, name, meta["uid"]))
            return web.json_response(obj)
        self._remove(kind, namespace, name)
        if policy == "Background":
            self._cascade(namespace, meta["uid"])
        else:
            self._orphan(namespace, meta["uid"])
        return web.json_response(success)

    async def _finish_foreground(self, kind: _Kind, namespace: str, name: str, uid: str) -> None:
        self._cascade(namespace, uid)
        await asyncio.sleep(self.foreground_delay)
        obj = self._store[kind.resource].get((namespace, name))
        if obj is not None and obj["metadata"]["uid"] == uid:
            obj["metadata"]["finalizers"].remove("foregroundDeletion")
            if obj["metadata"]["finalizers"]:  # others hold it until they are removed
                self._pending_deletes[(kind.resource, namespace, name)] = "Foreground"
                self._put(kind, obj, "MODIFIED")
            else:
                self._remove(kind, namespace, name)

    async def _patch(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        dry_run = self._dry_run(request)
        validation = self._field_validation(request)
        patch = await self._json_body(request)
        current = self._lookup(MPIJOBS, namespace, name)
        content_type = request.content_type
        if content_type == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise _bad_request("a merge patch must be a JSON object")
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
                # A resourceVersion in the patch is a precondition, as on a real API server.
                message = (
                    f'Operation cannot be fulfilled on {MPIJOBS.qualified_resource} "{name}": '
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again"
                )
                raise _ApiError(409, "Conflict", message, _details(MPIJOBS, name))
            patched = _merge_patch(copy.deepcopy(current), patch)
        elif content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise _bad_request(
                    f"json: cannot unmarshal {_json_type(patch)} into Go value of type "
                    "[]handlers.jsonPatchOp"
                )
            patched = _json_patch(current, patch)
        else:
            raise _ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        meta = patched.setdefault("metadata", {})
        if meta.get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
            message = (
                f'Operation cannot be fulfilled on {MPIJOBS.qualified_resource} "{name}": the '
                "object has been modified; please apply your changes to the latest version and "
                "try again"
            )
            raise _ApiError(409, "Conflict", message, _details(MPIJOBS, name))
        for field in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            meta[field] = current["metadata"][field]
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
            else:
                meta.pop(field, None)
        if meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(
                current["metadata"].get("finalizers") or ()
            )
            if added:
                raise _invalid(
                    MPIJOBS,
                    name,
                    [
                        _cause(
                            "FieldValueForbidden",
                            "metadata.finalizers",
                            "Forbidden: no new finalizers can be added if the object is being "
                            "deleted, found new finalizers " + json.dumps(sorted(added)),
                        )
                    ],
                )
        meta.pop("resourceVersion", None)
        if "status" in current:
            patched["status"] = copy.deepcopy(current["status"])  # a status subresource
        else:
            patched.pop("status", None)
        warnings = self._admit(MPIJOBS, namespace, patched, validation)
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if patched == current or dry_run:
            return self._json(patched if dry_run else current, 200, warnings)
        if patched.get("spec") != current.get("spec"):
            meta["generation"] += 1
        was_suspended = _suspend_requested(current)
        self._put(MPIJOBS, patched, "MODIFIED")
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._finalize(MPIJOBS, namespace, name)  # the last finalizer went
            return self._json(patched, 200, warnings)
        if _suspend_requested(patched) != was_suspended:
            self._on_suspend_change((namespace, name), _suspend_requested(patched))
        return self._json(patched, 200, warnings)

    async def _pod_log(self, request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        query = request.query
        pod = self._lookup(PODS, namespace, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container") or ""
        if not container:
            if len(names) != 1:
                raise _bad_request(
                    f"a container name must be specified for pod {name}, "
                    f"choose one of: [{' '.join(names)}]"
                )
            container = names[0]
        if container not in names:
            raise _bad_request(f"container {container} is not valid for pod {name}")
        if not pod["spec"].get("nodeName"):
            # No node, no kubelet to ask: the API server streams nothing (204 No Content).
            return web.Response(status=204)
        if _is_true(query.get("previous")):
            raise _bad_request(
                f'previous terminated container "{container}" in pod "{name}" not found'
            )
        waiting = _container_state(pod, container).get("waiting")
        if waiting is not None:
            reason = waiting.get("reason", "")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                reason = "trying and failing to pull image"
            raise _bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        try:
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
            tail = int(query["tailLines"]) if "tailLines" in query else None
            since = int(query["sinceSeconds"]) if "sinceSeconds" in query else None
        except ValueError as err:
            raise _bad_request(f"invalid log option: {err}") from err
        key = (namespace, name, container)
        lines = list(self._logs.get(key, []))
        if since is not None:
            cutoff = datetime.now(UTC) - timedelta(seconds=since)
            lines = [line for line in lines if line.at >= cutoff]
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        timestamps = _is_true(query.get("timestamps"))

        def render(chunk: Iterable[_LogLine]) -> bytes:
            return "".join(
                f"{_stamp_precise(line.at)} {line.text}\n" if timestamps else f"{line.text}\n"
                for line in chunk
            ).encode()

        if not _is_true(query.get("follow")):
            data = render(lines)
            return web.Response(
                body=data[:limit] if limit is not None else data, content_type="text/plain"
            )
        return await self._follow_log(request, key, render(lines), render, limit)

    async def _follow_log(
        self,
        request: web.Request,
        key: tuple[str, str, str],
        first: bytes,
        render: Callable[[Iterable[_LogLine]], bytes],
        limit: int | None,
    ) -> web.StreamResponse:
        """Stream a container's log until the container ends, shutdown, down() or ``limit``."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        transport = request.transport
        if transport is not None:
            self._streams.add(transport)
        budget = limit if limit is not None else -1
        sent = len(self._logs.get(key, []))

        async def send(data: bytes) -> bool:
            nonlocal budget
            if budget >= 0:
                data, budget = data[:budget], budget - min(budget, len(data))
            if data:
                await response.write(data)
            return budget != 0

        try:
            await response.prepare(request)
            more = await send(first)
            while more and not self._closing and not self._down:
                lines = self._logs.get(key, [])
                if len(lines) > sent:
                    more = await send(render(lines[sent:]))
                    sent = len(lines)
                    continue
                pod = self._store["pods"].get(key[:2])
                if pod is None or "terminated" in _container_state(pod, key[2]):
                    break
                if request.transport is None or request.transport.is_closing():
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_IDLE_CHECK_SECONDS):
                        await self._wake.wait()
        except ConnectionError:
            _LOGGER.debug("log follower of %s/%s went away", *key[:2])
        finally:
            if transport is not None:
                self._streams.discard(transport)
        return response
