"""One model of a run's state, used by everything that writes or reads it: the workflow
(its ``progress`` query and its result), the task-store mirror, the event stream's
terminal events and the API.

- ``TERMINAL``: the statuses a run ends in.
- ``new_stats`` / ``stats_view`` / ``add_stats``: the counters of a run (one list of
  keys), with the total the sources stated next to them.
- ``end_code`` / ``end_error`` / ``error_code_of``: how a status maps to its error code,
  and through ``ErrorCode`` to its HTTP status — the one mapping of the codebase.
- ``RunState``: status, stage, steps, stats, error and the operator's controls, as the
  progress query answers them; the workflow changes it through its methods only, and
  the mirror, the API and the CronJob's finalize body read its snapshot.
- ``RunStatus`` / ``StepStatus`` / ``CallbackResult`` / ``CandidateStatus``: every
  status vocabulary of the codebase, here once (no status string literal elsewhere).
- ``status_of_closed``: Temporal's status of a closed workflow → the run's status.

Stdlib, ``artemis.errors`` and ``artemis.ledger`` only: the workflow sandbox imports it, and
``artemis.run_models`` builds on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from artemis.errors import ErrorCode
from artemis.ledger import Ledger


class RunStatus(StrEnum):
    """A run's status. ``pausing``/``paused`` are shown (GET, progress), never stored: a
    paused run is ``running`` in task storage. So is ``stuck``: an open run whose workflow
    task keeps failing (``artemis.temporal.runs.stuck_of``)."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    STUCK = "stuck"


class StoredStatus(StrEnum):
    """The statuses task storage holds (``pausing``/``paused`` are views of running)."""

    PENDING = RunStatus.PENDING.value
    RUNNING = RunStatus.RUNNING.value
    COMPLETED = RunStatus.COMPLETED.value
    FAILED = RunStatus.FAILED.value
    CANCELLED = RunStatus.CANCELLED.value
    TIMEOUT = RunStatus.TIMEOUT.value


class StepStatus(StrEnum):
    """A plan step's status (the run's todo list)."""

    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"


class CallbackResult(StrEnum):
    """The CronJob protocol's verdict on a run (the finalize body's ``result``)."""

    SUCCESS = "success"
    FAILED = "failed"
    # finalize only: the run hit its deadline
    FAILED_TIMEOUT = "failed_timeout"


class Verdict(StrEnum):
    """A user's verdict on a run (POST /tasks/{id}/feedback)."""

    SUCCESS = CallbackResult.SUCCESS.value
    FAILED = CallbackResult.FAILED.value


class AlertStatus(StrEnum):
    """A crawl alert's state (Prometheus's: ok → pending for its hold → firing)."""

    OK = "ok"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


class CircuitState(StrEnum):
    """A source's circuit breaker, as the progress query shows it."""

    CLOSED = "closed"
    OPEN = "open"


class CookieStatus(StrEnum):
    """A crawl cookie's state (docs/operations.md): active → cooling → active, or invalid/banned;
    disabled by an operator."""

    ACTIVE = "active"
    COOLING = "cooling"
    INVALID = "invalid"
    BANNED = "banned"
    DISABLED = "disabled"


class MirrorHealth(StrEnum):
    """How the run's last write to task storage went (the progress query's
    ``task_store``)."""

    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"


class CandidateStatus(StrEnum):
    """A crawl candidate record's status (record locks: docs/operations.md)."""

    PENDING = "pending"
    PROCESSING = "processing"
    COLLECTED = "collected"
    FAILED = "failed"


TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMEOUT}
)
OPEN = frozenset({RunStatus.PENDING, RunStatus.RUNNING})
STORED = tuple(StoredStatus)
# The failures POST /tasks/{id}/retry finishes from the run's kept state
# (docs/architecture.md): a dependency down past its tolerance, an internal failure, a timeout.
RETRYABLE_ENDINGS = (
    ErrorCode.SOURCE_UNAVAILABLE,
    ErrorCode.SINK_UNAVAILABLE,
    ErrorCode.INTERNAL,
    ErrorCode.TIMEOUT_ERROR,
)
STAT_KEYS = (
    "pages",
    "records_fetched",
    "records_processed",
    "records_emitted",
    "batches",
    # Records set aside (artemis/quarantine/): delivered + quarantined = fetched, when
    # the task's process keeps one record per record.
    "records_quarantined",
    # Values of fields the record model does not name, dropped (a record × a field).
    "fields_dropped",
    # Records the task's process left out on purpose (a record step's filter): neither
    # delivered nor quarantined.
    "records_filtered",
    # Answers a response rule ignored (a 404 of a sub-resource whose parent is gone, say).
    "responses_ignored",
)
STEPS = ("step_prepare", "step_fetch", "step_process", "step_emit", "step_finalize")
# The steps of the batch loop, done together when it ends.
LOOP_STEPS = ("step_fetch", "step_process", "step_emit")
# The stages a run shows besides its steps.
STAGE_PAUSED = "paused"
STAGE_PAUSING = "pausing"
STAGE_WAITING = "waiting"
STAGE_CIRCUIT_OPEN = "circuit_open"
# The plan step a run waiting out an outage is in, by what it waits on.
WAITING_STEP = MappingProxyType(
    {"source": "step_fetch", "sink": "step_emit", "store": "step_process"}
)

# A status that is its own reason carries its own code; "failed" carries the failure's.
_STATUS_CODES = MappingProxyType(
    {RunStatus.CANCELLED: ErrorCode.CANCELLED, RunStatus.TIMEOUT: ErrorCode.TIMEOUT_ERROR}
)
# Temporal's status of a closed workflow (its enum's name) → the run's status, when the
# run could not say itself (terminated, timed out, cancelled before it answered).
_CLOSED = MappingProxyType(
    {
        "COMPLETED": RunStatus.COMPLETED,
        "CANCELED": RunStatus.CANCELLED,
        "TIMED_OUT": RunStatus.TIMEOUT,
    }
)


def status_of_closed(temporal_status_name: str | None) -> RunStatus:
    """The run status of a workflow Temporal closed as ``temporal_status_name``
    (``WorkflowExecutionStatus.name``): failed unless cancelled, timed out or completed."""
    return _CLOSED.get(temporal_status_name or "", RunStatus.FAILED)


def verdict_of(status: str) -> CallbackResult:
    """The CronJob protocol's ``result`` for a run that ended with ``status``."""
    if status == RunStatus.COMPLETED:
        return CallbackResult.SUCCESS
    if status == RunStatus.TIMEOUT:
        return CallbackResult.FAILED_TIMEOUT
    return CallbackResult.FAILED


def is_terminal(status: str | None) -> bool:
    return status in TERMINAL


def new_stats() -> dict[str, int]:
    return dict.fromkeys(STAT_KEYS, 0)


def stats_view(source: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's stats as every answer shows them: the counters, and the records the
    sources stated they hold (None when no source states a total)."""
    source = source or {}
    stated = source.get("expected_total")
    view: dict[str, Any] = {
        **{k: int(source.get(k) or 0) for k in STAT_KEYS},
        "expected_total": stated if isinstance(stated, int) else None,
    }
    # Records each sink took (http, sql, files, ...), and what sinks reported at the end
    # (the files sink's manifest).
    for extra in ("sinks", "sinks_finished", "resources"):
        if isinstance(source.get(extra), Mapping):
            view[extra] = dict(source[extra])
    return view


def add_sink_counts(into: dict[str, Any], counts: Mapping[str, int]) -> None:
    """Add records per sink (an emitted batch's, a child run's) to a run's stats."""
    if not counts:
        return
    per = dict(into.get("sinks") or {})
    for name, n in counts.items():
        per[name] = int(per.get(name) or 0) + int(n)
    into["sinks"] = per


def add_stats(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Add a part's stats (a child run's, say) to the whole's."""
    for key in STAT_KEYS:
        into[key] = int(into.get(key) or 0) + int(other.get(key) or 0)
    if isinstance(other.get("sinks"), Mapping):
        add_sink_counts(into, other["sinks"])
    stated = other.get("expected_total")
    if isinstance(stated, int):
        into["expected_total"] = int(into.get("expected_total") or 0) + stated
    if isinstance(other.get("resources"), Mapping):
        into["resources"] = summed_resources(into.get("resources") or {}, other["resources"])


def summed_resources(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two parts' counts per resource (records, ignored answers, stated totals) added."""
    out = {name: dict(counts) for name, counts in a.items()}
    for name, counts in b.items():
        mine = out.setdefault(name, {})
        for key, n in counts.items():
            if isinstance(n, int):
                mine[key] = int(mine.get(key) or 0) + n
            else:
                mine.setdefault(key, n)
    return out


def error_code_of(code: str | None) -> ErrorCode:
    """An error code as the enum (INTERNAL for a code this code does not know)."""
    try:
        return ErrorCode(code or ErrorCode.INTERNAL.value)
    except ValueError:
        return ErrorCode.INTERNAL


def end_code(status: str, code: str | None = None) -> ErrorCode | None:
    """The code a run's ending carries: none when it completed, CANCELLED / TIMEOUT_ERROR
    for those endings, otherwise the failure's own code (INTERNAL when unknown)."""
    if status == RunStatus.COMPLETED:
        return None
    return _STATUS_CODES.get(status) or error_code_of(code)  # type: ignore[call-overload]


def end_error(status: str, code: str | None, message: str | None) -> dict[str, Any] | None:
    """The ``error`` of a run that ended with ``status`` ({code, message}, or None)."""
    ended = end_code(status, code)
    if ended is None:
        return None
    return {"code": ended.value, "message": message or status}


@dataclass
class FetchRetry:
    """A task's own retry policy for its fetch activity (e.g. the registry's retry_cfg)."""

    initial_s: float = 1.0
    backoff: float = 2.0
    maximum_s: float = 30.0
    maximum_attempts: int = 5


@dataclass
class CircuitBreaker:
    """After ``threshold`` failed attempts in a row the source rests ``cool_down_s`` on a
    durable timer (no worker held), then the run goes on; at most ``max_opens`` times."""

    threshold: int
    cool_down_s: float
    max_opens: int = 5


@dataclass
class PrepareResult:
    params: dict[str, Any]
    total: int
    fetch_retry: FetchRetry | None = None
    circuit: CircuitBreaker | None = None
    # Rate-limited sources: fetch on the provenance's own queue, this many pages a time.
    rate_key: str | None = None
    pages_per_fetch: int | None = None
    # When set, the run fans out into this many child runs, `parallelism` at a time; their
    # params are asked a slice at a time (ChildSliceInput), never listed here.
    fan_out: int | None = None
    parallelism: int = 1
    # Keyword search attributes for the UI (ArtemisProvenance, ArtemisTaskType).
    search: dict[str, str] = field(default_factory=dict)
    # The shortfall (percent of a stated total) the run accepts before INCOMPLETE.
    tolerance_pct: float = 0.0
    # How long an outage of a dependency is waited out (None: runs.outage_tolerance_s).
    outage_tolerance_s: float | None = None


class FetchedBatch(Protocol):
    """What the run's state takes of a fetch batch's result (``FetchResult``,
    artemis/run_models.py, which builds on this module)."""

    @property
    def pages(self) -> int: ...

    @property
    def records(self) -> int: ...

    @property
    def done(self) -> bool: ...

    @property
    def units_done(self) -> int: ...

    @property
    def expected_total(self) -> int | None: ...

    @property
    def responses_ignored(self) -> int: ...

    @property
    def resources(self) -> dict[str, Any] | None: ...


@dataclass
class RunState:
    """A run's one state: what it shows (its ``progress`` query, GET /tasks/{id} while it
    runs, the UI's details line) and what goes on with it (continue-as-new passes it
    whole; a run that fails with a retryable code is kept with it for a retry). The
    workflow changes it through these methods; the mirror, the event stream's end, the
    API and the CronJob's finalize body read its snapshot."""

    # -- what it shows --------------------------------------------------------------------
    status: RunStatus = RunStatus.PENDING
    stage: str = RunStatus.PENDING.value
    steps: dict[str, str] = field(
        default_factory=lambda: dict.fromkeys(STEPS, StepStatus.PENDING.value)
    )
    stats: dict[str, Any] = field(default_factory=new_stats)
    current: int = 0  # units (symbols, windows, ids) done
    total: int = 0
    error: dict[str, Any] | None = None
    paused: bool = False
    qps: float | None = None
    circuit: str | None = None
    task_store: str = MirrorHealth.PENDING.value
    # Waiting out an outage: {dependency, name, since, reason, error, attempt,
    # next_attempt_at, next_in_s, tolerance_s}; None while nothing is down.
    waiting: dict[str, Any] | None = None

    # -- where it stands (carried to the next generation, kept for a retry) ----------------
    # The prepared params; None until prepare ran.
    params: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    next_seq: int = 0
    progress_last_ms: float | None = None
    started_ms: int = 0
    generation: int = 1
    fetch_retry: FetchRetry | None = None
    breaker: CircuitBreaker | None = None
    # Rate-limited sources: the provenance whose queue the fetches go to, and its pages
    # per fetch.
    rate_key: str | None = None
    pages_per_fetch: int | None = None
    tolerance_pct: float = 0.0
    # How long an outage is waited out (None: the tuning's).
    outage_tolerance_s: float | None = None
    # Pages fetched and staged but not yet delivered ([first, last] ranges, and pages of
    # them already delivered): a retried run emits these before it fetches on.
    undelivered: list[list[int]] = field(default_factory=list)
    delivered_above: list[int] = field(default_factory=list)
    # Every page below this sequence was delivered (above it: delivered_above).
    delivered_below: int = 0
    # Pages up to this sequence were processed (and counted in records_processed).
    processed_through: int = -1
    # The fetch side had reached the source's end (only emitting was left).
    fetch_done: bool = False
    # A run that fans out (a backfill's windows): how many child runs it has, and the
    # index of the next one to start (every one before it has ended: a generation waits
    # for its children before it continues as new).
    fan_out: int | None = None
    children_next: int = 0
    parallelism: int = 1
    # A run started again by POST /tasks/{id}/retry (how many times, from 1); set on the
    # first generation of that start only.
    retry_attempt: int = 0
    retry_start: bool = False

    # -- this generation only ---------------------------------------------------------------
    # A parent run (backfill windows): its children emit and finish their own sinks.
    parent: bool = False
    # The operator's cancel, with its reason.
    cancel_reason: str | None = None
    # Set once the run must stop. Cancelling an activity whose result is already on its
    # way can still return that result, so the loop also checks this flag itself.
    stopping: bool = False
    # The next fetch goes on from a checkpoint after a wait (a pause, an outage).
    resume_fetch: bool = False
    circuit_opens: int = 0
    # Outages being waited out, by dependency: {"since" (ISO time), "attempt", "waiting"}.
    outages: dict[str, dict[str, Any]] = field(default_factory=dict)

    def prepared(self, result: PrepareResult) -> None:
        """Prepare ran: the validated params, the run's size and its source's settings."""
        self.sized(result.total)
        self.params = result.params
        self.fetch_retry = result.fetch_retry
        self.breaker = result.circuit
        self.rate_key = result.rate_key
        self.pages_per_fetch = result.pages_per_fetch
        self.tolerance_pct = result.tolerance_pct
        self.outage_tolerance_s = result.outage_tolerance_s
        self.fan_out = result.fan_out
        self.parallelism = result.parallelism

    def next_generation(self, **more: Any) -> RunState:
        """The state its next generation (continue-as-new) or a retry starts from: where
        it stands and its counters; what this generation alone was doing is left out."""
        return dataclasses.replace(
            self,
            generation=self.generation + 1,
            retry_start=False,
            status=RunStatus.RUNNING,
            stage=RunStatus.PENDING.value,
            error=None,
            circuit=CircuitState.CLOSED.value,
            task_store=MirrorHealth.PENDING.value,
            waiting=None,
            parent=False,
            cancel_reason=None,
            stopping=False,
            resume_fetch=False,
            circuit_opens=0,
            outages={},
            steps=dict(self.steps),
            stats=dict(self.stats),
            **more,
        )

    # -- steps -----------------------------------------------------------------------------
    def enter(self, step: str) -> None:
        """The run works in ``step`` now."""
        self.stage = step
        if self.steps[step] == StepStatus.PENDING:
            self.steps[step] = StepStatus.IN_PROGRESS.value

    def working(self, step: str) -> None:
        """``step`` has work in flight (the stage stays where it is)."""
        if self.steps[step] != StepStatus.COMPLETED:
            self.steps[step] = StepStatus.IN_PROGRESS.value

    def complete(self, *steps: str) -> None:
        for step in steps:
            self.steps[step] = StepStatus.COMPLETED.value

    def failed_step(self, step: str) -> None:
        self.steps[step] = StepStatus.ERROR.value

    def reopen_failed_steps(self) -> None:
        """Started again by POST /tasks/{id}/retry: the failed attempt's steps go on."""
        for step, st in self.steps.items():
            if st == StepStatus.ERROR:
                self.steps[step] = StepStatus.IN_PROGRESS.value

    def step_done(self, step: str) -> bool:
        return self.steps[step] == StepStatus.COMPLETED

    # -- counters ----------------------------------------------------------------------------
    def fetched(self, result: FetchedBatch) -> None:
        """A fetch batch came back: its pages and records, the units done, the total the
        sources state."""
        self.add_fetch(
            result.pages,
            result.records,
            result.units_done,
            result.expected_total,
            result.done,
            result.responses_ignored,
        )
        if result.resources:
            self.stats["resources"] = result.resources

    def add_fetch(
        self,
        pages: int,
        records: int,
        units_done: int | None,
        expected_total: int | None,
        done: bool,
        ignored: int = 0,
    ) -> None:
        self.stats["pages"] += pages
        self.stats["records_fetched"] += records
        self.stats["batches"] += 1
        if expected_total is not None:
            self.stats["expected_total"] = expected_total
        if units_done is not None:
            self.current = units_done
        if done:
            self.complete("step_fetch")
        # (a run carried over from a build that did not count these has no such key yet)
        key = "responses_ignored"
        if ignored or key in self.stats:
            self.stats[key] = int(self.stats.get(key) or 0) + ignored

    def count(self, ledger: Ledger) -> None:
        """What a path's ledger counted (``artemis/ledger.py``) added to the run's counts:
        its judged pages' and its delivered pages'."""
        if ledger.judges:
            self.processed(
                ledger.records_out,
                ledger.records_quarantined,
                ledger.fields_dropped,
                ledger.records_filtered,
            )
        if ledger.delivers:
            self.emitted(ledger.records_emitted, ledger.sinks)

    def stand_after(self, ledger: Ledger) -> None:
        """The run standing after a path's ledger: every page below its ``next_seq``
        judged (``processed_through``) and, when it delivers, delivered
        (``delivered_below``)."""
        if ledger.next_seq <= ledger.first_seq:
            return
        if ledger.judges:
            self.processed_through = max(self.processed_through, ledger.next_seq - 1)
        if ledger.delivers:
            self.delivered_below = max(self.delivered_below, ledger.next_seq)

    def processed(
        self, records: int, quarantined: int = 0, dropped: int = 0, filtered: int = 0
    ) -> None:
        self.stats["records_processed"] += records
        # (a run carried over from a build that did not count these has no such keys yet)
        for key, n in (
            ("records_quarantined", quarantined),
            ("fields_dropped", dropped),
            ("records_filtered", filtered),
        ):
            if n or key in self.stats:
                self.stats[key] = int(self.stats.get(key) or 0) + n

    def emitted(self, records: int, sinks: Mapping[str, int]) -> None:
        self.stats["records_emitted"] += records
        add_sink_counts(self.stats, sinks)

    def child_ended(self, stats: Mapping[str, Any]) -> None:
        """A child run (a window, a piece of a split) ended: its counts add up here."""
        add_stats(self.stats, stats)
        self.current += 1

    def finalized(self, stats: Mapping[str, Any]) -> None:
        """The finalize's own counts (a task's finalize may correct them) and what the
        sinks reported when they finished."""
        for k, v in stats.items():
            if isinstance(v, int) and k in self.stats:
                self.stats[k] = v
        if isinstance(stats.get("sinks_finished"), dict):
            self.stats["sinks_finished"] = stats["sinks_finished"]

    def sized(self, total: int) -> None:
        """Prepare said how many units the run has."""
        self.total = total

    def split_into(self, pieces: int) -> None:
        """The run's window was split into ``pieces`` child runs: they are its units."""
        self.total, self.current = pieces, 0

    def expect(self, records: int) -> None:
        """What the source stated the run holds (a split window's count)."""
        self.stats["expected_total"] = records

    # -- the operator's controls and the run's waits ------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def set_qps(self, qps: float) -> None:
        self.qps = qps

    def stopped_fetching(self) -> None:
        """A pause reached the fetch: nothing is fetched until resume."""
        self.stage = STAGE_PAUSED

    def stopping_fetch(self) -> None:
        """A pause is stopping the fetch in flight at its next page."""
        self.stage = STAGE_PAUSING

    def wait_for(self, waiting: dict[str, Any], circuit_open: bool) -> None:
        """Waiting out an outage (``waiting``: what the progress query shows), on the
        source's circuit breaker when ``circuit_open``."""
        self.waiting = waiting
        self.stage = STAGE_CIRCUIT_OPEN if circuit_open else STAGE_WAITING
        if circuit_open:
            self.circuit = CircuitState.OPEN.value

    def circuit_rest(self) -> None:
        """The circuit breaker opened after the fetch's failures: the source rests."""
        self.circuit = CircuitState.OPEN.value
        self.stage = STAGE_CIRCUIT_OPEN

    def circuit_closed(self) -> None:
        self.circuit = CircuitState.CLOSED.value

    def waited(self, dependency: str, still_waiting: dict[str, Any] | None) -> None:
        """``dependency`` answered again; ``still_waiting``: another outage still on."""
        self.waiting = still_waiting
        if self.stage in (STAGE_WAITING, STAGE_CIRCUIT_OPEN) and still_waiting is None:
            self.stage = WAITING_STEP.get(dependency, "step_process")

    def mirrored(self, ok: bool) -> None:
        """How the last write to task storage went."""
        self.task_store = (MirrorHealth.OK if ok else MirrorHealth.FAILED).value

    # -- status ------------------------------------------------------------------------------
    def start(self) -> None:
        self.status = RunStatus.RUNNING

    def end(self, status: RunStatus, code: str | None, message: str | None) -> None:
        """The run ended: steps still in progress broke off (unless it completed), and its
        error is the ending's. Its status shows once it is recorded (``ended``)."""
        if status != RunStatus.COMPLETED:
            for step, st in self.steps.items():
                if st == StepStatus.IN_PROGRESS:
                    self.steps[step] = StepStatus.ERROR.value
        self.error = {"code": code, "message": message} if code else None
        self.waiting = None

    def ended(self, status: RunStatus) -> None:
        self.status = status

    def shown_status(self) -> RunStatus:
        """The status as a person reads it: a running run the operator paused is
        ``pausing`` until its fetch in flight has stopped, then ``paused``."""
        if self.status == RunStatus.RUNNING and self.paused:
            return RunStatus.PAUSED if self.stage == STAGE_PAUSED else RunStatus.PAUSING
        return self.status

    def progress(self) -> dict[str, Any]:
        return {
            "status": self.shown_status().value,
            "stage": self.stage,
            "current": self.current,
            "total": self.total,
            **stats_view(self.stats),
            "steps": [{"id": s, "status": self.steps[s]} for s in STEPS],
            "error": self.error,
            "paused": self.paused,
            "qps": self.qps,
            "circuit": self.circuit,
            "task_store": self.task_store,
            "waiting": self.waiting,
        }

    def details_line(self, waiting_text: str | None) -> str:
        """The run's line in the Temporal UI (current details)."""
        s = self.stats
        line = (
            f"**{self.shown_status().value}** · stage `{self.stage}` · "
            f"{self.current}/{self.total} units"
            f" · {s['pages']} pages · {s['records_fetched']} fetched · "
            f"{s['records_emitted']} emitted"
        )
        if s.get("records_quarantined"):
            line += f" · {s['records_quarantined']} quarantined"
        if waiting_text:
            line += f"\n\n**{waiting_text}**"
        return line
