"""The quarantine's tables: the records set aside and what a replay needs of their run,
the drift seen; writing, reading and replaying rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any

from cryptography.fernet import InvalidToken, MultiFernet
from sqlalchemy import (
    Column,
    Index,
    Text,
    UniqueConstraint,
    bindparam,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlmodel import Field as SqlField
from sqlmodel import SQLModel

from artemis import jsonio
from artemis.db import UTCDateTime, get_engine, upsert_insert, utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.owners import SEP as OWNER_SEP
from artemis.owners import owned_task_id
from artemis.quarantine.judging import BadRecord, Drift, example_text
from artemis.quarantine.policy import check_of
from artemis.redact import redact_json, redact_text
from artemis.vault import MASTER_KEY_ENV, PREVIOUS_KEYS_ENV, derive_multi, master_keys


class QuarantineStatus(StrEnum):
    QUARANTINED = "quarantined"
    REPLAYED = "replayed"
    DISCARDED = "discarded"


# -- the tables --------------------------------------------------------------------------------


class QuarantinedRecord(SQLModel, table=True):
    """A record set aside by a run, replayable. (run_key, page_seq, position) is unique:
    a page judged again (a retried attempt) keeps one row per record."""

    __tablename__ = "quarantined_record"
    __table_args__ = (
        UniqueConstraint("run_key", "page_seq", "position", name="uq_quarantined_record_place"),
        Index("ix_quarantined_record_run_status", "run_key", "status"),
        Index("ix_quarantined_record_created", "created_at"),
    )

    id: int | None = SqlField(default=None, primary_key=True)
    run_key: str = SqlField(max_length=200)
    task_code: str = SqlField(max_length=64)
    task_id: str = SqlField(max_length=200, index=True)
    provenance: str | None = SqlField(default=None, max_length=64)
    page_seq: int
    position: int
    stage: str = SqlField(max_length=16)
    record_key: str | None = SqlField(default=None, sa_column=Column(Text))
    # The record as shown (redacted like a log line when it holds a secret) and, then,
    # the record itself sealed for its replay (Fernet under the master key).
    record: str | None = SqlField(default=None, sa_column=Column(Text))
    record_sealed: str | None = SqlField(default=None, sa_column=Column(Text))
    record_bytes: int = 0
    error_code: str = SqlField(max_length=40)
    field_path: str | None = SqlField(default=None, max_length=300)
    message: str = SqlField(sa_column=Column(Text, nullable=False))
    status: str = SqlField(default=QuarantineStatus.QUARANTINED.value, max_length=16)
    replays: int = 0
    replayed_by: str | None = SqlField(default=None, max_length=300)
    created_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)


class QuarantineRun(SQLModel, table=True):
    """What a replay needs of the run that quarantined records: its task, params and
    output (as in its history: sealed secrets stay references)."""

    __tablename__ = "quarantine_run"

    run_key: str = SqlField(primary_key=True, max_length=200)
    task_code: str = SqlField(max_length=64)
    task_id: str = SqlField(max_length=200, index=True)
    provenance: str | None = SqlField(default=None, max_length=64)
    params: str = SqlField(sa_column=Column(Text, nullable=False))
    output: str = SqlField(sa_column=Column(Text, nullable=False))
    created_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)


class SchemaDrift(SQLModel, table=True):
    """A field a run saw the source add (or stop sending): one row per run and field."""

    __tablename__ = "schema_drift"

    run_key: str = SqlField(primary_key=True, max_length=200)
    field_name: str = SqlField(primary_key=True, max_length=200)
    kind: str = SqlField(max_length=16)
    task_code: str = SqlField(max_length=64)
    task_id: str = SqlField(max_length=200)
    provenance: str | None = SqlField(default=None, max_length=64)
    page_seq: int
    example: str | None = SqlField(default=None, sa_column=Column(Text))
    type_name: str | None = SqlField(default=None, max_length=40)
    action: str = SqlField(max_length=16)
    created_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)


_Q = QuarantinedRecord.__table__  # type: ignore[attr-defined]
_RUNS = QuarantineRun.__table__  # type: ignore[attr-defined]
_DRIFT = SchemaDrift.__table__  # type: ignore[attr-defined]


@dataclass
class RunPlace:
    """Which run a page belongs to, for the rows written about it: ``run_key`` the run
    that fetched it (a window's own), ``task_id`` the run that was started."""

    run_key: str
    task_code: str
    task_id: str
    provenance: str | None
    params: dict[str, Any]
    output: dict[str, Any]


def _rows(
    place: RunPlace,
    seq: int,
    bad: list[BadRecord],
    max_record_bytes: int,
    now: datetime,
    seal: RecordSeal | None,
) -> list[dict[str, Any]]:
    rows = []
    for b in bad:
        body = jsonio.dumps(b.record)
        kept = len(body) <= max_record_bytes
        shown, sealed = _kept_record(b.record, body, seal) if kept else (None, None)
        rows.append(
            {
                "run_key": place.run_key,
                "task_code": place.task_code,
                "task_id": place.task_id,
                "provenance": place.provenance,
                "page_seq": seq,
                "position": b.position,
                "stage": b.stage.value,
                "record_key": jsonio.dumps(redact_json(b.key)).decode() if b.key else None,
                "record": shown,
                "record_sealed": sealed,
                "record_bytes": len(body),
                "error_code": b.code,
                "field_path": (b.field or None) and redact_text(str(b.field))[:300],
                "message": redact_text(b.message)[:2000] + _not_kept(kept, shown, len(body)),
                "status": QuarantineStatus.QUARANTINED.value,
                "replays": 0,
                "replayed_by": None,
                "created_at": now,
                "updated_at": now,
            }
        )
    return rows


def _not_kept(kept: bool, shown: str | None, size: int) -> str:
    if not kept:
        return f" (record of {size} bytes not kept: over the bound)"
    if shown is None:
        return " (record not kept: it holds a secret value and there is no key to seal it)"
    return ""


def _kept_record(
    record: Any, body: bytes, seal: RecordSeal | None
) -> tuple[str | None, str | None]:
    """(the record as shown, the record sealed): a record that holds a secret value (a key
    the source echoes) is shown redacted and kept sealed for its replay; without a seal
    it is not kept (a replay never lands a redacted record)."""
    text = body.decode()
    if redact_text(text) == text:
        return text, None
    if seal is None:
        return None, None
    return jsonio.dumps(redact_json(record)).decode(), seal.seal(text)


class RecordSeal:
    """Quarantined records that hold a secret, sealed at rest (Fernet, under a key
    derived from the master key for this purpose alone: ``artemis.vault``); opened by
    the replay only."""

    PURPOSE = "quarantined-records"

    def __init__(self, key_file: str) -> None:
        self.key_file = key_file
        self._fernet: MultiFernet | None = None

    @property
    def fernet(self) -> MultiFernet:
        if self._fernet is None:  # (read when a record needs it: most runs never do)
            self._fernet = derive_multi(master_keys(self.key_file), self.PURPOSE)
        return self._fernet

    def seal(self, text: str) -> str:
        return self.fernet.encrypt(text.encode()).decode()

    def open(self, token: str) -> str:
        try:
            return self.fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                "a quarantined record cannot be opened with the master key "
                f"({MASTER_KEY_ENV}; a previous key belongs in {PREVIOUS_KEYS_ENV})",
                retryable=False,
            ) from None


@cache
def _statements(dialect: str) -> tuple[Any, Any, Any, Any]:
    """(the run's row, new rows, rows rewritten, the started run's count), built once per
    dialect: a page's rows go in one executemany of a statement compiled once."""
    from sqlalchemy.dialects import postgresql, sqlite

    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    run = insert(_RUNS).on_conflict_do_nothing(index_elements=["run_key"])
    rows = insert(_Q)
    rows = rows.on_conflict_do_update(
        index_elements=["run_key", "page_seq", "position"],
        set_={
            k: rows.excluded[k]
            for k in (
                "stage",
                "record_key",
                "record",
                "record_sealed",
                "record_bytes",
                "error_code",
                "field_path",
                "message",
                "updated_at",
            )
        },
    )
    fresh = (
        insert(_Q)
        .on_conflict_do_nothing(index_elements=["run_key", "page_seq", "position"])
        .returning(_Q.c.id)
    )
    count = select(func.count()).select_from(_Q).where(_Q.c.task_id == bindparam("p_task_id"))
    return run, fresh, rows, count


def store_bad(
    database_url: str,
    place: RunPlace,
    pages: list[tuple[int, list[BadRecord]]],
    max_record_bytes: int,
    with_run: bool = True,
    seal: RecordSeal | None = None,
) -> tuple[int, int]:
    """Keep each page's bad records, ``[(seq, bad)]`` (one row per record and place: a page
    judged again rewrites its rows); returns how many rows the started run
    (``place.task_id``) holds now, and how many of these are new. A record larger than
    ``max_record_bytes`` is kept with its reason but without its body (it cannot be
    replayed). ``with_run``: write what a replay needs of the run too (once per activity
    is enough). What the rows show is redacted as log lines are; a record holding a
    secret is kept sealed by ``seal`` (none: not kept)."""
    engine = get_engine(database_url)
    run_stmt, fresh_stmt, rows_stmt, count = _statements(engine.dialect.name)
    now = utcnow()
    rows = []
    for seq, bad in pages:
        rows.extend(_rows(place, seq, bad, max_record_bytes, now, seal))
    counted = {"p_task_id": place.task_id}
    with engine.begin() as c:
        if with_run:
            c.execute(
                run_stmt,
                {
                    "run_key": place.run_key,
                    "task_code": place.task_code,
                    "task_id": place.task_id,
                    "provenance": place.provenance,
                    "params": jsonio.dumps(place.params).decode(),
                    "output": jsonio.dumps(place.output).decode(),
                    "created_at": now,
                },
            )
        new = len(c.execute(fresh_stmt, rows).all()) if rows else 0
        if new < len(rows):  # a page judged again (a retried attempt): its rows rewritten
            c.execute(rows_stmt, rows)
        held = int(c.execute(count, counted).scalar_one())
    return held, new


def note_drift(
    database_url: str,
    place: RunPlace,
    seq: int,
    drift: list[Drift],
    action: str,
    actions: dict[str, str] | None = None,
) -> list[Drift]:
    """Record drift once per run and field; returns the drift not seen before in the run.
    ``action``: what became of a new field (``actions``: of each one, where they differ:
    ``evolved`` or ``skipped``)."""
    if not drift:
        return []
    engine = get_engine(database_url)
    insert = upsert_insert(engine)
    new: list[Drift] = []
    with engine.begin() as conn:
        for d in drift:
            done = conn.execute(
                insert(_DRIFT)
                .values(
                    # once per started run and field (a backfill's windows report it once)
                    run_key=_drift_key(place),
                    field_name=d.field,
                    kind=d.kind,
                    task_code=place.task_code,
                    task_id=place.task_id,
                    provenance=place.provenance,
                    page_seq=seq,
                    example=None if d.example is None else example_text(d.example),
                    type_name=d.type_name,
                    action=(actions or {}).get(d.field, action) if d.kind == "added" else "noted",
                    created_at=utcnow(),
                )
                .on_conflict_do_nothing(index_elements=["run_key", "field_name"])
            )
            if done.rowcount:
                new.append(d)
    return new


def _drift_key(place: RunPlace) -> str:
    return f"{place.task_code}/{place.task_id}"


def run_actions(database_url: str, place: RunPlace) -> dict[str, str]:
    """What the started run (all its windows) did with each new field it saw so far:
    field → ``evolved``, ``skipped``, ``discarded`` or ``frozen``."""
    q = select(_DRIFT.c.field_name, _DRIFT.c.action).where(
        _DRIFT.c.run_key == _drift_key(place), _DRIFT.c.kind == "added"
    )
    with get_engine(database_url).connect() as conn:
        return {str(f): str(a) for f, a in conn.execute(q).all()}


def run_drift(database_url: str, run_key: str) -> list[dict[str, Any]]:
    with get_engine(database_url).connect() as conn:
        rows = conn.execute(
            select(_DRIFT).where(_DRIFT.c.run_key == run_key).order_by(_DRIFT.c.created_at)
        ).all()
    return [dict(r._mapping) for r in rows]


# -- reading and replaying ---------------------------------------------------------------------


@dataclass(frozen=True)
class RowFilter:
    """Rows across runs: of one owner's runs (None: every owner's), of a provenance,
    set aside since an instant, of an error code."""

    owner: str | None = None
    provenance: str | None = None
    since: datetime | None = None
    code: str | None = None

    def where(self, q: Any) -> Any:
        if self.owner is not None:
            mine = owned_task_id(self.owner, "")
            # the default owner's task ids carry no owner: none holds the separator
            q = q.where(
                _Q.c.task_id.startswith(mine, autoescape=True)
                if mine
                else ~_Q.c.task_id.contains(OWNER_SEP, autoescape=True)
            )
        if self.provenance is not None:
            q = q.where(_Q.c.provenance == self.provenance)
        if self.since is not None:
            q = q.where(_Q.c.created_at >= self.since)
        if self.code is not None:
            q = q.where(_Q.c.error_code == self.code)
        return q


@dataclass
class RowPage:
    """Which quarantined rows to read, a page of them in id order: a run's
    (``task_id``), several runs' (``task_ids``), those of the runs ``across`` selects;
    of one status, of the ``ids`` given; from after ``after_id``, at most ``limit``."""

    task_id: str | None = None
    task_ids: list[str] | None = None
    status: str | None = None
    ids: list[int] | None = None
    across: RowFilter | None = None
    after_id: int = 0
    limit: int = 100


def list_rows(
    database_url: str,
    which: RowPage,
    *,
    with_record: bool = False,
    key_file: str | None = None,
) -> list[dict[str, Any]]:
    """The rows ``which`` names, in id order. ``with_record``: with the record as shown
    (redacted when it holds a secret); ``key_file`` too (the replay, in a worker): the
    record itself, opened from its seal."""
    left_out = {"record_sealed"}  # (the replay's alone)
    if not with_record:
        left_out.add("record")
    elif key_file:
        left_out.clear()
    cols = [c for c in _Q.c if c.name not in left_out]
    q = select(*cols).where(_Q.c.id > which.after_id)
    if which.ids is not None:
        q = q.where(_Q.c.id.in_(which.ids))
    if which.task_id is not None:
        q = q.where(_Q.c.task_id == which.task_id)
    if which.task_ids is not None:
        q = q.where(_Q.c.task_id.in_(which.task_ids))
    if which.status is not None:
        q = q.where(_Q.c.status == which.status)
    if which.across is not None:
        q = which.across.where(q)
    with get_engine(database_url).connect() as conn:
        rows = conn.execute(q.order_by(_Q.c.id).limit(which.limit)).all()
    out = [dict(r._mapping) for r in rows]
    if with_record and key_file:
        seal = RecordSeal(key_file)
        for row in out:
            sealed = row.pop("record_sealed", None)
            if sealed is not None:
                row["record"] = seal.open(sealed)
    return [_shown(row) for row in out]


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """A row as read: ``stage`` says which check set it aside, ``replay_from`` where a
    replay judges it again from (the column ``stage`` stores)."""
    row["replay_from"] = row.get("stage")
    row["stage"] = check_of(row.get("error_code")).value
    for name in ("record_key", "record"):
        if isinstance(row.get(name), str):
            row[name] = jsonio.loads(row[name])
    return row


def get_row(database_url: str, row_id: int) -> dict[str, Any] | None:
    """One row as shown (the API's view: a record holding a secret, redacted)."""
    cols = [c for c in _Q.c if c.name != "record_sealed"]
    with get_engine(database_url).connect() as conn:
        row = conn.execute(select(*cols).where(_Q.c.id == row_id)).first()
    return _shown(dict(row._mapping)) if row is not None else None


def counts(
    database_url: str, task_id: str | None, across: RowFilter | None = None
) -> dict[str, int]:
    """Rows by status: a run's (``task_id``), or those ``across`` selects."""
    q = select(_Q.c.status, func.count())
    if task_id is not None:
        q = q.where(_Q.c.task_id == task_id)
    if across is not None:
        q = across.where(q)
    with get_engine(database_url).connect() as conn:
        rows = conn.execute(q.group_by(_Q.c.status)).all()
    return {str(s): int(n) for s, n in rows}


def run_of(database_url: str, task_id: str) -> dict[str, Any] | None:
    with get_engine(database_url).connect() as conn:
        row = conn.execute(select(_RUNS).where(_RUNS.c.task_id == task_id)).first()
    if row is None:
        return None
    out = dict(row._mapping)
    out["params"] = jsonio.loads(out["params"])
    out["output"] = jsonio.loads(out["output"])
    return out


def discard(database_url: str, task_id: str, ids: list[int] | None = None) -> int:
    """Give up on quarantined records (kept, marked discarded, never replayed)."""
    q = update(_Q).where(_Q.c.task_id == task_id, _Q.c.status == QuarantineStatus.QUARANTINED.value)
    if ids is not None:
        q = q.where(_Q.c.id.in_(ids))
    with get_engine(database_url).begin() as conn:
        return conn.execute(
            q.values(status=QuarantineStatus.DISCARDED.value, updated_at=utcnow())
        ).rowcount


def mark_replayed(conn: Connection, row_id: int, by: str) -> None:
    conn.execute(
        update(_Q)
        .where(_Q.c.id == row_id, _Q.c.status == QuarantineStatus.QUARANTINED.value)
        .values(
            status=QuarantineStatus.REPLAYED.value,
            replays=_Q.c.replays + 1,
            replayed_by=by,
            updated_at=utcnow(),
        )
    )


def mark_still_bad(conn: Connection, row_id: int, bad: BadRecord) -> None:
    conn.execute(
        update(_Q)
        .where(_Q.c.id == row_id)
        .values(
            error_code=bad.code,
            field_path=(bad.field or None) and redact_text(str(bad.field))[:300],
            message=redact_text(bad.message)[:2000],
            replays=_Q.c.replays + 1,
            updated_at=utcnow(),
        )
    )


def drop_older_than(database_url: str, days: float) -> int:
    """Housekeeping: rows (and their runs' replay data) older than ``days``."""
    before = utcnow() - timedelta(days=days)
    with get_engine(database_url).begin() as conn:
        n = conn.execute(delete(_Q).where(_Q.c.created_at < before)).rowcount
        kept = select(_Q.c.run_key).distinct()
        conn.execute(delete(_RUNS).where(_RUNS.c.created_at < before, _RUNS.c.run_key.not_in(kept)))
        conn.execute(delete(_DRIFT).where(_DRIFT.c.created_at < before))
    return int(n or 0)
