"""The Artemis database: one engine factory (SQLite with WAL by default, PostgreSQL at
scale) and the SQLModel tables of the foundation; schema changes go through Alembic."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, Index, Text, TypeDecorator, UniqueConstraint, event
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.dialects.sqlite import pysqlite
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlmodel import Column, Field, SQLModel, create_engine


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timestamps stored as naive UTC (both SQLite and PostgreSQL), returned timezone-aware."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class StagedPage(SQLModel, table=True):
    """Claim check: the records of one fetched page, kept out of workflow history.

    ``kind`` is ``raw`` (as fetched) or ``processed`` (after the task's ``process``). The
    (run_key, kind, seq) key makes re-staging after a retry an overwrite, never a duplicate.
    """

    __tablename__ = "staged_page"
    __table_args__ = (
        UniqueConstraint("run_key", "kind", "seq", name="uq_staged_page_run_kind_seq"),
        Index("ix_staged_page_run_digest", "run_key", "digest"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_key: str = Field(max_length=200, index=True)
    kind: str = Field(max_length=16)
    seq: int
    record_count: int = 0
    payload: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # A fingerprint of the page's record keys (raw pages): a source serving any earlier
    # page of the run again is caught by content (SOURCE_LOOP), however far back.
    digest: str | None = Field(default=None, max_length=40)


class RetainedRun(SQLModel, table=True):
    """A run that failed with a retryable code (docs/architecture.md): what POST
    /tasks/{id}/retry needs to finish it — the run's request and its carry (checkpoint,
    next page, the pages staged but not delivered, stats; references and counts only, no
    record and no secret). Its staged pages and secret stay with it until ``expires_at``
    (``runs.retain_failed_s``), then the clean-up loop drops them all."""

    __tablename__ = "retained_run"

    run_key: str = Field(primary_key=True, max_length=200)
    task_code: str = Field(max_length=128)
    task_id: str = Field(max_length=200, index=True)
    workflow_id: str = Field(max_length=300)
    error_code: str = Field(max_length=64)
    error_message: str = Field(sa_column=Column(Text, nullable=False))
    state: str = Field(sa_column=Column(Text, nullable=False))
    retained_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime = Field(sa_type=UTCDateTime, index=True)
    # Set when a retry took the state (a second retry of the same failure is refused).
    taken_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class SinkFile(SQLModel, table=True):
    """A file the files sink wrote for a run (one per page and sink): what the run's
    ``_manifest.json`` lists at finalize. Dropped with the run's staged pages."""

    __tablename__ = "sink_file"

    run_key: str = Field(primary_key=True, max_length=200)
    sink: str = Field(primary_key=True, max_length=64)
    seq: int = Field(primary_key=True)
    path: str = Field(sa_column=Column(Text, nullable=False))
    records: int
    bytes: int
    written_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RunSecret(SQLModel, table=True):
    """Per-run secrets (a callback token sent with the request), encrypted at rest, so the
    workflow input only carries a reference to them."""

    __tablename__ = "run_secret"
    __table_args__ = (Index("ix_run_secret_created", "created_at"),)

    run_key: str = Field(primary_key=True, max_length=200)
    name: str = Field(primary_key=True, max_length=64)
    ciphertext: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


_UPSERT_INSERTS: dict[str, Any] = {"postgresql": pg_insert, "sqlite": sqlite_insert}


def upsert_insert(engine: Engine) -> Any:
    """The dialect's ``insert`` with ``on_conflict_do_update/nothing`` (PostgreSQL or
    SQLite, the two databases Artemis runs on); ValueError for any other."""
    try:
        return _UPSERT_INSERTS[engine.dialect.name]
    except KeyError:
        raise ValueError(
            f"dialect {engine.dialect.name!r} is not supported (sqlite, postgresql)"
        ) from None


@contextmanager
def transaction(engine: Engine, conn: Connection | None = None) -> Iterator[Connection]:
    """The caller's transaction when it gives one (several writes, one commit), else a
    transaction of its own, committed at the end of the block."""
    if conn is not None:
        yield conn
        return
    with engine.begin() as own:
        yield own


# How long a statement made on the event loop waits for SQLite's write lock before it gives
# way (``LoopBusy``), and a thread's; for how long after a give-way the loop's statements
# go straight to threads. Why: ``artemis.calls``, the policy that places them.
LOOP_BUSY_MS = 20
THREAD_BUSY_MS = 30_000
LOOP_BACKOFF_S = 0.2
_caller = threading.local()
_loop_busy_until = 0.0


class LoopBusy(Exception):
    """SQLite's write lock is held elsewhere: the call made on the event loop gave way
    (its transaction rolled back) and belongs in a thread."""


@contextmanager
def loop_statements() -> Iterator[None]:
    """The block's statements are made on the event loop (``artemis.calls``): they wait
    ``LOOP_BUSY_MS`` for the write lock, do not checkpoint the WAL, and keep their pooled
    connection for the loop's next block. ``LoopBusy`` when the lock is someone else's —
    now, or a call gave way less than ``LOOP_BACKOFF_S`` ago (then nothing runs)."""
    if time.monotonic() < _loop_busy_until:
        raise LoopBusy("a call on the loop gave way moments ago")
    was = getattr(_caller, "on_loop", False)
    _caller.on_loop = True
    try:
        yield
    finally:
        _caller.on_loop = was


def get_engine(url: str) -> Engine:
    """One engine per URL per process."""
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _make_engine(url)
            _engines[url] = engine
        return engine


def _make_engine(url: str) -> Engine:
    engine = create_engine(url, **_engine_options(url))
    if url.startswith("sqlite"):
        _add_sqlite_listeners(engine)
    return engine


def _engine_options(url: str) -> dict[str, Any]:
    """``create_engine``'s options for ``url`` (a SQLite file's folder made here)."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        if make_url(url).database not in (None, "", ":memory:"):
            # More connections than threads can want at once (the default executor's 32,
            # the event writers', the sinks'): a call on the loop never waits for the pool
            # while threads hold connections waiting out SQLite's lock.
            kwargs["pool_size"], kwargs["max_overflow"] = 5, 60
            # The connection checked in last goes out first: the loop's calls (one at a
            # time) keep taking the one they returned, whose pragmas are the loop's,
            # instead of turning the pool over and resetting a thread's on every call.
            kwargs["pool_use_lifo"] = True
    else:
        kwargs["pool_pre_ping"] = True
        if url.startswith("postgresql"):
            # A server that stops answering (not refusing) is cut, not waited on: a
            # connection within 10 s, and TCP keepalives find a dead peer in about 30 s.
            kwargs["connect_args"] = {
                "connect_timeout": 10,
                "keepalives": 1,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 4,
            }
    return kwargs


def _add_sqlite_listeners(engine: Engine) -> None:
    """A SQLite engine's pragmas, set by caller (the loop or a thread) on connect and on
    checkout, and its lock met on the loop turned into ``LoopBusy``."""

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn, record):  # noqa: ANN001
        here = getattr(_caller, "on_loop", False)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={LOOP_BUSY_MS if here else THREAD_BUSY_MS}")
        cur.execute(f"PRAGMA wal_autocheckpoint={0 if here else 1000}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
        record.info["on_loop"] = here

    @event.listens_for(engine, "checkout")
    def _caller_pragmas(dbapi_conn, record, _proxy):  # noqa: ANN001
        # A pooled connection serves the loop and threads in turn: its wait for the
        # write lock (and whether it checkpoints) follows its caller's.
        here = getattr(_caller, "on_loop", False)
        if record.info.get("on_loop") != here:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={LOOP_BUSY_MS if here else THREAD_BUSY_MS}")
            cur.execute(f"PRAGMA wal_autocheckpoint={0 if here else 1000}")
            cur.close()
            record.info["on_loop"] = here

    @event.listens_for(engine, "handle_error")
    def _gave_way(context):  # noqa: ANN001
        if _busy_on_loop(context.original_exception):
            raise LoopBusy(str(context.original_exception))


def _busy_on_loop(error: BaseException) -> bool:
    """Whether ``error`` is SQLite's write lock held elsewhere, met by a call on the loop:
    then the loop's next calls go to threads for ``LOOP_BACKOFF_S``."""
    if not (getattr(_caller, "on_loop", False) and _is_busy(error)):
        return False
    global _loop_busy_until
    _loop_busy_until = time.monotonic() + LOOP_BACKOFF_S
    return True


# -- SQLite's driver, for a run's hottest statements -----------------------------------------
# A run's events, its staged pages, its task record and its clean-up go, on SQLite, to the
# sqlite3 connection of a pooled connection (``run_transaction``), as SQLAlchemy Core
# statements compiled once each: SQLAlchemy's work per execution (a Connection and a
# Transaction object, the parameters' processing, a result) cost about as much as SQLite's
# own (a two-row INSERT: ~170 µs through ``engine.begin()``, ~95 µs on the driver; ten
# statements a run). The pool and its events (the caller's pragmas), the statements, the
# schema and the values' types stay SQLAlchemy's; PostgreSQL keeps SQLAlchemy's path.
_NAMED = pysqlite.dialect(paramstyle="named")


class DriverSQL:
    """An SQLAlchemy Core statement compiled once for SQLite's driver: ``sql`` with named
    parameters, and ``params`` giving the values as SQLAlchemy would bind them (each
    through its type's bind processor: a ``UTCDateTime`` as naive UTC text, JSON as text),
    with the values the statement holds itself (``version + 1``). ``column_keys``: the
    columns an INSERT gives (SQLAlchemy compiles an INSERT for the keys of its rows)."""

    def __init__(self, statement: Any, column_keys: list[str] | None = None) -> None:
        compiled = statement.compile(dialect=_NAMED, column_keys=column_keys)
        self.sql: str = compiled.string
        self._own: dict[str, Any] = {}
        self._processors: list[tuple[str, Callable[[Any], Any]]] = []
        for bind, name in compiled.bind_names.items():
            if not bind.required and bind.callable is None and bind.value is not None:
                self._own[name] = bind.value
            processor = bind.type.dialect_impl(_NAMED).bind_processor(_NAMED)
            if processor is not None:
                self._processors.append((name, processor))

    def params(self, values: dict[str, Any]) -> dict[str, Any]:
        bound = {**self._own, **values}
        for name, processor in self._processors:
            if name in bound:
                bound[name] = processor(bound[name])
        return bound


class DriverResult:
    """What a statement on the driver gives back: the rows it touched, its first row."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor
        self.rowcount: int = cursor.rowcount

    def first(self) -> tuple[Any, ...] | None:
        """The first row; the statement is done with (a read left open would keep the
        connection's snapshot: the loop keeps its connection)."""
        row: tuple[Any, ...] | None = self._cursor.fetchone()
        self._cursor.close()
        return row

    def scalar(self) -> Any:
        row = self.first()
        return None if row is None else row[0]


class DriverConnection:
    """SQLite's driver connection taking SQLAlchemy Core statements as a ``Connection``
    does: ``execute(statement, params)``, a list of parameter sets an executemany. Each
    statement (and an INSERT's set of keys) is compiled once, in a bounded cache that
    holds the statement (a run's statements are module constants)."""

    _compiled: dict[tuple[Any, tuple[str, ...] | None], DriverSQL] = {}

    def __init__(self, driver: sqlite3.Connection) -> None:
        self.driver = driver

    def execute(
        self, statement: Any, params: dict[str, Any] | list[dict[str, Any]] | None = None
    ) -> DriverResult:
        rows = params if isinstance(params, list) else [params or {}]
        keys = tuple(rows[0]) if statement.is_insert else None
        sql = self._compiled.get((statement, keys))
        if sql is None:
            if len(self._compiled) >= 256:
                self._compiled.clear()
            sql = self._compiled[(statement, keys)] = DriverSQL(
                statement, None if keys is None else list(keys)
            )
        if isinstance(params, list):
            return DriverResult(self.driver.executemany(sql.sql, [sql.params(r) for r in rows]))
        return DriverResult(self.driver.execute(sql.sql, sql.params(rows[0])))


@contextmanager
def run_transaction(engine: Engine) -> Iterator[Any]:
    """A transaction for a run's hottest statements, committed when the block ends: on
    SQLite a ``DriverConnection`` (``driver_transaction``), else ``engine.begin()``'s
    Connection. Both take ``execute(statement, params)`` and give ``rowcount``,
    ``first()`` and ``scalar()``."""
    if engine.dialect.name == "sqlite":
        with driver_transaction(engine) as driver:
            yield DriverConnection(driver)
    else:
        with engine.begin() as conn:
            yield conn


@contextmanager
def driver_transaction(engine: Engine) -> Iterator[sqlite3.Connection]:
    """A transaction on the sqlite3 connection of one of ``engine``'s pooled connections
    (its pragmas the pool's events set for the caller: the loop's or a thread's),
    committed when the block ends and rolled back when it raises. A call on the loop
    keeps its pooled connection checked out for the next one (the loop's calls come one at
    a time, and a checkout and check-in were as much again as the statement; after an
    error it is rolled back and kept, as the pool would hand it out again; one that cannot
    roll back is checked in, where the pool's reset deals with it).
    Errors come as SQLAlchemy's own statements raise them: SQLite's write lock held
    elsewhere, met on the loop, is ``LoopBusy``; any other sqlite3 error is SQLAlchemy's
    ``DBAPIError`` of its kind (``OperationalError``, ``IntegrityError``, ...)."""
    held: dict[Engine, Any] | None = (
        _caller.__dict__.setdefault("held", {}) if getattr(_caller, "on_loop", False) else None
    )
    try:
        pooled = held.get(engine) if held is not None else None
        if pooled is None:
            pooled = engine.raw_connection()
            if held is not None:
                held[engine] = pooled
    except sqlite3.Error as e:
        raise _as_sqlalchemy(e) from None
    keep = held is not None
    try:
        driver = pooled.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        try:
            yield driver
            driver.commit()
        except BaseException as e:
            try:
                driver.rollback()
            except sqlite3.Error:
                keep = False  # one that cannot roll back goes back to the pool's care
            if isinstance(e, sqlite3.Error):
                raise _as_sqlalchemy(e) from None
            raise
    finally:
        if not keep:
            if held is not None:
                held.pop(engine, None)
            pooled.close()


def release_held() -> None:
    """Check in the pooled connections this thread's loop calls keep (``driver_transaction``):
    the next call checks one out afresh (its checkout events run again)."""
    for pooled in _caller.__dict__.pop("held", {}).values():
        pooled.close()


def _is_busy(error: BaseException) -> bool:
    return isinstance(error, sqlite3.OperationalError) and "locked" in str(error)


def _as_sqlalchemy(error: sqlite3.Error) -> Exception:
    if _busy_on_loop(error):
        return LoopBusy(str(error))
    return DBAPIError.instance(None, None, error, sqlite3.Error)
