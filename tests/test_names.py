"""Kubernetes-safe names and label values, table-driven at the length limits."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy import names
from proxy.names import is_dns1035_label, is_label_value, label_value, mpijob_name, short_hash

DIGEST = "d90e1e9a49a06d972ecf1d50e684c62b"
STAMP = "2025_01_28_21_00_48_385"
LABEL_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _hash(model: str, stamp: str = STAMP, digest: str = DIGEST) -> str:
    return short_hash(digest, stamp, model)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("RiskPaths", "ompp-riskpaths-{h}"),
        ("NewCaseBased", "ompp-newcasebased-{h}"),
        ("OncoSimX-breast", "ompp-oncosimx-breast-{h}"),
        ("Model_With__Underscores", "ompp-model-with-underscores-{h}"),
        ("  spaced  out  ", "ompp-spaced-out-{h}"),
        ("UPPER", "ompp-upper-{h}"),
        ("2Digits1st", "ompp-2digits1st-{h}"),
        ("123", "ompp-123-{h}"),
        ("", "ompp-{h}"),
        ("!!!@@@###", "ompp-{h}"),
        ("---", "ompp-{h}"),
        ("Modèle_Été", "ompp-mod-le-t-{h}"),
        ("模型", "ompp-{h}"),
        ("a" * 53, "ompp-" + "a" * 40 + "-{h}"),
        ("a" * 54, "ompp-" + "a" * 40 + "-{h}"),
        ("a" * 55, "ompp-" + "a" * 40 + "-{h}"),
        ("a" * 39 + "-b", "ompp-" + "a" * 39 + "-{h}"),  # no '-' left before the hash
        ("a" * 63, "ompp-" + "a" * 40 + "-{h}"),
        ("a" * 64, "ompp-" + "a" * 40 + "-{h}"),
        ("a" * 65, "ompp-" + "a" * 40 + "-{h}"),
    ],
)
def test_mpijob_name(model: str, expected: str) -> None:
    name = mpijob_name("ompp", model, STAMP, DIGEST)
    assert name == expected.format(h=_hash(model))
    assert len(name) <= names.MAX_NAME
    assert is_dns1035_label(name)
    assert is_dns1035_label(f"{name}-worker-9")
    assert is_label_value(f"{name}-launcher")


@pytest.mark.parametrize("prefix", ["o", "ompp", "a" * 20, "x-y"])
@pytest.mark.parametrize("model", ["", "m", "M" * 100, "ü" * 64])
@pytest.mark.parametrize("max_len", [names.MAX_NAME, 53, 52, 40])
def test_mpijob_name_limits(prefix: str, model: str, max_len: int) -> None:
    name = mpijob_name(prefix, model, STAMP, DIGEST, max_len=max_len)
    assert len(name) <= max_len
    assert is_dns1035_label(name)
    assert name.startswith(prefix + "-")
    assert name.endswith("-" + _hash(model))


def test_mpijob_name_is_deterministic_and_covers_every_part() -> None:
    base = mpijob_name("ompp", "RiskPaths", STAMP, DIGEST)
    assert base == mpijob_name("ompp", "RiskPaths", STAMP, DIGEST)
    assert base != mpijob_name("ompp", "RiskPaths", STAMP + "1", DIGEST)
    assert base != mpijob_name("ompp", "RiskPaths", STAMP, DIGEST[:-1] + "0")
    assert base != mpijob_name("ompp", "riskpaths", STAMP, DIGEST)
    # Parts cannot run into each other.
    assert short_hash("ab", "c") != short_hash("a", "bc")


@pytest.mark.parametrize("prefix", ["", "Ompp", "1ompp", "ompp-", "a" * 46, "om_pp"])
def test_mpijob_name_refuses_a_bad_prefix(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        mpijob_name(prefix, "m", STAMP, DIGEST)


@pytest.mark.parametrize(
    ("value", "changed"),
    [
        ("", False),
        ("RiskPaths", False),
        (DIGEST, False),
        (STAMP, False),
        ("a" * 63, False),
        ("A.b-c_d", False),
        ("9", False),
        ("a" * 53, False),
        ("a" * 54, False),
        ("a" * 55, False),
        ("a" * 64, True),
        ("a" * 65, True),
        ("a" * 200, True),
        ("alice@example.org", True),
        ("DOMAIN\\alice", True),
        ("-leading", True),
        ("trailing.", True),
        ("_", True),
        ("with space", True),
        ("Modèle", True),
        ("模型", True),
        ("@@@", True),
        ("a\nb", True),
    ],
)
def test_label_value(value: str, changed: bool) -> None:
    result = label_value(value)
    assert len(result) <= names.MAX_LABEL_VALUE
    assert LABEL_RE.fullmatch(result)
    assert is_label_value(result)
    assert (result != value) is changed
    if changed:
        assert result.endswith(short_hash(value))
    assert label_value(value) == result  # deterministic: lookups by label work


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("alice@example.org", "alice-example.org-{h}"),
        ("a" * 64, "a" * 54 + "-{h}"),
        ("-x-", "x-{h}"),
        ("@@@", "{h}"),
        ("模型", "{h}"),
        ("a" * 53 + "..." + "b" * 10, "a" * 53 + "-{h}"),
    ],
)
def test_label_value_shapes(value: str, expected: str) -> None:
    assert label_value(value) == expected.format(h=short_hash(value))


def test_different_long_values_get_different_labels() -> None:
    a, b = "x" * 70 + "a", "x" * 70 + "b"
    assert label_value(a) != label_value(b)


def test_owned_keys_are_ours_or_the_managed_by_label() -> None:
    for key in names.OWNED_KEYS:
        assert key == names.MANAGED_BY_KEY or key.startswith("openmpp.org/")
        prefix, _, name = key.partition("/")
        assert len(name) <= 63
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", prefix)
    assert names.MANAGED_BY_VALUE == "oms-mpijob-proxy"
    assert names.RUN_STAMP_KEY == "openmpp.org/run-stamp"


@given(st.text(max_size=200))
def test_label_value_is_always_valid(value: str) -> None:
    result = label_value(value)
    assert is_label_value(result)
    assert result == value or result.endswith(short_hash(value))


@given(st.text(max_size=300), st.text(max_size=80))
def test_mpijob_name_is_always_a_short_dns_label(model: str, stamp: str) -> None:
    name = mpijob_name("ompp", model, stamp, DIGEST)
    assert is_dns1035_label(name)
    assert len(name) <= names.MAX_NAME
