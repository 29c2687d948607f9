"""A task's record model, as the table and file sinks see it.

Each TaskUnit declares once the shape of its processed records (a Pydantic model) and
their key (``record_key``). From that one declaration come the SQL table's typed columns,
the Parquet schema, and the check of every record before it is written: a field the
model lacks or a value of the wrong type is a ``RECORD_MODEL`` naming the record and the
field when the run judges its pages (a ``SINK_ERROR`` when a sink finds it) — never a
silent drop or a silent cast.

A record model may also be declared as data (``RecordModelDecl``: a registry provenance's
``record_model``, fields with their type names and a key); ``declared_spec`` turns it into
the same ``RecordSpec``.
"""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import cache, cached_property, lru_cache
from typing import Any, Union, get_args, get_origin

import pyarrow as pa
import sqlalchemy as sa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode
from artemis.redact import redact_text

# The columns every table sink adds to the record's own.
LOAD_COLUMNS = ("_artemis_task_id", "_artemis_page_seq", "_artemis_loaded_at")


def _base(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` → (X, nullable)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _kind(annotation: Any) -> str:
    base, _ = _base(annotation)
    origin = get_origin(base) or base
    if base is bool:
        return "bool"
    if base is int:
        return "int"
    if base is float:
        return "float"
    if base is str:
        return "str"
    if base is datetime:
        return "datetime"
    if base is date:
        return "date"
    if origin is list and get_args(base) in ((str,),):
        return "list_str"
    if isinstance(base, type) and issubclass(base, BaseModel):
        return "struct"
    if origin in (list, dict) or base is Any:
        return "json"
    raise TypeError(
        f"record models support str, int, float, bool, date, datetime, list, dict: {base!r}"
    )


_SQL: dict[str, Callable[[], sa.types.TypeEngine[Any]]] = {
    "bool": sa.Boolean,
    "int": sa.BigInteger,
    "float": sa.Double,
    "str": sa.Text,
    "datetime": lambda: sa.DateTime(timezone=True),
    "date": sa.Date,
    "list_str": sa.JSON,
    "json": sa.JSON,
    "struct": sa.JSON,
}
# The column types of an existing table that take the model's values as they are.
_AFFINITY: dict[str, tuple[type[Any], ...]] = {
    "bool": (sa.Boolean,),
    "int": (sa.Integer,),
    "float": (sa.Float, sa.Numeric),
    "str": (sa.String,),
    "datetime": (sa.DateTime,),
    "date": (sa.Date,),
    "list_str": (sa.JSON,),
    "json": (sa.JSON,),
    "struct": (sa.JSON,),
}
_ARROW = {
    "bool": pa.bool_(),
    "int": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "datetime": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "list_str": pa.list_(pa.string()),
    "json": pa.string(),
}


@dataclass(frozen=True)
class RecordSpec:
    """A task's record model and the fields that identify one record."""

    model: type[BaseModel]
    key: tuple[str, ...]

    def __post_init__(self) -> None:
        missing = [k for k in self.key if k not in self.model.model_fields]
        if missing or not self.key:
            raise TypeError(f"record key {self.key} not in {self.model.__name__}'s fields")

    @cached_property
    def kinds(self) -> dict[str, str]:
        return {name: _kind(f.annotation) for name, f in self.model.model_fields.items()}

    @property
    def adapter(self) -> TypeAdapter[list[Any]]:
        # One validator for a whole page, strict about unknown fields and about types as
        # JSON has them: "1.5" is not a float, 3.0 not an int, 1 not a bool; an ISO date
        # string is a date. Values come back as Python types.
        return _page_adapter(self.model, strict=True)

    @property
    def lax_adapter(self) -> TypeAdapter[list[Any]]:
        # The same model with pydantic's lax conversions: "1.5" is a float, "7" an int,
        # "true" a bool (a source that writes its numbers as strings).
        return _page_adapter(self.model, strict=False)

    def rows(self, records: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
        """The records checked against the model, as rows of Python values.

        Raises ArtemisError(SINK_ERROR, not retryable) naming the record and column."""
        try:
            # Checked as the JSON the records were staged as (dates are ISO strings there).
            models = self.adapter.validate_json(jsonio.dumps(records))
        except ValidationError as e:
            err = e.errors()[0]
            loc = err.get("loc") or ()
            index = loc[0] if loc and isinstance(loc[0], int) else "?"
            raise schema_error(
                f"{where}: record {index} {fault_of(err, self.model.__name__).problem}"
            ) from None
        rows = [m.__dict__ for m in models]
        for name in self._structs:
            for row in rows:
                value = row.get(name)
                if isinstance(value, BaseModel):
                    row[name] = value.model_dump()
        for name in self._datetimes:
            for row in rows:
                value = row.get(name)
                if isinstance(value, datetime) and value.tzinfo is not None:
                    row[name] = value.astimezone(UTC)  # stored as UTC, whatever the column
        return rows

    @cached_property
    def _datetimes(self) -> list[str]:
        return [n for n, k in self.kinds.items() if k == "datetime"]

    def sql_columns(self) -> list[sa.Column]:
        cols = []
        for name, field in self.model.model_fields.items():
            _, nullable = _base(field.annotation)
            cols.append(
                sa.Column(
                    name,
                    _SQL[self.kinds[name]](),
                    primary_key=name in self.key,
                    nullable=nullable and name not in self.key,
                )
            )
        return cols

    def check_table(self, table: sa.Table, where: str) -> tuple[list[sa.Column], list[sa.Column]]:
        """An existing table holds the model's values: every field a column of a fitting
        type, the load columns present. Returns the columns of nullable fields the table
        lacks (a model that grew: they are added) and the NOT NULL columns of fields the
        model now lets be null (a field turned optional: the column takes nulls from now
        on); any other misfit is an error naming the column and what to do."""
        missing: list[sa.Column] = []
        relaxed: list[sa.Column] = []
        for col in self.sql_columns():
            have = table.columns.get(col.name)
            kind = self.kinds[col.name]
            if have is None:
                if col.nullable and not col.primary_key:
                    missing.append(col)
                    continue
                raise schema_error(
                    f"{where}: table {table.name!r} has no column {col.name!r}, which the "
                    "model requires: declare the field `| None` (a new column is added for "
                    "it), or move the table aside"
                )
            if not isinstance(have.type, _AFFINITY[kind]):
                raise schema_error(
                    f"{where}: column {col.name!r} of table {table.name!r} is {have.type}, "
                    f"the records hold {kind.replace('_', ' of ')} values: a changed type "
                    "needs a table of its own (map the source to a new table, or migrate "
                    "this one)"
                )
            if col.nullable and not have.nullable and not have.primary_key:
                relaxed.append(have)
        for name in LOAD_COLUMNS:
            if name not in table.columns:
                raise schema_error(f"{where}: table {table.name!r} has no column {name!r}")
        own = set(self.kinds) | set(LOAD_COLUMNS)
        for have in table.columns:
            if have.name in own or have.nullable or have.server_default is not None:
                continue
            if have.primary_key:
                continue  # the key check's (a surrogate key fills itself)
            # A field the model no longer has: every row written now would lack it.
            raise schema_error(
                f"{where}: table {table.name!r} has a NOT NULL column {have.name!r} the model "
                "has no field for: declare the field again, allow nulls in the column, or "
                "map the source to a new table"
            )
        return missing, relaxed

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return _arrow_schema(self.model)

    def arrow_table(self, rows: list[dict[str, Any]]) -> pa.Table:
        """Rows (from ``rows``) as an Arrow table of the model's schema: a declared struct
        is a Parquet struct of its declared fields; a ``dict``, ``list`` or ``json`` field
        is JSON text (its keys are the records', so no one schema holds them)."""
        schema = self.arrow_schema
        columns = []
        for field in schema:
            values = [r.get(field.name) for r in rows]
            if self.kinds[field.name] == "json":
                values = [None if v is None else jsonio.dumps(v).decode() for v in values]
            try:
                columns.append(pa.array(values, type=field.type))
            except (pa.ArrowException, OverflowError) as e:
                raise schema_error(f"column {field.name!r}: {type(e).__name__}: {e}") from None
        return pa.Table.from_arrays(columns, schema=schema)

    def sql_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row as a SQL table takes it: a struct as JSON (its dates as ISO text)."""
        for name in self._structs:
            if row.get(name) is not None:
                row[name] = jsonio.loads(jsonio.dumps(row[name]))
        return row

    @cached_property
    def _structs(self) -> list[str]:
        return [n for n, k in self.kinds.items() if k == "struct"]


@dataclass(frozen=True)
class RecordFault:
    """Why one record does not fit a model: the field path, pydantic's error type and
    the problem in words (``column 'score': Input should be a valid number (got '1.5')``)."""

    field: str
    kind: str
    problem: str


def fault_of(err: Any, model_name: str) -> RecordFault:
    loc = err.get("loc") or ()
    column = ".".join(str(p) for p in loc[1:]) or "?"
    if err.get("type") == "extra_forbidden":
        problem = f"has a field {column!r} that {model_name} has no column for"
    else:
        # Redacted before it is cut (a secret cut in two is no longer found); what is
        # shown starts in the first 60 characters, so a secret of it ends within 1000.
        # The value as JSON writes it: null, "1.5", 1.5 (never Python's 'None'), its
        # text redacted before it is escaped and cut (a secret cut in two, or escaped, is
        # no longer found).
        got = json.dumps(_redacted(err.get("input")), ensure_ascii=False, default=_text)
        problem = f"column {column!r}: {err.get('msg')} (got {got[:60]})"
    return RecordFault(column, str(err.get("type")), problem)


def _text(value: Any) -> str:
    return redact_text(str(value)[:1000])


def _redacted(value: Any) -> Any:
    """``value`` with each text in it redacted (what a fault shows of a record)."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(k): _redacted(v) for k, v in list(value.items())[:50]}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value[:50]]
    return value


def _arrow_schema(model: type[BaseModel]) -> pa.Schema:
    fields = []
    for name, field in model.model_fields.items():
        base, nullable = _base(field.annotation)
        kind = _kind(field.annotation)
        typ = pa.struct(list(_arrow_schema(base))) if kind == "struct" else _ARROW[kind]
        fields.append(pa.field(name, typ, nullable=nullable))
    return pa.schema(fields)


def schema_error(message: str) -> ArtemisError:
    """The records and the destination disagree: no retry can fix that."""
    return ArtemisError(ErrorCode.SINK_ERROR, message, retryable=False)


def model_error(message: str) -> ArtemisError:
    """A record does not fit its model: the record's fault, not the destination's."""
    return ArtemisError(ErrorCode.RECORD_MODEL, message, retryable=False)


# -- record models declared as data ------------------------------------------------------------
# The type names a declared field may have (``X | None`` for a field that may be null or
# absent): the kinds a RecordSpec supports, written as Python writes them.
FIELD_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "date": date,
    "datetime": datetime,
    "list[str]": list[str],
    "list": list[Any],
    "dict": dict[str, Any],
    "json": Any,
}
# Names other schema languages use, offered as "did you mean" (never accepted as such).
_TYPE_HINTS = {
    "string": "str",
    "text": "str",
    "integer": "int",
    "long": "int",
    "bigint": "int",
    "number": "float",
    "double": "float",
    "decimal": "float",
    "boolean": "bool",
    "timestamp": "datetime",
    "array": "list",
    "object": "dict",
}
_FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
# The most columns a sql sink's table may have: PostgreSQL's limit (SQLite's default is
# 2000); a record model has room for this many fields besides Artemis' own load columns.
MAX_COLUMNS = 1600
MAX_FIELDS = MAX_COLUMNS - len(LOAD_COLUMNS)


def field_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a record model's field (a table's column, a Parquet
    field), or None: a name starts with a letter (so never ``_id``, ``@attr``, ``#text``
    or one of Artemis' own ``_artemis_*`` columns) and is at most 63 characters."""
    if not _FIELD_NAME.match(name):
        return "a name starts with a letter and holds letters, digits, '_' or '-' (at most 63)"
    if hasattr(BaseModel, name):
        return "the name is taken by Pydantic's BaseModel"
    return None


def same_but_case(name: str, names: Any) -> str | None:
    """The one of ``names`` that differs from ``name`` only in case (SQLite's column and
    table names ignore case: they would be one), or None."""
    low = name.lower()
    for other in names:
        if other != name and other.lower() == low:
            return str(other)
    return None


def evolution_plan(
    existing: list[str],
    new: dict[str, str],
    room: int | None = None,
    over_room: str = "over schema.max_new_fields",
) -> tuple[dict[str, str], dict[str, str]]:
    """Which of ``new`` (name → declared type) a model with the fields ``existing`` may
    add, by the import's rules (a valid name, unique whatever its case, within
    MAX_FIELDS), at most ``room`` of them (None: no bound but the budget; the rest are
    skipped ``over_room``): (the fields added, {field: why it was skipped})."""
    added: dict[str, str] = {}
    skipped: dict[str, str] = {}
    taken = {n.lower(): n for n in existing}
    there = set(existing)
    for name, type_name in new.items():
        if name in there:
            continue  # there already (another run added it)
        invalid = field_name_problem(name)
        why = None if invalid is None else f"not a valid field name: {invalid}"
        if why is None and name.lower() in taken:
            why = (
                f"differs only in case from field {taken[name.lower()]!r} (a table's column "
                "names ignore case)"
            )
        if why is None and len(taken) >= MAX_FIELDS:
            why = f"over the column budget: a record model has at most {MAX_FIELDS} fields"
        if why is None and room is not None and len(added) >= room:
            why = over_room
        if why is not None:
            skipped[name] = why
            continue
        added[name] = type_name
        taken[name.lower()] = name
    return added, skipped


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """``, did you mean 'x'?`` (or 'x' or 'y') for the closest of ``choices``; '' when none
    is close."""
    by_lower = {c.lower(): c for c in choices}
    low = word.lower()
    if low in by_lower:  # only the case differs
        close = [by_lower[low]]
    else:
        close = [c for c in choices if low and c.lower().startswith(low)][:2]
        if not close:
            found = difflib.get_close_matches(low, list(by_lower), n=3, cutoff=0.6)
            # Names that start with the same word first (page_… for page_param_name).
            head = low.split("_")[0]
            found = [c for c in found if c.split("_")[0] == head] or found
            score = [difflib.SequenceMatcher(None, low, c).ratio() for c in found]
            # A second name only when it is about as close as the first.
            near = [c for c, r in zip(found, score, strict=True) if r >= score[0] - 0.1]
            close = [by_lower[c] for c in near[:2]]
    if not close:
        return ""
    return ", did you mean " + " or ".join(repr(c) for c in close) + "?"


def parse_field_type(text: str) -> tuple[str, bool]:
    """``"float | None"`` → ``("float", True)``; ValueError naming the types otherwise."""
    parts = [p.strip() for p in str(text).split("|")]
    nullable = len(parts) == 2 and "None" in parts
    base = [p for p in parts if p != "None"]
    if len(base) == 1 and (len(parts) == 1 or nullable) and base[0] in FIELD_TYPES:
        return base[0], nullable
    name = base[0] if len(base) == 1 else str(text)
    hint = (
        f", did you mean {_TYPE_HINTS[name.lower()]!r}?"
        if name.lower() in _TYPE_HINTS
        else did_you_mean(name, list(FIELD_TYPES))
    )
    raise ValueError(
        f"{text!r} is not a field type{hint} (types: {', '.join(FIELD_TYPES)}, "
        "each optionally '| None')"
    )


class RecordModelDecl(BaseModel):
    """A record model written as data, e.g. ``{key: [id], fields: {id: int, name: str,
    price: float | None}}``: the SQL table's columns and the Parquet schema, checked as
    strictly as a TaskUnit's own model."""

    model_config = ConfigDict(extra="forbid")

    key: list[str] = Field(
        min_length=1,
        description="the fields that identify a record (the SQL table's primary key); never null",
    )
    fields: dict[str, str | dict[str, Any]] = Field(
        min_length=1,
        description="field name → type, in column order; types: "
        + ", ".join(FIELD_TYPES)
        + ", each optionally '| None' (may be null or absent), or a mapping of sub-fields "
        "typed the same way (a struct: a Parquet struct, JSON in SQL; it may be null or "
        "absent). A record keeps only these fields",
    )

    @field_validator("fields")
    @classmethod
    def _fields_ok(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _canonical_fields(value, "")

    @model_validator(mode="after")
    def _key_ok(self) -> RecordModelDecl:
        for name in self.key:
            if name not in self.fields:
                raise ValueError(
                    f"key {name!r} is not one of the fields{did_you_mean(name, list(self.fields))}"
                )
            text = self.fields[name]
            if not isinstance(text, str):
                raise ValueError(f"key {name!r} is a struct: a key is a plain field")
            if parse_field_type(text)[1]:
                raise ValueError(f"key {name!r} may not be null: declare it without '| None'")
        if len(set(self.key)) != len(self.key):
            raise ValueError(f"key {self.key} names a field twice")
        return self


def _canonical_fields(value: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Declared fields checked and spelt one way (``float|None`` → ``float | None``); a
    mapping is a struct's sub-fields."""
    out: dict[str, Any] = {}
    if not value:
        raise ValueError(f"struct {prefix.rstrip('.')!r} declares no field")
    if not prefix and len(value) > MAX_FIELDS:
        raise ValueError(
            f"{len(value)} fields: a record model has at most {MAX_FIELDS} (a sql sink's "
            f"table holds at most {MAX_COLUMNS} columns, {len(LOAD_COLUMNS)} of them Artemis' own)"
        )
    for name, text in value.items():
        where = f"{prefix}{name}"
        why = field_name_problem(name)
        if why is not None:
            raise ValueError(f"field {where!r}: {why}")
        twin = None if prefix else same_but_case(name, out)
        if twin is not None:
            # (a struct's sub-fields are JSON keys and Parquet fields: their case counts)
            raise ValueError(
                f"field {where!r}: differs only in case from field {twin!r} (a table's "
                "column names ignore case): rename one"
            )
        if isinstance(text, dict):
            out[name] = _canonical_fields(text, f"{where}.")
            continue
        try:
            kind, nullable = parse_field_type(text)
        except ValueError as e:
            raise ValueError(f"field {where!r}: {e}") from None
        out[name] = f"{kind} | None" if nullable else kind
    return out


# A task's RecordSpec is made anew for each run (TaskUnit.record_spec); its model class is
# not. A page's validators are built once per model class and kept: building one
# (create_model and its core schema) took 2.1 ms of CPU for the quote record, checking a
# page of five records with it 0.015 ms, and every run judges its pages with one
# (artemis/quarantine/judging.py). Bounded, for a process that meets many declared models.
@lru_cache(maxsize=1024)
def _page_adapter(model: type[BaseModel], strict: bool) -> TypeAdapter[list[Any]]:
    fields: dict[str, Any] = {name: (f.annotation, f) for name, f in model.model_fields.items()}
    checked = create_model(  # type: ignore[call-overload]
        f"{model.__name__}{'Row' if strict else 'Lax'}",
        __config__=ConfigDict(extra="forbid", strict=strict),
        **fields,
    )
    return TypeAdapter(list[checked])


def declared_spec(decl: dict[str, Any], name: str) -> RecordSpec:
    """The RecordSpec of a declared record model (validated again here: it may come from a
    run's history). One model class per declaration and name, so a sink that prepared
    its table for it once knows it again."""
    checked = RecordModelDecl.model_validate(decl)
    return _declared(json.dumps(checked.model_dump()), name)


@cache
def _declared(decl_json: str, name: str) -> RecordSpec:
    decl = json.loads(decl_json)
    return RecordSpec(_declared_model(decl["fields"], name), tuple(decl["key"]))


def _declared_model(declared: dict[str, Any], name: str) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for field, text in declared.items():
        if isinstance(text, dict):
            struct = _declared_model(text, f"{name}_{field}")
            fields[field] = (struct | None, None)
            continue
        kind, nullable = parse_field_type(text)
        annotation = FIELD_TYPES[kind]
        fields[field] = (annotation | None, None) if nullable else (annotation, ...)
    return create_model(  # type: ignore[call-overload, no-any-return]
        name, __config__=ConfigDict(protected_namespaces=()), **fields
    )


def record_model_name(code: str) -> str:
    """``my-shop`` → ``MyShopRecord`` (the model's name in sink errors)."""
    words = re.split(r"[^A-Za-z0-9]+", code)
    return "".join(w[:1].upper() + w[1:] for w in words if w) + "Record"
