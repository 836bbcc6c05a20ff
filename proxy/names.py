"""Kubernetes-safe names and label values, and the label/annotation keys the proxy writes.

Every MPIJob (and its ConfigMap and pods) carries the labels below with *sanitised* values
(:func:`label_value`) and annotations with the same keys holding the *full* values. Because
the sanitising is deterministic, a lookup by label works: select with
``label_value(original)``, then confirm with the annotation.
"""

from __future__ import annotations

import hashlib
import re

MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "oms-mpijob-proxy"

_PREFIX = "openmpp.org/"
MODEL_NAME_KEY = _PREFIX + "model-name"
MODEL_DIGEST_KEY = _PREFIX + "model-digest"
RUN_STAMP_KEY = _PREFIX + "run-stamp"
SUBMIT_STAMP_KEY = _PREFIX + "submit-stamp"
REQUEST_ID_KEY = _PREFIX + "request-id"
USER_KEY = _PREFIX + "user"
SUBMITTED_AT_KEY = _PREFIX + "submitted-at"  # annotation only: an RFC 3339 time
# The finalizer on each MPIJob (history.finalizer): the run cache removes it once the run is
# archived (proxy/follow/archive.py), so an MPIJob deleted by anyone is archived before it goes.
RUN_RECORD_FINALIZER = "openmpp.org/run-record"
# Kueue's label naming the LocalQueue of a job (set from mpijob.queue_name when not empty).
KUEUE_QUEUE_NAME_KEY = "kueue.x-k8s.io/queue-name"

# Keys the renderer owns: a template must not set them.
OWNED_KEYS: frozenset[str] = frozenset(
    {
        MANAGED_BY_KEY,
        MODEL_NAME_KEY,
        MODEL_DIGEST_KEY,
        RUN_STAMP_KEY,
        SUBMIT_STAMP_KEY,
        REQUEST_ID_KEY,
        USER_KEY,
        SUBMITTED_AT_KEY,
    }
)

MAX_NAME = 54
"""Longest MPIJob name: ``<name>-worker-<i>`` (a pod name, at most 63) then fits for up to
10 workers; the renderer asks for shorter names when a run has more workers."""

MAX_LABEL_VALUE = 63
HASH_LEN = 8

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NOT_SLUG = re.compile(r"[^a-z0-9]+")
_NOT_LABEL = re.compile(r"[^-A-Za-z0-9_.]+")


def short_hash(*parts: str) -> str:
    """8 hex digits of SHA-256 over the parts (NUL-separated, so parts cannot run together)."""
    data = "\0".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:HASH_LEN]


def is_dns1035_label(s: str) -> bool:
    """``[a-z]([-a-z0-9]*[a-z0-9])?`` and at most 63 characters."""
    return len(s) <= 63 and _DNS1035.fullmatch(s) is not None


def is_label_value(s: str) -> bool:
    """A valid Kubernetes label value (may be empty)."""
    return len(s) <= MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(s) is not None


def slug(s: str) -> str:
    """Lower-case ASCII letters and digits; every other run of characters becomes one '-'."""
    return _NOT_SLUG.sub("-", s.lower()).strip("-")


def mpijob_name(
    prefix: str, model_name: str, run_stamp: str, model_digest: str, max_len: int = MAX_NAME
) -> str:
    """``<prefix>-<model slug>-<8 hex>``: a DNS-1035 label of at most ``max_len`` characters.

    The hash covers digest, stamp and model name, so one run (same model, same stamp) always
    gets the same name and a second submission of it conflicts (409) instead of running twice.
    The slug is only for people; it is cut to fit and may be empty (``<prefix>-<hash>``).
    Find a run's objects by their labels, not by computing the name again: the renderer
    shortens the slug (``max_len``) for runs with many workers.
    """
    if not is_dns1035_label(prefix) or len(prefix) + HASH_LEN + 1 > min(max_len, MAX_NAME):
        raise ValueError(f"name prefix {prefix!r} is not a DNS-1035 label short enough")
    tail = short_hash(model_digest, run_stamp, model_name)
    room = min(max_len, MAX_NAME) - len(prefix) - HASH_LEN - 2
    middle = slug(model_name)[: max(room, 0)].rstrip("-")
    return f"{prefix}-{middle}-{tail}" if middle else f"{prefix}-{tail}"


def label_value(s: str) -> str:
    """``s`` if it is a valid label value, else a valid one derived from it.

    The derived value is the sanitised text (invalid character runs → '-', trimmed, cut) plus
    '-' and an 8 hex digit hash of the original, so different inputs stay apart and the same
    input always gives the same value.
    """
    if is_label_value(s):
        return s
    tail = short_hash(s)
    room = MAX_LABEL_VALUE - HASH_LEN - 1
    text = _NOT_LABEL.sub("-", s).strip("-_.")[:room].rstrip("-_.")
    return f"{text}-{tail}" if text else tail
