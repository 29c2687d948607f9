"""A run's hottest statements (``artemis.db.run_transaction``): on SQLite they go to the
sqlite3 driver as SQLAlchemy Core statements compiled once, on PostgreSQL through
SQLAlchemy. What they store must be what SQLAlchemy stores, their errors must be
SQLAlchemy's, and a fetch attempt's start (``Staging.start_attempt``: the staged cursor
read and the leftovers dropped in one transaction) must hold on both databases."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError, OperationalError

from artemis.db import (
    DriverConnection,
    get_engine,
    loop_statements,
    release_held,
    run_transaction,
)
from artemis.errors import ArtemisError
from artemis.migrate import upgrade
from artemis.staging import Staging
from artemis.taskstore.sql import SqlTaskStorage, _t


def _url(engine) -> str:  # noqa: ANN001
    return engine.url.render_as_string(hide_password=False)


def test_rows_written_on_the_driver_are_those_sqlalchemy_writes(tmp_path) -> None:
    """The same INSERT (timestamps, JSON, an upsert's ``excluded``) through SQLAlchemy and
    through the driver: the stored text is the same, column by column."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    store = SqlTaskStorage(url)
    engine = store.engine
    when = datetime(2026, 11, 27, 21, 0, 0, 5, tzinfo=UTC)
    row = {
        "task_code": "c",
        "workflow_id": "w",
        "status": "running",
        "payload": {"n": [1, 2.5, "é"], "none": None},
        "result": {"records": 3},
        "error": None,
        "feedback": None,
        "created_at": when,
        "started_at": when,
        "completed_at": None,
        "updated_at": when + timedelta(microseconds=1),
        "expires_at": when + timedelta(hours=1),
        "version": 0,
        "now_": when,
    }
    with engine.begin() as conn:
        conn.execute(store._create_many, {**row, "task_id": "by-sqlalchemy"})
    with run_transaction(engine) as conn:
        assert isinstance(conn, DriverConnection)
        conn.execute(store._create_many, {**row, "task_id": "by-driver"})
    with engine.connect() as conn:
        stored = {
            r[0]: r[1:] for r in conn.execute(text("SELECT * FROM async_tasks ORDER BY task_id"))
        }
    assert stored["by-driver"] == stored["by-sqlalchemy"]
    assert "2026-11-27 21:00:00.000005" in stored["by-driver"]
    # and SQLAlchemy reads the driver's row back as it wrote it
    with engine.connect() as conn:
        back = conn.execute(select(_t).where(_t.c.task_id == "by-driver")).one()._mapping
    assert back["payload"] == row["payload"] and back["created_at"] == when


def test_errors_on_the_driver_are_sqlalchemy_s_and_roll_back(tmp_path) -> None:
    """A failed statement rolls the whole transaction back and comes out as SQLAlchemy's
    error of its kind; the staging store names an unreachable table as its outage."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade(url)
    engine = get_engine(url)
    staging = Staging(url)
    key = f"run/{uuid.uuid4().hex}"
    with pytest.raises(IntegrityError):
        with run_transaction(engine) as conn:
            conn.execute(text("INSERT INTO run_secret VALUES ('k', 'n', 'c', '2026-01-01')"))
            conn.execute(text("INSERT INTO run_secret VALUES ('k', 'n', 'c', '2026-01-01')"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM run_secret")).scalar() == 0
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE staged_page"))
    with pytest.raises(ArtemisError) as caught:
        staging.put_pages(key, "raw", [(0, [{"a": 1}])])
    assert caught.value.retryable and caught.value.details["dependency"] == "store"
    assert "no such table" in str(caught.value)
    with pytest.raises(OperationalError):
        with run_transaction(engine) as conn:
            conn.execute(text("SELECT * FROM staged_page"))


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_fetch_attempt_starts_after_its_batch_s_staged_cursor(db, tmp_path, request) -> None:
    """A streaming attempt of a batch goes on from the cursor an earlier attempt of the
    same batch staged beyond where its heartbeat stands; a cursor of another batch, or not
    beyond, is not taken. Either way the raw pages from where the attempt starts go, in
    the same transaction; processed pages stay."""
    url = (
        f"sqlite:///{tmp_path / 'c.db'}"
        if db == "sqlite"
        else request.getfixturevalue("pg_server").url
    )
    upgrade(url)
    staging = Staging(url)
    key = f"run/{uuid.uuid4().hex}"

    def stage() -> None:
        staging.put_pages(key, "raw", [(0, [{"n": 0}])])
        cursor = {"first_seq": 0, "next_seq": 2, "pages": 2, "checkpoint": {"page": 3}}
        staging.put_pages(key, "raw", [(1, [{"n": 1}])], cursor=cursor)
        staging.put_pages(key, "raw", [(2, [{"n": 2}]), (3, [{"n": 3}])])
        staging.put_pages(key, "processed", [(2, [{"n": 2}])])

    def raw() -> list[int]:
        return [seq for seq, _ in staging.get_pages(key, "raw", 0, 10)]

    stage()
    resumed = staging.start_attempt(key, 0, batch_first_seq=0)
    assert resumed == {"next_seq": 2, "pages": 2, "checkpoint": {"page": 3}}
    assert raw() == [0, 1]
    assert [seq for seq, _ in staging.get_pages(key, "processed", 0, 10)] == [2]
    stage()
    assert staging.start_attempt(key, 1, batch_first_seq=5) is None  # another batch's
    assert raw() == [0]
    stage()
    assert staging.start_attempt(key, 3, batch_first_seq=0) is None  # not beyond
    assert raw() == [0, 1, 2]
    stage()
    assert staging.start_attempt(key, 1) is None  # not streaming: no cursor read
    assert raw() == [0]


def test_the_loop_keeps_its_connection_between_calls(tmp_path) -> None:
    """The loop's calls (one at a time) keep one pooled connection checked out; a thread
    takes its own from the pool. After an error it is rolled back and goes on serving the
    loop; ``release_held`` checks it in."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    upgrade(url)
    engine = get_engine(url)

    def driver(sql: str = "SELECT 1") -> object:
        with run_transaction(engine) as conn:
            conn.execute(text(sql))
            return conn.driver

    def on_loop(fn: Callable[..., object], *args: object) -> object:
        with loop_statements():  # as artemis.calls.statement runs a call on the loop
            return fn(*args)

    release_held()
    first = on_loop(driver)
    assert on_loop(driver) is first
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(driver).result() is not first
    duplicate = "INSERT INTO run_secret VALUES ('k', 'n', 'c', '2026-01-01')"
    on_loop(driver, duplicate)
    with pytest.raises(IntegrityError):
        on_loop(driver, duplicate)
    assert on_loop(driver) is first
    with pytest.raises(OperationalError):
        on_loop(driver, "SELECT * FROM no_such_table")
    assert on_loop(driver) is first
    on_loop(driver, duplicate.replace("'n'", "'m'"))
    with engine.connect() as conn:  # and what the loop wrote is there for everyone
        assert conn.execute(text("SELECT count(*) FROM run_secret")).scalar() == 2
    release_held()
