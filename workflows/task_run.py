"""The task-run workflow: one generic, deterministic orchestration for every TaskUnit.

prepare → (fetch a batch of pages → process → emit)* → finalize. This module is the
run's lifecycle: its signals and query, its start (fresh, carried across continue-as-new
or started again by a retry), the race of the batch loop against the deadline and the
cancel signal, and its ending. The parts live beside it (``workflows/run_*.py``).

A ``cancel`` signal, a Temporal cancellation or the run's deadline all stop at the next
safe point, cancel in-flight activities (waiting for their clean-up) and finalize.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate, VersioningBehavior
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from workflows.run_core import Stop, quietly
from workflows.run_ending import Ending
from workflows.run_loop import BatchLoop

with workflow.unsafe.imports_passed_through():
    from artemis.run_models import (
        SA_RUN_ID,
        SA_TASK_CODE,
        SA_TASK_ID,
        WORKFLOW_NAME,
        CancelRequest,
        PauseRequest,
        RateLimitRequest,
        RunCarry,
        RunRef,
        RunRequest,
        RunResult,
    )
    from artemis.run_state import RETRYABLE_ENDINGS, RunState, RunStatus, end_code
    from artemis.temporal.failures import code_of, message_of

KEY_TASK_CODE = SearchAttributeKey.for_keyword(SA_TASK_CODE)
KEY_TASK_ID = SearchAttributeKey.for_keyword(SA_TASK_ID)
KEY_RUN_ID = SearchAttributeKey.for_keyword(SA_RUN_ID)


@workflow.defn(name=WORKFLOW_NAME, versioning_behavior=VersioningBehavior.PINNED)
class TaskRunWorkflow(BatchLoop, Ending):
    # -- queries and signals ---------------------------------------------------------------
    @workflow.query
    def progress(self) -> dict[str, Any]:
        return self._state.progress()

    @workflow.signal
    def pause(self, request: PauseRequest) -> None:
        """Stop fetching: a fetch in flight stops at its next page (runs of this build;
        earlier ones finish the batch in flight); no worker is held while paused."""
        self._state.pause()
        workflow.logger.info("paused", extra={"artemis": {"reason": request.reason}})

    @workflow.signal
    def resume(self) -> None:
        self._state.resume()
        workflow.logger.info("resumed")

    @workflow.signal
    def set_rate_limit(self, request: RateLimitRequest) -> None:
        """A new requests-per-second limit for the source, from the next batch on."""
        if request.qps > 0:
            self._state.set_qps(request.qps)
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
        self._state.end(status, error_code, error_message)
        retain = (
            not self._parent
            and self._params is not None
            and status in (RunStatus.FAILED, RunStatus.TIMEOUT)
            and (error_code or "INTERNAL") in RETRYABLE_ENDINGS
        )
        for task in self._beside:
            await quietly(task)
        callback_outcome = await self._finalize(status, error_code, error_message, retain)
        if self._mirror_running is not None:
            await quietly(self._mirror_running)  # the `running` record goes first
        ended_ms = _now_ms()
        await self._mirror(status, ended_ms)
        self._state.ended(status)
        self._details()
        result = RunResult(
            task_code=req.task_code,
            task_id=req.task_id,
            workflow_id=self._run.workflow_id,
            status=status,
            duration_ms=ended_ms - self._live.started_ms,
            stats=dict(self._state.stats),
            error=self._state.error,
            callback=callback_outcome,
        )
        self._log("run_finished", status=status, error_code=error_code, **self._state.stats)
        if temporal_cancel is not None:
            raise temporal_cancel
        if status == RunStatus.FAILED:
            raise ApplicationError(
                error_message or "run failed",
                dataclasses.asdict(result),
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
            secrets_key=req.secrets_key,
        )
        self._log_fields = {
            "trace_id": req.trace_id,
            "request_id": req.request_id,
            "task_code": req.task_code,
            "task_id": req.task_id,
            "workflow_id": info.workflow_id,
        }
        carry = req.carry
        run_id_attribute = KEY_RUN_ID.value_set(str((req.callback or {}).get("run_id") or ""))
        if carry is None:
            self._prepared = False
            self._live = RunCarry(
                params={},
                total=0,
                checkpoint=None,
                next_seq=0,
                stats={},
                steps={},
                progress_last_ms=None,
                units_done=0,
                started_ms=_now_ms(),
            )
            self._upsert_new(
                [
                    KEY_TASK_CODE.value_set(req.task_code),
                    KEY_TASK_ID.value_set(req.task_id),
                    run_id_attribute,
                ]
            )
        else:
            self._prepared = True
            self._live = carry
            self._state = RunState.from_carry(carry)
            self._delivered_below = carry.undelivered[0][0] if carry.undelivered else carry.next_seq
            if carry.retry_start:
                # A new attempt: its own deadline, counted from now.
                carry.started_ms = _now_ms()
                self._upsert_new([run_id_attribute])
        self._state.start()
        retry_start = carry is not None and carry.retry_start
        if retry_start:
            # Started again by POST /tasks/{id}/retry: the failed attempt's ERROR steps go
            # on, and the run is `running` again in task storage.
            self._state.reopen_failed_steps()
            self._log("run_retried", attempt=self._live.retry_attempt, next_seq=self._live.next_seq)
        if carry is None or retry_start:
            # Recorded alongside, never in the way: a task-store outage is retried and shown
            # in the progress query, it neither fails nor blocks the run.
            self._mirror_running = asyncio.create_task(self._mirror(RunStatus.RUNNING))
        self._details()

    def _upsert_new(self, updates: list[SearchAttributeUpdate[Any]]) -> None:
        """Set search attributes, leaving out those the run already holds with the same
        value (the API sets them at start; an empty one is unset)."""
        held = workflow.info().typed_search_attributes
        updates = [u for u in updates if held.get(u.key) != (u.value or None)]
        if updates:
            workflow.upsert_search_attributes(updates)

    async def _run_until_end(
        self, req: RunRequest
    ) -> tuple[RunStatus, str | None, str | None, BaseException | None]:
        """The batch loop raced against the deadline and the cancel signal: (status,
        error code, message, Temporal's own cancellation to re-raise after finalizing)."""
        deadline_s = req.timeout_s - (_now_ms() - self._live.started_ms) / 1000
        main = asyncio.create_task(self._main())
        stopper = asyncio.create_task(self._stop_when_asked(max(deadline_s, 0.0)))
        status, error_code, error_message = RunStatus.COMPLETED, None, None
        temporal_cancel: BaseException | None = None
        try:
            await workflow.wait([main, stopper], return_when=asyncio.FIRST_COMPLETED)
            if main.done():
                stopper.cancel()
                main.result()  # re-raises a failure or a continue-as-new
            else:
                stop: Stop = stopper.result()
                status, error_message = stop.status, stop.message
                error_code = _code_value(stop.status)
                self._stopping = True
                main.cancel()
                await quietly(main)
        except asyncio.CancelledError as e:
            # Temporal's own cancellation (UI, CLI, API): clean up, finalize, then report it.
            temporal_cancel = e
            status, error_code = RunStatus.CANCELLED, _code_value(RunStatus.CANCELLED)
            error_message = f"cancelled: {self._cancel_reason or 'workflow cancellation requested'}"
            self._stopping = True
            main.cancel()
            stopper.cancel()
            await quietly(main)
        except workflow.ContinueAsNewError:
            raise
        except ActivityError as e:
            status, error_code, error_message = RunStatus.FAILED, code_of(e), message_of(e)
            stopper.cancel()
        except ApplicationError as e:
            status, error_code, error_message = RunStatus.FAILED, e.type or "INTERNAL", e.message
            stopper.cancel()
        except ChildWorkflowError as e:
            # A window (child run) failed: the run fails with its code, and finalizes.
            status, error_code, error_message = RunStatus.FAILED, code_of(e), message_of(e)
            stopper.cancel()
        return status, error_code, error_message, temporal_cancel

    async def _stop_when_asked(self, deadline_s: float) -> Stop:
        try:
            await workflow.wait_condition(
                lambda: self._cancel_reason is not None,
                timeout=timedelta(seconds=deadline_s),
                # What the UI shows for the timer (same StartTimer command: replay-safe).
                timeout_summary=f"Run deadline ({self._req.timeout_s:g} s)",
            )
        except TimeoutError:
            return Stop(
                RunStatus.TIMEOUT, f"run exceeded its deadline of {self._req.timeout_s:g} s"
            )
        return Stop(RunStatus.CANCELLED, f"cancelled: {self._cancel_reason}")


def _now_ms() -> int:
    return int(workflow.now().timestamp() * 1000)


def _code_value(status: RunStatus) -> str | None:
    code = end_code(status)
    return None if code is None else code.value
