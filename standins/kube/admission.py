"""Admission as the API server does it: schema validation, pruning, defaults, metadata rules,
and the two patch formats (pure).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import TYPE_CHECKING, Any

import yaml

from standins.kube.store import MPIJOBS, Json, _ApiError, _bad_request

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError as SchemaError
    from jsonschema.protocols import Validator

# --- helpers: admission (schema, pruning, defaults, metadata rules) ---------------------------

_OBJECT_META_FIELDS = (
    *("name", "generateName", "namespace", "labels", "annotations", "ownerReferences"),
    *("finalizers", "uid", "resourceVersion", "generation", "creationTimestamp"),
    *("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"),
)
_OBJECT_META_SCHEMA: Json = {
    "type": "object",
    "properties": {field: {} for field in _OBJECT_META_FIELDS},
}
_CONFIGMAP_SCHEMA: Json = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": _OBJECT_META_SCHEMA,
        "data": {"type": "object", "additionalProperties": {"type": "string"}},
        "binaryData": {"type": "object", "additionalProperties": {"type": "string"}},
        "immutable": {"type": "boolean"},
    },
}

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    r"for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_NAME_PART_RULE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_RULE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  "
    "or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)

_ANNOTATIONS_MAX_BYTES = 256 * 1024


def _cause(reason: str, field: str, message: str) -> Json:
    return {"reason": reason, "message": message, "field": field}


def _invalid_value(field: str, value: Any, detail: str) -> Json:
    return _cause("FieldValueInvalid", field, f"Invalid value: {json.dumps(value)}: {detail}")


def _name_causes(name: str) -> list[Json]:
    if len(name) > 253:
        return [_invalid_value("metadata.name", name, "must be no more than 253 characters")]
    if not _DNS_SUBDOMAIN.fullmatch(name):
        return [_invalid_value("metadata.name", name, _SUBDOMAIN_RULE)]
    return []


def _key_causes(field: str, key: str) -> list[Json]:
    prefix, _, name = key.rpartition("/")
    causes = []
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        causes.append(_invalid_value(field, key, f"prefix part {_SUBDOMAIN_RULE}"))
    if len(name) > 63:
        causes.append(_invalid_value(field, key, "name part must be no more than 63 characters"))
    elif not _QUALIFIED_NAME.fullmatch(name):
        causes.append(_invalid_value(field, key, _NAME_PART_RULE))
    return causes


def _metadata_causes(meta: Json) -> list[Json]:
    """metadata.labels and metadata.annotations rules (apimachinery ValidateObjectMeta)."""
    causes: list[Json] = []
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        raise _bad_request("metadata.labels and metadata.annotations must be JSON objects")
    for key, value in labels.items():
        causes += _key_causes("metadata.labels", key)
        if not isinstance(value, str):
            causes.append(_invalid_value("metadata.labels", value, "must be a string"))
        elif len(value) > 63:
            causes.append(_invalid_value("metadata.labels", value, "must be no more than 63 chars"))
        elif not _LABEL_VALUE.fullmatch(value):
            causes.append(_invalid_value("metadata.labels", value, _LABEL_VALUE_RULE))
    for key in annotations:
        causes += _key_causes("metadata.annotations", key)
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > _ANNOTATIONS_MAX_BYTES:
        causes.append(
            _cause(
                "FieldValueTooLong",
                "metadata.annotations",
                f"Too long: must have at most {_ANNOTATIONS_MAX_BYTES} bytes",
            )
        )
    return causes


def _join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _normalize(value: Any, schema: Json, path: str, unknown: list[str]) -> None:
    """Prune unknown fields (listing their paths) and non-nullable nulls; fill in defaults.

    Works in place, like the API server's structural pruning and defaulting of a custom resource.
    """
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                for key in [k for k in value if k not in props]:
                    unknown.append(_join_path(path, key))
                    del value[key]
            for key in [k for k, v in value.items() if v is None]:
                if not props.get(key, {}).get("nullable"):
                    del value[key]  # null means "unset" unless the schema allows null
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    _normalize(value[key], sub, _join_path(path, key), unknown)
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                _normalize(item, schema["additionalProperties"], _join_path(path, key), unknown)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _normalize(item, schema["items"], _join_path(path, index), unknown)


def _json_type(value: Any) -> str:
    """The JSON type name of a decoded value, as schema errors name it."""
    names: tuple[tuple[type, str], ...] = (
        *((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")),
        *((list, "array"), (dict, "object")),
    )
    return next((name for python_type, name in names if isinstance(value, python_type)), "null")


def _schema_causes(error: SchemaError) -> list[Json]:
    """The Status causes for one jsonschema error, worded like the API server's."""
    field = ""
    for key in error.absolute_path:
        field = _join_path(field, key)
    expected: Any = error.validator_value
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [p for p in expected if p not in error.instance]
        return [
            _cause("FieldValueRequired", _join_path(field, p), "Required value") for p in missing
        ]
    if error.validator == "type":
        got = _json_type(error.instance)
        detail = f'{field} in body must be of type {expected}: "{got}"'
        return [_cause("FieldValueTypeInvalid", field, f'Invalid value: "{got}": {detail}')]
    if error.validator == "enum":
        supported = ", ".join(json.dumps(v) for v in expected)
        message = f"Unsupported value: {json.dumps(error.instance)}: supported values: {supported}"
        return [_cause("FieldValueNotSupported", field, message)]
    return [_invalid_value(field, error.instance, error.message)]


@functools.lru_cache(maxsize=4)
def _load_crd(path: str) -> tuple[Json, Validator]:
    """The v2beta1 openAPIV3Schema of the MPIJob CRD in ``path`` and a validator for it."""
    import jsonschema  # a test dependency, needed only when a CRD is given

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as fh:
        docs = [doc for doc in yaml.load_all(fh, Loader=loader) if isinstance(doc, dict)]
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc.get("kind") != "CustomResourceDefinition" or spec.get("group") != MPIJOBS.group:
            continue
        for version in spec.get("versions") or ():
            if version.get("name") == MPIJOBS.version:
                schema: Json = version["schema"]["openAPIV3Schema"]
                return schema, jsonschema.Draft7Validator(schema)
    raise ValueError(f"{path}: no kubeflow.org/{MPIJOBS.version} CustomResourceDefinition")


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _json_patch(target: Json, operations: list[Any]) -> Json:
    """RFC 6902 JSON patch with the add, remove, replace and test operations."""
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise _bad_request(f"the server rejected our request: invalid JSON patch op {op!r}")
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        if not keys:
            raise _bad_request("the server rejected our request: JSON patch of the root")
        parent: Any = doc
        try:
            for key in keys[:-1]:
                parent = parent[int(key)] if isinstance(parent, list) else parent[key]
            last: Any = keys[-1]
            if isinstance(parent, list):
                last = len(parent) if last == "-" else int(last)
            kind = op.get("op")
            if kind == "add" and isinstance(parent, list):
                parent.insert(last, copy.deepcopy(op.get("value")))
            elif kind in ("add", "replace"):
                if kind == "replace" and isinstance(parent, dict) and last not in parent:
                    raise KeyError(last)
                parent[last] = copy.deepcopy(op.get("value"))
            elif kind == "remove":
                del parent[last]
            elif kind == "test":
                if parent[last] != op.get("value"):
                    raise _ApiError(422, "Invalid", f"testing value {op['path']} failed")
            else:
                raise _bad_request(f"the server rejected our request: unsupported op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as err:
            message = f"the server rejected our request: {op['path']}: {err!r}"
            raise _ApiError(422, "Invalid", message) from err
    return doc
