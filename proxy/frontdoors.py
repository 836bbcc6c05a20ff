"""The routes-only front doors, generated from :data:`proxy.routes.ROUTES`: pure, no I/O.

Each front door sends the proxy's own routes to the proxy Service and everything else (the UI,
downloads, uploads, table data) straight to oms. ``oms-mpijob-proxy routes --format <door>``
prints one of the files below; a test keeps the committed files equal to this output:

* ``istio``: an Istio VirtualService (``k8s/overlays/routes-only/virtualservice.yaml``);
* ``ingress-nginx``: two Ingresses for ingress-nginx (``k8s/overlays/routes-only-nginx``);
* ``gateway-api``: a Gateway API HTTPRoute (``k8s/overlays/routes-only-gateway``).
"""

from __future__ import annotations

from typing import Any

import yaml

from proxy.routes import ROUTES, Route

NAMESPACE = "openmpp"
HOST = "openmpp.example.org"
PROXY_SERVICE = "oms-mpijob-proxy"
PROXY_PORT = 80
OMS_SERVICE = "oms"
OMS_PORT = 4040
# Longer than oms.first_byte_timeout_seconds (600 s), so a slow oms gets the proxy's own 504.
PROXY_TIMEOUT_SECONDS = 620
# oms's downloads and uploads can take long; the front door should not cut them.
OMS_TIMEOUT_SECONDS = 3600

_LABELS = {
    "app.kubernetes.io/name": "oms-mpijob-proxy",
    "app.kubernetes.io/component": "routing",
    "app.kubernetes.io/part-of": "openmpp",
}

Obj = dict[str, Any]


def _rule_name(route: Route) -> str:
    return "proxy-" + route.name.replace("_", "-")


def _summary(route: Route) -> str:
    return f"{route.method} {route.path}"


# --- Istio ----------------------------------------------------------------------------------

_ISTIO_HEADER = f"""\
# Route the proxy's own routes to the proxy, everything else straight to oms.
#
# GENERATED from proxy/routes.py ROUTES by `oms-mpijob-proxy routes --format istio`; do not
# edit (tests/test_frontdoors.py checks it). Istio matches `regex` (RE2) against the whole path
# without the query string; the first matching entry wins, so the catch-all comes last.
#
# Set the name your users reach OpenM++ at (`hosts`) and your ingress gateway (`gateways`;
# Kubeflow's is kubeflow/kubeflow-gateway) with a patch in a kustomization of your own on top
# of this overlay (README). If oms is published under a path prefix, every regex needs the
# prefix and both destinations a `rewrite`.
#
# The proxy's routes, in order:
{"".join(f"#   {_summary(r)}{chr(10)}" for r in ROUTES)}"""


def virtual_service() -> Obj:
    """The Istio VirtualService: method + regex per route, first match wins, oms last."""
    proxy = {
        "host": f"{PROXY_SERVICE}.{NAMESPACE}.svc.cluster.local",
        "port": {"number": PROXY_PORT},
    }
    oms = {"host": f"{OMS_SERVICE}.{NAMESPACE}.svc.cluster.local", "port": {"number": OMS_PORT}}
    http: list[Obj] = [
        {
            "name": _rule_name(r),
            "match": [{"method": {"exact": r.method}, "uri": {"regex": r.regex}}],
            "route": [{"destination": dict(proxy)}],
        }
        for r in ROUTES
    ]
    http.append({"name": "oms", "route": [{"destination": oms}]})
    return {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "VirtualService",
        "metadata": {"name": "oms", "labels": dict(_LABELS)},
        "spec": {"hosts": [HOST], "gateways": ["kubeflow/kubeflow-gateway"], "http": http},
    }


# --- ingress-nginx --------------------------------------------------------------------------

_NGINX_HEADER = """\
# Two Ingresses for ingress-nginx on one host: the proxy's own routes to the proxy, everything
# else (the UI, downloads, uploads) straight to oms.
#
# GENERATED from proxy/routes.py ROUTES by `oms-mpijob-proxy routes --format ingress-nginx`; do
# not edit (tests/test_frontdoors.py checks it).
#
# How ingress-nginx matches (its "Ingress Path Matching" guide): with use-regex on ANY Ingress
# of a host, every path of that host becomes a case-insensitive regex location
# `location ~* "^<path>"`, the paths are ordered by descending length, and the first match
# wins. The proxy's paths are the ROUTES regexes (RE2, anchored with `$`); oms's `/` is the
# shortest, so it catches the rest. An Ingress cannot match the method: every method on a proxy
# path goes to the proxy, which passes what it does not answer (e.g. GET /api/run) to oms.
#
# Set the name your users reach OpenM++ at (`host`) and your `tls` with a patch in a
# kustomization of your own on top of this overlay (README). Remove any other Ingress that
# routes this host to oms. The annotations are per Ingress:
#   proxy-body-size "0"            no size limit at the ingress: oms's uploads are large; the
#                                  proxy limits a run request itself (runs.max_body_bytes, 413)
#   proxy-read/send-timeout        seconds between two reads/writes: 620 for the proxy (more
#                                  than oms.first_byte_timeout_seconds, 600), 3600 for oms
#   proxy-request-buffering "off"  uploads stream to oms instead of being spooled to disk
#   proxy-buffering "off"          downloads stream to the client as oms sends them
"""

_NGINX = "nginx.ingress.kubernetes.io/"


def _backend(service: str, port: int) -> Obj:
    return {"service": {"name": service, "port": {"number": port}}}


def nginx_ingresses() -> list[Obj]:
    """The proxy's Ingress (one regex path per route) and oms's (``/``, bulk-friendly)."""
    proxy_paths = [
        {
            # ingress-nginx writes `^` itself in front of the path.
            "path": r.regex.removeprefix("^"),
            "pathType": "ImplementationSpecific",
            "backend": _backend(PROXY_SERVICE, PROXY_PORT),
        }
        for r in ROUTES
    ]
    proxy_timeout = str(PROXY_TIMEOUT_SECONDS)
    oms_timeout = str(OMS_TIMEOUT_SECONDS)
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {
                "name": PROXY_SERVICE,
                "labels": dict(_LABELS),
                "annotations": {
                    _NGINX + "use-regex": "true",
                    _NGINX + "proxy-body-size": "0",
                    _NGINX + "proxy-read-timeout": proxy_timeout,
                    _NGINX + "proxy-send-timeout": proxy_timeout,
                },
            },
            "spec": {
                "ingressClassName": "nginx",
                "rules": [{"host": HOST, "http": {"paths": proxy_paths}}],
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {
                "name": OMS_SERVICE,
                "labels": dict(_LABELS),
                "annotations": {
                    # In force for the whole host anyway (the proxy's Ingress sets it); said
                    # here too so that this Ingress reads as what it is.
                    _NGINX + "use-regex": "true",
                    _NGINX + "proxy-body-size": "0",
                    _NGINX + "proxy-read-timeout": oms_timeout,
                    _NGINX + "proxy-send-timeout": oms_timeout,
                    _NGINX + "proxy-request-buffering": "off",
                    _NGINX + "proxy-buffering": "off",
                },
            },
            "spec": {
                "ingressClassName": "nginx",
                "rules": [
                    {
                        "host": HOST,
                        "http": {
                            "paths": [
                                {
                                    "path": "/",
                                    "pathType": "Prefix",
                                    "backend": _backend(OMS_SERVICE, OMS_PORT),
                                }
                            ]
                        },
                    }
                ],
            },
        },
    ]


# --- Gateway API ----------------------------------------------------------------------------

_GATEWAY_HEADER = """\
# A Gateway API HTTPRoute: the proxy's own routes to the proxy, everything else straight to oms.
#
# GENERATED from proxy/routes.py ROUTES by `oms-mpijob-proxy routes --format gateway-api`; do
# not edit (tests/test_frontdoors.py checks it).
#
# Every path match is a RegularExpression (Support: Implementation-specific), the catch-all to
# oms included, and every match of the proxy's rule also matches the method (Support: Extended,
# conformance feature HTTPRouteMethodMatching). Why regexes throughout: the precedence of
# RegularExpression matches against Exact/PathPrefix ones is implementation-specific (Istio
# ranks every PathPrefix, `/` included, above every regex), so a `PathPrefix: /` catch-all would
# take the status routes from the proxy on some implementations. With regexes only, the proxy's
# matches win whether an implementation orders regex matches by rule order or by descending
# length (the oms rule is last and shortest). The oms rule's `timeouts.request: 0s` (Extended)
# lets long downloads and uploads run.
#
# Set your Gateway (`parentRefs`) and the name your users reach OpenM++ at (`hostnames`) with a
# patch in a kustomization of your own on top of this overlay (README). Remove any other
# HTTPRoute that routes this host to oms.
"""

# The oms rule's regex: matches every path, and is shorter than every proxy regex.
OMS_CATCH_ALL = "/.*"


def http_route() -> Obj:
    """The HTTPRoute: a rule matching each route by method + RegularExpression, then oms."""
    # One rule for the proxy (its matches are ORed; a rule may have 64, a route 16 rules).
    rules: list[Obj] = [
        {
            "matches": [
                {"path": {"type": "RegularExpression", "value": r.regex}, "method": r.method}
                for r in ROUTES
            ],
            "backendRefs": [{"name": PROXY_SERVICE, "port": PROXY_PORT}],
        },
        {
            "matches": [{"path": {"type": "RegularExpression", "value": OMS_CATCH_ALL}}],
            "backendRefs": [{"name": OMS_SERVICE, "port": OMS_PORT}],
            "timeouts": {"request": "0s"},
        },
    ]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "oms", "labels": dict(_LABELS)},
        "spec": {
            "parentRefs": [{"name": "gateway", "namespace": "gateway-system"}],
            "hostnames": [HOST],
            "rules": rules,
        },
    }


# --- output ---------------------------------------------------------------------------------

FORMATS: dict[str, str] = {
    "istio": "k8s/overlays/routes-only/virtualservice.yaml",
    "ingress-nginx": "k8s/overlays/routes-only-nginx/ingress.yaml",
    "gateway-api": "k8s/overlays/routes-only-gateway/httproute.yaml",
}


def _dump(docs: list[Obj]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=100)


def render(fmt: str) -> str:
    """The file for front door ``fmt`` (a key of :data:`FORMATS`), comments included."""
    if fmt == "istio":
        return _ISTIO_HEADER + _dump([virtual_service()])
    if fmt == "ingress-nginx":
        return _NGINX_HEADER + _dump(nginx_ingresses())
    if fmt == "gateway-api":
        return _GATEWAY_HEADER + _dump([http_route()])
    raise ValueError(f"unknown front door {fmt!r}; known: {', '.join(FORMATS)}")
