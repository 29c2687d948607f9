"""The event stream of a run (docs/architecture.md).

Activities append *raw* events to the ``run_event`` table as they happen: an activity
started, an activity ended (with counts or an error), fetch progress, the run's terminal
status. The table is keyed by task id, so one stream spans continue-as-new and outlives
Temporal's retention until the clean-up loop removes it.

:class:`PlanTracker` turns raw events into the events a front end consumes — the
event converter: a ``plan_update`` first, then ``activity_start`` / ``activity_result`` /
``progress`` with ``planId`` = their step, a ``plan_update`` whenever a step's status
changes (priority ERROR > COMPLETED > IN_PROGRESS > PENDING; a step whose failure was
followed by a success of the same step is COMPLETED again), and one terminal ``complete``,
``error`` or ``cancelled``. The conversion is a pure function of the raw sequence, so the
SSE ids (``{raw seq}.{n}``) are stable and ``Last-Event-ID`` resumes exactly.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, Text, delete, insert, or_, select, text
from sqlmodel import Column, Field, SQLModel

from artemis import jsonio
from artemis.calls import statement, statements_on_loop
from artemis.db import UTCDateTime, get_engine, run_transaction, utcnow
from artemis.event_kinds import CONTROL_EVENTS, OUTAGE_EVENTS, RECORD_EVENTS, Ending
from artemis.ledger import Ledger
from artemis.logsetup import get_logger
from artemis.outage import waiting_line
from artemis.run_state import (
    STEPS,
    RunState,
    RunStatus,
    StepStatus,
    end_error,
    is_terminal,
    stats_view,
)

# Which plan step each activity of the task-run workflow belongs to. Bookkeeping
# activities (task-store mirroring, cleanup) are not part of the plan.
ACTIVITY_STEP = {
    "prepare_params": "step_prepare",
    "fetch_pages": "step_fetch",
    "split_run": "step_fetch",
    "process_batch": "step_process",
    "emit_batch": "step_emit",
    "finalize_run": "step_finalize",
}

STEP_TITLES = {
    "step_prepare": "Prepare parameters",
    "step_fetch": "Fetch pages",
    "step_process": "Process records",
    "step_emit": "Emit to sinks",
    "step_finalize": "Finalize and call back",
}

PLAN_NAMESPACE = uuid.UUID("7f0c5d1e-3a52-4c3e-9b8e-5b7c2a1d9e40")


class RunEvent(SQLModel, table=True):
    __tablename__ = "run_event"
    __table_args__ = (
        Index("ix_run_event_task_seq", "task_id", "seq"),
        Index("ix_run_event_root_seq", "root_id", "seq"),
        Index("ix_run_event_created", "created_at"),
    )

    seq: int | None = Field(default=None, primary_key=True)
    task_id: str = Field(max_length=200)
    # The top ancestor's task id: a backfill's stream includes its window runs.
    root_id: str | None = Field(default=None, max_length=200)
    kind: str = Field(max_length=32)
    step: str | None = Field(default=None, max_length=32)
    data: str = Field(sa_column=Column(Text, nullable=False))
    ts_ms: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


_t = RunEvent.__table__  # type: ignore[attr-defined]
_INSERT = insert(_t)  # built once: building it cost more than running it on SQLite
log = get_logger("artemis.events")


@dataclass(frozen=True)
class RawEvent:
    seq: int
    kind: str
    step: str | None
    data: dict[str, Any]
    ts_ms: int
    task_id: str | None = None  # None: the stream's own run


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class PendingEvent:
    """An event on its way to the log (EventWriter)."""

    task_id: str
    kind: str
    data: dict[str, Any]
    step: str | None
    ts_ms: int
    root_id: str | None = None


# An event queued by ``EventWriter.append_soon`` is committed with the next awaited append
# of the process (any run's), or after this many seconds when none comes.
SOON_S = 0.25


def _log_unwritten(done: asyncio.Future[None]) -> None:
    """A queued event's write failed (as ``record`` does for an awaited one: logged, and
    the run goes on — its state lives in Temporal, not in its events)."""
    if not done.cancelled() and (e := done.exception()) is not None:
        log.warning("event_not_recorded", error=f"{type(e).__name__}: {e}")


class EventWriter:
    """The events of a process's concurrent activities, committed together: what is
    appended while a commit runs goes into the next one (a group commit — one transaction
    for the events of many runs, instead of one each). ``append`` returns once its event
    is committed; ``append_soon`` returns at once, its event going with the next commit
    (see ``SOON_S``). Events are written in the order of the calls; one writer at a time."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._queue: list[tuple[PendingEvent, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._soon: asyncio.TimerHandle | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="event-log")
        # A commit is a statement (``artemis.calls``). SQLite: it runs on the loop, its
        # group is what was appended since the writer was scheduled; PostgreSQL: in the
        # writer's thread, its group is what was appended during the commit before.
        self._on_loop = statements_on_loop(log)

    async def append(
        self,
        task_id: str,
        kind: str,
        data: dict[str, Any],
        step: str | None = None,
        root_id: str | None = None,
    ) -> None:
        done = self._enqueue(PendingEvent(task_id, kind, data, step, now_ms(), root_id))
        self._start_writer()
        await done

    def append_soon(
        self,
        task_id: str,
        kind: str,
        data: dict[str, Any],
        step: str | None = None,
        root_id: str | None = None,
    ) -> asyncio.Future[None]:
        """Queue an event and return at once: it is committed with the next ``append`` of
        this process (whichever run's: one transaction instead of one each), or within
        ``SOON_S``. The future tells how its write went (nobody has to wait on it: a
        failure is logged)."""
        done = self._enqueue(PendingEvent(task_id, kind, data, step, now_ms(), root_id))
        done.add_done_callback(_log_unwritten)
        if self._soon is None and (self._writer is None or self._writer.done()):
            self._soon = asyncio.get_running_loop().call_later(SOON_S, self._start_writer)
        return done

    def _enqueue(self, event: PendingEvent) -> asyncio.Future[None]:
        """The event queued in call order; its future is done once it is written."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((event, done))
        return done

    def _start_writer(self) -> None:
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self._queue and (self._writer is None or self._writer.done()):
            self._writer = asyncio.create_task(self._write())

    async def _write(self) -> None:
        if self._on_loop:
            # One turn of the loop first: the other activities' ready steps append theirs.
            await asyncio.sleep(0)
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                events = [e for e, _ in batch]
                # (SQLite's write lock held elsewhere: in the writer's thread)
                await statement(self.log, self.log.append_many, events, thread=self._thread)
            except Exception as e:  # each caller decides (activities log it and go on)
                for _, done in batch:
                    if not done.done():
                        done.set_exception(e)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)


class EventLog:
    """Append and read raw run events (SQLite or PostgreSQL, the Artemis database)."""

    def __init__(self, database_url: str) -> None:
        self.engine = get_engine(database_url)
        self._pg = self.engine.dialect.name == "postgresql"

    def append(
        self,
        task_id: str,
        kind: str,
        data: dict[str, Any],
        step: str | None = None,
        ts_ms: int | None = None,
        root_id: str | None = None,
    ) -> int:
        root = root_id or task_id
        row = {
            "task_id": task_id,
            "root_id": root,
            "kind": kind,
            "step": step,
            "data": jsonio.dumps(data).decode(),
            "ts_ms": ts_ms if ts_ms is not None else now_ms(),
            "created_at": utcnow(),
        }
        with self.engine.begin() as conn:
            if self._pg:
                # Sequence numbers are handed out before commit: two concurrent writers of
                # one run could commit out of order and a reader would skip the earlier one.
                # Serialising a run's writers makes its seq order the commit order (SQLite
                # serialises every writer already).
                conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": root})
            result = conn.execute(insert(_t).values(row).returning(_t.c.seq))
            return int(result.scalar_one())

    def append_many(self, events: list[PendingEvent]) -> None:
        """Append events in one transaction, in order (the rows' seq follows it)."""
        if not events:
            return
        created = utcnow()
        rows = [
            {
                "task_id": e.task_id,
                "root_id": e.root_id or e.task_id,
                "kind": e.kind,
                "step": e.step,
                "data": jsonio.dumps(e.data).decode(),
                "ts_ms": e.ts_ms,
                "created_at": created,
            }
            for e in events
        ]
        with run_transaction(self.engine) as conn:
            if self._pg:
                # As append: each run's writers serialised (sorted: no two writers wait on
                # each other's locks in opposite orders).
                for root in sorted({e.root_id or e.task_id for e in events}):
                    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": root})
            conn.execute(_INSERT, rows)

    def since(self, task_id: str, after_seq: int = 0, limit: int = 1000) -> list[RawEvent]:
        """The run's events and those of its descendants (a backfill's windows)."""
        q = (
            select(_t.c.seq, _t.c.kind, _t.c.step, _t.c.data, _t.c.ts_ms, _t.c.task_id)
            .where(or_(_t.c.task_id == task_id, _t.c.root_id == task_id), _t.c.seq > after_seq)
            .order_by(_t.c.seq)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [
                RawEvent(
                    r.seq,
                    r.kind,
                    r.step,
                    jsonio.loads(r.data),
                    r.ts_ms,
                    None if r.task_id == task_id else r.task_id,
                )
                for r in conn.execute(q)
            ]

    def all(self, task_id: str) -> Iterator[RawEvent]:
        after = 0
        while True:
            chunk = self.since(task_id, after)
            yield from chunk
            if len(chunk) < 1000:
                return
            after = chunk[-1].seq

    def drop_older_than(self, before: datetime) -> int:
        with self.engine.begin() as conn:
            return conn.execute(delete(_t).where(_t.c.created_at < before)).rowcount


def plan_id_for(task_id: str) -> str:
    """The run's stable plan id (the id of every plan_update of the run)."""
    return str(uuid.uuid5(PLAN_NAMESPACE, task_id))


def cursor_of(event_id: str | None) -> tuple[int, int]:
    """``"17.2"`` → (17, 2); anything unparsable starts from the beginning."""
    if not event_id:
        return (0, -1)
    head, _, tail = event_id.strip().partition(".")
    try:
        return (int(head), int(tail or 0))
    except ValueError:
        return (0, -1)


@dataclass
class OutEvent:
    """One event for the front end: ``sse_id`` goes on the SSE ``id:`` line."""

    sse_id: str
    type: str
    payload: dict[str, Any]

    @property
    def cursor(self) -> tuple[int, int]:
        return cursor_of(self.sse_id)


@dataclass
class _Step:
    started: bool = False
    completed: bool = False
    failed: set[str] = field(default_factory=set)
    open: set[str] = field(default_factory=set)

    def resolve(self) -> StepStatus:
        if self.failed:
            return StepStatus.ERROR
        if self.completed:
            return StepStatus.COMPLETED
        if self.started:
            return StepStatus.IN_PROGRESS
        return StepStatus.PENDING


class _Out:
    """The stream events one recorded event becomes, with ids ``{seq}.{n}``."""

    def __init__(self, raw: RawEvent, plan_id: str) -> None:
        self.raw = raw
        self.plan_id = plan_id
        self.out: list[OutEvent] = []

    def __call__(self, kind: str, payload: dict[str, Any], plan: str | None) -> None:
        sse_id = f"{self.raw.seq}.{len(self.out)}"
        body = {
            "event": kind,
            "id": self.plan_id if kind == "plan_update" else sse_id,
            "planId": plan,
            "timestamp": self.raw.ts_ms,
            **payload,
        }
        self.out.append(OutEvent(sse_id, kind, body))


class PlanTracker:
    """Raw events in, front-end events out (deterministic; see the module docstring)."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.plan_id = plan_id_for(task_id)
        self.steps = {s: _Step() for s in STEPS}
        self.last_plan: tuple[str, ...] | None = None
        self.finished: str | None = None
        self.last_seq = 0
        # The run's state as the workflow keeps it — its counters changed by its own
        # methods, where fetch, process and emit stand in its own fields (next_seq,
        # processed_through, delivered_below, fetch_done) — and shown through its view:
        # the stream's progress has GET /tasks/{id}'s keys and rules.
        self.state = RunState()
        # Pages and records of the fetch batch in flight, per run ("" = this run).
        self._batch: dict[str, tuple[int, int]] = {}

    # -- public -----------------------------------------------------------------------
    def feed(self, raw: RawEvent) -> list[OutEvent]:
        self.last_seq = raw.seq
        if self.finished is not None:
            return []
        emit = _Out(raw, self.plan_id)
        first = self.last_plan is None
        if raw.task_id is not None and self._descendant(raw, emit, first):
            return emit.out
        if raw.kind == "activity_start":
            self._on_start(raw)
            self._plan_if_changed(emit, force=first)
            emit("activity_start", self._activity_payload(raw), raw.step)
        elif raw.kind == "activity_result":
            if first:
                self._plan_if_changed(emit, force=True)
            counted = self._on_result(raw)
            emit("activity_result", self._activity_payload(raw), raw.step)
            if counted:
                emit("progress", self._progress(), raw.step)
            self._plan_if_changed(emit)
        elif raw.kind == "progress":
            if first:
                self._plan_if_changed(emit, force=True)
            self._on_progress(raw)
            emit("progress", self._progress(), raw.step)
        elif raw.kind in CONTROL_EVENTS or raw.kind in OUTAGE_EVENTS or raw.kind in RECORD_EVENTS:
            if first:
                self._plan_if_changed(emit, force=True)
            # An operator's control (as the API signalled it: no step), an outage waited
            # out or recovered (docs/architecture.md), records set aside: told as they came.
            payload = dict(raw.data)
            if raw.kind == "waiting":
                payload["line"] = waiting_line(payload)
            emit(raw.kind, payload, None if raw.kind in CONTROL_EVENTS else raw.step)
        elif raw.kind == "run_status":
            status = str(raw.data.get("status"))
            if is_terminal(status):
                self._finish(status, raw.data.get("steps"))
                self._plan_if_changed(emit, force=first)
                kind, payload = self._terminal(status, raw.data)
                emit(kind, payload, None)
        return emit.out

    def _descendant(self, raw: RawEvent, emit: _Out, first: bool) -> bool:
        """A descendant run's event (a backfill window): its batches count towards this
        run's steps and progress; its own prepare/finalize/end are not this run's. True
        when the event is taken here."""
        if raw.kind == "run_status":
            if raw.data.get("status") == RunStatus.COMPLETED:
                self.state.current += 1
                if first:
                    self._plan_if_changed(emit, force=True)
                emit("progress", self._progress(), "step_fetch")
            return True
        return raw.data.get("activity") in ("prepare_params", "split_run", "finalize_run")

    def _on_progress(self, raw: RawEvent) -> None:
        self._batch[raw.task_id or ""] = (
            int(raw.data.get("pages", 0)),
            int(raw.data.get("records", 0)),
        )
        if raw.task_id is None:
            self.state.current = int(raw.data.get("units_done", self.state.current))
            self.state.total = int(raw.data.get("total", self.state.total))
            if raw.data.get("expected_total") is not None:
                self.state.stats["expected_total"] = int(raw.data["expected_total"])

    def synthetic_end(self, status: str, data: dict[str, Any], ts_ms: int) -> list[OutEvent]:
        """The terminal events of a run that closed without recording its end (terminated
        in Temporal, or its last record was lost); ids follow every recorded one."""
        if self.finished is not None:
            return []
        raw = RawEvent(self.last_seq, "run_status", None, {**data, "status": status}, ts_ms)
        events = self.feed(raw)
        for k, ev in enumerate(events):
            ev.sse_id = f"{raw.seq}.{900 + k}"
            if ev.type != "plan_update":
                ev.payload["id"] = ev.sse_id
        return events

    def plan(self) -> list[dict[str, str]]:
        return [
            {"id": s, "content": STEP_TITLES[s], "status": self.steps[s].resolve()} for s in STEPS
        ]

    # -- internals ------------------------------------------------------------------------
    def _plan_if_changed(self, emit: Any, force: bool = False) -> None:
        plan = self.plan()
        key = tuple(p["status"] for p in plan)
        if force or key != self.last_plan:
            self.last_plan = key
            emit("plan_update", {"todos": plan}, None)

    def _on_start(self, raw: RawEvent) -> None:
        step = self.steps.get(raw.step or "")
        if step is None:
            return
        step.started = True
        step.open.add(_key(raw))
        if raw.data.get("activity") == "finalize_run":
            # The workflow leaves its batch loop before it finalizes: with a completed run
            # every earlier step is done; otherwise the ones still running broke off.
            ok = raw.data.get("status") == RunStatus.COMPLETED
            for name in STEPS[:-1]:
                st = self.steps[name]
                if ok:
                    st.completed, st.failed = True, set()
                elif st.started and not st.completed and not st.failed:
                    st.failed.add("interrupted")

    def _on_result(self, raw: RawEvent) -> bool:
        step = self.steps.get(raw.step or "")
        if step is None:
            return False
        key = _key(raw)
        step.open.discard(key)
        if not raw.data.get("ok"):
            step.failed.add(key)
            return False
        # A success after a failure of the same step: the step recovered.
        step.failed.clear()
        res = raw.data.get("result") or {}
        act = raw.data.get("activity")
        counted = False
        if act == "prepare_params":
            step.completed = True
            self.state.total = int(res.get("total", self.state.total) or 0)
        elif act == "fetch_pages":
            self._count_fetch(raw, res, step)
            if raw.task_id is not None:
                return True  # a window's batch: its completion is not this run's
            counted = True
        elif act == "process_batch":
            # A retried run processes its failed attempt's pages again: counted once, as
            # the workflow counts them (up to the pages processed before).
            ledger = _ledger(res, judges=True)
            if raw.task_id is not None or ledger.next_seq - 1 > self.state.processed_through:
                self.state.count(ledger)
                counted = True
            if raw.task_id is None:
                self.state.stand_after(ledger)
        elif act == "emit_batch":
            ledger = _ledger(res, judges=False)
            self.state.count(ledger)
            if raw.task_id is None:
                self.state.stand_after(ledger)
            counted = True
        elif act == "finalize_run":
            step.completed = True
        state = self.state
        if state.fetch_done:
            proc, emit = self.steps["step_process"], self.steps["step_emit"]
            if not proc.open and state.processed_through >= state.next_seq - 1:
                proc.completed = True
            if proc.completed and not emit.open and state.delivered_below >= state.next_seq:
                emit.completed = True
        return counted

    def _count_fetch(self, raw: RawEvent, res: dict[str, Any], step: Any) -> None:
        """A fetch's batch counted (a window's: its counts only, not its completion)."""
        self._batch.pop(raw.task_id or "", None)
        self._streamed(raw.task_id, res.get("streamed"))
        pages, records = int(res.get("pages", 0)), int(res.get("records", 0))
        if raw.task_id is not None:
            self.state.add_fetch(pages, records, None, None, False)
            return
        expected = res.get("expected_total")
        self.state.add_fetch(
            pages,
            records,
            int(res.get("units_done", self.state.current)),
            int(expected) if expected is not None else None,
            False,
        )
        self.state.next_seq = max(self.state.next_seq, int(res.get("next_seq", 0)))
        if res.get("done"):
            self.state.fetch_done = True
            step.completed = True

    def _streamed(self, window: str | None, streamed: dict[str, Any] | None) -> None:
        """A fetch that processed and emitted its pages concurrently with it: those pages count as
        a process and an emit batch would have counted them."""
        if not streamed:
            return
        ledger = Ledger.from_json(streamed)
        self.state.count(ledger)
        if window is None:
            self.state.stand_after(ledger)
            for name in ("step_process", "step_emit"):
                self.steps[name].started = True

    def _finish(self, status: str, steps: dict[str, str] | None = None) -> None:
        """The run ended: its plan is the workflow's own (``steps``, the run's snapshot
        recorded with its end), or — an end without one (a terminated run, say) —
        what the activities' events say."""
        self.finished = status
        for name, st in self.steps.items():
            if steps is not None and name in steps:
                st.open.clear()
                st.failed = {"run"} if steps[name] == StepStatus.ERROR else set()
                st.completed = steps[name] == StepStatus.COMPLETED
                st.started = steps[name] != StepStatus.PENDING
                continue
            if st.open:
                st.open.clear()
                if status != RunStatus.COMPLETED:
                    st.failed.add("interrupted")
            if status == RunStatus.COMPLETED:
                st.completed, st.failed = True, set()

    def _progress(self) -> dict[str, Any]:
        """GET /tasks/{id}'s counters (batches delivered by their activities), and apart
        from them the pages of the fetch in flight (not counted until it returns)."""
        state = self.state
        return {
            "current": state.current,
            "total": state.total,
            "progress": round(state.current / state.total, 4) if state.total else None,
            **stats_view(state.stats),
            "sinks": dict(state.stats.get("sinks") or {}),
            "in_flight": {
                "pages": sum(p for p, _ in self._batch.values()),
                "records": sum(r for _, r in self._batch.values()),
            },
        }

    def _terminal(self, status: str, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        stats = data.get("stats") or {}
        error = data.get("error") or None
        if status == RunStatus.COMPLETED:
            return Ending.COMPLETE, {"status": status, "stats": stats}
        if status == RunStatus.CANCELLED:
            reason = (error or {}).get("message") or RunStatus.CANCELLED.value
            return Ending.CANCELLED, {
                "status": status,
                "cancelled": True,
                "reason": reason,
                "message": reason,
                "stats": stats,
            }
        return Ending.ERROR, {
            "status": status,
            "error": error or end_error(status, None, status),
            "stats": stats,
        }

    @staticmethod
    def _activity_payload(raw: RawEvent) -> dict[str, Any]:
        d = raw.data
        payload = {
            "activity": d.get("activity"),
            "attempt": d.get("attempt"),
            "summary": d.get("summary"),
        }
        if raw.kind == "activity_result":
            payload.update(
                error=not d.get("ok"),
                duration_ms=d.get("duration_ms"),
                data=d.get("result") if d.get("ok") else d.get("error"),
            )
        return payload


def _key(raw: RawEvent) -> str:
    d = raw.data
    return f"{d.get('run_id')}/{d.get('activity')}/{d.get('activity_id')}"


def _ledger(res: dict[str, Any], *, judges: bool) -> Ledger:
    """A process or emit batch's ledger as its step event tells it: judged or delivered
    up to the batch's last page (``last_seq``) unless it says where it stands."""
    below = int(res.get("last_seq", -1)) + 1
    return Ledger.from_json(
        {"first_seq": 0, "next_seq": below, **res, "judges": judges, "delivers": not judges}
    )
