"""``POST /api/run``: parse the body as oms does, then check it against the proxy's rules.

Parsing (:func:`parse_run_request`) follows Go's ``encoding/json`` decoding into oms's
``RunRequest`` (oms/runCatalog.go), so a body means the same to the proxy as to oms:

* object keys match field names exactly or, failing that, case-insensitively (Go's folding,
  including U+017F (long s) → ``S`` and U+212A (Kelvin sign) → ``K``); unknown keys are ignored;
* a repeated key is decoded again *into* the value so far: the last scalar wins, maps and
  structs are merged, list elements are decoded into the elements already there;
* ``null`` leaves a scalar or struct as it is (so: its zero value unless set earlier) and
  makes a map or list empty; a ``null`` map value is stored as ``""``;
* a wrong type is an error (a string is not a number, ``1.5`` and ``1e2`` are not integers,
  integers must fit 64 bits; ``Opts``/``Env`` values must be strings);
* only the first JSON value is read: anything after it is ignored, as by ``json.Decoder``;
  invalid UTF-8 and lone surrogate escapes become U+FFFD.

Errors keep oms's wording (``Invalid (empty) json at /api/run``, ``Json decode error at
/api/run``) and add what is wrong and where, e.g. ``... : Mpi.Np: expected an integer, got "x"``.

Checking (:func:`validate_run`) derives the MPI process and thread counts exactly as oms does
(``runModelHandler``, ``resFromRequest``) and applies the limits of
:class:`~proxy.config.RunsConfig`. Every rejection is a 400 whose message starts like oms's
(``Model start failed: <digest-or-name>``) and then names the field and the rule.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TypeAlias, TypeVar

WHERE = "/api/run"

T = TypeVar("T")


class RunRequestError(Exception):
    """A run request the proxy refuses; ``status`` is the HTTP status (400)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --- the request, as oms's RunRequest --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MpiOptions:
    """``RunRequest.Mpi``."""

    np: int = 0
    is_not_on_root: bool = False
    is_not_by_job: bool = False


@dataclasses.dataclass(frozen=True)
class MicrodataEntity:
    """One ``RunRequest.Microdata.Entity[]`` element."""

    name: str = ""
    attr: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class MicrodataRequest:
    """``RunRequest.Microdata``."""

    is_to_db: bool = False
    is_internal: bool = False
    entity: tuple[MicrodataEntity, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunNote:
    """One ``RunRequest.RunNotes[]`` element."""

    lang_code: str = ""
    note: str = ""


_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """oms's ``RunRequest`` as decoded from JSON (maps keep the order of first appearance)."""

    model_name: str = ""
    model_digest: str = ""
    run_stamp: str = ""
    dir: str = ""
    opts: Mapping[str, str] = dataclasses.field(default_factory=lambda: _EMPTY)
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: _EMPTY)
    threads: int = 0
    is_mpi: bool = False
    mpi: MpiOptions = MpiOptions()
    template: str = ""
    tables: tuple[str, ...] = ()
    microdata: MicrodataRequest = MicrodataRequest()
    run_notes: tuple[RunNote, ...] = ()

    def digest_or_name(self) -> str:
        """What oms looks the model up by, and names in its errors: digest, else name."""
        return self.model_digest or self.model_name


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """The model as resolved by oms (the caller resolves it)."""

    name: str
    digest: str


# --- JSON decoding like Go's encoding/json ----------------------------------------------------


class _Num:
    """A JSON number, kept as its literal text (converted only where a field needs it)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Obj:
    """A JSON object as its (key, value) pairs in order, duplicates included."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, _Raw]]) -> None:
        self.pairs = pairs


_Raw: TypeAlias = "bool | str | _Num | _Obj | list[_Raw] | None"


class _BadConstant(ValueError):
    pass


def _reject_constant(name: str) -> None:
    raise _BadConstant(f"invalid value {name}")


_JSON = json.JSONDecoder(
    object_pairs_hook=_Obj,
    parse_float=_Num,
    parse_int=_Num,
    parse_constant=_reject_constant,
)
_GO_SPACE = " \t\r\n"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_INT_LITERAL = re.compile(r"-?(0|[1-9][0-9]*)")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Go folds names by ASCII upper-casing plus the two non-ASCII runes that fold into ASCII.
_FOLD = str.maketrans(
    {**{chr(c): chr(c - 32) for c in range(ord("a"), ord("z") + 1)}, "\u017f": "S", "\u212a": "K"}
)


class _DecodeError(Exception):
    """A type mismatch at a path, e.g. ``Mpi.Np: expected an integer, got "x"``."""


def parse_run_request(body: bytes, *, where: str = WHERE) -> RunRequest:
    """Decode a ``POST /api/run`` body as oms would; :class:`RunRequestError` (400) if it can't."""
    text = body.decode("utf-8", errors="replace")
    start = len(text) - len(text.lstrip(_GO_SPACE))
    if start == len(text):
        raise RunRequestError(400, f"Invalid (empty) json at {where}")
    prefix = f"Json decode error at {where}"
    try:
        raw, _end = _JSON.raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise RunRequestError(
            400, f"{prefix}: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:
        raise RunRequestError(400, f"{prefix}: the JSON is nested too deeply") from None
    except ValueError as e:  # _BadConstant, or a number Python cannot convert
        raise RunRequestError(400, f"{prefix}: {e}") from None
    try:
        return _decode_request(raw)
    except _DecodeError as e:
        raise RunRequestError(400, f"{prefix}: {e}") from None


def _fix(s: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", s)


def _describe(raw: _Raw) -> str:
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, _Num):
        return raw.text if len(raw.text) <= 40 else raw.text[:40] + "..."
    if isinstance(raw, str):
        shown = json.dumps(_fix(raw), ensure_ascii=False)
        return shown if len(shown) <= 42 else shown[:40] + '..."'
    if isinstance(raw, _Obj):
        return "an object"
    return "an array"


def _expected(path: str, what: str, raw: _Raw) -> _DecodeError:
    where = f"{path}: " if path else ""
    return _DecodeError(f"{where}expected {what}, got {_describe(raw)}")


def _field(key: str, names: tuple[str, ...]) -> str | None:
    """The struct field a JSON key decodes into: exact name, else Go's case folding."""
    if key in names:
        return key
    folded = key.translate(_FOLD)
    for name in names:
        if name.translate(_FOLD) == folded:
            return name
    return None


def _pairs(raw: _Raw, path: str) -> list[tuple[str, _Raw]] | None:
    """The pairs of an object, None for null; anything else is a type error."""
    if raw is None:
        return None
    if isinstance(raw, _Obj):
        return raw.pairs
    raise _expected(path, "an object", raw)


def _str(raw: _Raw, cur: str, path: str) -> str:
    if raw is None:
        return cur
    if isinstance(raw, str):
        return _fix(raw)
    raise _expected(path, "a string", raw)


def _bool(raw: _Raw, cur: bool, path: str) -> bool:
    if raw is None:
        return cur
    if isinstance(raw, bool):
        return raw
    raise _expected(path, "true or false", raw)


def _int(raw: _Raw, cur: int, path: str) -> int:
    if raw is None:
        return cur
    if isinstance(raw, _Num) and _INT_LITERAL.fullmatch(raw.text):
        if len(raw.text) <= 20:
            value = int(raw.text)
            if INT64_MIN <= value <= INT64_MAX:
                return value
        raise _DecodeError(f"{path}: number {_describe(raw)} does not fit a 64-bit integer")
    raise _expected(path, "an integer", raw)


def _str_map(raw: _Raw, cur: dict[str, str], path: str) -> dict[str, str]:
    """Decode an object of strings *into* ``cur`` (changed in place, as Go merges maps).

    In place, not into a copy: copying for every repeated key made a body of repeated
    ``"Opts":{}`` after one large Opts cost quadratic time (minutes for 1 MB).
    """
    pairs = _pairs(raw, path)
    if pairs is None:
        return {}
    for key, value in pairs:
        k = _fix(key)
        cur[k] = _str(value, "", f"{path}[{json.dumps(k, ensure_ascii=False)}]")
    return cur


def _list(
    raw: _Raw,
    cur: tuple[T, ...],
    zero: T,
    item: Callable[[_Raw, T, str], T],
    path: str,
) -> tuple[T, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _expected(path, "an array", raw)
    return tuple(
        item(element, cur[i] if i < len(cur) else zero, f"{path}[{i}]")
        for i, element in enumerate(raw)
    )


_MPI_FIELDS = ("Np", "IsNotOnRoot", "IsNotByJob")


def _mpi(raw: _Raw, cur: MpiOptions, path: str) -> MpiOptions:
    for key, value in _pairs(raw, path) or ():
        match _field(key, _MPI_FIELDS):
            case "Np":
                cur = dataclasses.replace(cur, np=_int(value, cur.np, f"{path}.Np"))
            case "IsNotOnRoot":
                v = _bool(value, cur.is_not_on_root, f"{path}.IsNotOnRoot")
                cur = dataclasses.replace(cur, is_not_on_root=v)
            case "IsNotByJob":
                v = _bool(value, cur.is_not_by_job, f"{path}.IsNotByJob")
                cur = dataclasses.replace(cur, is_not_by_job=v)
    return cur


def _entity(raw: _Raw, cur: MicrodataEntity, path: str) -> MicrodataEntity:
    for key, value in _pairs(raw, path) or ():
        match _field(key, ("Name", "Attr")):
            case "Name":
                cur = dataclasses.replace(cur, name=_str(value, cur.name, f"{path}.Name"))
            case "Attr":
                attr = _list(value, cur.attr, "", _str, f"{path}.Attr")
                cur = dataclasses.replace(cur, attr=attr)
    return cur


def _microdata(raw: _Raw, cur: MicrodataRequest, path: str) -> MicrodataRequest:
    for key, value in _pairs(raw, path) or ():
        match _field(key, ("IsToDb", "IsInternal", "Entity")):
            case "IsToDb":
                v = _bool(value, cur.is_to_db, f"{path}.IsToDb")
                cur = dataclasses.replace(cur, is_to_db=v)
            case "IsInternal":
                v = _bool(value, cur.is_internal, f"{path}.IsInternal")
                cur = dataclasses.replace(cur, is_internal=v)
            case "Entity":
                entity = _list(value, cur.entity, MicrodataEntity(), _entity, f"{path}.Entity")
                cur = dataclasses.replace(cur, entity=entity)
    return cur


def _run_note(raw: _Raw, cur: RunNote, path: str) -> RunNote:
    for key, value in _pairs(raw, path) or ():
        match _field(key, ("LangCode", "Note")):
            case "LangCode":
                v = _str(value, cur.lang_code, f"{path}.LangCode")
                cur = dataclasses.replace(cur, lang_code=v)
            case "Note":
                cur = dataclasses.replace(cur, note=_str(value, cur.note, f"{path}.Note"))
    return cur


_REQUEST_FIELDS = (
    "ModelName",
    "ModelDigest",
    "RunStamp",
    "Dir",
    "Opts",
    "Env",
    "Threads",
    "IsMpi",
    "Mpi",
    "Template",
    "Tables",
    "Microdata",
    "RunNotes",
)


def _decode_request(raw: _Raw) -> RunRequest:
    req = RunRequest()
    if raw is not None and not isinstance(raw, _Obj):
        raise _expected("", "a JSON object", raw)
    replace = dataclasses.replace
    opts: dict[str, str] = {}
    env: dict[str, str] = {}
    for key, v in _pairs(raw, "") or ():
        match _field(key, _REQUEST_FIELDS):
            case "ModelName":
                req = replace(req, model_name=_str(v, req.model_name, "ModelName"))
            case "ModelDigest":
                req = replace(req, model_digest=_str(v, req.model_digest, "ModelDigest"))
            case "RunStamp":
                req = replace(req, run_stamp=_str(v, req.run_stamp, "RunStamp"))
            case "Dir":
                req = replace(req, dir=_str(v, req.dir, "Dir"))
            case "Opts":
                opts = _str_map(v, opts, "Opts")
            case "Env":
                env = _str_map(v, env, "Env")
            case "Threads":
                req = replace(req, threads=_int(v, req.threads, "Threads"))
            case "IsMpi":
                req = replace(req, is_mpi=_bool(v, req.is_mpi, "IsMpi"))
            case "Mpi":
                req = replace(req, mpi=_mpi(v, req.mpi, "Mpi"))
            case "Template":
                req = replace(req, template=_str(v, req.template, "Template"))
            case "Tables":
                req = replace(req, tables=_list(v, req.tables, "", _str, "Tables"))
            case "Microdata":
                req = replace(req, microdata=_microdata(v, req.microdata, "Microdata"))
            case "RunNotes":
                notes = _list(v, req.run_notes, RunNote(), _run_note, "RunNotes")
                req = replace(req, run_notes=notes)
    return replace(req, opts=MappingProxyType(opts), env=MappingProxyType(env))
