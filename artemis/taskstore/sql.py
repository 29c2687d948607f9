"""TaskStorage on SQL (SQLite or PostgreSQL): table ``async_tasks``, optimistic lock on a
``version`` column, expired tasks invisible to load and removed in batches."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, Index, and_, bindparam, delete, func, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Field, SQLModel

from artemis.db import UTCDateTime, get_engine, run_transaction, upsert_insert, utcnow
from artemis.owners import DEFAULT_OWNER, SEP, owned_task_id
from artemis.run_state import RunStatus, Verdict
from artemis.taskstore.base import (
    TERMINAL,
    ConcurrentModification,
    StatusChange,
    StorageUnavailable,
    TaskData,
    TaskNotFound,
    TaskStorage,
    TaskValidationError,
    check_status,
    decode_cursor,
    encode_cursor,
    utc,
)


class AsyncTask(SQLModel, table=True):
    __tablename__ = "async_tasks"
    __table_args__ = (
        Index("ix_async_tasks_status_completed", "status", "completed_at"),
        Index("ix_async_tasks_code_created", "task_code", "created_at"),
        Index("ix_async_tasks_created", "created_at"),
    )

    task_id: str = Field(primary_key=True, max_length=200)
    task_code: str = Field(default="", max_length=100)
    workflow_id: str | None = Field(default=None, max_length=300)
    status: str = Field(max_length=16)
    payload: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    result: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    error: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    feedback: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    completed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime = Field(sa_type=UTCDateTime)
    version: int = 0


_t = AsyncTask.__table__  # type: ignore[attr-defined]
_COLUMNS = [c for c in _t.c.keys() if c != "expires_at"]


def _set_status_statement(
    started: str | None, terminal: bool, has_result: bool, has_error: bool
) -> Any:
    """``set_status``'s UPDATE for one shape of its arguments, every value a parameter:
    ``started`` "given" sets started_at, "kept" sets it unless set (the record's first
    start wins), None leaves it."""
    now = bindparam("p_now", type_=UTCDateTime())
    values: dict[str, Any] = {
        "status": bindparam("p_status"),
        "updated_at": now,
        "version": _t.c.version + 1,
        "expires_at": bindparam("p_expires", type_=UTCDateTime()),
    }
    if started == "given":
        values["started_at"] = bindparam("p_started", type_=UTCDateTime())
    elif started == "kept":
        values["started_at"] = func.coalesce(_t.c.started_at, now)
    if terminal:
        values["completed_at"] = now
    if has_result:
        values["result"] = bindparam("p_result", type_=_t.c.result.type)
    if has_error:
        values["error"] = bindparam("p_error", type_=_t.c.error.type)
    return (
        update(_t)
        .where(
            _t.c.task_id == bindparam("p_task_id"),
            _t.c.expires_at > bindparam("p_wall", type_=UTCDateTime()),
        )
        .values(**values)
    )


class SqlTaskStorage(TaskStorage):
    def __init__(self, database_url: str, ttl_hours: int = 24) -> None:
        self.engine: Engine = get_engine(database_url)
        self.ttl = timedelta(hours=ttl_hours)
        self._insert = upsert_insert(self.engine)
        # Built once: SQLAlchemy builds ``excluded`` anew on every access (most of a save's
        # CPU when it was built per call); the values come as parameters.
        upsert = self._insert(_t)
        every = {k: upsert.excluded[k] for k in (*_COLUMNS, "expires_at") if k != "task_id"}
        self._upsert = upsert.on_conflict_do_update(index_elements=["task_id"], set_=every)
        # Insert-if-absent, where a record past its TTL counts as absent (``load`` does not
        # see it, and nothing else would ever replace it: a run that outlived the TTL
        # could not record its ending). ``now_`` is the caller's clock.
        self._create_many = upsert.on_conflict_do_update(  # an executemany: no RETURNING
            index_elements=["task_id"],
            set_=every,
            where=_t.c.expires_at <= bindparam("now_", type_=UTCDateTime()),
        )
        self._create = self._create_many.returning(_t.c.task_id)
        # set_status's UPDATE of each shape, built once (building it was most of its CPU).
        self._set_status: dict[tuple[str | None, bool, bool, bool], Any] = {}

    def _row(self, data: TaskData) -> dict[str, Any]:
        row = json.loads(data.model_dump_json())
        for key in ("created_at", "started_at", "completed_at", "updated_at"):
            row[key] = getattr(data, key)
        row["expires_at"] = data.updated_at + self.ttl
        return row

    def save(self, task_id: str, data: TaskData) -> None:
        self.same_id(task_id, data)
        try:
            with self.engine.begin() as conn:
                conn.execute(self._upsert, self._row(data))
        except OperationalError as e:
            raise StorageUnavailable(str(e)) from None

    def create(self, task_id: str, data: TaskData) -> bool:
        self.same_id(task_id, data)
        try:
            with self.engine.begin() as conn:
                row = {**self._row(data), "now_": datetime.now(UTC)}
                return conn.execute(self._create, row).first() is not None
        except OperationalError as e:
            raise StorageUnavailable(str(e)) from None

    def create_many(self, tasks: list[TaskData]) -> None:
        if not tasks:
            return
        # One transaction (one commit, one wait for SQLite's write lock), each row
        # insert-if-absent as ``create``.
        try:
            with self.engine.begin() as conn:
                now = datetime.now(UTC)
                conn.execute(self._create_many, [{**self._row(d), "now_": now} for d in tasks])
        except OperationalError as e:
            raise StorageUnavailable(str(e)) from None

    def _get(self, conn: Any, task_id: str) -> TaskData | None:
        row = conn.execute(select(_t).where(_t.c.task_id == task_id)).first()
        if row is None:
            return None
        m = dict(row._mapping)
        if m["expires_at"] <= datetime.now(UTC):
            return None
        m.pop("expires_at")
        return TaskData.model_validate(m)

    def load(self, task_id: str) -> TaskData | None:
        try:
            with self.engine.connect() as conn:
                return self._get(conn, task_id)
        except OperationalError as e:
            raise StorageUnavailable(str(e)) from None

    def update_status(
        self, task_id: str, change: StatusChange | str, *, expected_version: int | None = None
    ) -> TaskData:
        with self.engine.begin() as conn:
            current = self._get(conn, task_id)
            if current is None:
                raise TaskNotFound(task_id)
            version = current.version if expected_version is None else expected_version
            now = datetime.now(UTC)
            changes, updated = self.transition(current, StatusChange.of(change), version)
            values = {k: getattr(updated, k) for k in changes}
            done = conn.execute(
                update(_t)
                .where(_t.c.task_id == task_id, _t.c.version == version)
                .values(**values, version=version + 1, expires_at=now + self.ttl)
            ).rowcount
            if done == 0:
                raise ConcurrentModification(f"task {task_id} changed (expected version {version})")
            return updated

    def set_status(
        self,
        task_id: str,
        change: StatusChange | str,
        *,
        absent: Callable[[], TaskData] | None = None,
    ) -> None:
        # One UPDATE with ``stamped``'s rules in it, instead of a read, a validation and a
        # compare-and-set write: a run mirrors itself twice, and the read and the models
        # were most of that (6 % of a worker's CPU on the accept bench). ``absent()`` is
        # inserted (if absent) and updated in the same transaction.
        change = StatusChange.of(change)
        status, result, error = change.status, change.result, change.error
        started_at = change.started_at
        check_status(status, result, error)
        wall = datetime.now(UTC)
        now = utc(change.at) or wall
        started = (
            "given"
            if started_at is not None
            else "kept"
            if status == RunStatus.RUNNING or status in TERMINAL
            else None
        )
        shape = (started, status in TERMINAL, result is not None, error is not None)
        stmt = self._set_status.get(shape)
        if stmt is None:
            stmt = self._set_status[shape] = _set_status_statement(*shape)
        params: dict[str, Any] = {
            "p_task_id": task_id,
            "p_wall": wall,
            "p_status": status,
            "p_now": now,
            "p_expires": wall + self.ttl,
            "p_started": utc(started_at) if started_at is not None else now,
            "p_result": result,
            "p_error": error,
        }
        try:
            # (artemis.db: on SQLite, its driver)
            with run_transaction(self.engine) as conn:
                done = conn.execute(stmt, params).rowcount
                if done == 0 and absent is not None:
                    record = absent()
                    self.same_id(task_id, record)
                    conn.execute(self._create_many, {**self._row(record), "now_": wall})
                    done = conn.execute(stmt, params).rowcount
        except OperationalError as e:
            raise StorageUnavailable(str(e)) from None
        if done == 0:
            raise TaskNotFound(task_id)

    def delete(self, task_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(_t).where(_t.c.task_id == task_id))

    def delete_expired(self, before: datetime, batch_size: int = 1000) -> int:
        total = 0
        while True:
            with self.engine.begin() as conn:  # short transactions: no long table locks
                ids = (
                    conn.execute(
                        select(_t.c.task_id)
                        .where(_t.c.status.in_(TERMINAL), _t.c.completed_at < before)
                        .limit(batch_size)
                    )
                    .scalars()
                    .all()
                )
                if not ids:
                    return total
                total += conn.execute(delete(_t).where(_t.c.task_id.in_(ids))).rowcount

    def list(
        self,
        *,
        status: str | None = None,
        code: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        owner: str | None = None,
    ) -> tuple[list[TaskData], str | None]:
        q = select(_t).where(_t.c.expires_at > datetime.now(UTC))
        if owner == DEFAULT_OWNER:
            q = q.where(~_t.c.task_id.contains(SEP, autoescape=True))
        elif owner:
            q = q.where(_t.c.task_id.startswith(owned_task_id(owner, ""), autoescape=True))
        if status:
            q = q.where(_t.c.status == status)
        if code:
            q = q.where(_t.c.task_code == code)
        if cursor:
            created, task_id = decode_cursor(cursor)
            q = q.where(
                or_(
                    _t.c.created_at < created,
                    and_(_t.c.created_at == created, _t.c.task_id < task_id),
                )
            )
        q = q.order_by(_t.c.created_at.desc(), _t.c.task_id.desc()).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = conn.execute(q).fetchall()
        items = []
        for row in rows[:limit]:
            m = dict(row._mapping)
            m.pop("expires_at")
            items.append(TaskData.model_validate(m))
        nxt = (
            encode_cursor(items[-1].created_at, items[-1].task_id)
            if len(rows) > limit and items
            else None
        )
        return items, nxt

    def record_feedback(self, task_id: str, status: str, comment: str | None = None) -> TaskData:
        if status not in tuple(Verdict):
            raise TaskValidationError("feedback status must be success or failed")
        with self.engine.begin() as conn:
            current = self._get(conn, task_id)
            if current is None:
                raise TaskNotFound(task_id)
            feedback = {"status": status, "comment": comment, "at": datetime.now(UTC).isoformat()}
            conn.execute(
                update(_t)
                .where(_t.c.task_id == task_id)
                .values(feedback=feedback, version=_t.c.version + 1)
            )
            return current.model_copy(update={"feedback": feedback, "version": current.version + 1})
