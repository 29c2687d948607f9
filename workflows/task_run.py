"""The task-run workflow: one generic, deterministic orchestration for every TaskUnit.

prepare → (fetch a batch of pages → process → emit)* → finalize. The next fetch runs
while the previous batch is processed and emitted, so Temporal's per-activity cost hides
behind network time. Records never enter history (claim check); long runs continue as
new. A `cancel` signal, a Temporal cancellation or the run's deadline all stop at the
next safe point, cancel in-flight activities (waiting for their clean-up) and finalize.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
)

with workflow.unsafe.imports_passed_through():
    # Activities by reference: go-to-definition and the type checker see their arguments.
    from activities.task_run import TaskRunActivities
    from artemis.completeness import is_short
    from artemis.errors import ErrorCode
    from artemis.outage import UNAVAILABLE, next_delay, outage_from_details, waiting_line
    from artemis.run_models import (
        SA_PROVENANCE,
        SA_RUN_ID,
        SA_TASK_CODE,
        SA_TASK_ID,
        SA_TASK_TYPE,
        WORKFLOW_NAME,
        BatchInput,
        CancelRequest,
        CircuitBreaker,
        CleanupRunInput,
        EmitResult,
        FetchInput,
        FetchResult,
        FetchRetry,
        FinalizeInput,
        FinalizeResult,
        MirrorInput,
        Outage,
        OutageNote,
        PauseRequest,
        PrepareInput,
        PrepareResult,
        ProcessResult,
        RateLimitRequest,
        RetainInput,
        RunCarry,
        RunRef,
        RunRequest,
        RunResult,
        SplitInput,
        SplitResult,
        provenance_queue,
        workflow_id_for,
    )
    from artemis.run_state import (
        RETRYABLE_ENDINGS,
        RunState,
        add_sink_counts,
        add_stats,
        end_code,
    )

# Error codes no retry can fix (SPEC §10/§11); the activities mark them non-retryable too.
NON_RETRYABLE = [
    "INVALID_INPUT",
    "CONFIG_ERROR",
    "TASK_NOT_FOUND",
    "COOKIE_EXHAUSTED",
    "RESULT_CAP_EXCEEDED",
    "SOURCE_CONTRACT",
    "SOURCE_LOOP",
    "INCOMPLETE",
]

# Patch ids (SPEC §4 "Versioning"): a change to the command sequence runs only where the
# history has not already taken the old path. Remove one only when no kept history needs it.
PATCH_SPLIT_RECONCILE = "split-window-reconciled-v1"
PATCH_CLEANUP_STEP = "cleanup-after-finalize-v1"
# A batch followed by more fetching is processed by a regular activity: a local activity
# holds the workflow task open, and with it the next fetch's start.
PATCH_PROCESS_ACTIVITY = "process-beside-fetch-v1"
# Outages are waited out on timers (SPEC §4 "Outages"), the fetch side stays at most
# runs.max_batches_ahead batches ahead of emitting, delivered pages leave staging, and a
# run failing with a retryable code keeps its state for POST /tasks/{id}/retry. Asked
# once, when a run (or a generation of it) starts: a generation begun by an earlier build
# keeps that build's behaviour (its next generation takes this one's).
PATCH_OUTAGE_WAIT = "outage-wait-v1"
# A pause reaches the fetch in flight: the workflow cancels it, the activity learns of it
# with its next heartbeat's answer and returns the pages it has staged, checkpointed.
# Asked once per run (or generation), as PATCH_OUTAGE_WAIT.
PATCH_PAUSE_AT_PAGE = "pause-at-page-v1"

KEY_TASK_CODE = SearchAttributeKey.for_keyword(SA_TASK_CODE)
KEY_TASK_ID = SearchAttributeKey.for_keyword(SA_TASK_ID)
KEY_RUN_ID = SearchAttributeKey.for_keyword(SA_RUN_ID)
KEY_PROVENANCE = SearchAttributeKey.for_keyword(SA_PROVENANCE)
KEY_TASK_TYPE = SearchAttributeKey.for_keyword(SA_TASK_TYPE)


class _Stop(Exception):
    """Raised inside the workflow when the run must stop early (cancel or deadline)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@workflow.defn(name=WORKFLOW_NAME)
class TaskRunWorkflow:
    def __init__(self) -> None:
        # The run's state, as the progress query, the mirror and the result give it.
        self._state = RunState(circuit="closed")
        self._cancel_reason: str | None = None
        self._mirror_running: asyncio.Task[None] | None = None
        self._rate_key: str | None = None
        self._pages_per_fetch: int | None = None
        self._circuit: CircuitBreaker | None = None
        self._circuit_opens = 0
        self._tolerance_pct = 0.0
        self._resume_fetch = False
        # A parent run (backfill windows): its children emit and finish their own sinks.
        self._parent = False
        # Set once the run must stop. Cancelling an activity whose result is already on its
        # way can still return that result, so the loop also checks this flag itself.
        self._stopping = False
        # Outages being waited out, by dependency: {"since", "attempt", "waiting"}.
        self._outages: dict[str, dict[str, Any]] = {}
        self._waits = False
        self._outage_tolerance_s: float | None = None
        # Every page below this sequence was delivered; of those above, these were too.
        self._delivered_below = 0
        self._delivered_above: list[int] = []
        self._fetch_done = False
        self._retry_attempt = 0
        self._undelivered: list[list[int]] = []
        self._processed_through = -1
        # Bookkeeping started beside the run (awaited before it ends).
        self._beside: list[asyncio.Task[None]] = []

    # -- queries and signals ---------------------------------------------------------------
    @workflow.query
    def progress(self) -> dict[str, Any]:
        return self._state.progress()

    @workflow.signal
    def pause(self, request: PauseRequest) -> None:
        """Stop fetching: a fetch in flight stops at its next page (runs of this build;
        earlier ones finish the batch in flight); no worker is held while paused."""
        self._state.paused = True
        workflow.logger.info("paused", extra={"artemis": {"reason": request.reason}})

    @workflow.signal
    def resume(self) -> None:
        self._state.paused = False
        workflow.logger.info("resumed")

    @workflow.signal
    def set_rate_limit(self, request: RateLimitRequest) -> None:
        """A new requests-per-second limit for the source, from the next batch on."""
        if request.qps > 0:
            self._state.qps = request.qps
            workflow.logger.info("rate_limit_set", extra={"artemis": {"qps": request.qps}})

    @workflow.signal
    def cancel(self, request: CancelRequest) -> None:
        if self._cancel_reason is None:
            self._cancel_reason = request.reason or "cancelled by request"
            workflow.logger.info(
                "cancel_requested", extra={"artemis": {"reason": self._cancel_reason}}
            )

    # -- run -----------------------------------------------------------------------------
    @workflow.run
    async def run(self, req: RunRequest) -> RunResult:
        """Start (or carry on after continue-as-new), run the batch loop against the
        deadline and the cancel signal, then finalize, record and answer."""
        self._begin(req)
        status, error_code, error_message, temporal_cancel = await self._run_until_end(req)
        self._mark_step_errors(status)
        self._state.error = {"code": error_code, "message": error_message} if error_code else None

        retain = (
            self._waits
            and not self._parent
            and self._params is not None
            and status in ("failed", "timeout")
            and (error_code or "INTERNAL") in RETRYABLE_ENDINGS
        )
        for task in self._beside:
            await _quietly(task)
        self._state.waiting = None
        callback_outcome = await self._finalize(status, error_code, error_message, retain)
        if self._mirror_running is not None:
            await _quietly(self._mirror_running)  # the `running` record goes first
        await self._mirror(status, dict(self._state.stats), self._state.error)
        self._state.status = status
        self._details()
        result = RunResult(
            task_code=req.task_code,
            task_id=req.task_id,
            workflow_id=self._run.workflow_id,
            status=status,
            duration_ms=int(workflow.now().timestamp() * 1000) - self._started_ms,
            stats=dict(self._state.stats),
            error=self._state.error,
            callback=callback_outcome,
        )
        self._log("run_finished", status=status, error_code=error_code, **self._state.stats)
        if temporal_cancel is not None:
            raise temporal_cancel
        if status == "failed":
            raise ApplicationError(
                error_message or "run failed",
                asdict(result),
                type=error_code or "INTERNAL",
                non_retryable=True,
            )
        return result

    def _begin(self, req: RunRequest) -> None:
        """The run's identity, and its state: fresh, or carried across continue-as-new."""
        info = workflow.info()
        self._req = req
        self._run = RunRef(
            task_code=req.task_code,
            task_id=req.task_id,
            workflow_id=info.workflow_id,
            trace_id=req.trace_id,
            parent_span_id=req.parent_span_id,
            request_id=req.request_id,
            root_task_id=req.root_task_id or req.task_id,
        )
        self._log_fields = {
            "trace_id": req.trace_id,
            "request_id": req.request_id,
            "task_code": req.task_code,
            "task_id": req.task_id,
            "workflow_id": info.workflow_id,
        }
        carry = req.carry
        # This build's handling of outages, for runs (and generations) it starts.
        self._waits = bool(carry is not None and carry.waits) or workflow.patched(PATCH_OUTAGE_WAIT)
        self._pause_at_page = bool(carry is not None and carry.pause_at_page) or workflow.patched(
            PATCH_PAUSE_AT_PAGE
        )
        if carry is None:
            self._started_ms = int(workflow.now().timestamp() * 1000)
            self._params: dict[str, Any] | None = None
            self._checkpoint: dict[str, Any] | None = None
            self._next_seq = 0
            self._progress_ms: float | None = None
            self._fetch_retry: FetchRetry | None = None
            workflow.upsert_search_attributes(
                [
                    KEY_TASK_CODE.value_set(req.task_code),
                    KEY_TASK_ID.value_set(req.task_id),
                    KEY_RUN_ID.value_set(str((req.callback or {}).get("run_id") or "")),
                ]
            )
        else:
            self._restore(carry)
            if carry.retry_start:
                # A new attempt: its own deadline, counted from now.
                self._started_ms = int(workflow.now().timestamp() * 1000)
                workflow.upsert_search_attributes(
                    [KEY_RUN_ID.value_set(str((req.callback or {}).get("run_id") or ""))]
                )
        self._generation = carry.generation if carry else 1
        self._state.status = "running"
        retry_start = carry is not None and carry.retry_start
        if retry_start:
            # Started again by POST /tasks/{id}/retry: the failed attempt's ERROR steps go
            # on, and the run is `running` again in task storage.
            for step, st in self._state.steps.items():
                if st == "ERROR":
                    self._state.steps[step] = "IN_PROGRESS"
            self._log("run_retried", attempt=self._retry_attempt, next_seq=self._next_seq)
        if carry is None or retry_start:
            # Recorded alongside, never in the way: a task-store outage is retried and shown
            # in the progress query, it neither fails nor blocks the run.
            self._mirror_running = asyncio.create_task(self._mirror("running"))
        self._details()

    def _restore(self, carry: RunCarry) -> None:
        self._started_ms = carry.started_ms
        self._params = carry.params
        self._state.total = carry.total
        self._checkpoint = carry.checkpoint
        self._next_seq = carry.next_seq
        self._state.stats = dict(carry.stats)
        self._state.steps = dict(carry.steps)
        self._progress_ms = carry.progress_last_ms
        self._state.current = carry.units_done
        self._fetch_retry = carry.fetch_retry
        self._circuit = carry.circuit
        self._rate_key = carry.rate_key
        self._pages_per_fetch = carry.pages_per_fetch
        self._state.qps = carry.qps
        self._state.paused = carry.paused
        self._tolerance_pct = carry.tolerance_pct
        self._outage_tolerance_s = carry.outage_tolerance_s
        self._fetch_done = carry.fetch_done
        self._retry_attempt = carry.retry_attempt
        self._delivered_above = list(carry.delivered_above)
        self._delivered_below = carry.undelivered[0][0] if carry.undelivered else carry.next_seq
        self._undelivered = [list(r) for r in carry.undelivered]
        self._processed_through = carry.processed_through

    async def _run_until_end(
        self, req: RunRequest
    ) -> tuple[str, str | None, str | None, BaseException | None]:
        """The batch loop raced against the deadline and the cancel signal: (status,
        error code, message, Temporal's own cancellation to re-raise after finalizing)."""
        deadline_s = req.timeout_s - (workflow.now().timestamp() * 1000 - self._started_ms) / 1000
        main = asyncio.create_task(self._main())
        stopper = asyncio.create_task(self._stop_when_asked(max(deadline_s, 0.0)))
        status, error_code, error_message = "completed", None, None
        temporal_cancel: BaseException | None = None
        try:
            await workflow.wait([main, stopper], return_when=asyncio.FIRST_COMPLETED)
            if main.done():
                stopper.cancel()
                main.result()  # re-raises a failure or a continue-as-new
            else:
                stop: _Stop = stopper.result()
                status, error_message = stop.status, stop.message
                error_code = _code_value(end_code(stop.status))
                self._stopping = True
                main.cancel()
                await _quietly(main)
        except asyncio.CancelledError as e:
            # Temporal's own cancellation (UI, CLI, API): clean up, finalize, then report it.
            temporal_cancel = e
            status, error_code = "cancelled", _code_value(end_code("cancelled"))
            error_message = f"cancelled: {self._cancel_reason or 'workflow cancellation requested'}"
            self._stopping = True
            main.cancel()
            stopper.cancel()
            await _quietly(main)
        except workflow.ContinueAsNewError:
            raise
        except ActivityError as e:
            status = "failed"
            error_code, error_message = _code_of(e), _message_of(e)
            stopper.cancel()
        except ApplicationError as e:
            status, error_code, error_message = "failed", e.type or "INTERNAL", e.message
            stopper.cancel()
        except ChildWorkflowError as e:
            if not self._waits:
                raise  # earlier builds failed the workflow here, without a finalize
            # A window (child run) failed: the run fails with its code, and finalizes.
            status = "failed"
            error_code, error_message = _code_of(e), _message_of(e)
            stopper.cancel()
        return status, error_code, error_message, temporal_cancel

    async def _prepare(self) -> tuple[list[dict[str, Any]], int] | None:
        """Step 1: validated params, the run's size and its source's settings; the child
        runs (and how many at a time) when the run fans out."""
        req = self._req
        self._enter("step_prepare")
        prepared: PrepareResult = await workflow.execute_activity_method(
            TaskRunActivities.prepare_params,
            PrepareInput(run=self._run, params=req.params),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=NON_RETRYABLE),
            summary=f"Validate params of {req.task_code}",
        )
        self._params, self._state.total = prepared.params, prepared.total
        self._fetch_retry = prepared.fetch_retry
        self._circuit = prepared.circuit
        self._rate_key = prepared.rate_key
        self._pages_per_fetch = prepared.pages_per_fetch
        self._tolerance_pct = prepared.tolerance_pct
        self._outage_tolerance_s = prepared.outage_tolerance_s
        known = {SA_PROVENANCE: KEY_PROVENANCE, SA_TASK_TYPE: KEY_TASK_TYPE}
        updates = [known[k].value_set(v) for k, v in prepared.search.items() if k in known]
        if updates:
            workflow.upsert_search_attributes(updates)
        self._state.steps["step_prepare"] = "COMPLETED"
        if prepared.children is None:
            return None
        return prepared.children, prepared.parallelism

    # -- the batch loop ----------------------------------------------------------------------
    async def _main(self) -> None:
        req, tuning = self._req, self._req.tuning
        if self._params is None:
            children = await self._prepare()
            if children is not None:
                self._parent = True
                await self._run_children(*children)
                return

        # Batches being processed and emitted, in order (each waits for the one before it
        # to be emitted). At most `ahead` batches are fetched but not emitted: a batch is
        # handed over once at most ahead - 2 are still on their way, and the next fetch
        # starts once at most ahead - 1 are (earlier builds: 2).
        ahead = max(1, tuning.max_batches_ahead) if self._waits else 2
        pending: list[asyncio.Task[None]] = []

        def hand_over(first: int, last: int, beside_fetch: bool, again: bool = False) -> None:
            after = pending[-1] if pending else None
            pending.append(
                asyncio.create_task(self._process_and_emit(first, last, beside_fetch, after, again))
            )

        async def drain(keep: int) -> None:
            while len(pending) > keep:
                await pending.pop(0)

        batches_here = 0
        done = self._fetch_done
        try:
            # A run finished by POST /tasks/{id}/retry first delivers what its failed
            # attempt had staged and not delivered (skipping the pages it had).
            done_to = self._processed_through
            for first, last in self._undelivered:
                # what was processed then is processed again, not counted again
                for lo, hi, again in (
                    (first, min(last, done_to), True),
                    (max(first, done_to + 1), last, False),
                ):
                    if lo <= hi:
                        await drain(max(ahead - 2, 0))
                        hand_over(lo, hi, beside_fetch=not done, again=again)
            self._undelivered = []
            while not done:
                if self._state.paused:
                    self._state.stage = "paused"
                    self._details()
                    # A durable wait: no worker is held while the run is paused.
                    await workflow.wait_condition(lambda: not self._state.paused or self._stopping)
                    self._stop_point()
                await drain(ahead - 1)
                self._enter("step_fetch")
                try:
                    fetch = workflow.start_activity_method(
                        TaskRunActivities.fetch_pages,
                        FetchInput(
                            run=self._run,
                            params=self._params or {},
                            checkpoint=self._checkpoint,
                            first_seq=self._next_seq,
                            max_pages=self._pages_per_fetch or tuning.pages_per_fetch,
                            max_seconds=tuning.fetch_max_seconds,
                            total=self._state.total,
                            units_done=self._state.current,
                            callback=req.callback,
                            progress_last_ms=self._progress_ms,
                            qps=self._state.qps,
                            resumed=self._resume_fetch,
                            report_outages=self._reports_outages(),
                        ),
                        start_to_close_timeout=timedelta(seconds=tuning.fetch_start_to_close_s),
                        heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
                        retry_policy=self._fetch_retry_policy(),
                        task_queue=provenance_queue(workflow.info().task_queue, self._rate_key)
                        if self._rate_key
                        else None,
                        cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                        summary=f"Fetch pages from #{self._next_seq}",
                    )
                    fetched: FetchResult = await self._fetched(fetch)
                except ActivityError as e:
                    if self._pause_at_page and self._state.paused and _was_cancelled(e):
                        # Paused before it staged a page it could report: fetch afresh.
                        self._resume_fetch = True
                        continue
                    if _code_of(e) == "RESULT_CAP_EXCEEDED" and not self._state.stats["pages"]:
                        # The window holds more hits than the source can list: split it.
                        await self._split(e)
                        return
                    store = self._store_outage(e)
                    if store is not None:
                        await self._wait_out(store)
                        self._resume_fetch = True
                        continue
                    if await self._rest_after_failures(e):
                        self._resume_fetch = True
                        continue  # the same checkpoint, after the cool-down
                    raise
                self._state.stats["pages"] += fetched.pages
                self._state.stats["records_fetched"] += fetched.records
                self._state.stats["batches"] += 1
                self._resume_fetch = False
                if fetched.expected_total is not None:
                    self._state.stats["expected_total"] = fetched.expected_total
                self._stop_point()
                self._state.current = fetched.units_done
                self._progress_ms = fetched.progress_last_ms
                first, last = fetched.first_seq, fetched.next_seq - 1
                self._checkpoint, self._next_seq = fetched.checkpoint, fetched.next_seq
                done = fetched.done
                if done:
                    self._fetch_done = True
                    self._state.steps["step_fetch"] = "COMPLETED"
                if self._waits and (fetched.pages or fetched.outage is None):
                    self._recovered("source")  # pages came: a new outage counts afresh
                self._details()
                await drain(max(ahead - 2, 0))
                if last >= first:
                    hand_over(first, last, beside_fetch=not done)
                if fetched.incomplete is not None:
                    # A source ended short of its own count: what it gave is delivered,
                    # then the run fails visibly (never `completed`).
                    await drain(0)
                    raise ApplicationError(
                        str(fetched.incomplete.get("message")),
                        fetched.incomplete,
                        type="INCOMPLETE",
                        non_retryable=True,
                    )
                if fetched.outage is not None:
                    # The source is down: what it gave goes on to the sinks meanwhile.
                    await self._wait_out(fetched.outage)
                    self._resume_fetch = True
                    continue
                batches_here += 1
                if not done and (
                    batches_here >= tuning.max_batches_per_run
                    or workflow.info().is_continue_as_new_suggested()
                ):
                    await drain(0)
                    self._continue_as_new()
            await drain(0)
        finally:
            for task in pending:
                if not task.done():
                    task.cancel()
                    await _quietly(task)
        self._state.steps["step_fetch"] = "COMPLETED"
        self._state.steps["step_process"] = "COMPLETED"
        self._state.steps["step_emit"] = "COMPLETED"

    async def _fetched(self, fetch: workflow.ActivityHandle[FetchResult]) -> FetchResult:
        """The fetch's result; a pause meanwhile cancels it, and the fetch (learning of
        it through its heartbeat) returns the pages it has staged so far."""
        if not self._pause_at_page:
            return await fetch

        async def pause_it() -> None:
            await workflow.wait_condition(lambda: self._state.paused)
            self._state.stage = "pausing"
            self._details()
            fetch.cancel()

        watcher = asyncio.create_task(pause_it())
        try:
            return await fetch
        finally:
            watcher.cancel()

    async def _process_and_emit(
        self,
        first: int,
        last: int,
        beside_fetch: bool = False,
        after: asyncio.Task[None] | None = None,
        again: bool = False,
    ) -> None:
        """Process a staged batch, then emit it once the batch before it is emitted.
        ``again``: the batch of a failed attempt (a retried run), processed and counted
        then; it is processed again, not counted again."""
        req, tuning = self._req, self._req.tuning
        batch = BatchInput(
            run=self._run,
            params=self._params or {},
            first_seq=first,
            last_seq=last,
            output=req.output,
        )
        self._state.steps["step_process"] = "IN_PROGRESS"
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=120),
            # Rides out a database outage of several seconds (1 + 2 + 4 + 8 s by default):
            # three quick attempts failed a run whose staging store was down for 6 s.
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=tuning.activity_max_attempts,
                non_retryable_error_types=NON_RETRYABLE,
            ),
            "summary": f"Process pages #{first}-#{last}",
        }
        processed: ProcessResult
        while True:
            try:
                if beside_fetch and workflow.patched(PATCH_PROCESS_ACTIVITY):
                    # A heartbeat timeout: a batch lost with its worker runs again in seconds.
                    processed = await workflow.execute_activity_method(
                        TaskRunActivities.process_batch,
                        batch,
                        heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
                        **options,
                    )
                else:
                    # The last batch (nothing to overlap): one round trip fewer as a local
                    # activity.
                    processed = await workflow.execute_local_activity_method(
                        TaskRunActivities.process_batch, batch, **options
                    )
                break
            except ActivityError as e:
                store = self._store_outage(e)
                if store is None:
                    raise
                await self._wait_out(store)
        if self._waits:
            self._recovered("store")
        self._stop_point()
        if not again:
            self._state.stats["records_processed"] += processed.records_out
            self._processed_through = max(self._processed_through, last)
        if after is not None:
            await after  # emitted in order: the batch before this one first
        self._state.steps["step_emit"] = "IN_PROGRESS"
        skip = [s for s in self._delivered_above if first <= s <= last]
        while True:
            try:
                emitted = await self._emit(batch, first, last, skip)
            except ActivityError as e:
                store = self._store_outage(e)
                if store is None:
                    raise
                await self._wait_out(store)
                continue
            if self._waits:
                self._recovered("store")
            self._state.stats["records_emitted"] += emitted.records_emitted
            add_sink_counts(self._state.stats, emitted.sinks)
            if emitted.outage is None:
                break
            # A sink is down: the pages it took count now and are not sent again.
            skip = sorted({*skip, *emitted.delivered_seqs})
            self._delivered_above = skip
            if emitted.delivered_seqs:
                self._recovered("sink")  # pages went through: a new outage counts afresh
            self._details()
            await self._wait_out(emitted.outage)
        if self._waits:
            self._recovered("sink")
        self._delivered_below = last + 1
        self._delivered_above = []
        self._details()

    async def _emit(self, batch: BatchInput, first: int, last: int, skip: list[int]) -> EmitResult:
        """One emit of the batch's pages (but ``skip``, delivered by an earlier one)."""
        tuning = self._req.tuning
        return await workflow.execute_activity_method(
            TaskRunActivities.emit_batch,
            dataclasses.replace(
                batch,
                skip_seqs=skip,
                report_outages=self._reports_outages(),
                prune_below=first if self._waits else None,
            ),
            start_to_close_timeout=timedelta(seconds=tuning.emit_start_to_close_s),
            heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=0.5),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=tuning.activity_max_attempts,
                non_retryable_error_types=NON_RETRYABLE,
            ),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"Emit pages #{first}-#{last}"
            + (f" (again, {len(skip)} delivered)" if skip else ""),
        )

    async def _mirror(
        self, status: str, stats: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> None:
        try:
            # A local activity: a few small writes, so no task-queue round trip per record.
            await workflow.execute_local_activity_method(
                TaskRunActivities.mirror_state,
                MirrorInput(run=self._run, status=status, stats=stats or {}, error=error),
                start_to_close_timeout=timedelta(seconds=15),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=10),
                    maximum_attempts=5,
                ),
                summary=f"Record `{status}` in task storage",
            )
            self._state.task_store = "ok"
        except ActivityError as e:
            self._state.task_store = "failed"
            self._log("task_store_unavailable", status=status, error=_message_of(e))

    # -- outages (SPEC §4 "Outages") ---------------------------------------------------------
    def _tolerance(self) -> float:
        own = self._outage_tolerance_s
        return float(own) if own is not None else float(self._req.tuning.outage_tolerance_s)

    def _reports_outages(self) -> bool:
        """Activities report a dependency's transient failure to the workflow (which
        waits) instead of failing; with a tolerance of 0 their retry policies decide."""
        return self._waits and self._tolerance() > 0

    def _store_outage(self, e: ActivityError) -> Outage | None:
        """The staging store unreachable, past the activity's own quick retries."""
        if not self._reports_outages():
            return None
        app = _root_application_error(e)
        if app is None or app.non_retryable:
            return None
        return outage_from_details(_details_of(e), app.message, app.type or "INTERNAL")

    def _backoff(self, dependency: str) -> tuple[float, float, float]:
        """(initial, coefficient, cap) of the waits between attempts: a source's own retry
        cfg where it has one, always capped at runs.retry_max_interval_s."""
        cap = float(self._req.tuning.retry_max_interval_s)
        own = self._fetch_retry
        if dependency == "source" and own is not None:
            return own.initial_s, max(own.backoff, 1.0), min(own.maximum_s, cap)
        if dependency == "sink":
            return 0.5, 2.0, cap
        return 1.0, 2.0, cap

    async def _wait_out(self, outage: Outage) -> None:
        """Wait before the next attempt on a durable timer (no worker is held), showing
        the wait everywhere; past the tolerance, fail SOURCE_/SINK_UNAVAILABLE."""
        dep = outage.dependency
        now = workflow.now()
        track = self._outages.setdefault(dep, {"since": now, "attempt": 0})
        track["attempt"] += 1
        attempt = track["attempt"]
        since: datetime = track["since"]
        waited = (now - since).total_seconds()
        tolerance = self._tolerance()
        if waited >= tolerance:
            self._outages.pop(dep, None)
            self._state.waiting = None
            code = UNAVAILABLE.get(dep, UNAVAILABLE["store"]).value
            raise ApplicationError(
                f"{dep} {outage.name} unavailable for {waited:.0f} s since "
                f"{since.isoformat(timespec='seconds')} ({attempt} attempts, tolerance "
                f"{tolerance:g} s); last error: {outage.reason}: {outage.message}",
                {
                    "dependency": dep,
                    "name": outage.name,
                    "since": since.isoformat(),
                    "waited_s": round(waited, 1),
                    "attempts": attempt,
                    "last_error": outage.reason,
                },
                type=code,
                non_retryable=True,
            )
        initial, coefficient, cap = self._backoff(dep)
        circuit = self._circuit if dep == "source" else None
        opened = circuit is not None and attempt % max(circuit.threshold, 1) == 0
        if opened and circuit is not None:
            # The source's circuit breaker: after `threshold` failures in a row it rests.
            delay = min(circuit.cool_down_s, max(tolerance - waited, 0.0) + 0.05)
            self._state.circuit = "open"
            self._circuit_opens += 1
        else:
            # The attempts within this round of the breaker back off from the start.
            n = attempt % circuit.threshold if circuit is not None else attempt
            delay = next_delay(
                n, initial, coefficient, cap, outage.retry_after_s, tolerance - waited
            )
        waiting = {
            "dependency": dep,
            "name": outage.name,
            "since": since.isoformat(),
            "reason": outage.reason,
            "error": outage.message,
            "code": outage.code,
            "attempt": attempt,
            "next_in_s": round(delay, 3),
            "next_attempt_at": (now + timedelta(seconds=delay)).isoformat(),
            "tolerance_s": tolerance,
        }
        track["waiting"] = waiting
        self._state.waiting = waiting
        self._state.stage = "circuit_open" if opened else "waiting"
        self._details()
        self._log("waiting", **{k: v for k, v in waiting.items() if k != "error"})
        await self._note_outage("waiting", waiting)
        await workflow.sleep(
            delay,
            summary=f"Wait for {dep} {outage.name} ({outage.reason}), attempt {attempt}",
        )
        if opened:
            self._state.circuit = "closed"
        self._stop_point()

    def _recovered(self, dependency: str) -> None:
        """A dependency answered again: its outage ends (a later failure starts afresh)."""
        track = self._outages.pop(dependency, None)
        if track is None:
            return
        waited = (workflow.now() - track["since"]).total_seconds()
        info = {
            "dependency": dependency,
            "name": (track.get("waiting") or {}).get("name", dependency),
            "since": track["since"].isoformat(),
            "waited_s": round(waited, 1),
            "attempts": track["attempt"],
        }
        others = [t["waiting"] for t in self._outages.values() if t.get("waiting")]
        self._state.waiting = others[-1] if others else None
        if self._state.stage in ("waiting", "circuit_open") and not others:
            self._state.stage = {"source": "step_fetch", "sink": "step_emit"}.get(
                dependency, "step_process"
            )
        self._log("recovered", **info)
        self._details()
        # Recorded beside the run, never in its way.
        self._beside.append(asyncio.create_task(self._note_outage("recovered", info)))

    async def _note_outage(self, kind: str, data: dict[str, Any]) -> None:
        try:
            await workflow.execute_local_activity_method(
                TaskRunActivities.note_outage,
                OutageNote(run=self._run, kind=kind, waiting=data),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary=f"Record `{kind}` in the event stream",
            )
        except ActivityError as e:
            self._log("outage_note_failed", kind=kind, error=_message_of(e))

    async def _rest_after_failures(self, e: ActivityError) -> bool:
        """The durable circuit breaker: once the fetch has failed `threshold` times in a row
        (its retry policy's attempts) with a retryable error, wait the cool-down on a
        Temporal timer instead of burning retries, then go on. False: not this case."""
        circuit = self._circuit
        app = _root_application_error(e)
        if circuit is None or app is None or app.non_retryable:
            return False
        if self._circuit_opens >= circuit.max_opens:
            return False
        self._circuit_opens += 1
        self._state.circuit = "open"
        self._state.stage = "circuit_open"
        self._details()
        self._log(
            "circuit_open",
            cool_down_s=circuit.cool_down_s,
            opens=self._circuit_opens,
            error=app.message,
        )
        # A durable timer (the same StartTimer command as asyncio.sleep, with a summary).
        await workflow.sleep(
            circuit.cool_down_s, summary=f"Circuit breaker cool-down ({circuit.cool_down_s:g} s)"
        )
        self._state.circuit = "closed"
        self._log("circuit_closed", opens=self._circuit_opens)
        return True

    async def _split(self, e: ActivityError) -> None:
        details = _details_of(e)
        split: SplitResult = await workflow.execute_local_activity_method(
            TaskRunActivities.split_run,
            SplitInput(run=self._run, params=self._params or {}, details=details),
            start_to_close_timeout=timedelta(seconds=30),
            summary="Split the window over the result cap",
        )
        if not split.children:
            raise e
        self._log("run_split", pieces=len(split.children), count=details.get("count"))
        self._state.total = len(split.children)
        self._state.current = 0
        await self._run_children(split.children, split.parallelism, prefix="s")
        count = details.get("count")
        if workflow.patched(PATCH_SPLIT_RECONCILE) and isinstance(count, int):
            # The pieces must add up to the window the source counted: a gap between
            # them would lose records while every piece looks complete.
            self._state.stats["expected_total"] = count
            got = self._state.stats["records_fetched"]
            if is_short(count, got, self._tolerance_pct):
                raise ApplicationError(
                    f"the split window: expected {count} records (the source's count of the "
                    f"whole window), got {got} from its {len(split.children)} pieces, beyond "
                    f"the tolerance of {self._tolerance_pct:g} %",
                    {"expected_total": count, "records_fetched": got},
                    type="INCOMPLETE",
                    non_retryable=True,
                )

    async def _run_children(
        self, children: list[dict[str, Any]], parallelism: int, prefix: str = "w"
    ) -> None:
        """Run child task runs (windows), ``parallelism`` at a time; their records go to the
        sinks from the children, their counts add up here."""
        req = self._req
        self._enter("step_fetch")
        gate = asyncio.Semaphore(max(1, parallelism))

        async def one(n: int, params: dict[str, Any]) -> None:
            async with gate:
                self._stop_point()
                child_id = f"{req.task_id}.{prefix}{n}"
                result: RunResult = await workflow.execute_child_workflow(
                    WORKFLOW_NAME,
                    RunRequest(
                        task_code=req.task_code,
                        task_id=child_id,
                        params=params,
                        trace_id=req.trace_id,
                        parent_span_id=req.parent_span_id,
                        request_id=req.request_id,
                        output=req.output,
                        callback=None,
                        timeout_s=req.timeout_s,
                        tuning=req.tuning,
                        root_task_id=self._run.root_task_id,
                    ),
                    id=workflow_id_for(req.task_code, child_id),
                    result_type=RunResult,
                    # what the window harvests, and its own task id
                    static_summary=" · ".join(
                        str(x)
                        for x in (
                            req.task_code,
                            params.get("provenance"),
                            f"{params.get('start')}..{params.get('end')}",
                            f"task {child_id}",
                        )
                        if x
                    ),
                )
            add_stats(self._state.stats, result.stats)
            self._state.current += 1
            self._details()

        await asyncio.gather(*(one(n, p) for n, p in enumerate(children)))
        for step in ("step_fetch", "step_process", "step_emit"):
            self._state.steps[step] = "COMPLETED"

    def _fetch_retry_policy(self) -> RetryPolicy:
        own = self._fetch_retry
        if own is not None and self._circuit is not None:
            # With a circuit breaker, its threshold ends the attempts of one fetch.
            own = FetchRetry(
                own.initial_s,
                own.backoff,
                own.maximum_s,
                min(own.maximum_attempts, self._circuit.threshold),
            )
        if own is None:
            return RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=self._req.tuning.activity_max_attempts,
                non_retryable_error_types=NON_RETRYABLE,
            )
        return RetryPolicy(
            initial_interval=timedelta(seconds=own.initial_s),
            backoff_coefficient=own.backoff,
            maximum_interval=timedelta(seconds=own.maximum_s),
            maximum_attempts=own.maximum_attempts,
            non_retryable_error_types=NON_RETRYABLE,
        )

    def _continue_as_new(self) -> None:
        carry = self._carry()
        self._log("continue_as_new", next_seq=self._next_seq, generation=self._generation + 1)
        req = self._req
        workflow.continue_as_new(dataclasses.replace(req, carry=carry))

    def _carry(self, **more: Any) -> RunCarry:
        """The run's state for its next generation (continue-as-new) or, kept in the
        database, for POST /tasks/{id}/retry."""
        return RunCarry(
            params=self._params or {},
            total=self._state.total,
            checkpoint=self._checkpoint,
            next_seq=self._next_seq,
            stats=dict(self._state.stats),
            steps=dict(self._state.steps),
            progress_last_ms=self._progress_ms,
            units_done=self._state.current,
            started_ms=self._started_ms,
            generation=self._generation + 1,
            fetch_retry=self._fetch_retry,
            circuit=self._circuit,
            qps=self._state.qps,
            paused=self._state.paused,
            rate_key=self._rate_key,
            pages_per_fetch=self._pages_per_fetch,
            tolerance_pct=self._tolerance_pct,
            waits=self._waits,
            pause_at_page=self._pause_at_page,
            outage_tolerance_s=self._outage_tolerance_s,
            retry_attempt=self._retry_attempt,
            **more,
        )

    async def _stop_when_asked(self, deadline_s: float) -> _Stop:
        try:
            await workflow.wait_condition(
                lambda: self._cancel_reason is not None,
                timeout=timedelta(seconds=deadline_s),
                # What the UI shows for the timer (same StartTimer command: replay-safe).
                timeout_summary=f"Run deadline ({self._req.timeout_s:g} s)",
            )
        except TimeoutError:
            return _Stop("timeout", f"run exceeded its deadline of {self._req.timeout_s:g} s")
        return _Stop("cancelled", f"cancelled: {self._cancel_reason}")

    # -- finalize ----------------------------------------------------------------------------
    async def _finalize(
        self,
        status: str,
        error_code: str | None,
        error_message: str | None,
        retain: bool = False,
    ) -> str:
        self._enter("step_finalize")
        # The clean-up after a delivered finalize is its own step: a failed clean-up can
        # never send the finalize again (histories of earlier builds keep the old path).
        separate_cleanup = workflow.patched(PATCH_CLEANUP_STEP)
        try:
            fin: FinalizeResult = await workflow.execute_activity_method(
                TaskRunActivities.finalize_run,
                FinalizeInput(
                    run=self._run,
                    status=status,
                    stats=dict(self._state.stats),
                    error_code=error_code,
                    error_message=error_message,
                    callback=self._req.callback,
                    params=self._params,
                    cleanup=not separate_cleanup,
                    output=self._req.output,
                    # A run kept for a retry finishes its sinks when it really ends.
                    finish_sinks=not self._parent and not retain,
                    retry_attempt=self._retry_attempt,
                ),
                start_to_close_timeout=timedelta(seconds=30),
                # The CronJob protocol: 3 retries after 0.5 s, 1 s and 2 s (network errors
                # and 5xx only; a 4xx answer is not retried by the activity itself).
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=0.5),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=2),
                    maximum_attempts=4,
                ),
                summary=f"Finalize ({status}) and call the CronJob back",
            )
            self._state.steps["step_finalize"] = "COMPLETED"
            for k, v in fin.stats.items():
                if isinstance(v, int) and k in self._state.stats:
                    self._state.stats[k] = v
            if isinstance(fin.stats.get("sinks_finished"), dict):
                self._state.stats["sinks_finished"] = fin.stats["sinks_finished"]
            outcome = fin.callback
        except ActivityError as e:
            self._state.steps["step_finalize"] = "ERROR"
            self._log("finalize_failed", error=_message_of(e))
            outcome = "error"
        if retain:
            try:
                await self._retain(status, error_code or "INTERNAL", error_message or status)
                return outcome
            except ActivityError as e:
                # Not kept: the run cannot be retried, its data goes as after any ending.
                self._log("retain_failed", error=_message_of(e))
        if separate_cleanup:
            try:
                await workflow.execute_activity_method(
                    TaskRunActivities.cleanup_run,
                    CleanupRunInput(run=self._run),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(seconds=1),
                        maximum_interval=timedelta(seconds=30),
                        maximum_attempts=10,
                    ),
                    summary="Drop the run's staged pages and secret",
                )
            except ActivityError as e:
                # Left over, the data is dropped by the cleanup_old_tasks schedule.
                self._log("cleanup_failed", error=_message_of(e))
        return outcome

    async def _retain(self, status: str, error_code: str, error_message: str) -> None:
        """Keep what POST /tasks/{id}/retry needs: the carry with the pages staged but not
        delivered (``[lowest undelivered, next fetched)``, minus those delivered above)."""
        undelivered = (
            [[self._delivered_below, self._next_seq - 1]]
            if self._next_seq > self._delivered_below
            else []
        )
        carry = self._carry(
            undelivered=undelivered,
            delivered_above=list(self._delivered_above),
            fetch_done=self._fetch_done,
            processed_through=self._processed_through,
        )
        await workflow.execute_activity_method(
            TaskRunActivities.retain_run,
            RetainInput(
                run=self._run,
                request=dataclasses.replace(self._req, carry=None),
                carry=carry,
                error_code=error_code,
                error_message=error_message,
                retain_s=self._req.tuning.retain_failed_s,
            ),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=10,
            ),
            summary=f"Keep the run's state for a retry ({status}, {error_code})",
        )
        self._log("run_retained", undelivered=undelivered, next_seq=self._next_seq)

    # -- helpers -------------------------------------------------------------------------------
    def _stop_point(self) -> None:
        """A safe point: leave the batch loop if the run was asked to stop."""
        if self._stopping:
            raise asyncio.CancelledError("run is stopping")

    def _enter(self, step: str) -> None:
        self._state.stage = step
        if self._state.steps[step] == "PENDING":
            self._state.steps[step] = "IN_PROGRESS"
        self._details()

    def _mark_step_errors(self, status: str) -> None:
        if status != "completed":
            for step, state in self._state.steps.items():
                if state == "IN_PROGRESS":
                    self._state.steps[step] = "ERROR"

    def _details(self) -> None:
        s = self._state.stats
        line = (
            f"**{self._state.shown_status()}** · stage `{self._state.stage}` · "
            f"{self._state.current}/{self._state.total} units"
            f" · {s['pages']} pages · {s['records_fetched']} fetched · "
            f"{s['records_emitted']} emitted"
        )
        if self._state.waiting:
            line += f"\n\n**{waiting_line(self._state.waiting)}**"
        workflow.set_current_details(line)

    def _log(self, event: str, **fields: Any) -> None:
        workflow.logger.info(event, extra={"artemis": {**self._log_fields, **fields}})


async def _quietly(task: asyncio.Task[Any]) -> None:
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


def _root_application_error(e: BaseException) -> ApplicationError | None:
    cur: BaseException | None = e
    while cur is not None:
        if isinstance(cur, ApplicationError):
            return cur
        cur = cur.cause if isinstance(cur, FailureError) else cur.__cause__
    return None


def _details_of(e: BaseException) -> dict[str, Any]:
    app = _root_application_error(e)
    details = app.details[0] if app is not None and app.details else None
    return details if isinstance(details, dict) else {}


def _was_cancelled(e: ActivityError) -> bool:
    """The activity ended acknowledging its cancellation (no result)."""
    return isinstance(e.cause, CancelledError)


def _code_of(e: BaseException) -> str:
    app = _root_application_error(e)
    if app is not None and app.type:
        return app.type
    msg = str(getattr(e, "cause", None) or e).lower()
    return "TIMEOUT_ERROR" if "timeout" in msg or "timed out" in msg else "INTERNAL"


def _message_of(e: BaseException) -> str:
    app = _root_application_error(e)
    if app is not None:
        return app.message
    cause = getattr(e, "cause", None)
    return str(cause or e)


def _code_value(code: ErrorCode | None) -> str | None:
    return None if code is None else code.value
