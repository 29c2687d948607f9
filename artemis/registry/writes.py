"""Writes to the registry with its application-level rules: no overlapping
intervals within one dimension (the error names the conflicting rows), no TASK row
without a task type, gray switch and rollback by adding and closing intervals."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, false, not_, or_, select, update
from sqlalchemy.engine import Connection

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.http_rules import OAUTH2_REFRESH, PAIRED_AUTH_TYPES, PUBLIC_CLIENT
from artemis.registry.models import (
    DEFAULT_RESOURCE,
    DIMENSIONS,
    SCOPES,
    TABLES,
    TASK_TYPES,
    DimensionBase,
    RegProvCredential,
    RegProvenance,
    RegProvEndpointDef,
    RegProvRecordModel,
    utcnow,
)
from artemis.registry.record_steps import as_json, step_problems
from artemis.registry.resolve import as_utc, current_row, place_of, resolve_contract
from artemis.registry.secret_env import check_secret_env, refused_secret_env
from artemis.registry.tree import resource_problems
from artemis.sinks.factory import table_name_for
from artemis.sinks.sql import table_name_problem


def model_for(table_name: str) -> type[DimensionBase]:
    model = TABLES.get(table_name) or DIMENSIONS.get(table_name)
    if model is None:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"unknown registry table {table_name!r} (known: {', '.join(sorted(TABLES))})",
        )
    return model


def identity_value(values: Any, column: str) -> Any:
    """A row's identity column; a row that names no resource is the provenance's default
    resource (``resource_name`` "")."""
    value = values.get(column)
    return (value or DEFAULT_RESOURCE) if column == "resource_name" else value


def describe(model: type[DimensionBase], row: Any) -> str:
    r = row._mapping if hasattr(row, "_mapping") else row
    ident = "".join(f" {c}={r.get(c)}" for c in model.identity)
    start = as_utc(r["effective_from"]).isoformat() if r.get("effective_from") else "?"
    to = as_utc(r["effective_to"]).isoformat() if r.get("effective_to") else "open"
    return (
        f"{model.__tablename__} id={r.get('id')} scope={r.get('scope_code')} "
        f"task_type={r.get('task_type') or '-'}{ident} [{start}, {to})"
    )


def validate_scope(model: type[DimensionBase], values: dict[str, Any]) -> None:
    where = f"{model.__tablename__}"
    scope, task = values.get("scope_code"), values.get("task_type")
    if scope not in SCOPES:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT, f"{where}.scope_code must be SOURCE or TASK, got {scope!r}"
        )
    if scope == "TASK" and not task:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{where}: a TASK row needs a task_type (harvest | update | backfill)",
        )
    if task is not None and task not in TASK_TYPES:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{where}.task_type must be harvest, update or backfill, got {task!r}",
        )
    if scope == "SOURCE" and task:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT, f"{where}: a SOURCE row has no task_type (got {task!r})"
        )
    start, end = values.get("effective_from"), values.get("effective_to")
    if start is None:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{where}.effective_from is required")
    if end is not None and as_utc(end) <= as_utc(start):
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{where}: effective_to ({as_utc(end).isoformat()}) must be after "
            f"effective_from ({as_utc(start).isoformat()})",
        )


def overlapping(
    conn: Connection,
    model: type[DimensionBase],
    values: dict[str, Any],
    exclude_id: int | None = None,
) -> list[Any]:
    """Rows of the same dimension slot whose interval intersects ``values``' interval."""
    t = model.__table__  # type: ignore[attr-defined]
    start = as_utc(values["effective_from"])
    end = as_utc(values["effective_to"]) if values.get("effective_to") else None
    if end is not None and end <= start:
        return []  # an empty interval (a row closed where it starts) is never in force
    disjoint = or_(
        and_(t.c.effective_to.is_not(None), t.c.effective_to <= t.c.effective_from),
        and_(t.c.effective_to.is_not(None), t.c.effective_to <= start),
        false() if end is None else (t.c.effective_from >= end),
    )
    conds = [
        t.c.provenance_id == values["provenance_id"],
        t.c.scope_code == values["scope_code"],
        t.c.task_type_key == (values.get("task_type") or "ALL"),
        not_(disjoint),
    ]
    conds += [t.c[c] == identity_value(values, c) for c in model.identity]
    if exclude_id is not None:
        conds.append(t.c.id != exclude_id)
    return list(conn.execute(select(t).where(*conds).order_by(t.c.id)).fetchall())


def refuse_overlaps(
    conn: Connection,
    model: type[DimensionBase],
    values: dict[str, Any],
    exclude_id: int | None = None,
) -> None:
    clashes = overlapping(conn, model, values, exclude_id)
    if clashes:
        new = {**values, "id": exclude_id or "new"}
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"interval overlap: {describe(model, new)} overlaps "
            + "; ".join(describe(model, r) for r in clashes),
            details={"conflicts": [r.id for r in clashes]},
        )


def normalise(model: type[DimensionBase], values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for key in ("effective_from", "effective_to"):
        if out.get(key) is not None:
            out[key] = as_utc(out[key])
    known = set(model.__table__.c.keys()) - {"task_type_key"}  # type: ignore[attr-defined]
    unknown = set(out) - known
    if unknown:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{model.__tablename__}: unknown column(s) {', '.join(sorted(unknown))}",
        )
    return out


def _check_credential(model: type[DimensionBase], values: dict[str, Any]) -> None:
    """A credential written by any path (import, switch, rollback) names no variable of
    the service's own."""
    if model is RegProvCredential and "secret_env_name" in values:
        check_secret_env(values["secret_env_name"])
    if model is RegProvCredential and "principal_env_name" in values:
        check_secret_env(values["principal_env_name"], label="principal_env")
    if model is RegProvCredential and "client_secret_env_name" in values:
        check_secret_env(values["client_secret_env_name"], label="client_secret_env")


def add_row(conn: Connection, model: type[DimensionBase], values: dict[str, Any]) -> int:
    values = normalise(model, values)
    _check_credential(model, values)
    validate_scope(model, values)
    refuse_overlaps(conn, model, values)
    now = utcnow()
    values.setdefault("created_at", now)
    values.setdefault("updated_at", now)
    t = model.__table__  # type: ignore[attr-defined]
    key = conn.execute(t.insert().values(**values)).inserted_primary_key
    assert key is not None
    return int(key[0])


def update_row(
    conn: Connection, model: type[DimensionBase], row_id: int, values: dict[str, Any]
) -> None:
    t = model.__table__  # type: ignore[attr-defined]
    current = get_row(conn, model, row_id)
    merged = {**dict(current._mapping), **values}
    merged.pop("task_type_key", None)
    merged = normalise(model, merged)
    validate_scope(model, merged)
    refuse_overlaps(conn, model, merged, exclude_id=row_id)
    values = normalise(model, values)
    # Only what is written is checked: a reserved row can still be closed or deleted.
    _check_credential(model, values)
    conn.execute(update(t).where(t.c.id == row_id).values(**values, updated_at=utcnow()))


def get_row(conn: Connection, model: type[DimensionBase], row_id: int) -> Any:
    t = model.__table__  # type: ignore[attr-defined]
    row = conn.execute(select(t).where(t.c.id == row_id)).first()
    if row is None:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{model.__tablename__} has no row {row_id}")
    return row


def close_row(conn: Connection, table_name: str, row_id: int, at: datetime | str | None) -> None:
    """End a row's interval at ``at`` (default now)."""
    model = model_for(table_name)
    row = get_row(conn, model, row_id)
    when = as_utc(at)
    if when < as_utc(row.effective_from):
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"cannot close {describe(model, row)} at {when.isoformat()}: before it starts",
        )
    update_row(conn, model, row_id, {"effective_to": when})


def reopen_row(conn: Connection, table_name: str, row_id: int) -> None:
    """Make a closed row open-ended again (refused if that overlaps another row)."""
    model = model_for(table_name)
    get_row(conn, model, row_id)
    update_row(conn, model, row_id, {"effective_to": None})


def gray_switch(
    conn: Connection, table_name: str, old_id: int, new_values: dict[str, Any], at: datetime | str
) -> int:
    """Add ``new_values`` from ``at`` (typically in the future) and close the old row then:
    runs resolving before ``at`` keep the old row, later ones get the new."""
    model = model_for(table_name)
    old = dict(get_row(conn, model, old_id)._mapping)
    when = as_utc(at)
    close_row(conn, table_name, old_id, when)
    values = {
        k: v for k, v in old.items() if k not in ("id", "task_type_key", "created_at", "updated_at")
    }
    values.update(new_values)
    values.update(effective_from=when, effective_to=None)
    return add_row(conn, model, values)


def rollback(
    conn: Connection, table_name: str, new_id: int, old_id: int, at: datetime | str | None = None
) -> int:
    """Undo a switch: close the new row and put the old one back in force.

    If the new row has not started yet it is closed where it starts and the old row is
    reopened as it was. If it has, history is kept exact: the new row ends at ``at`` and
    the old row's configuration is restored from ``at`` (a copy). Returns the id in force.
    """
    model = model_for(table_name)
    new = get_row(conn, model, new_id)
    old = dict(get_row(conn, model, old_id)._mapping)
    when = as_utc(at)
    if when <= as_utc(new.effective_from):
        t = model.__table__  # type: ignore[attr-defined]
        conn.execute(
            update(t)
            .where(t.c.id == new_id)
            .values(effective_to=as_utc(new.effective_from), updated_at=utcnow())
        )
        reopen_row(conn, table_name, old_id)
        return old_id
    close_row(conn, table_name, new_id, when)
    values = {
        k: v for k, v in old.items() if k not in ("id", "task_type_key", "created_at", "updated_at")
    }
    values.update(effective_from=when, effective_to=None)
    return add_row(conn, model, values)


def check_registry(conn: Connection) -> list[dict[str, Any]]:
    """Findings: overlapping intervals, TASK rows without a task type, provenances with
    no SEARCH endpoint in force now, credentials without a secret or holding one of the
    service's own variables, tables two places share (whatever their case) or that
    PostgreSQL would cut, and resources that are no tree from some instant on."""
    findings = _dimension_findings(conn)
    findings += _endpoint_findings(conn)
    findings += _credential_findings(conn)
    findings += _table_findings(conn)
    findings += _resource_findings(conn)
    findings += _step_findings(conn)
    return findings


@dataclass(frozen=True)
class Place:
    """One table and folder a provenance lands in: its own (``resource`` None, named by
    its code) or a named resource's (artemis/registry/resolve.py ``place_of``)."""

    code: str
    resource: str | None
    name: str

    @property
    def table(self) -> str:
        return table_name_for(self.name)

    def owner(self) -> str:
        if self.resource is None:
            return f"provenance {self.code!r}'s"
        return f"the table of provenance {self.code!r}'s resource {self.resource!r}"


def places(code: str, endpoints: Iterable[Any]) -> list[Place]:
    """Every place provenance ``code`` lands in, from its endpoint rows (mappings, any
    interval): its code when it has a SEARCH endpoint of its own resource or no named
    resource, and each named resource's place (each SEARCH row's ``output_name``, else
    ``{code}__{resource}``)."""
    search = [r for r in endpoints if r.get("endpoint_usage_code") == "SEARCH"]
    named = [r for r in search if r.get("resource_name")]
    out = [Place(code, None, code)] if not named or len(named) < len(search) else []
    for r in named:
        name = str(r["resource_name"])
        found = Place(code, name, place_of(code, {"name": name, "endpoint": r}))
        if found not in out:
            out.append(found)
    return out


def stored_places(conn: Connection) -> dict[str, list[Place]]:
    """Every stored provenance's places, by code (in the order the provenances were
    written)."""
    pt = RegProvenance.__table__  # type: ignore[attr-defined]
    et = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    rows: dict[int, list[dict[str, Any]]] = {}
    cols = (et.c.endpoint_usage_code, et.c.resource_name, et.c.output_name)
    for r in conn.execute(
        select(et.c.provenance_id, *cols).where(et.c.endpoint_usage_code == "SEARCH")
    ):
        rows.setdefault(r.provenance_id, []).append(dict(r._mapping))
    return {
        p.provenance_code: places(p.provenance_code, rows.get(p.id, []))
        for p in conn.execute(select(pt.c.id, pt.c.provenance_code).order_by(pt.c.id))
    }


def shared(mine: Place, theirs: Place) -> bool:
    """Whether two places of different provenances, or of different resources of one,
    write one table (names are one whatever their case)."""
    if (mine.code, mine.resource) == (theirs.code, theirs.resource):
        return False
    return mine.table.lower() == theirs.table.lower()


def _table_findings(conn: Connection) -> list[dict[str, Any]]:
    """Places written before the import refused them: a table past 63 bytes, or one
    another place's table is too (the import's rule: case aside)."""
    findings: list[dict[str, Any]] = []
    pt = RegProvenance.__table__  # type: ignore[attr-defined]
    seen: dict[str, Place] = {}
    for code, found in stored_places(conn).items():
        for place in found:
            who = f"provenance {code}" + (
                f": resource {place.resource!r} (place {place.name!r})" if place.resource else ""
            )
            why = table_name_problem(place.table)
            if why is not None:
                findings.append(_finding("table_name", pt.name, None, f"{who}: {why}"))
            other = seen.setdefault(place.table.lower(), place)
            if shared(place, other):
                findings.append(
                    _finding("shared_table", pt.name, None, _shared_message(place, other))
                )
    return findings


def _shared_message(place: Place, other: Place) -> str:
    if place.resource is None and other.resource is None:
        return (
            f"provenance {place.code}: its default table {place.table!r} is provenance "
            f"{other.code}'s (names are one whatever their case): map one of them to "
            "a table of its own (output_defaults.<code>.sql.tables)"
        )
    who = f"provenance {place.code}" + (f": resource {place.resource!r}" if place.resource else "")
    return (
        f"{who}: its table {place.table!r} (place {place.name!r}) is {other.owner()} "
        f"({other.table!r}; names are one whatever their case): give one of the resources "
        "an output_name of its own"
    )


def _resource_findings(conn: Connection) -> list[dict[str, Any]]:
    """Resources that are no tree (``artemis.registry.tree.resource_problems``) at some
    instant: each problem once, from the first instant it holds, naming the task types
    it holds for unless it holds for all."""
    pt = RegProvenance.__table__  # type: ignore[attr-defined]
    et = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    rows: dict[int, list[Any]] = {}
    for r in conn.execute(select(et).where(et.c.endpoint_usage_code == "SEARCH")):
        rows.setdefault(r.provenance_id, []).append(r)
    findings: list[dict[str, Any]] = []
    for prov in conn.execute(select(pt.c.id, pt.c.provenance_code).order_by(pt.c.id)):
        search = rows.get(prov.id, [])
        if not any(r.resource_name for r in search):
            continue  # one resource: no tree to walk
        code = prov.provenance_code
        tasks, found = _tree_problems(conn, code, search)
        for problem, (since, where) in found.items():
            only = "" if len(where) == len(tasks) else f" (task_type {', '.join(where)})"
            message = f"provenance {code}: from {since.isoformat()}{only}: {problem}"
            findings.append(_finding("resource_tree", et.name, None, message))
    return findings


def _tree_problems(
    conn: Connection, code: str, search: list[Any]
) -> tuple[list[str], dict[str, tuple[datetime, list[str]]]]:
    """The task types walked (``-``: none) and each problem with the first instant it
    holds at and the task types it holds for. The endpoints a tree is made of change only
    where a SEARCH row starts or ends, and differ by task type only for the task types of
    TASK SEARCH rows: resolving there finds every problem."""
    instants = sorted({as_utc(v) for r in search for v in (r.effective_from, r.effective_to) if v})
    own = sorted({r.task_type for r in search if r.scope_code == "TASK" and r.task_type})
    tasks: list[str | None] = [None, *own]
    found: dict[str, tuple[datetime, list[str]]] = {}
    for task in tasks:
        walked: set[frozenset[int]] = set()
        for at in instants:
            live = frozenset(
                r.id
                for r in search
                if (r.scope_code == "SOURCE" or r.task_type == task)
                and as_utc(r.effective_from) <= at
                and (r.effective_to is None or at < as_utc(r.effective_to))
            )
            if live in walked:
                continue  # the same rows to pick from: the same tree, found already
            walked.add(live)
            for problem in resource_problems(resolve_contract(conn, code, task, at)):
                since, where = found.get(problem, (at, []))
                label = task or "-"
                found[problem] = (min(since, at), where if label in where else [*where, label])
    return [t or "-" for t in tasks], found


def _finding(kind: str, table: str, row_id: int | None, message: str) -> dict[str, Any]:
    return {"kind": kind, "table": table, "id": row_id, "message": message}


def _dimension_findings(conn: Connection) -> list[dict[str, Any]]:
    """Every dimension row's findings: a TASK row without a task type, a scope not known,
    an interval overlapping a later row's."""
    findings: list[dict[str, Any]] = []
    for model in DIMENSIONS.values():
        t = model.__table__  # type: ignore[attr-defined]
        rows = conn.execute(select(t).order_by(t.c.id)).fetchall()
        for r in rows:
            if r.scope_code == "TASK" and not r.task_type:
                findings.append(
                    _finding(
                        "task_row_without_task_type",
                        t.name,
                        r.id,
                        f"{describe(model, r)}: TASK row without task_type",
                    )
                )
            if r.scope_code not in SCOPES:
                findings.append(
                    _finding(
                        "bad_scope",
                        t.name,
                        r.id,
                        f"{describe(model, r)}: scope_code not in {SCOPES}",
                    )
                )
            clashes = [
                c
                for c in overlapping(conn, model, dict(r._mapping), exclude_id=r.id)
                if c.id > r.id
            ]
            for c in clashes:
                findings.append(
                    _finding(
                        "overlap",
                        t.name,
                        r.id,
                        f"{describe(model, r)} overlaps {describe(model, c)}",
                    )
                )
    return findings


def _endpoint_findings(conn: Connection) -> list[dict[str, Any]]:
    """A provenance with no SEARCH endpoint in force now, for any task type or none."""
    findings: list[dict[str, Any]] = []
    pt = RegProvenance.__table__  # type: ignore[attr-defined]
    et = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    now = utcnow()
    for prov in conn.execute(select(pt)).fetchall():
        for task in (None, *TASK_TYPES):
            if (
                current_row(
                    conn,
                    RegProvEndpointDef,
                    prov.id,
                    task,
                    now,
                    et.c.endpoint_usage_code == "SEARCH",
                )
                is None
            ):
                findings.append(
                    _finding(
                        "missing_endpoint",
                        et.name,
                        None,
                        f"provenance {prov.provenance_code}: no SEARCH "
                        f"endpoint in force for task_type={task or '-'}",
                    )
                )
    return findings


def _step_findings(conn: Connection) -> list[dict[str, Any]]:
    """A record model row whose record steps the import would refuse (written around it):
    a run that resolves the row stops with CONFIG_ERROR."""
    findings: list[dict[str, Any]] = []
    mt = RegProvRecordModel.__table__  # type: ignore[attr-defined]
    for r in conn.execute(select(mt).where(mt.c.record_steps_json.is_not(None))).fetchall():
        steps = as_json(r.record_steps_json)
        if steps is None:
            continue
        problems = step_problems(steps, r.fields_json, r.key_json, not r.coerce_types_enabled)
        if problems:
            what = describe(RegProvRecordModel, r)
            findings.append(
                _finding("record_steps", mt.name, r.id, f"{what}: {'; '.join(problems)}")
            )
    return findings


def _credential_findings(conn: Connection) -> list[dict[str, Any]]:
    """A live credential without a secret, naming one of the service's own variables, or
    of a paired auth type without its principal (a refresh token's confidential client
    without its secret)."""
    findings: list[dict[str, Any]] = []
    ct = RegProvCredential.__table__  # type: ignore[attr-defined]
    for r in conn.execute(select(ct).where(ct.c.deleted.is_(False))).fetchall():
        if not r.secret_ciphertext:
            findings.append(
                _finding(
                    "credential_without_secret",
                    ct.name,
                    r.id,
                    f"{describe(RegProvCredential, r)} has no secret",
                )
            )
        for field, env in (
            ("secret_env", r.secret_env_name),
            ("principal_env", r.principal_env_name),
            ("client_secret_env", r.client_secret_env_name),
        ):
            why = refused_secret_env(env) if env else None
            if why:
                findings.append(
                    _finding(
                        "reserved_secret_env",
                        ct.name,
                        r.id,
                        f"{describe(RegProvCredential, r)}: {field} {why}",
                    )
                )
        if r.auth_type_code in PAIRED_AUTH_TYPES and not r.principal_ciphertext:
            findings.append(
                _finding(
                    "credential_without_principal",
                    ct.name,
                    r.id,
                    f"{describe(RegProvCredential, r)}: {r.auth_type_code} "
                    "without its principal (principal_env)",
                )
            )
        if (
            r.auth_type_code == OAUTH2_REFRESH
            and r.token_auth_method_code != PUBLIC_CLIENT
            and not r.client_secret_ciphertext
        ):
            findings.append(
                _finding(
                    "credential_without_client_secret",
                    ct.name,
                    r.id,
                    f"{describe(RegProvCredential, r)}: {r.auth_type_code} without its "
                    f"client secret (client_secret_env; a public client: "
                    f"token_auth_method_code {PUBLIC_CLIENT})",
                )
            )
    return findings
