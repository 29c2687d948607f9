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
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    # Activities by reference: go-to-definition and the type checker see their arguments.
    from activities.task_run import TaskRunActivities
    from artemis.completeness import is_short
    from artemis.errors import ErrorCode
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
        PauseRequest,
        PrepareInput,
        PrepareResult,
        ProcessResult,
        RateLimitRequest,
        RunCarry,
        RunRef,
        RunRequest,
        RunResult,
        SplitInput,
        SplitResult,
        provenance_queue,
        workflow_id_for,
    )
    from artemis.run_state import RunState, add_sink_counts, add_stats, end_code

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

    # -- queries and signals ---------------------------------------------------------------
    @workflow.query
    def progress(self) -> dict[str, Any]:
        return self._state.progress()

    @workflow.signal
    def pause(self, request: PauseRequest) -> None:
        """Stop before the next batch (the batch in flight finishes); no worker is held."""
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

        callback_outcome = await self._finalize(status, error_code, error_message)
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
        self._generation = carry.generation if carry else 1
        self._state.status = "running"
        if carry is None:
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

        emitting: asyncio.Task[None] | None = None
        batches_here = 0
        done = False
        try:
            while not done:
                if self._state.paused:
                    self._state.stage = "paused"
                    self._details()
                    # A durable wait: no worker is held while the run is paused.
                    await workflow.wait_condition(lambda: not self._state.paused or self._stopping)
                    self._stop_point()
                self._enter("step_fetch")
                try:
                    fetched: FetchResult = await workflow.execute_activity_method(
                        TaskRunActivities.fetch_pages,
                        FetchInput(
                            run=self._run,
                            params=self._params,
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
                except ActivityError as e:
                    if _code_of(e) == "RESULT_CAP_EXCEEDED" and not self._state.stats["pages"]:
                        # The window holds more hits than the source can list: split it.
                        await self._split(e)
                        return
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
                    self._state.steps["step_fetch"] = "COMPLETED"
                self._details()
                # At most one batch is being emitted while the next is fetched.
                if emitting is not None:
                    await emitting
                    emitting = None
                if last >= first:
                    emitting = asyncio.create_task(
                        self._process_and_emit(first, last, beside_fetch=not done)
                    )
                if fetched.incomplete is not None:
                    # A source ended short of its own count: what it gave is delivered,
                    # then the run fails visibly (never `completed`).
                    if emitting is not None:
                        await emitting
                        emitting = None
                    raise ApplicationError(
                        str(fetched.incomplete.get("message")),
                        fetched.incomplete,
                        type="INCOMPLETE",
                        non_retryable=True,
                    )
                batches_here += 1
                if not done and (
                    batches_here >= tuning.max_batches_per_run
                    or workflow.info().is_continue_as_new_suggested()
                ):
                    await emitting if emitting else None
                    emitting = None
                    self._continue_as_new()
            if emitting is not None:
                await emitting
                emitting = None
        finally:
            if emitting is not None and not emitting.done():
                emitting.cancel()
                await _quietly(emitting)
        self._state.steps["step_fetch"] = "COMPLETED"
        self._state.steps["step_process"] = "COMPLETED"
        self._state.steps["step_emit"] = "COMPLETED"

    async def _process_and_emit(self, first: int, last: int, beside_fetch: bool = False) -> None:
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
        if beside_fetch and workflow.patched(PATCH_PROCESS_ACTIVITY):
            # A heartbeat timeout: a batch lost with its worker runs again in seconds.
            processed = await workflow.execute_activity_method(
                TaskRunActivities.process_batch,
                batch,
                heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
                **options,
            )
        else:
            # The last batch (nothing to overlap): one round trip fewer as a local activity.
            processed = await workflow.execute_local_activity_method(
                TaskRunActivities.process_batch, batch, **options
            )
        self._stop_point()
        self._state.stats["records_processed"] += processed.records_out
        self._state.steps["step_emit"] = "IN_PROGRESS"
        emitted: EmitResult = await workflow.execute_activity_method(
            TaskRunActivities.emit_batch,
            batch,
            start_to_close_timeout=timedelta(seconds=tuning.emit_start_to_close_s),
            heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=0.5),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=tuning.activity_max_attempts,
                non_retryable_error_types=NON_RETRYABLE,
            ),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"Emit pages #{first}-#{last}",
        )
        self._state.stats["records_emitted"] += emitted.records_emitted
        add_sink_counts(self._state.stats, emitted.sinks)
        self._details()

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
                    static_summary=f"{req.task_code} · {params.get('start')}..{params.get('end')}",
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
        carry = RunCarry(
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
        )
        self._log("continue_as_new", next_seq=self._next_seq, generation=self._generation + 1)
        req = self._req
        workflow.continue_as_new(dataclasses.replace(req, carry=carry))

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
        self, status: str, error_code: str | None, error_message: str | None
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
                    finish_sinks=not self._parent,
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
        workflow.set_current_details(
            f"**{self._state.status}** · stage `{self._state.stage}` · "
            f"{self._state.current}/{self._state.total} units"
            f" · {s['pages']} pages · {s['records_fetched']} fetched · "
            f"{s['records_emitted']} emitted"
        )

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
