"""Where a call of Artemis' asynchronous code runs: on the event loop or in a worker thread.

Call sites say what a call is; this module alone decides where it runs.

``statement(db, fn, *args)`` — a short statement on Artemis' own database (a run's staged
page and cursor, its secret, its kept state, its task-store record, its events). On
SQLite it runs on the event loop: SQLite's calls are calls into a local file of tens of
microseconds, less than the hop to a worker thread, and a thread holding SQLite's write
lock waits for the GIL between its statements (milliseconds on a busy worker) while every
other writer waits for it. A server (PostgreSQL) answers over the network, and a store
outside the database (Redis) or one not built yet (its first use builds it: a Redis
client's import is slow): a thread.

A statement on the loop waits at most ``LOOP_BUSY_MS`` for SQLite's write lock (held by
another process, or by a thread of this one: a clean-up, housekeeping, a sink), then gives
way: ``LoopBusy``, its transaction rolled back and nothing written, and it runs again in a
thread, which waits as long as any call does (``THREAD_BUSY_MS``). After a give-way the
loop's next statements go straight to threads for ``LOOP_BACKOFF_S``: a lock held for
seconds must not cost every waiting activity its 20 ms in turn. A statement on the loop
does not checkpoint the WAL either (an fsync): the connections of threaded calls do.

``hook(task.name, *args)`` and ``hooks(task, names, fn, *args)`` — a task's hooks. Those
a task leaves to the base class are pure: on the loop. A task's own may block (a registry
query, a database write): a thread. ``prepare_params`` is the exception: a task overrides
it for its own validation, usually pure, and says so itself (``prepare_blocks``).

``work(fn, *args)`` — batch-sized work (a batch's pages, a larger run's clean-up,
housekeeping), a task's own blocking code, I/O outside Artemis' database, a sink's write,
the API's calls into its stores: a thread, so that the loop keeps heartbeating and serving
the other activities (or requests) meanwhile; ``work_on(pool, …)`` on the caller's own
pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, ParamSpec, Protocol, TypeVar, TypeVarTuple

from sqlalchemy.engine import Engine

from artemis.db import LoopBusy, loop_statements

P = ParamSpec("P")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Hooks a task declares blocking or not by a flag of its own (the flag's name), whether or
# not it overrides them.
_DECLARED = {"prepare_params": "prepare_blocks"}


class InDatabase(Protocol):
    """A store whose calls are statements on ``engine`` (None: a store outside the
    database, or one not built yet)."""

    @property
    def engine(self) -> Engine | None: ...


def statements_on_loop(db: Engine | InDatabase | None) -> bool:
    """Whether ``statement`` runs ``db``'s statements on the event loop (SQLite's): a
    writer that groups statements forms its group where they run."""
    engine = db if db is None or isinstance(db, Engine) else db.engine
    return engine is not None and engine.dialect.name == "sqlite"


async def statement(
    db: Engine | InDatabase | None,
    fn: Callable[[*Ts], T],
    *args: *Ts,
    thread: Executor | None = None,
) -> T:
    """``fn(*args)``, a short statement (or a few) on Artemis' database ``db``: on the
    event loop for SQLite, giving way to a thread when the write lock is held elsewhere;
    in a thread otherwise. ``thread``: the caller's own executor for it (the event
    writer's, its commits one at a time), else a thread as ``work``'s."""
    if statements_on_loop(db):
        with contextlib.suppress(LoopBusy), loop_statements():
            return fn(*args)
    if thread is not None:
        return await asyncio.get_running_loop().run_in_executor(thread, fn, *args)
    return await asyncio.to_thread(fn, *args)


async def work(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn`` — batch-sized work, a task's blocking code, I/O outside Artemis' database, a
    sink's or a rate gate's write, a call the API makes to a store — in a worker thread:
    the event loop keeps heartbeating and serving the other activities (or requests)
    meanwhile."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def work_on(pool: Executor, fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``work`` on the caller's own pool: a writer whose calls go one at a time, or a pool
    sized for what it serves (the event stream's polls), so they never queue behind the
    other threaded calls."""
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


async def hook(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """A task's hook (``task.finalize``, bound): on the event loop when the task leaves it
    to the base class, in a thread when the task has its own."""
    task = getattr(fn, "__self__", None)
    if task is None or not hasattr(type(task), fn.__name__):
        raise TypeError(f"{fn!r} is not a hook bound to a task")
    return await hooks(task, (fn.__name__,), fn, *args, **kwargs)


async def hooks(
    task: Any, names: Sequence[str], fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``fn``, a call into the task's hooks ``names`` (and nothing else that blocks): on the
    event loop when none of them may block, else in a thread. On the loop it runs as a
    statement does: should it reach the database after all, it gives way to a thread
    rather than wait there for SQLite's write lock."""
    if not any(_blocks(task, name) for name in names):
        with contextlib.suppress(LoopBusy), loop_statements():
            return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def _blocks(task: Any, name: str) -> bool:
    """Whether the task's hook ``name`` may block: a flag the task sets for it, else
    whether the task overrides the base class's (pure) one: whether a class below the one
    that declares it (``TaskUnit``, artemis/tasks/base.py) defines it again. (Read from
    the classes, so that this module, which the sinks use, needs no import of the tasks.)"""
    flag = _DECLARED.get(name)
    if flag is not None:
        return bool(getattr(task, flag))
    return sum(name in vars(k) for k in type(task).__mro__) > 1
