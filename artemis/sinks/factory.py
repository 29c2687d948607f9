"""From a run's output to its sinks: the rules of an ``output`` mapping (request over
``output_defaults.<code>``), its check without building anything (what the API does before
a run starts), its resolution once when the run starts, and the sinks built from it (what
the activities emit to)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from artemis.errors import ArtemisError, ErrorCode
from artemis.security import same_origin
from artemis.sinks.base import Sink
from artemis.sinks.files import FileSink, check_format
from artemis.sinks.http import HttpSink, LogSink
from artemis.sinks.records import RecordSpec
from artemis.sinks.sql import SqlSink, sql_key, table_name_problem

# Where records land is the operator's choice (config), never a request's: a request may
# pick among the configured sinks and a file format, not a database, table or key, a path
# on the workers' disks or an object store.
OPERATOR_ONLY = {
    "sql": ("url", "table", "tables", "key"),
    "files": ("url", "endpoint_url", "folder"),
}


def check_sinks(spec: dict[str, Any], record: RecordSpec | None = None) -> list[str]:
    """The sink names of an ``output_defaults.<code>`` mapping (request merged in), each
    checked without building it — no engine, no file system, nothing created: what the
    API does with a run's output before it starts. Raises INVALID_INPUT naming the field."""
    names = spec.get("sinks") or []
    if isinstance(names, str):
        names = [names]
    for name in names:
        if name == "http":
            if not spec.get("http_endpoint"):
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT, "output: sink 'http' needs 'http_endpoint'"
                )
        elif name == "sql":
            cfg = _section(spec, "sql", ("url", "table"))
            if record is None:
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT,
                    "output: sink 'sql' needs the task's record model; this task has none",
                )
            sql_key(cfg, record)
            try:
                backend = make_url(str(cfg["url"])).get_backend_name()
            except ArgumentError as e:
                raise ArtemisError(ErrorCode.INVALID_INPUT, f"output.sql.url: {e}") from None
            if backend not in ("sqlite", "postgresql"):
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT,
                    f"output.sql.url: dialect {backend!r} is not supported (sqlite, postgresql)",
                )
        elif name == "files":
            cfg = _section(spec, "files", ("url",))
            check_format(str(cfg.get("format") or "jsonl"), record)
        elif name != "log":
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"output: unknown sink {name!r} (known: http, log, sql, files)",
            )
    if not names:
        raise ArtemisError(ErrorCode.INVALID_INPUT, "output: no sinks configured")
    return list(names)


def build_sinks(
    spec: dict[str, Any],
    record: RecordSpec | None = None,
    database_url: str = "",
    trusted_endpoint: str | None = None,
) -> list[Sink]:
    """Build sinks from an ``output_defaults.<code>`` mapping (request overrides merged in),
    checked first by ``check_sinks``.

    ``record``: the task's record model and key (the sql and files sinks need it);
    ``database_url``: the Artemis database (the files sink records what it wrote there);
    ``trusted_endpoint``: the operator's ``http_endpoint`` (an endpoint on another origin
    came from a request, and its connections are checked where they are made)."""
    sinks: list[Sink] = []
    for name in check_sinks(spec, record):
        if name == "http":
            endpoint = spec["http_endpoint"]
            sinks.append(
                HttpSink(
                    endpoint,
                    headers=spec.get("http_headers") or {},
                    guarded=not same_origin(str(endpoint), trusted_endpoint),
                )
            )
        elif name == "log":
            sinks.append(LogSink())
        elif name == "sql":
            assert record is not None  # checked
            cfg = spec["sql"]
            sinks.append(SqlSink(str(cfg["url"]), str(cfg["table"]), record, sql_key(cfg, record)))
        else:
            cfg = spec["files"]
            sinks.append(
                FileSink(
                    str(cfg["url"]),
                    str(cfg.get("format") or "jsonl"),
                    record,
                    database_url,
                    endpoint_url=cfg.get("endpoint_url"),
                    folder=cfg.get("folder"),
                )
            )
    return sinks


def _section(spec: dict[str, Any], name: str, required: tuple[str, ...]) -> dict[str, Any]:
    cfg = spec.get(name)
    if not isinstance(cfg, dict):
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output: sink {name!r} needs its section '{name}' (in output_defaults.<code>) "
            f"with {', '.join(required)}",
        )
    for key in required:
        if not cfg.get(key):
            raise ArtemisError(ErrorCode.INVALID_INPUT, f"output.{name}.{key}: required")
    return cfg


def merge_output(defaults: dict[str, Any], request: dict[str, Any] | None) -> dict[str, Any]:
    """A request's ``output`` over ``output_defaults.<code>``; the ``sql`` and ``files``
    sections are merged key by key (a request may pick a table or a format).

    The operator's ``http_headers`` belong to the endpoint they were configured with: a
    request that names an endpoint on another origin gets none of them (its own headers,
    if any, are all it sends), so a credential never follows a URL a request picked."""
    merged = {**defaults, **(request or {})}
    endpoint = (request or {}).get("http_endpoint")
    if endpoint is not None and not same_origin(str(endpoint), defaults.get("http_endpoint")):
        merged["http_headers"] = dict((request or {}).get("http_headers") or {})
        if not merged["http_headers"]:
            del merged["http_headers"]
    for name in OPERATOR_ONLY:
        if isinstance(defaults.get(name), dict) and isinstance((request or {}).get(name), dict):
            merged[name] = {**defaults[name], **(request or {})[name]}
    return merged


# Marks a run's output as resolved when it started (request over ``output_defaults``):
# the run's sinks come from it, whatever the configuration of the worker that emits.
RESOLVED = "resolved"


def resolve_output(
    code: str,
    defaults: dict[str, Any],
    request: dict[str, Any] | None,
    record: RecordSpec | None,
    database_url: str,
    place: str | None = None,
) -> dict[str, Any]:
    """A run's output, resolved once when it starts: the request's ``output`` over
    ``output_defaults.<code>``, checked against the sinks' models (check_sinks: nothing
    built, no connection opened), marked RESOLVED.

    ``place``: the run's own place (a registry run's provenance): its sql table is
    ``sql.tables[place]``, else ``place`` as a table name; its files go under
    ``{files.url}/{place}/{task_id}/``.

    A problem of the request is INVALID_INPUT naming ``output.…``; one of the
    configuration alone (the request said nothing) is CONFIG_ERROR naming
    ``output_defaults.<code>``."""
    where = f"output_defaults.{code}"
    spec = merge_output(defaults, request)
    try:
        if request:
            check_request_output(request)
        if place is not None:
            spec = _placed(spec, place, record, None if request is None else defaults)
        check_sinks(spec, record)
    except ArtemisError as e:
        message = e.message.replace("output_defaults.<code>", where)
        if request or e.code is not ErrorCode.INVALID_INPUT:
            raise ArtemisError(e.code, message, retryable=e.retryable, details=e.details) from None
        if message.startswith("output"):
            message = where + message[len("output") :]
        raise ArtemisError(ErrorCode.CONFIG_ERROR, message, retryable=False) from None
    return {**spec, RESOLVED: True}


def table_name_for(place: str) -> str:
    """A place's default table: its name with anything but letters, digits and ``_`` as
    ``_`` (``my-shop`` → ``my_shop``), so it needs no quoting in SQL."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", place)
    return name if name[:1].isalpha() or name[:1] == "_" else f"t_{name}"


def _typed_sink(spec: dict[str, Any]) -> str | None:
    """The sink of ``spec`` that types records by a model (sql, Parquet files), or None."""
    names = spec.get("sinks") or []
    names = [names] if isinstance(names, str) else list(names)
    files = spec.get("files") if isinstance(spec.get("files"), dict) else None
    if "sql" in names:
        return "sql"
    if "files" in names and files is not None and files.get("format") == "parquet":
        return "files (parquet)"
    return None


def _placed(
    spec: dict[str, Any],
    place: str,
    record: RecordSpec | None,
    configured: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``spec`` with the place's own table and folder; a sink that types records by a
    model (sql, Parquet) without one is refused naming the place's missing model.

    ``configured``: the configuration alone, when a request's output was merged into
    ``spec``: a typed sink only the request picked is the request's to change
    (INVALID_INPUT naming what it set), not the operator's."""
    out = dict(spec)
    files = spec.get("files") if isinstance(spec.get("files"), dict) else None
    sink = _typed_sink(spec)
    if sink is not None and record is None:
        why = (
            f"provenance {place!r} declares no record model (its registry record_model "
            f"fields_json and key_json), and the {sink} sink types records by one"
        )
        if configured is not None and _typed_sink(configured) is None:
            field = "output.sinks" if sink == "sql" else "output.files.format"
            raise ArtemisError(ErrorCode.INVALID_INPUT, f"{field}: {why}")
        raise ArtemisError(ErrorCode.CONFIG_ERROR, why)
    sql = spec.get("sql")
    if isinstance(sql, dict):
        if sql.get("table"):
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                "output_defaults.<code>.sql.table: one table for every provenance; name "
                "a provenance's table in sql.tables ({provenance: table}; default: its code)",
            )
        tables = sql.get("tables") or {}
        if not isinstance(tables, dict):
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                "output_defaults.<code>.sql.tables: a mapping {provenance: table}",
            )
        table = str(tables.get(place) or table_name_for(place))
        _check_place_table(place, table, tables)
        out["sql"] = {k: v for k, v in sql.items() if k != "tables"} | {"table": table}
    if files is not None:
        out["files"] = {**files, "folder": place}
    return out


def _check_place_table(place: str, table: str, tables: dict[str, Any]) -> None:
    """A place's table is a name both databases keep whole, and no other place's in
    ``sql.tables`` (whatever its case: SQLite takes ``Shop`` and ``shop`` for one
    table): two sources never share a table. CONFIG_ERROR naming both otherwise."""
    where = (
        f"output_defaults.<code>.sql.tables.{place}"
        if tables.get(place)
        else f"provenance {place!r}'s default table"
    )
    why = table_name_problem(table)
    if why is not None:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"{where}: {why}: name a shorter table in output_defaults.<code>.sql.tables",
        )
    for other, name in tables.items():
        if other != place and name and str(name).lower() == table.lower():
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"{where}: table {table!r} is provenance {other!r}'s too "
                f"(output_defaults.<code>.sql.tables maps it to {str(name)!r}; a table's "
                "name is one whatever its case): give each provenance a table of its own",
            )


# Sinks built without I/O (an endpoint and headers; nothing): the sql sink opens an
# engine and the files sink a filesystem (an object store's client) when built.
BUILT_OFFLINE = frozenset({"http", "log"})


def builds_offline(output: dict[str, Any] | None) -> bool:
    """Whether a run's resolved output names only sinks built without I/O (False for an
    output not resolved at the run's start: it is resolved when its sinks are built)."""
    spec = resolved_spec(output or {})
    if spec is None:
        return False
    names = spec.get("sinks") or []
    return set([names] if isinstance(names, str) else names) <= BUILT_OFFLINE


def resolved_spec(output: dict[str, Any]) -> dict[str, Any] | None:
    """The sinks' mapping of a run's resolved output (None: an output without the
    resolved marker, the request's alone)."""
    if output.get(RESOLVED) is not True:
        return None
    return {k: v for k, v in output.items() if k != RESOLVED}


def check_request_output(output: dict[str, Any]) -> None:
    """A request may not say where records land on the workers' side (a database URL, a
    path or an object store): that is config. Raises INVALID_INPUT naming the field."""
    if RESOLVED in output:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output.{RESOLVED}: set by Artemis when the run starts, not by a request",
        )
    for name, keys in OPERATOR_ONLY.items():
        section = output.get(name)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ArtemisError(ErrorCode.INVALID_INPUT, f"output.{name}: must be an object")
        for key in keys:
            if key in section:
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT,
                    f"output.{name}.{key}: set by the operator in "
                    f"output_defaults.<code>.{name}, not by a request",
                )


# A run of several lanes (a provenance of several resources): each lane's table and
# folder in its resolved output, in addition to the sinks the lanes share.
LANES = "lanes"


def resolve_lanes(
    code: str,
    defaults: dict[str, Any],
    request: dict[str, Any] | None,
    lanes: dict[str, tuple[str, RecordSpec | None]],
    database_url: str,
) -> dict[str, Any]:
    """A run's output resolved for each lane (``{lane: (place, record model)}``), checked
    as ``resolve_output`` checks one: the first lane's output with every lane's table and
    folder under ``LANES`` (the sinks, endpoints and URLs are the same for all)."""
    resolved = {
        lane: resolve_output(code, defaults, request, spec, database_url, place)
        for lane, (place, spec) in lanes.items()
    }
    first = next(iter(resolved.values()))
    return {
        **first,
        LANES: {
            lane: {
                "table": (out.get("sql") or {}).get("table"),
                "folder": (out.get("files") or {}).get("folder"),
            }
            for lane, out in resolved.items()
        },
    }


def lane_output(output: dict[str, Any], lane: str) -> dict[str, Any]:
    """One lane's resolved output (as a run of that lane alone carries it)."""
    own = (output.get(LANES) or {}).get(lane) or {}
    out = {k: v for k, v in output.items() if k != LANES}
    if isinstance(out.get("sql"), dict) and own.get("table"):
        out["sql"] = {**out["sql"], "table": own["table"]}
    if isinstance(out.get("files"), dict) and own.get("folder"):
        out["files"] = {**out["files"], "folder": own["folder"]}
    return out
