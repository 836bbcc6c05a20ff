"""The routes-only front doors (Istio, ingress-nginx, Gateway API) route like the proxy expects.

The committed manifests must equal what :mod:`proxy.frontdoors` generates from ROUTES. Then each
front door's rendered rules (from the kustomize build) are evaluated, by a small evaluator per
front door that implements the matching semantics its documentation gives, against a table of
requests the real clients send (shared/reference/oms-api.md, and the bulk traffic that must skip
the proxy). Which requests the proxy answers is decided by the proxy's own aiohttp router.
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

import tests.test_deploy as deploy
from proxy import frontdoors
from proxy.app import create_app
from proxy.config import Config
from proxy.routes import HEALTH_ROUTES, ROUTES

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = ROOT / "k8s" / "overlays"
DOORS = {
    "istio": OVERLAYS / "routes-only",
    "ingress-nginx": OVERLAYS / "routes-only-nginx",
    "gateway-api": OVERLAYS / "routes-only-gateway",
}
PROXY, OMS = "proxy", "oms"
Obj = dict[str, Any]


@pytest.fixture(scope="module", params=sorted(DOORS))
def door(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    return request.param, deploy.kustomize_build(DOORS[request.param])


@pytest.mark.parametrize("fmt", sorted(frontdoors.FORMATS))
def test_committed_manifest_is_generated(fmt: str) -> None:
    path = ROOT / frontdoors.FORMATS[fmt]
    assert path.read_text(encoding="utf-8") == frontdoors.render(fmt), (
        f"{path.relative_to(ROOT)} differs from the generator: "
        f"oms-mpijob-proxy routes --format {fmt} > {path.relative_to(ROOT)}"
    )
    assert path.parent in DOORS.values()


def test_cli_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    from proxy.cli import main

    for fmt in frontdoors.FORMATS:
        assert main(["routes", "--format", fmt]) == 0
        assert capsys.readouterr().out == frontdoors.render(fmt)


def test_unknown_front_door() -> None:
    with pytest.raises(ValueError, match="unknown front door"):
        frontdoors.render("haproxy")


# --- which backend a request reaches: one evaluator per front door -------------------------


def _service_backend(name: str, namespace: str) -> str:
    """Our two Services by name (short name or cluster-local host)."""
    short = name.removesuffix(f".{namespace}.svc.cluster.local")
    assert short in (deploy.PROXY_NAME, "oms"), name
    return PROXY if short == deploy.PROXY_NAME else OMS


def istio_backend(objs: list[Obj], method: str, path: str) -> str:
    """Istio VirtualService: the first http entry (in order) whose match applies wins.

    A ``uri.regex`` is RE2 matched against the whole path (no query string); ``method.exact``
    compares the method; an entry without ``match`` matches everything.
    """
    (vs,) = [o for o in objs if o["kind"] == "VirtualService"]
    path = path.partition("?")[0]
    for http in vs["spec"]["http"]:
        for match in http.get("match") or [{}]:
            assert set(match) <= {"method", "uri", "name"}, match
            if "method" in match and match["method"]["exact"] != method:
                continue
            if "uri" in match and not re.fullmatch(match["uri"]["regex"], path):
                continue
            (route,) = http["route"]
            return _service_backend(route["destination"]["host"], vs["metadata"]["namespace"])
    raise AssertionError(f"no VirtualService entry for {method} {path}")


def nginx_backend(objs: list[Obj], method: str, path: str, host: str = frontdoors.HOST) -> str:
    """ingress-nginx (user guide, "Ingress Path Matching"): with ``use-regex`` (or
    ``rewrite-target``) on ANY Ingress of a host, every path of that host, whatever its Ingress,
    becomes a case-insensitive regex location ``~* "^<path>"``; the locations are ordered by
    descending path length and the first that matches wins. The method plays no part.
    """
    del method  # an Ingress cannot match it
    path = path.partition("?")[0]  # nginx matches locations against $uri, without the query
    ingresses = [
        o for o in objs if o["kind"] == "Ingress" and o["spec"].get("ingressClassName") == "nginx"
    ]
    locations: list[tuple[str, str]] = []
    use_regex = False
    for ing in ingresses:
        annotations = ing["metadata"].get("annotations") or {}
        for rule in ing["spec"]["rules"]:
            if rule.get("host") != host:
                continue
            use_regex |= annotations.get("nginx.ingress.kubernetes.io/use-regex") == "true"
            use_regex |= "nginx.ingress.kubernetes.io/rewrite-target" in annotations
            for p in rule["http"]["paths"]:
                assert p["pathType"] in ("Prefix", "ImplementationSpecific"), p
                service = p["backend"]["service"]["name"]
                locations.append(
                    (p["path"], _service_backend(service, ing["metadata"]["namespace"]))
                )
    assert use_regex, "these Ingresses rely on regex locations"
    locations.sort(key=lambda loc: len(loc[0]), reverse=True)  # stable: ties keep their order
    hits = [(p, b) for p, b in locations if re.match("^" + p, path, re.IGNORECASE)]
    if not hits:
        raise AssertionError(f"no location for {path}")
    ties = {b for p, b in hits if len(p) == len(hits[0][0])}
    assert len(ties) == 1, f"{path}: equally long locations disagree ({hits})"
    return hits[0][1]


RegexRank = Literal["above-exact", "below-exact", "below-prefix"]
RegexOrder = Literal["rule-order", "longest-first"]
RegexMode = Literal["full", "search"]


def _prefix_matches(prefix: str, path: str) -> bool:
    """PathPrefix: element-wise on `/`-separated labels; a trailing `/` is ignored."""
    want = [s for s in prefix.split("/") if s]
    have = path.split("/")[1:]
    return have[: len(want)] == want


def gateway_backend(
    objs: list[Obj],
    method: str,
    path: str,
    rank: RegexRank,
    order: RegexOrder,
    mode: RegexMode,
) -> str:
    """Gateway API HTTPRoute (HTTPRouteRule.matches): across all rules of the applicable
    routes, precedence goes to the match with an Exact path, then the PathPrefix with most
    characters, then a method match, then most header matches, then most query param matches;
    then the oldest route, then ``{namespace}/{name}``; then the first matching rule in list
    order. RegularExpression precedence is implementation-specific, so every placement
    (``rank``), every order among regexes (``order``) and either way of applying a regex
    (``mode``: the whole path, or a search) is evaluated.
    """
    candidates: list[tuple[tuple[Any, ...], str]] = []
    path = path.partition("?")[0]  # path matches never see the query string
    routes = [o for o in objs if o["kind"] == "HTTPRoute"]
    routes.sort(
        key=lambda r: (
            r["metadata"].get("creationTimestamp", ""),
            f"{r['metadata']['namespace']}/{r['metadata']['name']}",
        )
    )
    path_rank = {
        "above-exact": {"RegularExpression": 0, "Exact": 1, "PathPrefix": 2},
        "below-exact": {"Exact": 0, "RegularExpression": 1, "PathPrefix": 2},
        "below-prefix": {"Exact": 0, "PathPrefix": 1, "RegularExpression": 2},
    }[rank]
    for route_index, route in enumerate(routes):
        assert frontdoors.HOST in route["spec"]["hostnames"]
        for rule_index, rule in enumerate(route["spec"]["rules"]):
            for match in rule.get("matches") or [{}]:
                assert set(match) <= {"path", "method"}, "no header or query matches here"
                kind = match.get("path", {}).get("type", "PathPrefix")
                value = match.get("path", {}).get("value", "/")
                if kind == "Exact":
                    ok = path == value
                elif kind == "PathPrefix":
                    ok = _prefix_matches(value, path)
                else:
                    assert kind == "RegularExpression", kind
                    find = re.fullmatch if mode == "full" else re.search
                    ok = find(value, path) is not None
                if not ok or match.get("method", method) != method:
                    continue
                length = len(value) if kind == "PathPrefix" else 0
                if kind == "RegularExpression" and order == "longest-first":
                    length = len(value)
                key = (path_rank[kind], -length, "method" not in match, route_index, rule_index)
                (ref,) = rule["backendRefs"]
                candidates.append(
                    (key, _service_backend(ref["name"], route["metadata"]["namespace"]))
                )
    if not candidates:
        raise AssertionError(f"no HTTPRoute rule for {method} {path} (404)")
    return min(candidates)[1]


# --- what the proxy answers, and the table ---------------------------------------------------


@functools.cache
def _proxy_app() -> web.Application:
    return create_app(Config())


async def proxy_route(method: str, path: str) -> str | None:
    """The name of the proxy's own route that takes the request; None: passed through to oms."""
    app = _proxy_app()
    match_info = await app.router.resolve(make_mocked_request(method, path, app=app))
    name = match_info.route.resource.name if match_info.route.resource else None
    return name


# Samples of every ROUTE as the clients send it (oms-api.md): model digest or name, run or
# submit stamp, the log's paging suffix.
DIGEST = "d90e1e9a49a06d972ecf1d50e684c62b"
STAMP = "2024_01_02_03_04_05_678"
ROUTE_SAMPLES = {
    "run_submit": ["/api/run"],
    "run_log": [
        f"/api/run/log/model/{DIGEST}/stamp/{STAMP}",
        f"/api/run/log/model/RiskPaths/stamp/{STAMP}/start/0/count/0",
        f"/api/run/log/model/{DIGEST}/stamp/{STAMP}/start/120/count/50",
    ],
    "run_stop": [f"/api/run/stop/model/{DIGEST}/stamp/{STAMP}"],
    "run_status": [f"/api/model/RiskPaths/run/{STAMP}/status"],
    "run_status_list": [f"/api/model/{DIGEST}/run/{STAMP}/status/list"],
    "run_status_last": [f"/api/model/{DIGEST}/run/status/last"],
    "service_state": ["/api/service/state", "/api/service/state?lang=EN"],
    "service_job_active": [f"/api/service/job/active/{STAMP}"],
    "service_job_queue": [f"/api/service/job/queue/{STAMP}"],
    "service_job_history": [f"/api/service/job/history/{STAMP}"],
}

# Other traffic: it must reach oms. "proxy-path" marks another method on a proxy route's path:
# Istio and Gateway API match the method and send it to oms; an Ingress cannot, so ingress-nginx
# sends it to the proxy, which passes it to oms unchanged.
OTHER: list[tuple[str, str, str]] = [
    # the UI's static files
    ("GET", "/", "oms"),
    ("GET", "/index.html", "oms"),
    ("GET", "/js/app.3f1c2b.js", "oms"),
    ("GET", "/css/vendor.9a8b.css", "oms"),
    ("GET", "/favicon.ico", "oms"),
    # model and run data, table values and CSV exports
    ("GET", "/api/model-list", "oms"),
    ("GET", "/api/model/RiskPaths", "oms"),
    ("GET", f"/api/model/{DIGEST}/run-list/text/lang/EN", "oms"),
    ("GET", f"/api/model/{DIGEST}/run/{STAMP}", "oms"),
    ("GET", f"/api/model/{DIGEST}/run/{STAMP}/text/lang/EN", "oms"),
    ("GET", f"/api/model/{DIGEST}/run/{STAMP}/table/T01_LifeExpectancy/expr", "oms"),
    ("GET", f"/api/model/{DIGEST}/run/{STAMP}/table/T01_LifeExpectancy/calc/avg/csv", "oms"),
    ("GET", f"/api/model/{DIGEST}/run/{STAMP}/status/extra", "oms"),
    ("POST", "/api/model/RiskPaths/run/table/value", "oms"),
    ("DELETE", f"/api/model/{DIGEST}/run/{STAMP}", "oms"),
    ("GET", f"/api/model/RiskPaths/task/Task1/run-status/run/{STAMP}", "oms"),
    # downloads and uploads (multi-GB)
    ("POST", f"/api/download/model/{DIGEST}/run/{STAMP}", "oms"),
    ("GET", "/api/download/file-tree/RiskPaths.run.102", "oms"),
    ("GET", "/download/RiskPaths.run.102.zip", "oms"),
    ("POST", f"/api/upload/model/{DIGEST}/run", "oms"),
    ("POST", f"/api/upload/model/{DIGEST}/workset", "oms"),
    ("GET", "/api/upload/log/file/RiskPaths.run.102.zip.upload.log", "oms"),
    ("PUT", "/upload/RiskPaths.run.102.zip", "oms"),
    ("GET", "/files/data/input.csv", "oms"),
    # the jobs page's other calls, service config, admin
    ("GET", "/api/service/config", "oms"),
    ("GET", "/api/service/disk-use", "oms"),
    ("PUT", f"/api/service/job/move/0/{STAMP}", "oms"),
    ("DELETE", f"/api/service/job/delete/history/{STAMP}", "oms"),
    ("GET", f"/api/service/job/history/{STAMP}/extra", "oms"),
    ("GET", f"/api/service/job/active/{STAMP}/extra", "oms"),
    ("POST", "/api/admin/all-models/refresh", "oms"),
    ("GET", "/api/run/log/model/RiskPaths", "oms"),
    ("POST", "/api/run/extra", "oms"),
    # health and metrics are the proxy's, but internal: a front door publishes none of them
    ("GET", "/healthz", "internal"),
    ("GET", "/readyz", "internal"),
    ("GET", "/metrics", "internal"),
    # a proxy route's path with another method
    ("GET", "/api/run", "proxy-path"),
    ("POST", f"/api/run/stop/model/{DIGEST}/stamp/{STAMP}", "proxy-path"),
    ("DELETE", f"/api/model/{DIGEST}/run/{STAMP}/status", "proxy-path"),
    ("HEAD", "/api/service/state", "proxy-path"),
]


def _requests() -> list[tuple[str, str, str]]:
    """(method, path, what the proxy makes of it) for every sample: 'answers' or the OTHER tag."""
    out = [(r.method, sample, "answers") for r in ROUTES for sample in ROUTE_SAMPLES[r.name]]
    out += [
        (r.method, sample + "/", "answers-slash")
        for r in ROUTES
        if r.name != "run_log"
        for sample in ROUTE_SAMPLES[r.name][:1]
    ]
    return out + OTHER


def test_samples_cover_every_route() -> None:
    assert set(ROUTE_SAMPLES) == {r.name for r in ROUTES}


@pytest.mark.parametrize(("method", "path", "tag"), _requests())
async def test_table_agrees_with_the_proxy(method: str, path: str, tag: str) -> None:
    """The table says what the proxy really does with each request (its own router)."""
    name = await proxy_route(method, path)
    if tag == "answers":
        assert name in {r.name for r in ROUTES}, f"the proxy does not answer {method} {path}"
    elif tag == "internal":
        assert name in {r.name for r in HEALTH_ROUTES}
    elif tag in ("oms", "proxy-path"):
        assert name is None, f"the proxy answers {method} {path} itself ({name})"


def _expected(door_name: str, tag: str) -> str:
    if tag in ("answers", "answers-slash"):
        # A trailing slash: the front doors accept it (`/?$`); the proxy passes what its
        # router does not take (POST /api/run/) to oms itself.
        return PROXY
    if tag == "proxy-path":
        return PROXY if door_name == "ingress-nginx" else OMS
    return OMS


def _evaluations(door_name: str, objs: list[Obj], method: str, path: str) -> list[str]:
    if door_name == "istio":
        return [istio_backend(objs, method, path)]
    if door_name == "ingress-nginx":
        return [nginx_backend(objs, method, path)]
    return [
        gateway_backend(objs, method, path, rank, order, mode)
        for rank, order, mode in itertools.product(
            ("above-exact", "below-exact", "below-prefix"),
            ("rule-order", "longest-first"),
            ("full", "search"),
        )
    ]


def test_front_door_routing(door: tuple[str, list[Obj]]) -> None:
    door_name, objs = door
    wrong = []
    for method, path, tag in _requests():
        want = _expected(door_name, tag)
        for got in _evaluations(door_name, objs, method, path):
            if got != want:
                wrong.append(f"{method} {path}: {got}, expected {want}")
    assert not wrong, "\n".join(wrong)


async def test_ingress_nginx_is_case_insensitive() -> None:
    """`~*`: an upper-case path reaches the proxy, which passes what it does not answer to oms."""
    objs = deploy.kustomize_build(DOORS["ingress-nginx"])
    assert nginx_backend(objs, "GET", "/API/SERVICE/STATE") == PROXY
    assert await proxy_route("GET", "/API/SERVICE/STATE") is None


def test_evaluators_can_fail() -> None:
    """Each evaluator notices a front door that loses a route or orders its catch-all first."""
    vs = deploy.kustomize_build(DOORS["istio"])
    http = next(o for o in vs if o["kind"] == "VirtualService")["spec"]["http"]
    http.insert(0, http.pop())  # catch-all first: Istio's first match takes everything
    assert istio_backend(vs, "POST", "/api/run") == OMS

    nginx = deploy.kustomize_build(DOORS["ingress-nginx"])
    for ing in nginx:
        if ing["kind"] == "Ingress":
            ing["metadata"]["annotations"].pop("nginx.ingress.kubernetes.io/use-regex")
    with pytest.raises(AssertionError, match="regex locations"):
        nginx_backend(nginx, "GET", "/api/service/state")

    gw = deploy.kustomize_build(DOORS["gateway-api"])
    route = next(o for o in gw if o["kind"] == "HTTPRoute")
    route["spec"]["rules"][-1]["matches"] = [{"path": {"type": "PathPrefix", "value": "/"}}]
    got = {
        gateway_backend(gw, "GET", f"/api/service/job/active/{STAMP}", rank, "rule-order", "full")
        for rank in ("above-exact", "below-prefix")
    }
    assert got == {PROXY, OMS}, "a PathPrefix catch-all depends on the implementation"


# --- the manifests' own contracts ------------------------------------------------------------


def test_nginx_annotations() -> None:
    objs = deploy.kustomize_build(DOORS["ingress-nginx"])
    config = deploy.deploy_config()
    ingresses = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Ingress"}
    assert set(ingresses) == {deploy.PROXY_NAME, "oms"}
    a = "nginx.ingress.kubernetes.io/"
    oms = ingresses["oms"]["metadata"]["annotations"]
    proxy = ingresses[deploy.PROXY_NAME]["metadata"]["annotations"]
    for key in ("proxy-request-buffering", "proxy-buffering"):
        assert oms[a + key] == "off", "bulk traffic streams, no spooling at the ingress"
    assert oms[a + "proxy-body-size"] == proxy[a + "proxy-body-size"] == "0"
    for key in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(proxy[a + key]) > config.oms.first_byte_timeout_seconds, (
            "the ingress must wait longer than the proxy waits for oms, so the client gets the "
            "proxy's 504, not the ingress's"
        )
        assert int(oms[a + key]) >= int(proxy[a + key])
    hosts = {r["host"] for ing in ingresses.values() for r in ing["spec"]["rules"]}
    assert hosts == {frontdoors.HOST}


def test_gateway_route_shape() -> None:
    objs = deploy.kustomize_build(DOORS["gateway-api"])
    (route,) = [o for o in objs if o["kind"] == "HTTPRoute"]
    proxy_rule, oms_rule = route["spec"]["rules"]
    assert proxy_rule["backendRefs"] == [{"name": deploy.PROXY_NAME, "port": 80}]
    matches = proxy_rule["matches"]
    assert [(m["method"], m["path"]["value"]) for m in matches] == [
        (r.method, r.regex) for r in ROUTES
    ]
    assert {m["path"]["type"] for m in matches} == {"RegularExpression"}
    assert oms_rule["backendRefs"] == [{"name": "oms", "port": 4040}]
    assert oms_rule["timeouts"] == {"request": "0s"}, "downloads must not be cut"
    assert all(len(oms_rule["matches"][0]["path"]["value"]) < len(r.regex) for r in ROUTES)
    published = {r.regex for r in HEALTH_ROUTES}
    assert not published & {m["path"]["value"] for m in matches}


@pytest.mark.parametrize(
    ("name", "namespace"),
    [("routes-only-nginx", "ingress-nginx"), ("routes-only-gateway", "gateway-system")],
)
def test_network_policy_admits_the_front_door(name: str, namespace: str) -> None:
    objs = deploy.kustomize_build(OVERLAYS / name)
    policy = deploy.one(objs, "NetworkPolicy")
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    ]
    base = deploy.one(deploy.kustomize_build(ROOT / "k8s" / "base"), "NetworkPolicy")
    assert ingress["ports"] == base["spec"]["ingress"][0]["ports"]
    assert policy["spec"]["egress"] == base["spec"]["egress"]
