"""What a request selects: its RBAC attributes, label and field selectors (pure)."""

from __future__ import annotations

import functools
import re
from collections.abc import (
    Mapping,
)
from typing import TYPE_CHECKING, Any

from standins.kube.store import Json, _bad_request, _Kind, _Predicate

if TYPE_CHECKING:
    pass

# --- helpers: request attributes --------------------------------------------------------------

_RESOURCE_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/(?P<namespace>[^/]+)/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<subresource>[^/]+))?)?$"
)


def _is_true(value: str | None) -> bool:
    """A query flag as Go's strconv.ParseBool reads it (kubernetes_asyncio sends ``True``)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _request_attributes(method: str, path: str, query: Mapping[str, str]) -> Json:
    """RBAC attributes of a request: verb, apiGroup, resource, subresource, namespace, name."""
    match = _RESOURCE_PATH.match(path)
    if match is None:
        empty = dict.fromkeys(("api_group", "resource", "subresource", "namespace", "name"), "")
        return {"verb": method.lower(), **empty}
    name = match["name"] or ""
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if verb is None and method == "DELETE":
        verb = "delete" if name else "deletecollection"
    if verb is None:
        verb = "get" if name else ("watch" if _is_true(query.get("watch")) else "list")
    return {
        "verb": verb,
        "api_group": match["group"] or "",
        "resource": match["resource"],
        "subresource": match["subresource"] or "",
        "namespace": match["namespace"],
        "name": name,
    }


# --- helpers: selectors -----------------------------------------------------------------------

_SELECTOR_PART = re.compile(
    r"^\s*(?:(?P<absent>!)\s*(?P<akey>[^\s!=,()]+)"
    r"|(?P<key>[^\s!=,()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s!=,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
)


def _labels_of(obj: Json) -> Mapping[str, str]:
    labels = obj.get("metadata", {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def _label_requirement(part: str) -> _Predicate:
    match = _SELECTOR_PART.match(part)
    if match is None:
        raise _bad_request(f"unable to parse requirement: found '{part.strip()}', expected: key")
    if match["absent"]:
        absent_key = match["akey"]
        return lambda obj: absent_key not in _labels_of(obj)
    key = match["key"]
    if match["op"]:
        value, negate = match["value"], match["op"] == "!="
        return lambda obj: (_labels_of(obj).get(key) == value) != negate
    if match["setop"]:
        values = {v.strip() for v in match["values"].split(",") if v.strip()}
        wanted = match["setop"] == "in"
        return lambda obj: (key in _labels_of(obj) and _labels_of(obj)[key] in values) == wanted
    return lambda obj: key in _labels_of(obj)


def _parse_label_selector(selector: str) -> list[_Predicate]:
    """Equality (``k=v``, ``k==v``, ``k!=v``), existence (``k``, ``!k``) and ``in``/``notin``."""
    parts = re.split(r",(?![^()]*\))", selector)
    return [_label_requirement(part) for part in parts if part.strip()]


def _dig(obj: Json, dotted: str) -> str:
    value: Any = obj
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _parse_field_selector(kind: _Kind, selector: str) -> list[_Predicate]:
    predicates: list[_Predicate] = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        match = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", part)
        if match is None:
            raise _bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        field, op, value = match.groups()
        if field not in kind.field_labels:
            raise _bad_request(f'"{field}" is not a known field selector: only "{kind.resource}"')
        negate = op == "!="
        predicates.append(functools.partial(_field_matches, field, value, negate))
    return predicates


def _field_matches(field: str, value: str, negate: bool, obj: Json) -> bool:
    return (_dig(obj, field) == value) != negate
