"""Where Artemis' own short statements run (``artemis.calls.statement``): on the event
loop's thread for SQLite (a local file, cheaper than the hop to a thread), in a worker
thread for PostgreSQL (network round trips must not hold the loop). Observed through
SQLAlchemy's own cursor events on a real database of each kind. And which task hooks skip
the thread (``artemis.calls.hooks``): those a task leaves to the base class."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import sqlite3
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from activities import prepare as prepare_module
from activities.prepare import PREPARE_HOOKS
from activities.run_base import run_key
from activities.task_run import TaskRunActivities
from artemis.calls import hook, hooks, statement, statements_on_loop, work
from artemis.db import LOOP_BACKOFF_S, release_held
from artemis.events import SOON_S, EventLog, EventWriter
from artemis.migrate import upgrade
from artemis.run_models import CleanupRunInput, RunRef
from artemis.sinks.factory import builds_offline
from artemis.staging import Staging
from artemis.tasks import TaskContext, TaskUnit
from artemis.tasks.registry import get_task
from artemis.tasks.stock_quotes import PullStockQuotes
from tests.conftest import new_task_id
from tests.helpers import slow_callbacks_reported

# A step of the loop longer than this is a stall (asyncio's own debug report); the lock
# is held for 1.5 s, and a call that gave way holds the loop for about 20 ms.
STALL_S = 0.75


@contextmanager
def _statement_threads(engine: Engine, marker: str) -> Iterator[list[int]]:
    """The thread ids that executed a statement containing ``marker`` on ``engine``."""
    seen: list[int] = []

    def traced(statement: str) -> None:
        if marker in statement:
            seen.append(threading.get_ident())

    if engine.dialect.name == "sqlite":
        # A run's hottest statements go to SQLite's driver (artemis.db.run_transaction),
        # past SQLAlchemy's events: the driver's own trace sees every statement (an
        # executemany's rows one by one: a run of them counts once).
        def checkout(dbapi_conn, record, proxy) -> None:  # noqa: ANN001
            last = [""]

            def trace(statement: str) -> None:
                if marker not in last[0]:
                    traced(statement)
                last[0] = statement

            dbapi_conn.set_trace_callback(trace)

        def checkin(dbapi_conn, record) -> None:  # noqa: ANN001
            if dbapi_conn is not None:
                dbapi_conn.set_trace_callback(None)

        listeners = [("checkout", checkout), ("checkin", checkin)]
    else:

        def before(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
            traced(statement)

        listeners = [("before_cursor_execute", before)]
    for name, fn in listeners:
        event.listen(engine, name, fn)
    release_held()  # the loop's kept connection is checked out afresh, with the trace
    try:
        yield seen
    finally:
        release_held()
        for name, fn in listeners:
            event.remove(engine, name, fn)


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


async def test_a_statement_runs_on_the_loop_for_sqlite_and_in_a_thread_for_postgresql(
    db_engine,
) -> None:
    here = statements_on_loop(db_engine)
    assert here == (db_engine.dialect.name == "sqlite")

    def query() -> int:
        with db_engine.connect() as conn:
            return int(conn.execute(text("SELECT 41 + 1 AS on_db_probe")).scalar_one())

    with _statement_threads(db_engine, "on_db_probe") as seen:
        assert await statement(db_engine, query) == 42
    assert len(seen) == 1
    assert (seen[0] == threading.get_ident()) is here


async def test_a_store_outside_the_database_or_not_built_yet_is_called_in_a_thread() -> None:
    """A store without an engine (Redis) or none yet (built on first use): a thread."""

    class Outside:
        engine = None

    for db in (Outside(), None):
        assert not statements_on_loop(db)
        assert await statement(db, threading.get_ident) != threading.get_ident()
    assert await work(threading.get_ident) != threading.get_ident()


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
    if statements_on_loop(db_engine):
        assert seen == [threading.get_ident()]
    else:
        assert 1 <= len(seen) <= 2
        assert threading.get_ident() not in seen


async def test_queued_events_go_with_the_next_awaited_one_in_one_commit(db_engine) -> None:
    """An activity's start and its progress are queued (``append_soon``), not waited for:
    they are committed with the next awaited append — its result — in one transaction
    (one INSERT on SQLite, where the whole group is one executemany), in call order."""
    log = EventLog(_url(db_engine))
    writer = EventWriter(log)
    task_id = new_task_id()
    with _statement_threads(db_engine, "INSERT INTO") as seen:
        start = writer.append_soon(task_id, "activity_start", {"n": 0}, "step_fetch")
        progress = writer.append_soon(task_id, "progress", {"n": 1}, "step_fetch")
        assert not start.done() and log.since(task_id) == []  # nothing waited, nothing yet
        await writer.append(task_id, "activity_result", {"n": 2}, "step_fetch")
        assert start.done() and progress.done()
    assert [(e.kind, e.data) for e in log.since(task_id)] == [
        ("activity_start", {"n": 0}),
        ("progress", {"n": 1}),
        ("activity_result", {"n": 2}),
    ]
    assert len(seen) == 1


async def test_a_queued_event_alone_is_committed_within_soon_s(db_engine) -> None:
    """With no awaited append after it (a long fetch's start), a queued event is written
    within ``SOON_S`` all the same: a stream shows a long activity while it runs."""
    log = EventLog(_url(db_engine))
    writer = EventWriter(log)
    task_id = new_task_id()
    done = writer.append_soon(task_id, "activity_start", {"n": 0}, "step_fetch")
    await asyncio.wait_for(done, SOON_S + 30)  # a deadline with slack, not a fixed sleep
    assert [e.kind for e in log.since(task_id)] == ["activity_start"]


async def test_a_queued_event_that_fails_is_logged_not_raised(tmp_path, app_log) -> None:
    """The event log gone (its table dropped): the queued event's write fails, the failure
    is logged as ``event_not_recorded``, and nothing is raised at the caller."""
    url = f"sqlite:///{tmp_path / 'artemis.db'}"
    upgrade(url)
    log = EventLog(url)
    with log.engine.begin() as conn:
        conn.execute(text("DROP TABLE run_event"))
    writer = EventWriter(log)
    done = writer.append_soon(new_task_id(), "activity_start", {"n": 0})
    await asyncio.wait_for(asyncio.wait([done]), SOON_S + 30)
    assert done.exception() is not None
    deadline = time.monotonic() + 30  # the done callback runs on a later turn of the loop
    while "event_not_recorded" not in app_log.read_text():
        assert time.monotonic() < deadline, "the failed write was not logged"
        await asyncio.sleep(0.01)


async def test_a_small_run_s_data_is_dropped_on_the_loop(base_settings) -> None:
    """Clean-up (``cleanup_run``): a run that staged a few pages has them dropped on the
    event loop on SQLite (two deletes: less than the hop to a thread); one that staged
    many, or an input that does not tell, in a thread."""
    activities = TaskRunActivities(base_settings)
    staging = activities.services.staging
    small = statements_on_loop(staging.engine)
    for pages, on_loop_thread in ((1, small), (500, False), (None, False)):
        run = RunRef("pull_stock_quotes", new_task_id(), "w", trace_id="0" * 32)
        key = run_key(run)
        await work(staging.put_pages, key, "raw", [(0, [{"n": 1}])], "d0")
        with _statement_threads(staging.engine, "DELETE FROM staged_page") as seen:
            await activities.ending.cleanup_run(CleanupRunInput(run=run, pages=pages))
        assert seen and all((t == threading.get_ident()) is on_loop_thread for t in seen)
        assert staging.get_pages(key, "raw", 0, 0) == []


async def _hooks_on_loop(task: TaskUnit, *names: str) -> bool:
    """Whether a call into the task's hooks ``names`` runs on the loop's thread."""
    return await hooks(task, names, threading.get_ident) == threading.get_ident()


async def test_a_task_s_own_hooks_run_in_a_thread_the_base_class_s_on_the_loop() -> None:
    """A task that leaves its prepare and finalize hooks to the base class has them called
    on the loop; one with its own (the literature task's registry queries) in a thread.
    ``prepare_params`` goes by what the task says of it (``prepare_blocks``)."""
    quotes, literature = get_task("pull_stock_quotes"), get_task("literature_harvest")
    assert await _hooks_on_loop(quotes, *PREPARE_HOOKS, "finalize", "run_ended")
    assert not await _hooks_on_loop(literature, *PREPARE_HOOKS)
    assert not await _hooks_on_loop(literature, "finalize")
    assert not await _hooks_on_loop(quotes, "process")  # its own shaping of a page
    for task in (quotes, literature, get_task("source_harvest")):
        assert await _hooks_on_loop(task, "prepare_params") is not task.prepare_blocks


class _Finalizing(PullStockQuotes):
    def finalize(self, ctx: TaskContext, stats: dict[str, Any]) -> dict[str, Any]:
        return {**stats, "thread": threading.get_ident()}


async def test_a_hook_is_called_where_its_task_s_class_says() -> None:
    """``hook(task.name, ...)``: the bound hook tells the task and the hook."""
    base = await hook(PullStockQuotes().finalize, cast(TaskContext, None), {"n": 1})
    assert base == {"n": 1}
    own = await hook(_Finalizing().finalize, cast(TaskContext, None), {})
    assert own["thread"] != threading.get_ident()


async def test_sinks_built_without_io_are_built_in_place_only_when_resolved() -> None:
    """A run's sinks are built on the loop only when its resolved output names sinks whose
    construction does no I/O; a sql or files sink (an engine, a filesystem) or an output
    left unresolved at the run's start goes to a thread."""
    assert builds_offline({"resolved": True, "sinks": ["http", "log"], "http_endpoint": "x"})
    assert not builds_offline({"resolved": True, "sinks": ["http", "sql"]})
    assert not builds_offline({"resolved": True, "sinks": ["files"]})
    assert builds_offline({"resolved": True, "sinks": "http", "http_endpoint": "x"})
    assert not builds_offline({"sinks": ["http"]})  # a request output, not resolved
    assert not builds_offline(None)
    quotes = get_task("pull_stock_quotes")
    assert await _hooks_on_loop(quotes, "decide_sinks", "record_spec")


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
            page = [(0, [{"n": 1}])]
            await statement(staging.engine, staging.put_pages, "k/1", "raw", page, "d0")
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
                    statement(staging.engine, staging.put_pages, f"k/{n}", "raw", [(0, [{"n": n}])])
                    for n in range(30)
                )
            )
    assert all(staging.get_pages(f"k/{n}", "raw", 0, 0) for n in range(30))
    on_the_loop = seen.count(threading.get_ident())
    assert LOOP_BACKOFF_S >= 0.1 and 1 <= on_the_loop <= 5, on_the_loop


def test_only_the_policy_module_picks_a_thread() -> None:
    """Call sites say what a call is (``artemis/calls.py``); none sends one to a thread
    or an executor itself."""
    root = Path(__file__).resolve().parents[2]
    picks = re.compile(r"asyncio\.to_thread\(|\.run_in_executor\(")
    found = [
        f"{path.relative_to(root)}:{n}"
        for package in ("artemis", "workflows", "activities", "starter", "workers")
        for path in sorted((root / package).rglob("*.py"))
        if path.relative_to(root).as_posix() != "artemis/calls.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if picks.search(line)
    ]
    assert not found, found
    assert picks.search((root / "artemis" / "calls.py").read_text())
