"""What the starter API and the CLI do with Temporal: start a run (params, output and
callback checked, `pending` recorded concurrently with the answer), retry a failed one, pause,
resume, re-rate and cancel. Finding and reading runs: ``starter/run_reads.py``.

Routes stay thin; this module owns the mapping between task ids and workflow ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from opentelemetry import context as otel_context
from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowHandle,
)
from temporalio.client import (
    WorkflowExecutionStatus as WfStatus,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from artemis import jsonio
from artemis.callback import CallbackTarget, resolve_base_url
from artemis.calls import work, work_on
from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.event_kinds import Control
from artemis.events import EventLog
from artemis.logsetup import get_logger
from artemis.owners import (
    DEFAULT_OWNER,
    owned_lock,
    owned_task_id,
    writes_shared,
)
from artemis.redact import MIN_REQUEST_SECRET, scoped
from artemis.run_models import (
    WORKFLOW_NAME,
    LockHold,
    PauseRequest,
    RateLimitRequest,
    RunRequest,
    workflow_id_for,
)
from artemis.run_record import RunSnapshot, Write, write_runs
from artemis.run_state import TERMINAL, RunStatus
from artemis.security import check_header_names
from artemis.sinks import (
    lane_output,
    register_sink_secret,
    resolve_lanes,
    resolve_output,
    resolved_spec,
    seal_output,
)
from artemis.sinks.sealing import is_credential_name
from artemis.sinks.sql import check_sql_output
from artemis.tasks.base import TaskUnit
from artemis.tasks.registry import get_task
from artemis.taskstore import TaskStorage
from artemis.temporal.runs import closed_run_end
from artemis.tracing import TraceContext, otel_context_for
from artemis.vault import CALLBACK_TOKEN, START_SEP, RunSecrets
from starter.locks import ExecutionLocks, locked
from starter.run_reads import (
    KEY_OWNER,
    KEY_RUN_ID,
    KEY_TASK_CODE,
    KEY_TASK_ID,
    RUNS_QUERY,
    RunReads,
    from_record,
    ui_list_url,
    ui_url,
)
from starter.ssrf import check_request_urls

log = get_logger("artemis.starter")

# How long the `pending` writer lets a burst of starts gather before a transaction that
# follows another within this time (the first record after a quiet spell goes at once).
# Without it a burst of 50 went in transactions of one to three records, each a round
# trip to the writer's thread that the busy event loop paid for in GIL hand-offs (a fifth
# of the API's CPU a request under the accept bench). The records are written concurrently with the
# answers, never in their way, and this API's reads see them while they wait
# (``RunService.record``).
PENDING_GATHER_S = 0.02

__all__ = ["RUNS_QUERY", "RunService", "StartRequest", "Started", "ui_list_url", "ui_url"]


@dataclass(frozen=True)
class StartRequest:
    """A run to start, as a request asks for it (the API reads it from its body model,
    ``starter/api/schemas.RunBody``); checked here against the task and the config."""

    params: dict[str, Any] = field(default_factory=dict)
    task_id: str | None = None
    request_id: str | None = None
    timeout_s: float | None = None
    output: dict[str, Any] | None = None
    # The CronJob to call back (a base URL of None: ``callback.base_url``) and the token
    # to send it, kept as a run secret.
    callback: CallbackTarget | None = None
    callback_token: str | None = None
    # The caller's role (artemis/config.py Role): an operator's or admin's run may change
    # a provenance's shared state; a client's may not.
    role: str = "client"


@dataclass
class Started:
    handle: WorkflowHandle
    task_id: str
    workflow_id: str
    run_id: str | None
    callback_mode: str
    existing_result: dict[str, Any] | None = None


async def check_sql_output_async(output: dict[str, Any], record: Any) -> None:
    spec = resolved_spec(output) or {}
    names = spec.get("sinks") or []
    if "sql" in ([names] if isinstance(names, str) else names):
        await work(check_sql_output, spec, record)


def check_shared_writes(params: dict[str, Any] | None, role: str, owner: str) -> None:
    """A request that asks to change what every owner's runs share needs an operator or
    admin token (403 FORBIDDEN naming the role): ``schema_contract: evolve`` rewrites the
    provenance's record model. (A client's ``update`` runs, and never moves the shared
    pointer: the task reads the run's role, artemis/tasks/source_harvest.py.)"""
    if (params or {}).get("schema_contract") == "evolve" and not writes_shared(role):
        raise ArtemisError(
            ErrorCode.FORBIDDEN,
            "params.schema_contract: 'evolve' changes the provenance's record model for "
            f"every owner's runs: it needs an operator or admin token (token {owner!r} is "
            f"a {role})",
        )


@dataclass
class NewRun:
    """A start under way: the run it makes and whose it is (its secrets: StartSecrets)."""

    code: str
    task_id: str
    workflow_id: str
    owner: str
    params: dict[str, Any]
    callback_mode: str = "none"


class StartSecrets:
    """The secrets one start sealed (its callback token, sink header values and
    credential-bearing URLs), held for the length of the start, ``async with``: the run
    the start makes reads them (``keep``); a start that makes no run (refused, its lock
    held by another task, attached to the run of its task id) drops them when it ends,
    so they never reach a run they were not sent with. A start whose answer was lost
    keeps them too: the run may exist, and the clean-up drops them once Temporal says it
    is not open."""

    def __init__(self, service: RunService, output: dict[str, Any], key: str | None) -> None:
        self._service = service
        self.output = output  # the run's output, its secrets replaced by their names
        self.key = key  # where they are stored (None: the start has none)
        self._kept = False

    def keep(self) -> None:
        self._kept = True

    async def __aenter__(self) -> StartSecrets:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._kept:
            await self._service.drop_secrets(self.key)


class RunService(RunReads):
    """Starting runs, retrying a failed one, an operator's controls (the reads: RunReads)."""

    def __init__(self, client: Client, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self._secrets: RunSecrets | None = None
        self._store: TaskStorage | None = None
        self._events: EventLog | None = None
        self._jobs: set[asyncio.Future[Any]] = set()
        # `pending` records waiting for the writer, and the writer (one at a time): the
        # records of a burst of starts go in one transaction, on a thread of their own
        # (not asyncio's default pool, which the request path and the reads use).
        self._pending: dict[str, RunSnapshot] = {}
        self._writing: dict[str, RunSnapshot] = {}  # the batch being written
        self._last_write = float("-inf")  # when the last batch was written (monotonic)
        self._pending_writer: asyncio.Future[Any] | None = None
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="pending-records")

    @property
    def secrets(self) -> RunSecrets:
        if self._secrets is None:
            self._secrets = RunSecrets(
                self.settings.database.url,
                self.settings.vault.master_key_file,
            )
        return self._secrets

    async def start(
        self,
        code: str,
        ask: StartRequest,
        trace: TraceContext,
        request_id: str | None,
        owner: str = DEFAULT_OWNER,
    ) -> Started:
        """Start ``owner``'s run of task ``code`` (its task id and its execution lock are
        ``owner``'s own: ``artemis.owners``), with the caller's role (``ask.role``)."""
        task, prepared, callback, output = await self._checked(code, ask, owner)
        lock = task.lock_name(prepared)
        task_id = owned_task_id(owner, ask.task_id or uuid.uuid4().hex)
        run = NewRun(code, task_id, workflow_id_for(code, task_id), owner, ask.params)
        run.callback_mode = "progress_and_finalize" if callback else "none"
        if lock and ask.task_id:
            # A repeat of a finished task id is answered from the task store: never
            # started again, nor refused for the lock another run holds now.
            finished = await self._finished_repeat(task_id, run.workflow_id)
            if finished is not None:
                return finished
        async with await self._seal_secrets(code, task_id, ask.callback_token, output) as sealed:
            req = self._run_request(run, ask, trace, request_id, callback, sealed)
            held = (
                await self.take_lock(lock, req, owner, ask.role, run.callback_mode)
                if lock
                else None
            )
            if isinstance(held, Started):  # this task id's run holds it: attached to that run
                return held
            # Make Temporal's tracing interceptor continue the caller's trace.
            otel_token = otel_context.attach(otel_context_for(trace))
            try:
                handle = await self.start_workflow(
                    req,
                    run.workflow_id,
                    exclusive=False,
                    summary=(code, task.describe(prepared), f"task {task_id}"),
                    details=f"Task `{code}` started by request `{req.request_id}`; "
                    f"trace `{trace.trace_id}`.",
                    owner=owner,
                )
            except WorkflowAlreadyStartedError:
                await self.unlock(held, "the task id's run has ended already")
                return await self._already_started(task_id, run.workflow_id, run.callback_mode)
            except BaseException as e:
                await self.unlock(held, f"the run did not start ({type(e).__name__})", e)
                self._start_failed(e, run, sealed)
                raise
            finally:
                otel_context.detach(otel_token)
            if _started_new(handle):  # not a repeat of a running task id's (it has its own)
                sealed.keep()
        if held is not None:
            await self.bind_lock(held, handle)
        return self._started(handle, run)

    async def _checked(
        self, code: str, ask: StartRequest, owner: str
    ) -> tuple[TaskUnit, BaseModel, dict[str, Any] | None, dict[str, Any]]:
        """Everything a start checks before it starts anything: the task, the caller's
        right to the shared state its params write, the params, the request's secrets
        and URLs, the sinks. The task, its params, callback and output."""
        task = get_task(code)  # 404 TASK_NOT_FOUND first
        check_shared_writes(ask.params, ask.role, owner)
        prepared = await self._prepared_params(task, ask.params)
        check_request_secrets(ask)
        callback = self._callback_target(ask)
        await check_request_urls(self.settings, code, task, ask.params, ask.output, callback)
        output = await self._run_output(code, task, prepared, ask.output)
        return task, prepared, callback, output

    async def check_start(self, code: str, ask: StartRequest, owner: str = DEFAULT_OWNER) -> None:
        """What ``start`` would refuse of this request now, refused now (a schedule is
        checked so when it is made; each of its starts is checked again)."""
        await self._checked(code, ask, owner)

    async def _prepared_params(self, task: TaskUnit, params: dict[str, Any]) -> BaseModel:
        """The task's params, validated now so that a bad request is a 422 and not a
        failed run (in a thread when the task reads the database for it: a registry
        task's contract)."""
        return (
            await work(task.prepare_params, params, self.settings)
            if task.prepare_blocks
            else task.prepare_params(params, self.settings)
        )

    async def _run_output(
        self, code: str, task: TaskUnit, prepared: BaseModel, asked: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The run's sinks, resolved once now and carried by the run (like its contract):
        a worker with another configuration sends this run's records to the same places."""
        defaults = self.settings.output_defaults.get(code, {})
        lanes = task.lanes(prepared)
        if lanes:
            # A run of several lanes (resources): each lane's table and folder, checked
            # each against its own record model.
            asked_lanes = {lane: (ln.place, ln.spec) for lane, ln in lanes.items()}
            output = resolve_lanes(code, defaults, asked, asked_lanes, self.settings.database.url)
            for lane, ln in lanes.items():
                await check_sql_output_async(lane_output(output, lane), ln.spec)
            return output
        output = resolve_output(
            code,
            defaults,
            asked,
            task.record_spec(prepared),
            self.settings.database.url,
            task.output_place(prepared),
        )
        # A table that does not fit the records is found now, not after the fetch.
        await check_sql_output_async(output, task.record_spec(prepared))
        return output

    async def _finished_repeat(self, task_id: str, workflow_id: str) -> Started | None:
        """The answer to a repeat of a finished task id, from the task store (None: the
        task id has no finished run)."""
        record = await self.record(task_id)
        if record is not None and record.status in TERMINAL:
            handle = self.client.get_workflow_handle(workflow_id)
            done = from_record(record)
            return Started(handle, task_id, workflow_id, None, "none", existing_result=done)
        return None

    async def _seal_secrets(
        self, code: str, task_id: str, callback_token: str | None, output: dict[str, Any]
    ) -> StartSecrets:
        """The run's output with its secrets sealed (history carries only their names),
        stored under this start's own key, for the length of the start."""
        stored: dict[str, str] = {}
        if callback_token:
            stored[CALLBACK_TOKEN] = callback_token
        output = seal_output(output, stored.__setitem__)
        for name, value in stored.items():
            if name != CALLBACK_TOKEN:
                register_sink_secret(name, value)
        secrets_key = f"{code}/{task_id}{START_SEP}{uuid.uuid4().hex[:16]}" if stored else None
        if secrets_key is not None:
            await work(self.secrets.put_many, secrets_key, stored)
        return StartSecrets(self, output, secrets_key)

    def _run_request(
        self,
        run: NewRun,
        ask: StartRequest,
        trace: TraceContext,
        request_id: str | None,
        callback: dict[str, Any] | None,
        sealed: StartSecrets,
    ) -> RunRequest:
        """The workflow's input for a new run (``sealed``: its output with the secrets
        sealed, and the key they are kept under)."""
        output, secrets_key = sealed.output, sealed.key
        # The run's own tuning (in its history); the worker-side knobs stay out of it.
        tuning = self.settings.runs.run_tuning()
        return RunRequest(
            task_code=run.code,
            task_id=run.task_id,
            params=ask.params,
            trace_id=trace.trace_id,
            parent_span_id=trace.span_id,
            request_id=request_id or ask.request_id,
            output=output,
            callback=callback,
            timeout_s=ask.timeout_s or self.settings.server.run_timeout_s,
            tuning=tuning,
            secrets_key=secrets_key,
            role=ask.role,
        )

    def _start_failed(self, e: BaseException, run: NewRun, sealed: StartSecrets) -> None:
        """After a start that raised ``e`` (not an already-started id): only a start
        Temporal refused is known not to have made the run (its secrets go); after any
        other failure (the answer lost on its way back) the run may exist and read them:
        they stay, for the clean-up to drop once Temporal says the run is not open. A
        start refused for the namespace's search attributes (CONFIG_ERROR) made no run."""
        if not _refused(e):
            sealed.keep()
            log.warning(
                "run_start_unconfirmed",
                task_code=run.code,
                task_id=run.task_id,
                workflow_id=run.workflow_id,
                error=f"{type(e).__name__}: {e}",
            )

    def _started(self, handle: WorkflowHandle, run: NewRun) -> Started:
        """A start Temporal accepted: its `pending` record queued, the start logged."""
        # Listed as pending from now on, even before a worker picks the run up: written
        # concurrently with the answer, never in its way (insert-if-absent, so it cannot overwrite
        # what the run itself recorded meanwhile).
        self._record_pending(run.task_id, run.code, run.workflow_id, run.params)
        log.info(
            "run_started",
            task_code=run.code,
            task_id=run.task_id,
            workflow_id=run.workflow_id,
            run_id=handle.result_run_id,
            owner=run.owner,
        )
        return Started(
            handle, run.task_id, run.workflow_id, handle.result_run_id, run.callback_mode
        )

    async def drop_secrets(self, key: str | None) -> None:
        """A refused or attached start's own secrets (best effort: the clean-up drops any
        left behind)."""
        if key is None:
            return
        try:
            await work(self.secrets.drop_key, key)
        except Exception as e:
            log.warning("run_secret_not_dropped", error=f"{type(e).__name__}: {e}")

    async def start_workflow(
        self,
        req: RunRequest,
        workflow_id: str,
        *,
        exclusive: bool,
        summary: Sequence[str],
        details: str,
        owner: str = DEFAULT_OWNER,
    ) -> WorkflowHandle:
        """Start the run's workflow. ``exclusive`` (a lock, a retry): a new execution once
        the last one closed, never two at once; otherwise a repeat of the id attaches to
        the open run. ``summary``: the UI's one line, of the parts that are not empty.
        A namespace without Artemis' search attributes: CONFIG_ERROR naming each and its
        command, before Temporal is asked (or when Temporal refuses the start for one)."""
        await self.search_attributes.require()
        try:
            return await self.client.start_workflow(
                WORKFLOW_NAME,
                req,
                id=workflow_id,
                task_queue=self.settings.temporal.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE
                if exclusive
                else WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL
                if exclusive
                else WorkflowIDConflictPolicy.USE_EXISTING,
                # Set at start, so that a competing start can tell who holds a lock.
                search_attributes=_run_attributes(
                    req.task_code,
                    req.task_id,
                    owner,
                    str((req.callback or {}).get("caller_run_id") or ""),
                ),
                static_summary=" · ".join(x for x in summary if x),
                static_details=details,
                # Runs end by themselves at their deadline; this is only a backstop.
                execution_timeout=timedelta(seconds=req.timeout_s + 3600),
            )
        except RPCError as e:
            refusal = await self.search_attributes.after_refusal(e)
            if refusal is not None:
                raise refusal from e
            raise

    def _callback_target(self, ask: StartRequest) -> dict[str, Any] | None:
        """The CronJob callback (docs/api.md), checked up front (host allowed, header
        names not reserved); its token is redacted in this request's text."""
        if ask.callback is None:
            return None
        target = dataclasses.replace(
            ask.callback, base_url=ask.callback.base_url or self.settings.callback.base_url
        )
        if target.auth_header is not None:
            check_header_names([target.auth_header], "meta.callback.auth_header")
        if ask.callback_token:
            scoped(ask.callback_token)  # in this request's text only
        if not target.enabled:
            return None
        resolve_base_url(target, self.settings.callback, self.settings.callback_hosts())
        return target.to_dict()

    async def take_lock(
        self, lock: str, req: RunRequest, owner: str, role: str, callback_mode: str
    ) -> WorkflowHandle | Started:
        """``owner``'s lock ``lock`` taken for ``req``'s run (starter/locks.py). Held by
        another task: 409 EXECUTION_LOCKED (naming the holder to its owner, an operator
        or an admin only); by this task id: its run, attached to."""
        lock_id = owned_lock(owner, lock)
        run_workflow_id = workflow_id_for(req.task_code, req.task_id)
        await self.search_attributes.require()
        hold = LockHold(lock_id, req.task_id, run_workflow_id, req.timeout_s)
        for attempt in range(2):
            try:
                return await self.locks.take(lock_id, hold, owner)
            except WorkflowAlreadyStartedError:
                holder = await self.locks.holder(lock_id)
            if holder == req.task_id:  # this task id's run (or its start, under way)
                handle = self.client.get_workflow_handle(run_workflow_id)
                return Started(handle, req.task_id, run_workflow_id, None, callback_mode)
            holder_run = workflow_id_for(req.task_code, holder) if holder else ""
            if attempt or (holder and await self.locks.is_open(holder_run)):
                break
            await self.locks.closing(lock_id)  # its run has ended: the lock is closing
        raise locked(lock, req.task_id, holder, owner, writes_shared(role))

    async def bind_lock(self, lock: WorkflowHandle, run: WorkflowHandle) -> None:
        """Tell the lock its run started (not told, it ends by itself: starter/locks.py)."""
        try:
            await self.locks.bind(lock, run.result_run_id or "")
        except RPCError as e:
            log.warning("lock_not_bound", lock=lock.id, error=f"{e.status}: {e.message}")

    async def unlock(
        self, lock: WorkflowHandle | Started | None, why: str, e: BaseException | None = None
    ) -> None:
        """A lock taken for a run that did not start, released. After a failure that may
        have started it all the same (``e``: a lost answer), kept: not told a run id, the
        lock holds for the id's latest run, if any (workflows/execution_lock.py)."""
        created = e is not None and not _refused(e)
        if isinstance(lock, WorkflowHandle) and not created:
            await self.locks.release(lock, why)

    @property
    def locks(self) -> ExecutionLocks:
        return ExecutionLocks(self.client, self.settings.temporal.task_queue)

    async def _already_started(self, task_id: str, workflow_id: str, callback_mode: str) -> Started:
        """A start that met a workflow of the same id: the same task while it runs is
        attached to; a finished one answers its result."""
        handle = self.client.get_workflow_handle(workflow_id)
        status = await self.status(task_id, handle=handle)
        return Started(
            handle,
            task_id,
            workflow_id,
            status.get("run_id"),
            callback_mode,
            existing_result=status,
        )

    async def wait(self, started: Started, timeout_s: float) -> dict[str, Any] | None:
        """The run's final status, or None if it is still running after ``timeout_s``."""
        if started.existing_result is not None:
            return started.existing_result
        try:
            # On timeout wait_for cancels the long poll; the run itself goes on.
            await asyncio.wait_for(_swallow(started.handle.result()), timeout_s)
        except TimeoutError:
            return None
        return await self.status(started.task_id, handle=started.handle)

    def _beside(self, coro: Any) -> asyncio.Future[Any]:
        """Run ``coro`` after the answer, holding a reference until it is done."""
        job = asyncio.ensure_future(coro)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return job

    async def drain(self) -> None:
        """Wait for the writes still running concurrently with answers (at shutdown)."""
        if self._jobs:
            await asyncio.gather(*self._jobs, return_exceptions=True)

    def _record_pending(
        self, task_id: str, code: str, workflow_id: str, params: dict[str, Any]
    ) -> None:
        """The run's `pending` record unless the task id has one, written concurrently with the
        answer by the one writer (with the records queued meanwhile)."""
        self._pending.setdefault(
            task_id, RunSnapshot(task_id, code, workflow_id, RunStatus.PENDING.value, params)
        )
        if self._pending_writer is None or self._pending_writer.done():
            self._pending_writer = self._beside(self._write_pending())

    async def _write_pending(self) -> None:
        """Write the queued `pending` records until none is left, each batch in one
        transaction. Best effort: a task-store outage is logged; each run records itself
        when it starts."""
        while self._pending:
            if time.monotonic() - self._last_write < PENDING_GATHER_S:
                await asyncio.sleep(PENDING_GATHER_S)  # a burst: let it gather
            self._writing, self._pending = self._pending, {}
            batch = list(self._writing.values())
            try:
                await work_on(self._writes, write_runs, self.store, batch, Write.NEW)
            except Exception as e:
                log.warning(
                    "task_store_unavailable",
                    task_ids=[d.task_id for d in batch],
                    error=f"{type(e).__name__}: {e}",
                )
            finally:
                self._writing = {}
                self._last_write = time.monotonic()

    async def record(self, task_id: str) -> Any:
        """The run's task-store record, or the `pending` one this API has not written yet
        (a lock's run is found through its record: without it, a status read right after
        the 202 would answer 404)."""
        queued = self._pending.get(task_id) or self._writing.get(task_id)
        found = await super().record(task_id)
        return found if found is not None or queued is None else queued.record()

    async def _running(self, task_id: str) -> WorkflowHandle:
        """The run's workflow while it runs: 404 unknown, 409 finished."""
        record = await self.record(task_id)
        handle = await self.find(task_id, record.workflow_id if record is not None else None)
        if handle is None:
            raise ArtemisError(ErrorCode.TASK_NOT_FOUND, f"no task with id {task_id!r}")
        desc = await handle.describe()
        if desc.status not in (WfStatus.RUNNING,):
            # the run's own ending (a cancelled run's workflow completes)
            end = await closed_run_end(handle, desc.status)
            raise ArtemisError(
                ErrorCode.CONFLICT,
                f"task {task_id} has already finished ({end.get('status') or 'closed'})",
            )
        return handle

    async def control(self, task_id: str, action: str, value: Any = None) -> dict[str, Any]:
        """An operator's control of a running task: ``pause`` (value: the reason),
        ``resume`` or ``rate`` (value: requests per second). Signalled to the workflow
        (it acts at its next safe point) and recorded in the run's event stream."""
        handle = await self._running(task_id)
        data: dict[str, Any]
        if action == "pause":
            await handle.signal("pause", PauseRequest(reason=str(value)))
            kind, data = Control.PAUSED, {"reason": str(value)}
        elif action == "resume":
            await handle.signal("resume")
            kind, data = Control.RESUMED, {}
        else:
            await handle.signal("set_rate_limit", RateLimitRequest(qps=float(value)))
            kind, data = Control.RATE_CHANGED, {"qps": float(value)}
        await work(self.events.append, task_id, kind, data)
        log.info("task_controlled", task_id=task_id, workflow_id=handle.id, action=kind, **data)
        return {"task_id": task_id, "workflow_id": handle.id, "action": kind, **data}

    @property
    def events(self) -> EventLog:
        if self._events is None:
            self._events = EventLog(self.settings.database.url)
        return self._events

    async def cancel(self, task_id: str, reason: str) -> dict[str, Any]:
        handle = await self._running(task_id)
        # Temporal's own cancellation, with the reason: the run stops at its next safe
        # point, finalizes with the reason, and ends CANCELED in Temporal's list as well
        # as `cancelled` here.
        await handle.cancel(reason=reason)
        log.info("cancel_requested", task_id=task_id, workflow_id=handle.id, reason=reason)
        return {
            "task_id": task_id,
            "workflow_id": handle.id,
            "cancel_requested": True,
            "reason": reason,
        }


def _run_attributes(
    code: str, task_id: str, owner: str, caller_run_id: str = ""
) -> TypedSearchAttributes:
    """The search attributes a run starts with (the UI's filters; a lock's holder; who
    started it; the CronJob's run id): set here, the workflow does not write them again."""
    pairs = [
        SearchAttributePair(KEY_TASK_CODE, code),
        SearchAttributePair(KEY_TASK_ID, task_id),
        SearchAttributePair(KEY_OWNER, owner),
    ]
    if caller_run_id:
        pairs.append(SearchAttributePair(KEY_RUN_ID, caller_run_id))
    return TypedSearchAttributes(pairs)


# Temporal's answers that refuse a start outright: the request was understood and
# turned down, so no workflow was created (an already-started id has its own exception).
_REFUSALS = frozenset(
    {
        RPCStatusCode.INVALID_ARGUMENT,
        RPCStatusCode.NOT_FOUND,
        RPCStatusCode.PERMISSION_DENIED,
        RPCStatusCode.UNAUTHENTICATED,
        RPCStatusCode.FAILED_PRECONDITION,
        RPCStatusCode.OUT_OF_RANGE,
        RPCStatusCode.UNIMPLEMENTED,
    }
)


def not_created(e: BaseException) -> bool:
    """Whether a failed start certainly made no run: Temporal refused it (a workflow of
    the id exists, a bad request, no permission). A timeout, a lost connection or a
    cancelled request may have started the run all the same."""
    if isinstance(e, WorkflowAlreadyStartedError):
        return True
    return isinstance(e, RPCError) and e.status in _REFUSALS


def _refused(e: BaseException) -> bool:
    """Whether a start that raised ``e`` certainly made no run: Temporal refused it, or
    the namespace's search attributes did before it was asked (CONFIG_ERROR)."""
    return not_created(e) or (isinstance(e, ArtemisError) and e.code is ErrorCode.CONFIG_ERROR)


def _started_new(handle: WorkflowHandle) -> bool:
    """Whether the start made a new execution (False: it attached to the open run of the
    same id). Read from the start's answer; a client library that does not keep it counts
    as new (the run's end then drops what the start wrote)."""
    answer = getattr(handle, "_start_workflow_response", None)
    return bool(getattr(answer, "started", True))


# What a request may send as a secret: a value long enough to be a credential (shorter
# ones would also match ordinary words in the run's lines), and bounded headers.
MAX_HEADERS = 32
MAX_HEADER_VALUE = 4096
# A request's output as JSON, at most (docs/performance.md, "Bounded payloads").
MAX_OUTPUT_BYTES = 16 * 1024


def check_request_secrets(ask: StartRequest) -> None:
    """INVALID_INPUT naming the field: a callback token or credential-named sink header
    shorter than MIN_REQUEST_SECRET, too many sink headers, or a value too long."""
    token = ask.callback_token
    if token is not None and len(token) < MIN_REQUEST_SECRET:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"meta.callback.auth_token: at least {MIN_REQUEST_SECRET} characters",
        )
    size = len(jsonio.dumps(ask.output or {}))
    if size > MAX_OUTPUT_BYTES:
        # A run's output travels in its request and in each of its child runs'.
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output: {size} bytes as JSON, more than the {MAX_OUTPUT_BYTES} a run carries",
        )
    headers = (ask.output or {}).get("http_headers")
    if not isinstance(headers, dict):
        return
    if len(headers) > MAX_HEADERS:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT, f"output.http_headers: at most {MAX_HEADERS} headers"
        )
    for name, value in headers.items():
        text = str(value)
        if len(text) > MAX_HEADER_VALUE:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"output.http_headers.{name}: at most {MAX_HEADER_VALUE} characters",
            )
        if is_credential_name(str(name)) and len(text) < MIN_REQUEST_SECRET:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"output.http_headers.{name}: a credential of at least {MIN_REQUEST_SECRET} "
                "characters",
            )


async def _swallow(coro: Any) -> None:
    try:
        await coro
    except Exception:
        pass
