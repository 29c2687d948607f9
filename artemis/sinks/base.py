"""The Sink contract and the factory that turns ``output_defaults`` into sinks."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from artemis.errors import ArtemisError, ErrorCode
from artemis.http import HttpClient
from artemis.tracing import TraceContext

if TYPE_CHECKING:
    from artemis.sinks.records import RecordSpec

# Where records land is the operator's choice (config), never a request's: a request may
# pick among the configured sinks and a file format, not a database, table or key, a path
# on the workers' disks or an object store.
OPERATOR_ONLY = {"sql": ("url", "table", "key"), "files": ("url", "endpoint_url")}


@dataclass
class EmitContext:
    """What a sink needs to know about the batch it is sending."""

    run_key: str
    seq: int
    trace: TraceContext
    request_id: str | None
    task_code: str
    task_id: str = ""
    # Records each sink took from this page (for the run's stats).
    counts: dict[str, int] = field(default_factory=dict)

    def delivered(self, sink_name: str, records: int) -> None:
        self.counts[sink_name] = self.counts.get(sink_name, 0) + records

    def idempotency_key(self, sink_name: str) -> str:
        # Derived from the run and the batch only: every retry of this batch sends the same key.
        return f"{self.run_key}:{sink_name}:{self.seq}"


class Sink(ABC):
    name: str

    @abstractmethod
    async def emit(
        self, client: HttpClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        """Deliver ``records``; raise ArtemisError(SINK_ERROR) when not delivered."""

    async def finish(self, end: RunEnd) -> dict[str, Any] | None:
        """Called once at the run's finalize (e.g. to write a manifest); what it returns
        goes into the run's stats under ``sinks_finished.<name>``."""
        return None


@dataclass
class RunEnd:
    run_key: str
    task_code: str
    task_id: str
    status: str


def check_sinks(spec: dict[str, Any], record: RecordSpec | None = None) -> list[str]:
    """The sink names of an ``output_defaults.<code>`` mapping (request merged in), each
    checked without building it — no engine, no file system, nothing created: what the
    API does with a run's output before it starts. Raises INVALID_INPUT naming the field."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from artemis.sinks.files import check_format

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


def sql_key(cfg: dict[str, Any], record: RecordSpec) -> tuple[str, ...]:
    """The sql sink's upsert key (``output.sql.key``, else the record key), checked
    against the record model."""
    key = cfg.get("key") or ()
    key = tuple([key] if isinstance(key, str) else key) or record.key
    unknown = [k for k in key if k not in record.model.model_fields]
    if unknown:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output.sql.key: {unknown[0]!r} is not a field of {record.model.__name__}",
        )
    if not set(record.key) <= set(key):
        # A narrower key would fold distinct records into one row.
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output.sql.key: must hold the record key ({', '.join(record.key)})",
        )
    return key


def build_sinks(
    spec: dict[str, Any], record: RecordSpec | None = None, database_url: str = ""
) -> list[Sink]:
    """Build sinks from an ``output_defaults.<code>`` mapping (request overrides merged in),
    checked first by ``check_sinks``.

    ``record``: the task's record model and key (the sql and files sinks need it);
    ``database_url``: the Artemis database (the files sink records what it wrote there)."""
    from artemis.sinks.files import FileSink
    from artemis.sinks.http import HttpSink, LogSink
    from artemis.sinks.sql import SqlSink

    sinks: list[Sink] = []
    for name in check_sinks(spec, record):
        if name == "http":
            sinks.append(HttpSink(spec["http_endpoint"], headers=spec.get("http_headers") or {}))
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
    sections are merged key by key (a request may pick a table or a format)."""
    merged = {**defaults, **(request or {})}
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
) -> dict[str, Any]:
    """A run's output, resolved once when it starts: the request's ``output`` over
    ``output_defaults.<code>``, checked by building its sinks, marked RESOLVED.

    A problem of the request is INVALID_INPUT naming ``output.…``; one of the
    configuration alone (the request said nothing) is CONFIG_ERROR naming
    ``output_defaults.<code>``."""
    where = f"output_defaults.{code}"
    spec = merge_output(defaults, request)
    try:
        if request:
            check_request_output(request)
        check_sinks(spec, record)
    except ArtemisError as e:
        message = e.message.replace("output_defaults.<code>", where)
        if request or e.code is not ErrorCode.INVALID_INPUT:
            raise ArtemisError(e.code, message, retryable=e.retryable, details=e.details) from None
        if message.startswith("output"):
            message = where + message[len("output") :]
        raise ArtemisError(ErrorCode.CONFIG_ERROR, message, retryable=False) from None
    return {**spec, RESOLVED: True}


def resolved_spec(output: dict[str, Any]) -> dict[str, Any] | None:
    """The sinks' mapping of a run's resolved output (None: a run of an earlier build,
    whose output was the request's alone)."""
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


# A request's sink secrets (SPEC §5): header values of ``output.http_headers`` and an
# ``output.http_endpoint`` carrying a user, password or query are run secrets — encrypted
# in ``run_secret``, resolved inside the activities — and workflow history carries this
# marker in their place.
SECRET_REF = "@run-secret"
_HEADER_SECRET = "output.http_headers:"
_ENDPOINT_SECRET = "output.http_endpoint"


def seal_output(output: dict[str, Any], put: Any) -> dict[str, Any]:
    """``output`` for history: each secret value stored by ``put(name, value)`` and
    replaced by SECRET_REF."""
    from urllib.parse import urlsplit

    sealed = dict(output)
    headers = output.get("http_headers")
    if isinstance(headers, dict) and headers:
        for name, value in headers.items():
            put(f"{_HEADER_SECRET}{name}", str(value))
        sealed["http_headers"] = dict.fromkeys(headers, SECRET_REF)
    endpoint = output.get("http_endpoint")
    if isinstance(endpoint, str):
        parts = urlsplit(endpoint)
        if parts.username or parts.password or parts.query:
            put(_ENDPOINT_SECRET, endpoint)
            sealed["http_endpoint"] = SECRET_REF
    # The operator's URLs of a resolved output (a database or object store) may carry a
    # user and password: those are run secrets too.
    for section, keys in OPERATOR_ONLY.items():
        cfg = output.get(section)
        if not isinstance(cfg, dict):
            continue
        for key in keys:
            value = cfg.get(key)
            if isinstance(value, str) and _has_credentials(value):
                put(f"output.{section}.{key}", value)
                sealed[section] = {**sealed[section], key: SECRET_REF}
    return sealed


def _has_credentials(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        return bool(parts.password or parts.query)
    except ValueError:
        return False


def unseal_output(output: dict[str, Any], get: Any) -> dict[str, Any]:
    """``output`` with its run secrets read back by ``get(name)`` (inside an activity);
    its credentials are registered for redaction. A secret that is gone is INVALID_INPUT."""

    def read(name: str) -> str:
        value = get(name)
        if value is None:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{name.rstrip(':')}: the run's secret is gone (cleaned up)",
                retryable=False,
            )
        register_sink_secret(name, str(value))
        return str(value)

    if not output:
        return output
    opened = dict(output)
    headers = output.get("http_headers")
    if isinstance(headers, dict) and SECRET_REF in headers.values():
        opened["http_headers"] = {
            k: read(f"{_HEADER_SECRET}{k}") if v == SECRET_REF else v for k, v in headers.items()
        }
    for section in OPERATOR_ONLY:
        cfg = output.get(section)
        if isinstance(cfg, dict) and SECRET_REF in cfg.values():
            opened[section] = {
                k: read(f"output.{section}.{k}") if v == SECRET_REF else v for k, v in cfg.items()
            }
    if output.get("http_endpoint") == SECRET_REF:
        opened["http_endpoint"] = read(_ENDPOINT_SECRET)
    return opened


# What in a sink secret is redacted from logs and error texts: a header's value when its
# name says it is a credential, a URL's password and the values of its credential-named
# query keys. Redaction replaces substrings everywhere, so a plain value ("data", a
# "require" of sslmode) is not registered: it would garble every line it appears in.
_SECRET_NAME = re.compile(r"auth|token|key|secret|pass|cookie|session|sig|cred", re.I)


def register_sink_secret(name: str, value: str) -> None:
    """Register for redaction what in the run secret ``name`` (``output.http_headers:H``,
    ``output.http_endpoint``, ``output.sql.url`` …) is a credential."""
    from urllib.parse import parse_qsl, urlsplit

    from artemis.logsetup import register_secret

    if name.startswith(_HEADER_SECRET):
        if _SECRET_NAME.search(name[len(_HEADER_SECRET) :]):
            register_secret(value)
        return
    try:
        parts = urlsplit(value)
    except ValueError:
        register_secret(value)
        return
    if parts.password:
        register_secret(parts.password)
    for key, v in parse_qsl(parts.query):
        if _SECRET_NAME.search(key):
            register_secret(v)


def shown_url(url: str) -> str:
    """A URL as errors and logs show it: no user, password or query."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
