"""Where Artemis' own short statements run (``artemis.db.on_loop``): on the event loop's
thread for SQLite (a local file, cheaper than the hop to a thread), in a worker thread for
PostgreSQL (network round trips must not hold the loop). Observed through SQLAlchemy's
own cursor events on a real database of each kind. And which task hooks skip the thread:
those a task leaves to the base class (``own_hooks``)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import sqlite3
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from activities import prepare as prepare_module
from activities.prepare import PREPARE_HOOKS
from activities.run_base import on_loop_if, own_hooks
from artemis.db import LOOP_BACKOFF_S, on_loop
from artemis.events import EventLog, EventWriter
from artemis.migrate import upgrade
from artemis.sinks.factory import builds_offline
from artemis.staging import Staging
from artemis.tasks.registry import get_task
from tests.conftest import new_task_id
from tests.helpers import slow_callbacks_reported

# A step of the loop longer than this is a stall (asyncio's own debug report); the lock
# is held for 1.5 s, and a call that gave way holds the loop for about 20 ms.
STALL_S = 0.75


@contextmanager
def _statement_threads(engine: Engine, marker: str) -> Iterator[list[int]]:
    """The thread ids that executed a statement containing ``marker`` on ``engine``."""
    seen: list[int] = []

    def before(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if marker in statement:
            seen.append(threading.get_ident())

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


async def test_on_db_runs_sqlite_on_the_loop_and_postgresql_in_a_thread(db_engine) -> None:
    here = on_loop(db_engine)
    assert here == (db_engine.dialect.name == "sqlite")

    def query() -> int:
        with db_engine.connect() as conn:
            return int(conn.execute(text("SELECT 41 + 1 AS on_db_probe")).scalar_one())

    with _statement_threads(db_engine, "on_db_probe") as seen:
        assert await on_loop_if(here, query) == 42
    assert len(seen) == 1
    assert (seen[0] == threading.get_ident()) is here


async def test_event_writer_groups_concurrent_appends_on_either_database(db_engine) -> None:
    """Ten concurrent appends: one commit where the writer runs on the loop (SQLite), at
    most two in a thread (the first goes alone, the rest gather behind it); every event is
    there, in the order appended, either way."""
    log = EventLog(_url(db_engine))
    writer = EventWriter(log)
    task_id = new_task_id()
    with _statement_threads(db_engine, "INSERT INTO") as seen:
        await asyncio.gather(*(writer.append(task_id, "probe", {"n": n}) for n in range(10)))
    kinds = [(e.kind, e.data) for e in log.since(task_id)]
    assert kinds == [("probe", {"n": n}) for n in range(10)]
    if on_loop(db_engine):
        assert seen == [threading.get_ident()]
    else:
        assert 1 <= len(seen) <= 2
        assert threading.get_ident() not in seen


def test_own_hooks_tells_a_task_s_hooks_from_the_base_class_defaults() -> None:
    """A task that leaves its prepare and finalize hooks to the base class has them called
    on the loop; one with its own (the literature task's registry queries) in a thread."""
    quotes, literature = get_task("pull_stock_quotes"), get_task("literature_harvest")
    assert not own_hooks(quotes, *PREPARE_HOOKS, "finalize", "run_ended")
    assert own_hooks(literature, *PREPARE_HOOKS)
    assert own_hooks(literature, "finalize")
    assert own_hooks(quotes, "process")  # its own shaping of a page


def test_sinks_built_without_io_are_built_in_place_only_when_resolved() -> None:
    """A run's sinks are built on the loop only when its resolved output names sinks whose
    construction does no I/O; a sql or files sink (an engine, a filesystem) or an output
    an earlier build left unresolved goes to a thread."""
    assert builds_offline({"resolved": True, "sinks": ["http", "log"], "http_endpoint": "x"})
    assert not builds_offline({"resolved": True, "sinks": ["http", "sql"]})
    assert not builds_offline({"resolved": True, "sinks": ["files"]})
    assert builds_offline({"resolved": True, "sinks": "http", "http_endpoint": "x"})
    assert not builds_offline({"sinks": ["http"]})  # an earlier build's request output
    assert not builds_offline(None)
    quotes = get_task("pull_stock_quotes")
    assert not own_hooks(quotes, "decide_sinks", "record_spec")


@contextmanager
def _write_lock_held(path: Path, seconds: float) -> Iterator[threading.Event]:
    """SQLite's write lock on ``path`` taken by another connection (as another process's
    long transaction would), released after ``seconds`` by a thread of its own (the event
    loop may be the one waiting); the event is set once it is released."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Event()

    def release() -> None:
        holder.execute("ROLLBACK")
        holder.close()
        released.set()

    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield released
    finally:
        timer.join()


async def test_a_call_on_the_loop_gives_way_to_a_thread_when_sqlite_is_locked(tmp_path) -> None:
    """The write lock held elsewhere for 1.5 s: the page is staged once it is released, by
    a thread, while the loop goes on (it would stall for the whole 1.5 s if the call
    waited for the lock on the loop, as SQLite's busy timeout of 30 s lets it)."""
    path = tmp_path / "artemis.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    staging = Staging(url)
    staging.cursor("warm/up")  # a pooled connection, set up before the lock is taken
    with _write_lock_held(path, 1.5) as released:
        with slow_callbacks_reported(STALL_S) as stalls:
            await on_loop_if(True, staging.put_pages, "k/1", "raw", [(0, [{"n": 1}])], "d0")
        assert released.is_set()
    assert staging.get_pages("k/1", "raw", 0, 0) == [(0, [{"n": 1}])]
    assert not stalls.seen, f"the loop stalled behind SQLite's lock: {stalls.seen}"


async def test_the_event_writer_gives_way_to_its_thread_when_sqlite_is_locked(tmp_path) -> None:
    path = tmp_path / "artemis.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    log = EventLog(url)
    writer = EventWriter(log)
    task_id = new_task_id()
    await writer.append(task_id, "probe", {"n": 0})  # a pooled connection, set up
    with _write_lock_held(path, 1.5) as released:
        with slow_callbacks_reported(STALL_S) as stalls:
            await writer.append(task_id, "probe", {"n": 1})
        assert released.is_set()
    assert [e.data for e in log.since(task_id)] == [{"n": 0}, {"n": 1}]
    assert not stalls.seen, f"the loop stalled behind SQLite's lock: {stalls.seen}"


def test_prepare_hooks_name_every_hook_prepare_calls() -> None:
    """A hook ``_prepared`` calls but PREPARE_HOOKS leaves out would run on the loop when a
    task overrides only it (with a database read, say)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(prepare_module._prepared)))
    called = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "task"
    }
    assert called and called <= set(PREPARE_HOOKS), called - set(PREPARE_HOOKS)


async def test_after_giving_way_the_loop_sends_calls_to_threads_for_a_while(tmp_path) -> None:
    """Thirty calls while the lock is held elsewhere: one tries the loop, waits its 20 ms
    and gives way, and the others go to threads at once for LOOP_BACKOFF_S — not each of
    the thirty waiting its 20 ms on the loop in turn (0.6 s of a held loop). Counted by
    SQLAlchemy's cursor events: the staging inserts executed on the loop's thread."""
    path = tmp_path / "artemis.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    staging = Staging(url)
    staging.cursor("warm/up")
    with _statement_threads(staging.engine, "INSERT INTO staged_page") as seen:
        with _write_lock_held(path, 0.8):
            await asyncio.gather(
                *(
                    on_loop_if(True, staging.put_pages, f"k/{n}", "raw", [(0, [{"n": n}])])
                    for n in range(30)
                )
            )
    assert all(staging.get_pages(f"k/{n}", "raw", 0, 0) for n in range(30))
    on_the_loop = seen.count(threading.get_ident())
    assert LOOP_BACKOFF_S >= 0.1 and 1 <= on_the_loop <= 5, on_the_loop
