"""A task's record model, as the table and file sinks see it.

Each TaskUnit declares once the shape of its processed records (a Pydantic model) and
their key (``record_key``). From that one declaration come the SQL table's typed columns,
the Parquet schema, and the check of every record before it is written: a field the
model lacks or a value of the wrong type is a ``SINK_ERROR`` naming the column — never a
silent drop or a silent cast.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import cached_property
from typing import Any, Union, get_args, get_origin

import pyarrow as pa
import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode

# The columns every table sink adds beside the record's own.
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
    if origin in (list, dict):
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

    @cached_property
    def _adapter(self) -> TypeAdapter[list[Any]]:
        # One validator for a whole page, strict about unknown fields and about types as
        # JSON has them: "1.5" is not a float, 3.0 not an int, 1 not a bool; an ISO date
        # string is a date. Values come back as Python types.
        fields: dict[str, Any] = {
            name: (f.annotation, f) for name, f in self.model.model_fields.items()
        }
        checked = create_model(  # type: ignore[call-overload]
            f"{self.model.__name__}Row",
            __config__=ConfigDict(extra="forbid", strict=True),
            **fields,
        )
        return TypeAdapter(list[checked])

    def rows(self, records: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
        """The records checked against the model, as rows of Python values.

        Raises ArtemisError(SINK_ERROR, not retryable) naming the record and column."""
        try:
            # Checked as the JSON the records were staged as (dates are ISO strings there).
            models = self._adapter.validate_json(jsonio.dumps(records))
        except ValidationError as e:
            err = e.errors()[0]
            loc = err.get("loc") or ()
            index = loc[0] if loc and isinstance(loc[0], int) else "?"
            column = ".".join(str(p) for p in loc[1:]) or "?"
            if err.get("type") == "extra_forbidden":
                problem = f"has a field {column!r} that {self.model.__name__} has no column for"
            else:
                got = str(err.get("input"))[:60]
                problem = f"column {column!r}: {err.get('msg')} (got {got!r})"
            raise schema_error(f"{where}: record {index} {problem}") from None
        rows = [m.__dict__ for m in models]
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

    def check_table(self, table: sa.Table, where: str) -> None:
        """An existing table holds the model's values: every field a column of a fitting
        type, the load columns present."""
        for name, kind in self.kinds.items():
            col = table.columns.get(name)
            if col is None:
                raise schema_error(f"{where}: table {table.name!r} has no column {name!r}")
            if not isinstance(col.type, _AFFINITY[kind]):
                raise schema_error(
                    f"{where}: column {name!r} of table {table.name!r} is {col.type}, "
                    f"the records hold {kind.replace('_', ' of ')} values"
                )
        for name in LOAD_COLUMNS:
            if name not in table.columns:
                raise schema_error(f"{where}: table {table.name!r} has no column {name!r}")

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        fields = []
        for name, field in self.model.model_fields.items():
            _, nullable = _base(field.annotation)
            fields.append(pa.field(name, _ARROW[self.kinds[name]], nullable=nullable))
        return pa.schema(fields)

    def arrow_table(self, rows: list[dict[str, Any]]) -> pa.Table:
        """Rows (from ``rows``) as an Arrow table of the model's schema."""
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


def schema_error(message: str) -> ArtemisError:
    """The records and the destination disagree: no retry can fix that."""
    return ArtemisError(ErrorCode.SINK_ERROR, message, retryable=False)
