"""The registry YAML file as Pydantic models (``extra="forbid"``): every section, row and
column typed from the table models themselves, so a typo or a wrong type is refused with
the path of the value (``pagination_cfg[0].page_size_value``) before anything reaches the
database, and the values that do reach it are typed (datetimes, ints, booleans, lists).

The models are derived from the SQLModel tables (one source of truth for the columns):
the file carries each table's columns except the ones the import sets itself, plus
``secret_env`` / ``endpoint_name`` for a credential.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonpath
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import DIMENSIONS, DimensionBase, RegProvenance

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
_STRICT = ConfigDict(extra="forbid")


def _jsonpath_ok(value: str | None) -> str | None:
    if value is not None:
        try:
            jsonpath.compile(value)
        except jsonpath.JSONPathError as e:
            raise ValueError(f"not a JSONPath: {str(e).splitlines()[0]}") from None
    return value


def _fields(model: type[BaseModel], skip: frozenset[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        default = ... if info.is_required() else None
        out[name] = (info.annotation, Field(default, **_limits(info)))
    return out


def _limits(info: Any) -> dict[str, Any]:
    for meta in info.metadata:
        if getattr(meta, "max_length", None) is not None:
            return {"max_length": meta.max_length}
    return {}


def _no_inline_secret(cls: Any, data: Any) -> Any:
    if isinstance(data, dict) and {"secret", "secret_value", "secret_ciphertext"} & set(data):
        raise ValueError("secrets are never written in the file: use secret_env: VAR")
    return data


@cache
def row_model(dim: str) -> type[BaseModel]:
    """One row of a dimension section as the file writes it."""
    table = DIMENSIONS[dim]
    fields = _fields(table, HIDDEN)
    if dim == "credential":
        # Secrets are named by environment variable, endpoints by name.
        fields["secret_env"] = (str | None, None)
        fields["endpoint_name"] = (str | None, None)
    paths = tuple(n for n in fields if n.endswith("_jsonpath"))
    validators: dict[str, Any] = {}
    if paths:
        validators["jsonpaths"] = field_validator(*paths)(_jsonpath_ok)
    if dim == "credential":
        validators["no_inline_secret"] = model_validator(mode="before")(_no_inline_secret)
    return create_model(  # type: ignore[call-overload, no-any-return]
        f"{table.__name__}Row", __config__=_STRICT, __validators__=validators, **fields
    )


@cache
def file_model() -> type[BaseModel]:
    """The whole file: ``provenance`` plus one list per dimension."""
    prov_fields = {
        k: v for k, v in _fields(RegProvenance, HIDDEN).items() if k in PROVENANCE_COLUMNS
    }
    # The name defaults to the code.
    prov_fields["provenance_name"] = (str | None, Field(None, max_length=200))
    provenance = create_model("ProvenanceSection", __config__=_STRICT, **prov_fields)
    sections: dict[str, Any] = {
        dim: (list[row_model(dim)], Field(default_factory=list))  # type: ignore[misc]
        for dim in DIMENSIONS
    }
    return create_model(  # type: ignore[call-overload, no-any-return]
        "RegistryFile", __config__=_STRICT, provenance=(provenance, ...), **sections
    )


def parse_file(data: Any, source: str) -> dict[str, Any]:
    """The file's document, checked and typed: ``{"provenance": {...}, dim: [{...}]}``
    holding only what the file sets (a column left out stays out, so an import can tell
    "set to null" from "not given")."""
    try:
        doc = file_model().model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in first["loc"]).replace(
            ".[", "["
        )
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{source}: {where or 'file'}: {_why(first)}{more}",
            details={"errors": [_short(err) for err in e.errors()]},
        ) from None
    return doc.model_dump(exclude_unset=True)


def _why(err: Any) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "missing":
        return "is required"
    if err["type"] == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    return f"{err['msg']} (got {err.get('input')!r})"


def _short(err: Any) -> dict[str, Any]:
    return {"loc": list(err["loc"]), "type": err["type"], "msg": err["msg"]}


__all__ = ["HIDDEN", "PROVENANCE_COLUMNS", "DimensionBase", "file_model", "parse_file", "row_model"]
