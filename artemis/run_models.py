"""The data that crosses the Temporal boundary for one task run.

Plain dataclasses with JSON-friendly fields (safe inside the workflow sandbox: the
stdlib, and pydantic's ``Field`` only as bounds metadata on ``RunTuning``), one per
workflow or activity, so signatures can grow without breaking running
histories. Nothing here may hold a secret or a record: histories carry references and
counts only (claim check).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from artemis.ledger import Ledger
from artemis.owners import DEFAULT_OWNER
from artemis.run_state import RunState

WORKFLOW_NAME = "TaskRunWorkflow"


# The CronJob protocol's finalize: the first try and 3 retries (0.5 s, 1 s, 2 s), as the
# workflow's retry policy runs them; the activity reads its attempt against this.
FINALIZE_MAX_ATTEMPTS = 4


class FinalizeOutcome(StrEnum):
    """How the finalize callback went (``RunResult.callback``, the callbacks metric)."""

    DELIVERED = "delivered"
    REJECTED = "rejected"  # 4xx: CronJob not in CallbackPending; never retried
    RETRY = "retry"  # network error or 5xx: the activity retry policy tries again
    SKIPPED = "skipped"  # no callback configured
    GAVE_UP = "gave_up"  # still failing after the last attempt
    ERROR = "error"  # the finalize activity itself failed (the workflow's view)


# Search attribute names (registered by `artemis dev` and the test fixtures).
SA_TASK_CODE = "ArtemisTaskCode"
SA_TASK_ID = "ArtemisTaskId"
SA_RUN_ID = "ArtemisRunId"
SA_PROVENANCE = "ArtemisProvenance"
SA_TASK_TYPE = "ArtemisTaskType"
# The name of the API token that started the run (artemis/owners.py).
SA_OWNER = "ArtemisOwner"
SEARCH_ATTRIBUTES = (SA_TASK_CODE, SA_TASK_ID, SA_RUN_ID, SA_PROVENANCE, SA_TASK_TYPE, SA_OWNER)


def workflow_id_for(task_code: str, task_id: str) -> str:
    return f"artemis/{task_code}/{task_id}"


def lock_workflow_id(workflow_name: str) -> str:
    """The workflow id of an execution lock (workflows/execution_lock.py): one open per
    name. (Runs started before the lock was a workflow of its own have it as theirs.)"""
    return f"artemis/lock/{workflow_name}"


# The workflow type of an execution lock, and the signal that tells it the run it holds.
LOCK_WORKFLOW = "ExecutionLock"
LOCK_BIND_SIGNAL = "bind"


@dataclass
class LockHold:
    """An execution lock taken for one run: the lock's name, the run's task id and
    workflow id, and the run's deadline (the lock never outlives it by much)."""

    lock: str
    task_id: str
    run_workflow_id: str
    timeout_s: float


@dataclass
class LockedRun:
    """The run an execution lock waits for: its workflow id and first run id."""

    workflow_id: str
    run_id: str


def provenance_queue(task_queue: str, provenance: str) -> str:
    """The task queue of one provenance's fetch activities: its worker-side options carry
    the provenance's cluster-wide activities-per-second limit."""
    return f"{task_queue}.provenance.{provenance}"


@dataclass
class RunTuning:
    """How a run is cut into activities (docs/performance.md): the
    run's own tuning, fixed when it starts and carried in its history.

    The one definition of these knobs: the ``runs:`` settings section
    (``artemis.config.RunsSettings``) extends this class with the worker-side ones, so a
    field's default and bounds are written here only. The bounds are metadata Temporal's
    converter ignores (it reads plain type hints) and the settings validate.
    """

    # Pages per fetch activity (its pages are emitted concurrently with it: a batch is a checkpoint
    # in history, not a unit of delivery; a fetch also ends after fetch_max_seconds).
    pages_per_fetch: Annotated[int, Field(ge=1)] = 200
    fetch_max_seconds: Annotated[float, Field(gt=0)] = 5.0
    heartbeat_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    fetch_start_to_close_s: Annotated[float, Field(gt=0)] = 600.0
    emit_start_to_close_s: Annotated[float, Field(gt=0)] = 600.0
    max_batches_per_run: Annotated[int, Field(ge=1)] = 200
    activity_max_attempts: Annotated[int, Field(ge=1)] = 5
    # Outages (docs/architecture.md): a source or sink failing transiently (5xx, 408, 429, refused,
    # reset, DNS, read timeout, database unreachable) is waited out on Temporal timers for
    # this long from the first failure of the current outage (0: fail fast, as the
    # activities' own retry policies decide); per task `task_defaults.<code>.
    # outage_tolerance_s`, per provenance `retry_cfg.outage_tolerance_millis`.
    outage_tolerance_s: Annotated[float, Field(ge=0)] = 1800.0
    # The longest wait between two attempts while a dependency is down.
    retry_max_interval_s: Annotated[float, Field(gt=0)] = 60.0
    # How many batches the fetch side may be ahead of what was emitted (staged, not sent).
    max_batches_ahead: Annotated[int, Field(ge=1, le=16)] = 2
    # Emit while fetching: a batch's pages are processed and sent as they are staged
    # (false: each batch is processed and emitted once fetched, by its own activities —
    # larger writes for a sink that prefers them, a step per stage in the Temporal UI).
    emit_while_fetching: bool = True
    # A run that failed with a retryable code keeps its checkpoint, staged pages and
    # delivery ledger this long, for POST /tasks/{id}/retry.
    retain_failed_s: Annotated[float, Field(ge=0)] = 72 * 3600.0
    # A run that fans out (a backfill's windows) starts at most this many child runs per
    # generation, then waits for them and continues as new: its history stays far below
    # Temporal's event limit however many windows it has (docs/performance.md).
    children_per_run: Annotated[int, Field(ge=1, le=5000)] = 500


@dataclass
class RunRef:
    """Who a run is, for activities (logging fields, staging keys, tracing)."""

    task_code: str
    task_id: str
    workflow_id: str
    trace_id: str
    parent_span_id: str | None = None
    request_id: str | None = None
    # The task id of the run's top ancestor (a backfill's window runs stream into it).
    root_task_id: str | None = None
    # Where the run's secrets are kept (``RunRequest.secrets_key``).
    secrets_key: str | None = None
    # The role of the token that started it (``RunRequest.role``).
    role: str = "client"


@dataclass
class Outage:
    """A dependency failing transiently, as an activity saw it (docs/architecture.md): no
    secret, no record — the words an operator reads in ``waiting: …``."""

    dependency: str  # "source" | "sink" | "store"
    name: str  # the sink ("http", "sql", "files"), the source or provenance, "staging"
    reason: str  # short: "503 Service Unavailable", "read timed out", "connection refused"
    message: str  # the error as the activity raised it (redacted)
    code: str  # its error code (SOURCE_ERROR, SINK_ERROR, TIMEOUT_ERROR, ...)
    retry_after_s: float | None = None


@dataclass
class RunRequest:
    task_code: str
    task_id: str
    params: dict[str, Any]
    trace_id: str
    parent_span_id: str | None = None
    request_id: str | None = None
    output: dict[str, Any] = field(default_factory=dict)
    callback: dict[str, Any] | None = None
    timeout_s: float = 3600.0
    tuning: RunTuning = field(default_factory=RunTuning)
    # Set when the run goes on from a state: its next generation (continue-as-new) or
    # a retry of a failed run.
    carry: RunState | None = None
    root_task_id: str | None = None  # set on child runs: the top ancestor's task id
    # The key of the run's secrets (its callback token, sink credentials): the start's
    # own, so a start that is refused or attaches to a running run drops what it wrote
    # and never hands it to another run. None: the secrets are under `{code}/{task id}`.
    secrets_key: str | None = None
    # The role of the API token that started the run (artemis/owners.py): only an
    # operator's or admin's run changes a provenance's shared state (its record model, its
    # pointers). A run's children and its retries keep it.
    role: str = "client"


@dataclass
class PrepareInput:
    run: RunRef
    params: dict[str, Any]


# The housekeeping workflows (CleanupOldTasks, ReclaimStaleLocks, EvaluateAlerts) take
# two more fields:
#   every_s    None: one pass, then the workflow completes; set: the workflow loops, one pass every
#              every_s seconds on a Temporal timer (workers/main.py starts one per job).
#              A `configure` signal with None stops a loop.
#   run_for_s  a loop continues as new after running this long (or when Temporal
#              suggests it), so the UI's list gets about one row per job per day.
HOUSEKEEPING_RUN_FOR_S = 86400.0


@dataclass
class CleanupInput:
    hours: float = 24.0
    # A run still open in the task store this long after its last write is checked
    # against Temporal, and its ending recorded when its workflow has closed.
    reconcile_after_s: float = 60.0
    every_s: float | None = None
    run_for_s: float = HOUSEKEEPING_RUN_FOR_S


@dataclass
class CleanupResult:
    tasks_removed: int
    staged_pages_removed: int
    events_removed: int = 0
    runs_reconciled: int = 0
    # The files sink's records of runs that never reached their finalize.
    sink_files_forgotten: int = 0


@dataclass
class ReclaimInput:
    lock_timeout_minutes: float = 30.0
    now: str | None = None  # ISO time from the workflow's clock (None: the activity's)
    every_s: float | None = None
    run_for_s: float = HOUSEKEEPING_RUN_FOR_S


@dataclass
class ReclaimResult:
    records_pending: int
    records_failed: int
    executions_timed_out: int


@dataclass
class AlertsInput:
    now: str | None = None  # the workflow's clock
    every_s: float | None = None
    run_for_s: float = HOUSEKEEPING_RUN_FOR_S


@dataclass
class AlertsResult:
    sent: list[str] = field(default_factory=list)  # "firing:key" / "resolved:key"


@dataclass
class NoteDetailsRequest:
    """POST /notes/details: one activity per note, all at once; notes come back through
    staging (``batch_key``), only outcomes through history."""

    platform: str
    note_ids: list[str]
    batch_key: str
    detail_timeout_s: float = 15.0
    request_id: str | None = None
    trace_id: str | None = None


@dataclass
class NoteDetailInput:
    platform: str
    note_id: str
    batch_key: str
    seq: int
    timeout_s: float = 15.0
    request_id: str | None = None


@dataclass
class NoteDetailOutcome:
    id: str
    success: bool
    error: dict[str, Any] | None = None
    cookie_used: str | None = None


@dataclass
class MirrorInput:
    """A state change of the run, recorded in task storage."""

    run: RunRef
    status: str
    stats: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    # The run's start and (terminal) end on the workflow's clock, epoch ms: the record's
    # started_at / completed_at, so its duration is the workflow's.
    started_ms: int | None = None
    ended_ms: int | None = None
    # The run's plan steps at its end (the event stream's last plan); None: not told.
    steps: dict[str, str] | None = None
    # The request's params, for the record this write creates when the API's `pending`
    # record is not there yet (a sync run may end before it): the run keeps its source's
    # name in the task list. None: the record is created without them.
    params: dict[str, Any] | None = None


# The workflow that replays a run's quarantined records (workflows/quarantine_replay.py).
REPLAY_WORKFLOW_NAME = "QuarantineReplay"


def replay_workflow_id(task_id: str) -> str:
    """One replay at a time per run: a second start while one runs is refused."""
    return f"artemis/quarantine-replay/{task_id}"


@dataclass
class ReplayRequest:
    """Replay the quarantined records of run ``task_id`` (``ids``: those rows only)."""

    task_id: str
    ids: list[int] | None = None
    trace_id: str = ""
    request_id: str | None = None
    # Quarantine rows per activity (each row is sent on its own, under its own key).
    batch: int = 200


@dataclass
class ReplayBatchInput:
    task_id: str
    after_id: int
    limit: int
    ids: list[int] | None = None
    trace_id: str = ""
    request_id: str | None = None


@dataclass
class ReplayResult:
    """Rows landed (marked replayed), rows judged bad again (kept, with the new reason),
    and where the next batch starts."""

    landed: int = 0
    still_bad: int = 0
    next_after: int = 0
    done: bool = False


@dataclass
class SplitInput:
    run: RunRef
    params: dict[str, Any]
    details: dict[str, Any]


@dataclass
class SplitResult:
    children: list[dict[str, Any]] | None
    parallelism: int = 1


@dataclass
class ChildSliceInput:
    """The params of a fan-out's child runs ``offset`` .. ``offset + limit - 1``: a parent
    asks them a slice at a time, so no payload lists them all."""

    run: RunRef
    params: dict[str, Any]
    offset: int
    limit: int


@dataclass
class FetchInput:
    run: RunRef
    params: dict[str, Any]
    checkpoint: dict[str, Any] | None
    first_seq: int
    max_pages: int
    max_seconds: float
    total: int
    units_done: int
    callback: dict[str, Any] | None = None
    progress_last_ms: float | None = None
    qps: float | None = None  # a live set_rate_limit override
    # Fetched again after a failed attempt (e.g. after the circuit breaker's cool-down):
    # the source's last request may have been served, its answer lost.
    resumed: bool = False
    # A transient failure of the source ends the batch with ``FetchResult.outage`` (the
    # pages fetched so far counted) instead of failing the activity: the workflow waits.
    report_outages: bool = False
    # Emit while fetching: each staged page is processed and sent to the run's sinks
    # (``output``) concurrently with the fetch, in order, under its own idempotency key (asked only
    # when every earlier batch is delivered); what it delivered: ``FetchResult.streamed``.
    stream: bool = False
    output: dict[str, Any] = field(default_factory=dict)
    # The records the run fetched before this batch (a streaming fetch judges its pages:
    # what a percentage ``max_bad_records`` is of).
    records_before: int = 0


@dataclass
class FetchResult:
    first_seq: int
    next_seq: int
    pages: int
    records: int
    checkpoint: dict[str, Any] | None
    done: bool
    units_done: int
    progress_last_ms: float | None = None
    # What the sources stated they hold, so far (None: no source states a total).
    expected_total: int | None = None
    # A source ended short of its stated total beyond the tolerance: {"message",
    # "expected_total", "records_fetched"}; the run fails INCOMPLETE after this batch.
    incomplete: dict[str, Any] | None = None
    # The source failed transiently after these pages (report_outages): wait, go on.
    outage: Outage | None = None
    # FetchInput.stream: the pages it judged and delivered (None: not asked to stream).
    streamed: Ledger | None = None
    # Answers a response rule ignored (each an empty page): a count, for the run's stats.
    responses_ignored: int = 0
    # A source of several resources: each resource's counts so far (records, ignored
    # answers, stated totals), as the last page taken told them.
    resources: dict[str, Any] | None = None


@dataclass
class BatchInput:
    run: RunRef
    params: dict[str, Any]
    first_seq: int
    last_seq: int
    output: dict[str, Any] = field(default_factory=dict)
    # Emit: pages of the range already delivered by an earlier call (not sent again), and
    # whether a sink's transient failure ends the call with ``EmitResult.outage``.
    skip_seqs: list[int] = field(default_factory=list)
    report_outages: bool = False
    # Emit: staged pages below this sequence were delivered; their payloads can go.
    prune_below: int | None = None
    # Process: the records the run had fetched, and the total its sources state (what a
    # percentage ``max_bad_records`` is of).
    fetched: int = 0
    stated: int | None = None


@dataclass
class EmitResult:
    # The pages delivered without a gap, and the counts of every page this call delivered.
    ledger: Ledger
    # A sink failed transiently (report_outages): the ledger counts the pages in
    # ``delivered_seqs`` only; the others of the range go again after the wait.
    outage: Outage | None = None
    delivered_seqs: list[int] = field(default_factory=list)


@dataclass
class FinalizeInput:
    run: RunRef
    status: str
    stats: dict[str, Any]
    error_code: str | None = None
    error_message: str | None = None
    callback: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    # The run's sink overrides, and whether its sinks finish here (a manifest); a parent
    # run's children finish their own.
    output: dict[str, Any] | None = None
    finish_sinks: bool = True
    # A run finished by POST /tasks/{id}/retry (from 1): its finalize is a new call.
    retry_attempt: int = 0


@dataclass
class CleanupRunInput:
    run: RunRef
    # How many pages the run staged (its next page number once its fetching is done;
    # None: not told): a run of a few pages is dropped on the event loop, others in a
    # thread.
    pages: int | None = None


@dataclass
class OutageNote:
    """A run started or stopped waiting on a dependency: recorded in its event stream,
    the waiting gauge and the log (a local activity)."""

    run: RunRef
    kind: str  # "waiting" | "recovered"
    waiting: dict[str, Any]


@dataclass
class RetainInput:
    """A run that failed with a retryable code keeps what POST /tasks/{id}/retry needs."""

    run: RunRef
    request: RunRequest
    carry: RunState
    error_code: str
    error_message: str
    retain_s: float


@dataclass
class FinalizeResult:
    callback: str
    detail: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class CancelRequest:
    reason: str = "cancelled by request"


@dataclass
class PauseRequest:
    reason: str = "paused by request"


@dataclass
class RateLimitRequest:
    qps: float


@dataclass
class RunResult:
    task_code: str
    task_id: str
    workflow_id: str
    status: str
    duration_ms: int
    stats: dict[str, Any]
    error: dict[str, Any] | None = None
    callback: str | None = None


# -- a schedule's starts (artemis/schedules.py; workflows/scheduled_start.py) ----------------

STARTER_WORKFLOW = "ScheduledStart"
# Who made a schedule: the API (its owner a token, checked at each start) or the config.
MADE_BY_CONFIG = "config"
MADE_BY_API = "api"


@dataclass
class ScheduledStart:
    """The starter workflow's input: the run to start and whose it is. Bounded by the
    definition it comes from; no secret (``token_env`` is a name)."""

    name: str
    task_code: str
    params: dict[str, Any] = field(default_factory=dict)
    owner: str = DEFAULT_OWNER
    role: str = "operator"
    callback: dict[str, Any] | None = None
    token_env: str | None = None
    timeout_s: float | None = None
    # The definition's digest (``ScheduleDef.digest``): a reconcile updates on a change.
    digest: str | None = None
    # ``api`` (its owner a token, checked at each start) or ``config``.
    made_by: str = MADE_BY_API


@dataclass
class StartScheduled:
    """The start activity's input: the start, and the instant Temporal scheduled it for
    (ISO 8601, UTC)."""

    start: ScheduledStart
    scheduled_at: str


@dataclass
class ScheduledRun:
    """A run a schedule started (or attached to: the same task id again)."""

    task_id: str
    workflow_id: str
    run_id: str | None = None
    status: str | None = None


_STAMP = re.compile(r"-(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)$")


def scheduled_instant(workflow_id: str) -> datetime | None:
    """The instant a schedule's action was scheduled for, from the workflow id Temporal
    gave the workflow it started (the action's id, ``-``, the instant in RFC 3339);
    None for a workflow id without one."""
    m = _STAMP.search(workflow_id)
    if m is None:
        return None
    try:
        return datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
    except ValueError:
        return None
