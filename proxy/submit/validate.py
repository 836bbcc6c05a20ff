"""Checking a decoded run request against the config's limits, like oms derives its MPI settings.

:func:`validate_run` derives the MPI process and thread counts exactly as oms does and refuses
anything the config does not allow, with a message that names the field and the rule.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from datetime import datetime

from proxy.config import FORBIDDEN_ENV_PATTERN, RunsConfig
from proxy.stamps import StampSource, clean_file_name, clean_file_path, make_stamp
from proxy.submit.decode import INT64_MAX, ModelInfo, RunRequest, RunRequestError

# --- checking ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MicrodataSettings:
    """Microdata to write (only when allowed and asked for): ``[Microdata]`` in the ini."""

    is_internal: bool
    entities: tuple[tuple[str, tuple[str, ...]], ...]  # (entity, attributes), in request order


@dataclasses.dataclass(frozen=True)
class ValidatedRun:
    """A checked run request, normalised for rendering (see :func:`validate_run`)."""

    model: ModelInfo
    exe_stem: str
    """``CleanFileName(model name)``; the executable is ``<models_bin_dir>/<exe_stem>_mpi``."""
    is_mpi: bool
    np: int
    """``Mpi.Np`` as oms normalises it: 0 for a non-MPI run, else >= 1."""
    not_on_root: bool
    """MPI run that keeps modelling off the root process (``-OpenM.NotOnRoot``)."""
    process_count: int
    """oms ``Res.ProcessCount``: modelling processes."""
    mpi_np: int
    """Processes to start (``mpirun -n``): ``process_count`` + 1 when ``not_on_root``."""
    threads: int
    """Modelling threads per process, >= 1."""
    work_dir: str
    """``Dir`` normalised: a relative path under the models bin dir, '' for the bin dir."""
    model_opts: tuple[tuple[str, str], ...]
    """``("-Key", value)`` run options for the model's argv, sorted by key."""
    ini_file: str | None
    """The user's own ini file (``OpenM.IniFile``/``ini``), relative to the work dir or absolute
    under ``runs.user_files_dir``."""
    descriptions: tuple[tuple[str, str], ...]
    """``(lang, text)`` from ``<LANG>.RunDescription`` options, sorted by lang."""
    run_notes: tuple[tuple[str, str], ...]
    """``(lang, note)`` of non-empty ``RunNotes``, last one per lang, sorted by lang."""
    tables: tuple[str, ...]
    microdata: MicrodataSettings | None
    env: tuple[tuple[str, str], ...]
    """``(name, value)`` environment for the model (``mpirun -x``), sorted by name."""
    run_name: str
    """``Opts["OpenM.RunName"]`` (any case), as oms reports it in RunState."""
    template: str
    """The request's ``Template``: accepted only as a plain file name, otherwise ignored."""

    def has_generated_settings(self) -> bool:
        """True when there is something oms would put into a generated ini file."""
        return bool(self.tables or self.microdata or self.descriptions or self.run_notes)


# oms drops these run options (makeRunArgsIni); keys compared lower-case, without leading '-'.
_DROPPED = frozenset(
    {
        "openm.runstamp",
        "openm.threads",
        "openm.notonroot",
        "openm.logtoconsole",
        "openm.logtofile",
        "openm.logfilepath",
        "openm.database",
        "db",
        "openm.sqlite",
        "openm.sqlitefrombin",
    }
)
_DIR_OPTS = frozenset({"openm.inifile", "ini", "openm.paramdir", "p", "microdata.csvdir"})
_INI_OPTS = frozenset({"openm.inifile", "ini"})
_USER_FILES_FORMS = (
    "OM_USER_FILES",
    "$OM_USER_FILES",
    "{OM_USER_FILES}",
    "${OM_USER_FILES}",
    "%OM_USER_FILES%",
)
_RUN_DESCRIPTION = ".rundescription"

EXE_STEM_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
RUN_STAMP_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
LANG_CODE_RE = re.compile(r"[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

MAX_OPTS = 512
"""Most run options one request may set (each becomes two argv elements)."""
MAX_VALUE_BYTES = 32 * 1024
"""Longest Opts or Env value: one argv element must stay well under Linux's 128 KiB limit."""
_TRUE = frozenset({"", "true", "t", "1", "yes", "y"})
_FALSE = frozenset({"false", "f", "0", "no", "n"})
_GO_ATOI = re.compile(r"[+-]?[0-9]+")
MAX_NOTES_BYTES = 900_000
"""Run notes and descriptions together (they go into one ConfigMap, limit 1 MiB)."""


def is_mpi(req: RunRequest) -> bool:
    """oms: ``Mpi.Np > 0`` or ``IsMpi`` makes a run an MPI run."""
    return req.mpi.np > 0 or req.is_mpi


class _Checker:
    """Builds the 400 errors of :func:`validate_run`, all worded alike."""

    def __init__(self, req: RunRequest) -> None:
        self.prefix = f"Model start failed: {req.digest_or_name()}"

    def fail(self, field: str, problem: str) -> RunRequestError:
        return RunRequestError(400, f"{self.prefix}: {field}: {problem}")


def _opt_field(key: str) -> str:
    return f"Opts[{json.dumps(key, ensure_ascii=False)}]"


def _env_field(key: str) -> str:
    return f"Env[{json.dumps(key, ensure_ascii=False)}]"


def _bare(key: str) -> str:
    """An Opts key without its leading '-' (oms accepts both spellings)."""
    return key[1:] if key.startswith("-") else key


def _local_path_problem(value: str) -> str | None:
    """Why ``value`` is not a relative local path (like Go's ``filepath.IsLocal``, stricter)."""
    if value == "":
        return "expected a relative path, got an empty value"
    if "\0" in value or _CONTROL.search(value):
        return "control characters are not allowed in a path"
    if "\\" in value:
        return "use '/' to separate directories ('\\' is not allowed)"
    if value.startswith("/"):
        return f"expected a relative path, got the absolute path {value!r}"
    if ".." in value.split("/"):
        return f"'..' is not allowed in a path, got {value!r}"
    return None


def _is_allowed_opt(bare: str, runs: RunsConfig) -> bool:
    low = bare.lower()
    if any(_bare(a).lower() == low for a in runs.allowed_opts):
        return True
    return any(re.fullmatch(p, bare) for p in runs.allowed_opts_patterns)


def _user_files_path(value: str, runs: RunsConfig) -> str | None:
    """Substitute an ``OM_USER_FILES`` prefix as oms does; None if there is none."""
    for form in _USER_FILES_FORMS:
        if value == form or value.startswith(form + "/"):
            return posixpath.normpath(runs.user_files_dir + value[len(form) :])
    return None


def validate_run(req: RunRequest, model: ModelInfo, runs: RunsConfig) -> ValidatedRun:
    """Check a parsed request against oms's semantics and the proxy's limits.

    Raises :class:`RunRequestError` (400) naming the field and the rule. Besides the limits
    (``runs.max_processes``, ``runs.max_threads``, allowed Opts and Env), it refuses what oms
    would refuse (bad ``OpenM.Threads``/``OpenM.NotOnRoot`` values, non-local directories,
    microdata options when microdata is off) and what could not be passed on safely (a value
    starting with '-', which the model would read as an option; NUL bytes; control characters
    on an ini line).

    Run options oms always drops (``OpenM.LogToConsole``, ``OpenM.Database``, ``ImportDb.*``,
    ...; see ``makeRunArgsIni``) are dropped here too, before the allow-list check: they never
    reach the model, and real clients send some of them.

    ``Template`` names an oms template file in ``etc/``. The proxy builds the ``mpirun``
    command itself, so the template is never read: it is accepted only as a plain file name
    (no '/', '\\' or '..'), for compatibility with the UI and R scripts, and otherwise ignored.
    """
    check = _Checker(req)
    fail = check.fail

    exe_stem = clean_file_name(model.name)
    if not EXE_STEM_RE.fullmatch(exe_stem):
        raise fail(
            "ModelName",
            f"the model name {model.name!r} cannot be used as an executable name "
            "(expected letters, digits, '_', '.', '-', not starting with '.', at most 128)",
        )
    if req.template and (
        req.template in (".", "..")
        or any(c in req.template for c in "/\\")
        or _CONTROL.search(req.template)
        or len(req.template) > 255
    ):
        raise fail("Template", f"expected a plain file name, got {req.template!r}")

    work_dir = ""
    if req.dir:
        problem = _local_path_problem(req.dir)
        if problem:
            raise fail("Dir", problem)
        work_dir = posixpath.normpath(req.dir)
        work_dir = "" if work_dir == "." else work_dir

    # Threads and NotOnRoot as oms's resFromRequest: the request fields first, then Opts.
    threads = req.threads
    not_on_root = req.mpi.is_not_on_root
    for key in sorted(req.opts):
        low, value = _bare(key).lower(), req.opts[key]
        if req.threads <= 1 and low == "openm.threads":
            if not _GO_ATOI.fullmatch(value) or len(value) > 20 or not 1 <= int(value) <= INT64_MAX:
                raise fail(_opt_field(key), f"expected a whole number >= 1, got {value!r}")
            threads = int(value)
        if not not_on_root and low == "openm.notonroot":
            if value.lower() not in _TRUE | _FALSE:
                raise fail(_opt_field(key), f"expected true or false, got {value!r}")
            not_on_root = value.lower() in _TRUE
    threads = max(threads, 1)
    if threads > runs.max_threads:
        raise fail(
            "Threads",
            f"{threads} threads per process requested, at most {runs.max_threads} allowed",
        )

    # MPI processes as oms's runModelHandler + resFromRequest + makeCommand.
    mpi = is_mpi(req)
    np = max(req.mpi.np, 0)
    if mpi and np == 0:
        np = 1
    process_count = max(np, 1)
    if process_count > 1 and not_on_root:
        process_count -= 1
    not_on_root = mpi and not_on_root
    mpi_np = process_count + 1 if not_on_root else process_count
    if mpi_np > runs.max_processes:
        raise fail(
            "Mpi.Np",
            f"{mpi_np} MPI processes requested, at most {runs.max_processes} allowed",
        )

    model_opts: list[tuple[str, str]] = []
    ini_file: str | None = None
    descriptions: dict[str, str] = {}
    run_name = ""
    seen: dict[str, str] = {}
    if len(req.opts) > MAX_OPTS:
        raise fail("Opts", f"{len(req.opts)} run options given, at most {MAX_OPTS} allowed")
    for key, value in req.opts.items():
        field = _opt_field(key)
        bare = _bare(key)
        low = bare.lower()
        if "\0" in key or "\0" in value:
            raise fail(field, "NUL characters are not allowed")
        if len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
            raise fail(field, f"value longer than {MAX_VALUE_BYTES} bytes")
        if low in _DROPPED or low.startswith("importdb."):
            continue
        if not _is_allowed_opt(bare, runs):
            raise fail(field, "this run option is not allowed here")
        if low in seen:
            raise fail(field, f"given twice (also as {seen[low]!r}; keys differ only in case)")
        seen[low] = key
        if value.startswith("-"):
            raise fail(
                field, "a value may not start with '-' (the model would read it as an option)"
            )
        if low.startswith("microdata."):
            if not runs.allow_microdata:
                raise fail(field, "microdata is not allowed")
            if low in ("microdata.all", "microdata.todb", "microdata.useinternal"):
                raise fail(field, "set this in the request's Microdata instead")
        if low == "openm.runname":
            run_name = value
        if low in _DIR_OPTS:
            problem = _local_path_problem(value)
            if problem:
                raise fail(field, problem)
            substituted = _user_files_path(value, runs)
            if substituted is not None and not runs.user_files_dir:
                raise fail(field, "OM_USER_FILES is not available to runs started here")
            value = clean_file_path(substituted if substituted is not None else value)
            if low in _INI_OPTS:
                ini_file = value
                continue
        if low.endswith(_RUN_DESCRIPTION):
            lang = bare[: -len(_RUN_DESCRIPTION)]
            if not LANG_CODE_RE.fullmatch(lang):
                raise fail(field, f"expected <language code>.RunDescription, got {key!r}")
            if _CONTROL.search(value):
                raise fail(field, "a run description must be one line without control characters")
            if value:
                descriptions[lang] = value
            continue
        model_opts.append(("-" + bare, value))
    model_opts.sort()

    env: list[tuple[str, str]] = []
    for name, value in req.env.items():
        if name == "" or value == "":
            continue  # oms passes only entries with a name and a value
        field = _env_field(name)
        if FORBIDDEN_ENV_PATTERN.match(name):
            raise fail(field, "this variable can change how programs load or run: never allowed")
        if name not in runs.allowed_env:
            raise fail(field, "this environment variable is not allowed here")
        if "\0" in value:
            raise fail(field, "NUL characters are not allowed")
        if len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
            raise fail(field, f"value longer than {MAX_VALUE_BYTES} bytes")
        env.append((name, value))
    env.sort()

    for i, table in enumerate(req.tables):
        if not IDENTIFIER_RE.fullmatch(table):
            raise fail(f"Tables[{i}]", f"expected a table or group name, got {table!r}")

    entities: dict[str, tuple[str, ...]] = {}
    for i, entity in enumerate(req.microdata.entity):
        path = f"Microdata.Entity[{i}]"
        if not IDENTIFIER_RE.fullmatch(entity.name):
            raise fail(f"{path}.Name", f"expected an entity name, got {entity.name!r}")
        if not entity.attr:
            raise fail(f"{path}.Attr", "expected attribute names (or All), got none")
        for j, attr in enumerate(entity.attr):
            if not IDENTIFIER_RE.fullmatch(attr):
                raise fail(f"{path}.Attr[{j}]", f"expected an attribute name, got {attr!r}")
        entities[entity.name] = entity.attr
    microdata: MicrodataSettings | None = None
    if runs.allow_microdata and req.microdata.is_to_db and entities:
        microdata = MicrodataSettings(req.microdata.is_internal, tuple(entities.items()))

    notes: dict[str, str] = {}
    for i, note in enumerate(req.run_notes):
        if note.note == "":
            continue  # oms skips empty notes
        if not LANG_CODE_RE.fullmatch(note.lang_code):
            raise fail(
                f"RunNotes[{i}].LangCode", f"expected a language code, got {note.lang_code!r}"
            )
        if "\0" in note.note:
            raise fail(f"RunNotes[{i}].Note", "NUL characters are not allowed")
        notes[note.lang_code] = note.note
    size = sum(len(n.encode("utf-8", "surrogatepass")) for n in notes.values())
    size += sum(len(d.encode("utf-8", "surrogatepass")) for d in descriptions.values())
    if size > MAX_NOTES_BYTES:
        raise fail("RunNotes", f"run notes and descriptions exceed {MAX_NOTES_BYTES} bytes")

    run = ValidatedRun(
        model=model,
        exe_stem=exe_stem,
        is_mpi=mpi,
        np=np if mpi else 0,
        not_on_root=not_on_root,
        process_count=process_count,
        mpi_np=mpi_np,
        threads=threads,
        work_dir=work_dir,
        model_opts=tuple(model_opts),
        ini_file=ini_file,
        descriptions=tuple(sorted(descriptions.items())),
        run_notes=tuple(sorted(notes.items())),
        tables=tuple(req.tables),
        microdata=microdata,
        env=tuple(env),
        run_name=run_name,
        template=req.template,
    )
    if run.ini_file is None:
        for lang, text in run.descriptions:
            if ini_quote(text) is None:
                raise fail(
                    _opt_field(f"{lang}.RunDescription"),
                    "cannot be written to an ini file as it is: it has both kinds of quotes "
                    "and a ';' or '#'",
                )
    return run


def choose_run_stamp(
    req: RunRequest, source: StampSource | datetime, now: datetime | None = None
) -> str:
    """The run stamp as oms chooses it (``runModel``), checked for use in names and files.

    ``CleanFileName(RunStamp)``, else ``CleanFileName(Opts["OpenM.RunStamp"])`` (exact key),
    else a new stamp: ``source.next(now)`` for a :class:`~proxy.stamps.StampSource` (stamps
    never repeat), or :func:`~proxy.stamps.make_stamp` of a datetime ``source``. A client's
    stamp must be 1-64 letters, digits, '_', '.', '-' (not starting with '.' or '-'), else 400.
    """
    stamp = client_run_stamp(req)
    if not stamp:
        return source.next(now) if isinstance(source, StampSource) else make_stamp(source)
    return stamp


def client_run_stamp(req: RunRequest) -> str:
    """The run stamp the client chose ('' for none), checked as :func:`choose_run_stamp` does."""
    field, stamp = "RunStamp", clean_file_name(req.run_stamp)
    if not stamp:
        field, stamp = 'Opts["OpenM.RunStamp"]', clean_file_name(req.opts.get("OpenM.RunStamp", ""))
    if not stamp:
        return ""
    if not RUN_STAMP_RE.fullmatch(stamp):
        raise _Checker(req).fail(
            field,
            f"{stamp!r} cannot be used as a run stamp here (expected 1-64 letters, digits, "
            "'_', '.', '-', not starting with '.' or '-')",
        )
    return stamp


# --- ini values, as the OpenM++ ini reader (libopenm iniReader.cpp) reads them -----------------

_INI_SPACE = " \t\n\v\f\r"


def ini_read_value(text: str) -> str | None:
    """The value OpenM++ reads from the line ``Key = <text>``; None if it continues a line."""
    line = f"K = {text}".strip(_INI_SPACE)
    quote = ""
    equals = -1
    end = len(line)
    for i, c in enumerate(line):
        if (not quote and c in "\"'") or (quote and c == quote):
            quote = "" if quote else c
            continue
        if not quote:
            if c == "=" and equals < 0:
                equals = i
            if c in ";#":
                end = i
                break
    line = line[:end].rstrip(_INI_SPACE)
    value = line[equals + 1 :].lstrip(_INI_SPACE) if equals + 1 < len(line) else ""
    if value.endswith("\\"):
        return None
    value = value.strip(_INI_SPACE)
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        value = value[1:-1]
    return value


def ini_quote(value: str) -> str | None:
    """How to write ``value`` on one ini line so that OpenM++ reads it back exactly.

    The reader has no escapes: a value is kept as is, or wrapped in "double" or 'single'
    quotes (which also protect ``;`` and ``#``). None if no form reads back exactly (the value
    has a line break, or both kinds of quotes and a comment character).
    """
    if any(c in value for c in "\r\n"):
        return None
    for candidate in (value, f'"{value}"', f"'{value}'"):
        if ini_read_value(candidate) == value:
            return candidate
    return None
