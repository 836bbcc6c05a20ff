"""Validate MPIJobs against the MPIJob CRD's openAPIV3Schema (the schema kept in the repository).

The schema is made strict the way ``fieldValidation=Strict`` is: an object schema that lists
its properties (and does not preserve unknown fields) rejects any other property, instead of
the API server's silent pruning. The CRD file must exist: a missing file fails the tests.
"""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import yaml

from standins.kube import SCHEMA_CRD as CRD_PATH


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    if not CRD_PATH.is_file():
        raise FileNotFoundError(f"the MPIJob CRD is missing: {CRD_PATH}")
    crd = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v2beta1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def validate_mpijob(obj: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` (the first, most relevant one) if ``obj`` is invalid."""
    assert obj.get("apiVersion") == "kubeflow.org/v2beta1", obj.get("apiVersion")
    assert obj.get("kind") == "MPIJob", obj.get("kind")
    error = jsonschema.exceptions.best_match(_validator().iter_errors(obj))
    if error is not None:
        raise error
