"""The MPIJob schema kept in the repository: derived from the upstream CRD by our script.

The byte-for-byte comparison with the upstream file needs the MPI Operator's Go module and lives in
the e2e tier (``tests/e2e/test_schema_provenance.py``); here the committed file is checked to be in
the derivation's fixed point and to keep every validation fact.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from standins.kube import SCHEMA_CRD
from tools.mpijob_schema import derive, render, strip_schema


def _walk(schema: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (properties, items, additionalProperties, anyOf)."""
    if not isinstance(schema, dict):
        return []
    out = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        out += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    for i, sub in enumerate(schema.get("anyOf") or ()):
        out += _walk(sub, f"{path}|{i}")
    return out


@pytest.fixture(scope="module")
def committed() -> str:
    return SCHEMA_CRD.read_text(encoding="utf-8")


def test_the_committed_schema_is_the_scripts_output(committed: str) -> None:
    # Deriving again from the committed file changes nothing: it is exactly what the script writes.
    assert render(committed) == committed


def test_the_schema_keeps_what_validation_needs(committed: str) -> None:
    crd = yaml.safe_load(committed)
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v2beta1", True, True)
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["kind"] == "MPIJob"
    assert crd["spec"]["scope"] == "Namespaced"
    nodes = dict(_walk(version["schema"]["openAPIV3Schema"]))
    assert not [p for p, node in nodes.items() if "description" in node]
    spec = nodes[".spec"]
    assert spec["required"] == ["mpiReplicaSpecs"]
    assert nodes[".spec.launcherCreationPolicy"] == {"default": "AtStartup", "type": "string"}
    assert nodes[".spec.mpiImplementation"] == {
        "default": "OpenMPI",
        "enum": ["OpenMPI", "Intel", "MPICH"],
        "type": "string",
    }
    assert nodes[".spec.slotsPerWorker"] == {"default": 1, "format": "int32", "type": "integer"}
    # The pod template is fully typed (unknown fields are pruned, or refused under Strict).
    pod = ".spec.mpiReplicaSpecs{}.template.spec"
    assert nodes[pod + ".containers"]["type"] == "array"
    assert nodes[pod + ".containers"]["x-kubernetes-list-map-keys"] == ["name"]
    assert nodes[pod + ".containers[]"]["required"] == ["name"]
    assert set(nodes[".spec.mpiReplicaSpecs{}.template.metadata"]["properties"]) >= {
        "labels",
        "annotations",
    }
    markers = {k for node in nodes.values() for k in node if k.startswith("x-kubernetes-")}
    assert markers >= {
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-int-or-string",
    }


def test_strip_keeps_data_and_properties_named_description() -> None:
    upstream = {
        "type": "object",
        "description": "cut",
        "properties": {
            "description": {"type": "string", "description": "cut too"},
            "mode": {"type": "string", "default": "x", "enum": ["x", "y"], "description": "cut"},
            "blob": {"type": "object", "default": {"description": "kept: this is data"}},
            "ports": {"type": "array", "items": {"type": "integer", "description": "cut"}},
            "quantity": {
                "anyOf": [{"type": "integer"}, {"type": "string", "description": "cut"}],
                "x-kubernetes-int-or-string": True,
            },
        },
    }
    assert strip_schema(upstream) == {
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "mode": {"type": "string", "default": "x", "enum": ["x", "y"]},
            "blob": {"type": "object", "default": {"description": "kept: this is data"}},
            "ports": {"type": "array", "items": {"type": "integer"}},
            "quantity": {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
            },
        },
    }


def test_derive_refuses_what_is_not_the_mpijob_crd() -> None:
    with pytest.raises(ValueError, match="not a CustomResourceDefinition"):
        derive({"kind": "ConfigMap"})
    crd = yaml.safe_load(SCHEMA_CRD.read_text(encoding="utf-8"))
    crd["spec"]["versions"][0]["name"] = "v1"
    with pytest.raises(ValueError, match="exactly one v2beta1"):
        derive(crd)
