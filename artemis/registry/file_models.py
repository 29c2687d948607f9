"""The registry YAML file as Pydantic models (``extra="forbid"``): every section, row and
column typed from the table models themselves, so a typo or a wrong type is refused with
the path of the value (``pagination_cfg[0].page_size_value``) before anything reaches the
database, and the values that do reach it are typed (datetimes, ints, booleans, lists).

The models are derived from the SQLModel tables (one source of truth for the columns):
the file carries each table's columns except the ones the import sets itself, plus
``secret_env`` / ``endpoint_name`` for a credential. Code columns with a closed set of
values are checked against it; each field's meaning is in ``field_docs.py``, and
``reference()`` prints them all (``artemis registry schema``, docs/registry.md's reference).
A refused file lists every problem, each with the closest valid name or value.
"""

from __future__ import annotations

import re
import types
from datetime import UTC, datetime
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from artemis.errors import ArtemisError, ErrorCode
from artemis.quarantine.policy import parse_max_bad
from artemis.registry import field_docs
from artemis.registry.http_rules import (
    AUTH_TYPES,
    BUCKET_GRANULARITIES,
    TOKEN_AUTH_METHODS,
    credential_problem,
    http_cfg_problem,
)
from artemis.registry.limit_headers import HEADER_STYLES, RESET_FORMATS, rate_limit_problems
from artemis.registry.models import (
    BAD_RECORD_POLICIES,
    DEFAULT_RESOURCE,
    DIMENSIONS,
    ENDPOINT_USAGES,
    OFFSET_TYPES,
    PAGINATION_MODES,
    PAGING_PLACES,
    RECORD_FAMILIES,
    REQUEST_CONTENT_TYPES,
    RESOURCE_TABLES,
    RESPONSE_FORMATS,
    SCHEMA_CONTRACTS,
    SCOPES,
    TASK_TYPES,
    DimensionBase,
    RegProvenance,
)
from artemis.registry.record_steps import as_json, step_problems
from artemis.registry.request_modes import (
    batching_problems,
    check_path,
    endpoint_problems,
    file_problems,
    pagination_problems,
)
from artemis.registry.resolve import Contract, as_utc
from artemis.registry.secret_env import refused_secret_env
from artemis.registry.tree import resource_problems
from artemis.registry.windows import check_time_format, window_file_problems, zone
from artemis.sinks.factory import table_name_for
from artemis.sinks.records import RecordModelDecl, did_you_mean
from artemis.sinks.sql import table_name_problem

# Columns the import sets (ids, audit times, sealed secrets): never read from a file.
HIDDEN = frozenset(
    {
        "id",
        "provenance_id",
        "task_type_key",
        "created_at",
        "updated_at",
        "secret_ciphertext",
        "encryption_key_id",
        "secret_env_name",
        "principal_ciphertext",
        "principal_env_name",
        "client_secret_ciphertext",
        "client_secret_env_name",
        "endpoint_id",
    }
)
PROVENANCE_COLUMNS = (
    "provenance_code",
    "provenance_name",
    "base_url_default",
    "timezone_default",
    "docs_url",
    "lifecycle_status_code",
)
# ``provenance.record_model`` is the short form of one ``record_model`` row: SOURCE
# scope, in force from the epoch.
SHORTHAND_FROM = datetime(1970, 1, 1, tzinfo=UTC)
_STRICT = ConfigDict(extra="forbid")
_UNITS = ("MINUTE", "HOUR", "DAY", "WEEK", "MONTH")
# Code columns whose values Artemis acts on: any other value is refused, naming these.
CODES: dict[str, tuple[str, ...]] = {
    "scope_code": SCOPES,
    "task_type": TASK_TYPES,
    "pagination_mode_code": PAGINATION_MODES,
    "paging_params_in_code": PAGING_PLACES,
    "endpoint_usage_code": ENDPOINT_USAGES,
    "http_method_code": ("GET", "POST"),
    "request_content_type": REQUEST_CONTENT_TYPES,
    "response_format_code": RESPONSE_FORMATS,
    "window_mode_code": ("SLIDING", "CALENDAR"),
    "window_size_unit_code": _UNITS,
    "overlap_unit_code": _UNITS,
    "lookback_unit_code": _UNITS,
    "backoff_policy_code": ("FIXED", "EXPONENTIAL"),
    "auth_type_code": AUTH_TYPES,
    "token_auth_method_code": TOKEN_AUTH_METHODS,
    "bucket_granularity_code": BUCKET_GRANULARITIES,
    "ratelimit_headers_code": HEADER_STYLES,
    "reset_format_code": RESET_FORMATS,
    "record_family_code": RECORD_FAMILIES,
    "on_bad_record_code": BAD_RECORD_POLICIES,
    "schema_contract_code": SCHEMA_CONTRACTS,
    "offset_type_code": OFFSET_TYPES,
}
# The sections whose rows belong to a resource (``resource_name``).
_RESOURCE_SECTIONS = tuple(d for d, m in DIMENSIONS.items() if m.__tablename__ in RESOURCE_TABLES)
# The marker paths only page-number and offset paging read.
_MARKERS = ("next_page_jsonpath", "has_more_jsonpath")


def _jsonpath_ok(value: str | None) -> str | None:
    # A JSONPath, or an XML path (./...) for an endpoint that answers XML.
    return check_path(value)


def _problems_ok(check: Any) -> Any:
    """A row validator raising the problems ``check`` finds in the row, all of them."""

    def validate(self: Any) -> Any:
        problems = check(self.model_dump())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    return validate


def _fields(model: type[BaseModel], skip: frozenset[str], section: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        default = ... if info.is_required() else None
        annotation = info.annotation
        if name in CODES:
            values = Literal[CODES[name]]  # type: ignore[valid-type]
            annotation = values if info.is_required() else values | None
        out[name] = (
            annotation,
            Field(default, description=field_docs.description(section, name), **_limits(info)),
        )
    return out


def _limits(info: Any) -> dict[str, Any]:
    for meta in info.metadata:
        if getattr(meta, "max_length", None) is not None:
            return {"max_length": meta.max_length}
    return {}


# Keys a credential row may think to hold a secret in: each is named by variable instead.
_INLINE_SECRETS = {
    "secret",
    "secret_value",
    "secret_ciphertext",
    "client_secret",
    "refresh_token",
    "password",
}


def _no_inline_secret(cls: Any, data: Any) -> Any:
    if isinstance(data, dict) and _INLINE_SECRETS & set(data):
        raise ValueError("secrets are never written in the file: use secret_env: VAR")
    return data


def _secret_env_ok(value: str | None) -> str | None:
    why = refused_secret_env(value) if value is not None else None
    if why:
        raise ValueError(why)
    return value


def _http_cfg_ok(self: Any) -> Any:
    why = http_cfg_problem(self.model_dump())
    if why:
        raise ValueError(why)
    return self


def _credential_ok(self: Any) -> Any:
    why = credential_problem(self.model_dump())
    if why:
        raise ValueError(why)
    return self


def _markers_ok(self: Any) -> Any:
    """``next_page_jsonpath`` / ``has_more_jsonpath``: page-number and offset paging only,
    one of the two."""
    given = [m for m in _MARKERS if getattr(self, m) is not None]
    if given and self.pagination_mode_code not in ("PAGE_NUMBER", "OFFSET"):
        own = {"CURSOR": "next_cursor_jsonpath", "TOKEN": "next_token_jsonpath"}
        other = own.get(self.pagination_mode_code)
        raise ValueError(
            f"{given[0]} is for PAGE_NUMBER and OFFSET paging, not "
            f"{self.pagination_mode_code}" + (f" (which has {other})" if other else "")
        )
    if len(given) == 2:
        raise ValueError("set one of next_page_jsonpath and has_more_jsonpath, not both")
    return self


def _record_model_ok(self: Any) -> Any:
    """A record model row: a family, or fields and a key (checked as a declared model)."""
    family, fields, key = self.record_family_code, self.fields_json, self.key_json
    if family is not None and (fields is not None or key is not None):
        raise ValueError(
            f"record_family_code {family} brings its own shape: leave fields_json and key_json out"
        )
    if family is None:
        if fields is None or key is None:
            raise ValueError("set record_family_code, or fields_json and key_json")
        try:
            checked = RecordModelDecl.model_validate({"key": key, "fields": fields})
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            name = {"key": "key_json", "fields": "fields_json"}.get(where.split(".")[0], where)
            rest = where.split(".", 1)[1] if "." in where else ""
            loc = f"{name}.{rest}" if rest else name
            raise ValueError(f"{loc}: {str(err['msg']).removeprefix('Value error, ')}") from None
        self.fields_json = checked.fields  # the canonical spelling (`float | None`)
    if self.max_bad_records_value is not None:
        parse_max_bad(self.max_bad_records_value)
    if family is not None and self.schema_contract_code == "EVOLVE":
        raise ValueError(
            f"schema_contract_code EVOLVE: the {family} family's shape is Artemis' own; "
            "declare fields to evolve them"
        )
    return self


def _record_steps_ok(self: Any) -> Any:
    """Record steps that can work on the records of the row's model
    (``artemis.registry.record_steps``), every problem named by its place."""
    if self.record_steps_json is None:
        return self
    if self.record_family_code is not None:
        raise ValueError(
            f"record_steps_json: the {self.record_family_code} family's records are shaped "
            "by Artemis; record steps shape the records of a model that declares fields"
        )
    steps = as_json(self.record_steps_json)
    problems = step_problems(steps, self.fields_json, self.key_json, not self.coerce_types_enabled)
    if problems:
        raise ValueError("; ".join(problems))
    self.record_steps_json = steps
    return self


def _time_format_ok(value: str | None) -> str | None:
    return check_time_format(value)


_CODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _code_ok(value: str) -> str:
    """A code names a table and a folder: letters, digits, ``_``, ``-`` and ``.``, never a
    path."""
    if not _CODE.match(value) or ".." in value:
        raise ValueError(
            f"{value!r}: a code starts with a letter or digit and holds letters, digits, "
            "'_', '-' or '.' (no '..'; at most 64): it names the provenance's table and folder"
        )
    return value


def _zone_ok(value: str | None) -> str | None:
    if value is not None:
        try:
            zone(value)
        except ArtemisError as e:
            raise ValueError(e.message.removeprefix(f"timezone_default {value!r} ")) from None
    return value


_RESOURCE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# What only a named resource's SEARCH endpoint reads (its parent, what it copies of the
# parent's records, where it lands).
_RESOURCE_ONLY = ("parent_resource_name", "include_from_parent_json", "output_name")


def _resource_name_ok(value: str | None, info: ValidationInfo) -> str | None:
    """A resource's name: a letter, then letters, digits, ``_`` and ``-`` (at most 64); ""
    (the provenance's own resource) for ``resource_name``."""
    if value is None or (value == DEFAULT_RESOURCE and info.field_name == "resource_name"):
        return value
    if not _RESOURCE.match(value):
        raise ValueError(
            f"{value!r}: a resource name starts with a letter and holds letters, digits, '_' "
            "or '-' (at most 64)"
        )
    return value


def _resource_fields_ok(self: Any) -> Any:
    """``parent_resource_name``, ``include_from_parent_json`` and ``output_name`` are a
    named resource's SEARCH endpoint's; its place is a folder and a table name."""
    given = [f for f in _RESOURCE_ONLY if getattr(self, f) is not None]
    if given and (self.endpoint_usage_code != "SEARCH" or not self.resource_name):
        raise ValueError(
            f"{', '.join(given)}: only on the SEARCH endpoint of a named resource "
            "(with a resource_name)"
        )
    wanted = self.include_from_parent_json
    pairs = wanted.items() if isinstance(wanted, dict) else [(f, "") for f in wanted or []]
    if any(not isinstance(k, str) or not k or not isinstance(v, str) for k, v in pairs):
        raise ValueError(
            "include_from_parent_json: a list of the parent record's fields, or a mapping "
            "of a parent field to the record's field (text)"
        )
    name = self.output_name
    if name is not None:
        if not _CODE.match(name) or ".." in name:
            raise ValueError(
                f"output_name {name!r}: starts with a letter or digit and holds letters, "
                "digits, '_', '-' or '.' (no '..'): it names the resource's table and folder"
            )
        why = table_name_problem(table_name_for(name))
        if why:
            raise ValueError(f"output_name {name!r}: {why}")
    return self


@cache
def row_model(dim: str) -> type[BaseModel]:
    """One row of a dimension section as the file writes it."""
    table = DIMENSIONS[dim]
    fields = _fields(table, HIDDEN, dim)
    if dim == "credential":
        # Secrets are named by environment variable, endpoints by name.
        for name in ("secret_env", "principal_env", "client_secret_env", "endpoint_name"):
            fields[name] = (str | None, Field(None, description=field_docs.FIELDS[dim][name]))
    paths = tuple(n for n in fields if n.endswith("_jsonpath"))
    validators: dict[str, Any] = {}
    if paths:
        validators["jsonpaths"] = field_validator(*paths)(_jsonpath_ok)
    if dim == "credential":
        validators["no_inline_secret"] = model_validator(mode="before")(_no_inline_secret)
        validators["secret_env_ok"] = field_validator(
            "secret_env", "principal_env", "client_secret_env"
        )(_secret_env_ok)
        validators["auth_fields"] = model_validator(mode="after")(_credential_ok)
    if dim == "http_cfg":
        validators["http_cfg"] = model_validator(mode="after")(_http_cfg_ok)
    if dim == "rate_limit_cfg":
        validators["headers"] = model_validator(mode="after")(_problems_ok(rate_limit_problems))
    if dim == "pagination_cfg":
        validators["markers"] = model_validator(mode="after")(_markers_ok)
        validators["modes"] = model_validator(mode="after")(_problems_ok(pagination_problems))
    if dim == "endpoint_def":
        validators["modes"] = model_validator(mode="after")(_problems_ok(endpoint_problems))
        validators["resource"] = model_validator(mode="after")(_resource_fields_ok)
        validators["parent_name_ok"] = field_validator("parent_resource_name")(_resource_name_ok)
    if DIMENSIONS[dim].__tablename__ in RESOURCE_TABLES:
        validators["resource_name_ok"] = field_validator("resource_name")(_resource_name_ok)
    if dim == "batching_cfg":
        validators["modes"] = model_validator(mode="after")(_problems_ok(batching_problems))
    if dim == "record_model":
        validators["record_model"] = model_validator(mode="after")(_record_model_ok)
        validators["record_steps"] = model_validator(mode="after")(_record_steps_ok)
    if dim == "window_offset_cfg":
        validators["time_format"] = field_validator("window_time_format")(_time_format_ok)
    return create_model(  # type: ignore[call-overload, no-any-return]
        f"{table.__name__}Row",
        __config__=_STRICT,
        __doc__=field_docs.SECTIONS[dim],
        __validators__=validators,
        **fields,
    )


@cache
def file_model() -> type[BaseModel]:
    """The whole file: ``provenance`` plus one list per dimension."""
    prov_fields = {
        k: v
        for k, v in _fields(RegProvenance, HIDDEN, "provenance").items()
        if k in PROVENANCE_COLUMNS
    }
    docs = field_docs.FIELDS["provenance"]
    # The name defaults to the code.
    prov_fields["provenance_name"] = (
        str | None,
        Field(None, max_length=200, description=docs["provenance_name"]),
    )
    prov_fields["record_model"] = (
        RecordModelDecl | None,
        Field(None, description=docs["record_model"]),
    )
    provenance = create_model(
        "ProvenanceSection",
        __config__=_STRICT,
        __validators__={
            "zone": field_validator("timezone_default")(_zone_ok),
            "code": field_validator("provenance_code")(_code_ok),
        },
        __doc__=field_docs.SECTIONS["provenance"],
        **prov_fields,
    )
    sections: dict[str, Any] = {
        dim: (
            list[row_model(dim)],  # type: ignore[misc]
            Field(default_factory=list, description=field_docs.SECTIONS[dim]),
        )
        for dim in DIMENSIONS
    }
    return create_model(  # type: ignore[call-overload, no-any-return]
        "RegistryFile",
        __config__=_STRICT,
        provenance=(provenance, Field(..., description=field_docs.SECTIONS["provenance"])),
        **sections,
    )


def parse_file(data: Any, source: str) -> dict[str, Any]:
    """The file's document, checked and typed: ``{"provenance": {...}, dim: [{...}]}``
    holding only what the file sets (a column left out stays out, so an import can tell
    "set to null" from "not given"). A refused file is one INVALID_INPUT listing every
    problem by its path, with "did you mean" where a valid name or value is close."""
    try:
        doc = file_model().model_validate(data)
    except ValidationError as e:
        problems = [f"{_where(err['loc']) or 'file'}: {_why(err, data)}" for err in e.errors()]
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{source}: {count}{'; '.join(problems)}",
            details={"errors": [_short(err) for err in e.errors()]},
        ) from None
    out: dict[str, Any] = doc.model_dump(exclude_unset=True)
    short = out["provenance"].pop("record_model", None)
    if short is not None:
        if out.get("record_model"):
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{source}: provenance.record_model: the file has a record_model section; "
                "write the model there only",
            )
        out["record_model"] = [
            {
                "scope_code": "SOURCE",
                "effective_from": SHORTHAND_FROM,
                "key_json": short["key"],
                "fields_json": short["fields"],
            }
        ]
    # A row that names no resource is the provenance's own: stored as such even where it
    # updates a row that named one (a column left out of a file is cleared).
    for dim in _RESOURCE_SECTIONS:
        for row in out.get(dim) or []:
            row.setdefault("resource_name", DEFAULT_RESOURCE)
    # Rows of different sections that cannot work together (a POST body on a GET
    # search, JSONPaths into an XML answer, resources that are no tree...), each named by
    # the rows' places.
    together = file_problems(out) + window_file_problems(out) + tree_file_problems(out)
    if together:
        count = f"{len(together)} problems: " if len(together) > 1 else ""
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{source}: {count}{'; '.join(together)}")
    return out


def tree_file_problems(doc: dict[str, Any]) -> list[str]:
    """What keeps the file's resources from being a tree
    (``artemis.registry.tree.resource_problems``) at an instant one of its SEARCH rows
    starts or ends, for no task type and each its TASK rows name: each problem once, from
    the first instant it holds."""
    search = [r for r in doc.get("endpoint_def") or [] if r.get("endpoint_usage_code") == "SEARCH"]
    stray = _stray_resource_rows(doc, {r.get("resource_name") or "" for r in search})
    if not any(r.get("resource_name") for r in search):
        return stray
    instants = sorted(
        {as_utc(r[k]) for r in search for k in ("effective_from", "effective_to") if r.get(k)}
    )
    tasks = sorted({r["task_type"] for r in search if r.get("scope_code") == "TASK"})
    found: dict[str, datetime] = {}
    for task in (None, *tasks):
        for at in instants:
            for problem in resource_problems(_file_contract(search, task, at)):
                found[problem] = min(found.get(problem, at), at)
    return stray + [f"endpoint_def: from {at.isoformat()}: {p}" for p, at in found.items()]


def _stray_resource_rows(doc: dict[str, Any], named: set[str]) -> list[str]:
    """Rows a resource would never read: a resource name on an endpoint that is not a
    SEARCH (a DETAIL or TOKEN endpoint is the provenance's), and a pagination, record
    model or window row of a resource that has no SEARCH endpoint in the file."""
    out = []
    for i, row in enumerate(doc.get("endpoint_def") or []):
        if row.get("resource_name") and row.get("endpoint_usage_code") != "SEARCH":
            out.append(
                f"endpoint_def[{i}].resource_name: a {row.get('endpoint_usage_code')} endpoint "
                "is the provenance's, shared by its resources: only a SEARCH endpoint names "
                "a resource"
            )
    for section in ("pagination_cfg", "record_model", "window_offset_cfg"):
        for i, row in enumerate(doc.get(section) or []):
            name = row.get("resource_name") or ""
            if name and name not in named:
                out.append(
                    f"{section}[{i}].resource_name: {name!r} has no SEARCH endpoint in the "
                    f"file (resources: {', '.join(sorted(n for n in named if n)) or 'none'})"
                )
    return out


def _file_contract(search: list[dict[str, Any]], task: str | None, at: datetime) -> Contract:
    """The SEARCH endpoints the file's rows would resolve to for ``task`` at ``at``: the
    provenance's own, and each named resource's (as ``resolve_contract`` picks them)."""
    by_name: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, row in enumerate(search):
        start, end = as_utc(row["effective_from"]), row.get("effective_to")
        if start <= at and (end is None or at < as_utc(end)):
            by_name.setdefault(row.get("resource_name") or DEFAULT_RESOURCE, []).append((i, row))
    picked = {name: _newest(rows, task) for name, rows in by_name.items()}
    resources = {
        name: {"name": name, "parent": row.get("parent_resource_name"), "endpoint": row}
        for name, row in picked.items()
        if name != DEFAULT_RESOURCE and row is not None
    }
    return Contract(
        provenance={},
        task_type=task,
        at=at.isoformat(),
        usage="SEARCH",
        endpoint=picked.get(DEFAULT_RESOURCE),
        endpoints={},
        pagination=None,
        window_offset=None,
        http=None,
        batching=None,
        retry=None,
        rate_limit=None,
        resources=resources or None,
    )


def _newest(rows: list[tuple[int, dict[str, Any]]], task: str | None) -> dict[str, Any] | None:
    """The newest TASK row of ``task``, else the newest SOURCE row (of one start, the one
    later in the file, as the one of the higher id)."""
    for scope, wanted in [*([("TASK", task)] if task else []), ("SOURCE", None)]:
        fit = [
            (as_utc(r["effective_from"]), i, r)
            for i, r in rows
            if r.get("scope_code") == scope and r.get("task_type") == wanted
        ]
        if fit:
            return max(fit, key=lambda f: (f[0], f[1]))[2]
    return None


def _where(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")


def _why(err: Any, data: Any) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        name = str(loc[-1])
        # The names this mapping does not set yet: a misspelt field is not one it has.
        given = _value_at(data, loc[:-1])
        valid = [n for n in _names_at(loc[:-1]) if not isinstance(given, dict) or n not in given]
        hint = did_you_mean(name, valid) if valid else ""
        elsewhere = [s for s, names in _section_fields().items() if name in names]
        if elsewhere and (not loc[:1] or elsewhere != [loc[0]]):
            hint += f" ({name} is a field of {' and '.join(elsewhere)})"
        return f"unknown field{hint}"
    if err["type"] == "missing":
        return "is required"
    if err["type"] == "literal_error":
        allowed = CODES.get(str(loc[-1])) or ()
        got = err.get("input")
        hint = did_you_mean(str(got), allowed) if isinstance(got, str) else ""
        return f"must be one of {', '.join(allowed)} (got {got!r}){hint}"
    if err["type"] == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    return f"{err['msg']} (got {err.get('input')!r})"


def _value_at(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _names_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names valid at ``loc`` (a path into the file model), for "did you mean"."""
    model: Any = file_model()
    for part in loc:
        if isinstance(part, int):
            continue
        inside = _model_of(model)
        info = inside.model_fields.get(str(part)) if inside is not None else None
        if info is None:
            return []
        model = info.annotation
    found = _model_of(model)
    return list(found.model_fields) if found is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model inside ``X``, ``X | None`` or ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (list, Union, types.UnionType):
        for arg in get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


@cache
def _section_fields() -> dict[str, frozenset[str]]:
    out = {"provenance": frozenset(_names_at(("provenance",)))}
    out.update({dim: frozenset(row_model(dim).model_fields) for dim in DIMENSIONS})
    return out


def _short(err: Any) -> dict[str, Any]:
    return {"loc": list(err["loc"]), "type": err["type"], "msg": err["msg"]}


# -- the field reference ---------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return " | ".join(str(a) for a in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return " | ".join(_type_name(a) for a in args)
    if annotation is RecordModelDecl:
        return "record model (below)"
    names = {str: "text", int: "integer", float: "number", bool: "true/false"}
    if annotation in names:
        return names[annotation]
    if getattr(annotation, "__name__", "") == "datetime":
        return "timestamp"
    origin = get_origin(annotation)
    if origin is dict:
        return "mapping"
    if origin is list:
        return "list"
    return str(annotation)


def _table(rows: list[tuple[str, Any, bool]]) -> list[str]:
    out = ["| field | type | meaning |", "| --- | --- | --- |"]
    for name, field, required in rows:
        cells = [
            f"`{name}`" + (" (required)" if required else ""),
            _type_name(field.annotation),
            field.description or "",
        ]
        # A "|" in a cell would end it: Markdown's escape.
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def reference() -> str:
    """Every section and field of the registry YAML, as Markdown tables (generated from
    the file models: docs/registry.md's reference is this text)."""
    common = row_model("http_cfg").model_fields
    out = [
        "Every row of a dimension section (all but `provenance`) has:",
        "",
        *_table([(n, common[n], common[n].is_required()) for n in field_docs.COMMON]),
    ]
    for section, info in file_model().model_fields.items():
        model = _model_of(info.annotation)
        assert model is not None
        shape = "a list of rows" if get_origin(info.annotation) is list else "a mapping"
        fields = [
            (n, f, f.is_required())
            for n, f in model.model_fields.items()
            if section == "provenance" or n not in field_docs.COMMON
        ]
        out += ["", f"`{section}` ({shape}): {field_docs.SECTIONS[section]}", ""]
        out += _table(fields)
    decl = RecordModelDecl.model_fields
    out += ["", f"`provenance.record_model`: {field_docs.SECTIONS['record_model_shorthand']}", ""]
    out += _table([(n, decl[n], True) for n in decl])
    return "\n".join(out) + "\n"


def json_schema() -> dict[str, Any]:
    """The registry YAML's JSON Schema (for an editor's YAML language server)."""
    return file_model().model_json_schema()


__all__ = [
    "CODES",
    "HIDDEN",
    "PROVENANCE_COLUMNS",
    "DimensionBase",
    "file_model",
    "json_schema",
    "parse_file",
    "reference",
    "row_model",
]
