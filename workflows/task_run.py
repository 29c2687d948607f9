"""The task-run workflow: one generic, deterministic orchestration for every TaskUnit.

prepare → (fetch a batch of pages → process → emit)* → finalize. This module is the
run's lifecycle: its signals and query, its start (fresh, carried across continue-as-new
or started again by a retry), the race of the batch loop against the deadline and the
cancel signal, and its ending. The parts live next to it (``workflows/run_*.py``).

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

from workflows.run_core import RunContext, Stop, quietly
from workflows.run_ending import Ending
from workflows.run_fanout import FanOut
from workflows.run_loop import BatchLoop
from workflows.run_outages import OutageWaits

with workflow.unsafe.imports_passed_through():
    from artemis.errors import ErrorCode
    from artemis.run_models import (
        SA_RUN_ID,
        SA_TASK_CODE,
        SA_TASK_ID,
        WORKFLOW_NAME,
        CancelRequest,
        PauseRequest,
        RateLimitRequest,
        RunRef,
        RunRequest,
        RunResult,
    )
    from artemis.run_state import RETRYABLE_ENDINGS, RunStatus, end_code
    from artemis.temporal.failures import code_of, message_of

KEY_TASK_CODE = SearchAttributeKey.for_keyword(SA_TASK_CODE)
KEY_TASK_ID = SearchAttributeKey.for_keyword(SA_TASK_ID)
KEY_RUN_ID = SearchAttributeKey.for_keyword(SA_RUN_ID)


@workflow.defn(name=WORKFLOW_NAME, versioning_behavior=VersioningBehavior.PINNED)
class TaskRunWorkflow:
    """One task run: its lifecycle here, its parts as plain objects over one context."""

    def __init__(self) -> None:
        self.ctx = RunContext()
        self.outages = OutageWaits(self.ctx)
        self.fanout = FanOut(self.ctx)
        self.loop = BatchLoop(self.ctx, self.outages, self.fanout)
        self.ending = Ending(self.ctx)

    # -- queries and signals ---------------------------------------------------------------
    @workflow.query
    def progress(self) -> dict[str, Any]:
        return self.ctx.state.progress()

    @workflow.signal
    def pause(self, request: PauseRequest) -> None:
        """Stop fetching: a fetch in flight stops at its next page; no worker is held
        while paused."""
        self.ctx.state.pause()
        workflow.logger.info("paused", extra={"artemis": {"reason": request.reason}})

    @workflow.signal
    def resume(self) -> None:
        self.ctx.state.resume()
        workflow.logger.info("resumed")

    @workflow.signal
    def set_rate_limit(self, request: RateLimitRequest) -> None:
        """A new requests-per-second limit for the source, from the next batch on."""
        if request.qps > 0:
            self.ctx.state.set_qps(request.qps)
            workflow.logger.info("rate_limit_set", extra={"artemis": {"qps": request.qps}})

    @workflow.signal
    def cancel(self, request: CancelRequest) -> None:
        if self.ctx.state.cancel_reason is None:
            self.ctx.state.cancel_reason = request.reason or "cancelled by request"
            workflow.logger.info(
                "cancel_requested", extra={"artemis": {"reason": self.ctx.state.cancel_reason}}
            )

    # -- run -----------------------------------------------------------------------------
    @workflow.run
    async def run(self, req: RunRequest) -> RunResult:
        """Start (or carry on after continue-as-new), run the batch loop against the
        deadline and the cancel signal, then finalize, record and answer."""
        self._begin(req)
        status, error_code, error_message, temporal_cancel = await self._run_until_end(req)
        self.ctx.state.end(status, error_code, error_message)
        retain = (
            not self.ctx.state.parent
            and self.ctx.params is not None
            and status in (RunStatus.FAILED, RunStatus.TIMEOUT)
            and (error_code or ErrorCode.INTERNAL) in RETRYABLE_ENDINGS
        )
        for task in self.ctx.bookkeeping:
            await quietly(task)
        callback_outcome = await self.ending.finalize(status, error_code, error_message, retain)
        if self.ctx.mirror_running is not None:
            await quietly(self.ctx.mirror_running)  # the `running` record goes first
        ended_ms = _now_ms()
        await self.ending.mirror(status, ended_ms)
        self.ctx.state.ended(status)
        self.ctx.details()
        result = RunResult(
            task_code=req.task_code,
            task_id=req.task_id,
            workflow_id=self.ctx.ref.workflow_id,
            status=status,
            duration_ms=ended_ms - self.ctx.state.started_ms,
            stats=dict(self.ctx.state.stats),
            error=self.ctx.state.error,
            callback=callback_outcome,
        )
        self.ctx.log("run_finished", status=status, error_code=error_code, **self.ctx.state.stats)
        if temporal_cancel is not None:
            raise temporal_cancel
        if status == RunStatus.FAILED:
            raise ApplicationError(
                error_message or "run failed",
                dataclasses.asdict(result),
                type=error_code or ErrorCode.INTERNAL,
                non_retryable=True,
            )
        return result

    def _begin(self, req: RunRequest) -> None:
        """The run's identity, and its state: fresh, or carried across continue-as-new."""
        info = workflow.info()
        self.ctx.req = req
        self.ctx.ref = _ref(req, info.workflow_id)
        self.ctx.log_fields = {
            "trace_id": req.trace_id,
            "request_id": req.request_id,
            "task_code": req.task_code,
            "task_id": req.task_id,
            "workflow_id": info.workflow_id,
        }
        carry = req.carry
        caller_run_id_attribute = KEY_RUN_ID.value_set(
            str((req.callback or {}).get("caller_run_id") or "")
        )
        if carry is None:
            self.ctx.state.started_ms = _now_ms()
            self._upsert_new(
                [
                    KEY_TASK_CODE.value_set(req.task_code),
                    KEY_TASK_ID.value_set(req.task_id),
                    caller_run_id_attribute,
                ]
            )
        else:
            # A cancel signal handled before the run began (signals come first in an
            # activation) acted on the state built in __init__: it stays asked.
            carry.cancel_reason = self.ctx.state.cancel_reason
            self.ctx.state = carry
            self.ctx.state.delivered_below = (
                carry.undelivered[0][0] if carry.undelivered else carry.next_seq
            )
            if carry.retry_start:
                # A new attempt: its own deadline, counted from now.
                carry.started_ms = _now_ms()
                self._upsert_new([caller_run_id_attribute])
        self.ctx.state.start()
        retry_start = carry is not None and carry.retry_start
        if retry_start:
            # Started again by POST /tasks/{id}/retry: the failed attempt's ERROR steps go
            # on, and the run is `running` again in task storage.
            self.ctx.state.reopen_failed_steps()
            self.ctx.log(
                "run_retried",
                attempt=self.ctx.state.retry_attempt,
                next_seq=self.ctx.state.next_seq,
            )
        if carry is None or retry_start:
            # Recorded alongside, never in the way: a task-store outage is retried and shown
            # in the progress query, it neither fails nor blocks the run.
            self.ctx.mirror_running = asyncio.create_task(self.ending.mirror(RunStatus.RUNNING))
        self.ctx.details()

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
        deadline_s = req.timeout_s - (_now_ms() - self.ctx.state.started_ms) / 1000
        main = asyncio.create_task(self.loop.main())
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
                self.ctx.state.stopping = True
                main.cancel()
                await quietly(main)
        except asyncio.CancelledError as e:
            # Temporal's own cancellation (UI, CLI, API): clean up, finalize, then report it.
            temporal_cancel = e
            status, error_code = RunStatus.CANCELLED, _code_value(RunStatus.CANCELLED)
            reason = (
                self.ctx.state.cancel_reason
                or workflow.cancellation_reason()
                or "workflow cancellation requested"
            )
            error_message = f"cancelled: {reason}"
            self.ctx.state.stopping = True
            main.cancel()
            stopper.cancel()
            await quietly(main)
        except workflow.ContinueAsNewError:
            raise
        except ActivityError as e:
            status, error_code, error_message = RunStatus.FAILED, code_of(e), message_of(e)
            stopper.cancel()
        except ApplicationError as e:
            status, error_code, error_message = (
                RunStatus.FAILED,
                e.type or ErrorCode.INTERNAL,
                e.message,
            )
            stopper.cancel()
        except ChildWorkflowError as e:
            # A window (child run) failed: the run fails with its code, and finalizes.
            status, error_code, error_message = RunStatus.FAILED, code_of(e), message_of(e)
            stopper.cancel()
        return status, error_code, error_message, temporal_cancel

    async def _stop_when_asked(self, deadline_s: float) -> Stop:
        try:
            await workflow.wait_condition(
                lambda: self.ctx.state.cancel_reason is not None,
                timeout=timedelta(seconds=deadline_s),
                # What the UI shows for the timer (same StartTimer command: replay-safe).
                timeout_summary=f"Run deadline ({self.ctx.req.timeout_s:g} s)",
            )
        except TimeoutError:
            return Stop(
                RunStatus.TIMEOUT, f"run exceeded its deadline of {self.ctx.req.timeout_s:g} s"
            )
        return Stop(RunStatus.CANCELLED, f"cancelled: {self.ctx.state.cancel_reason}")


def _ref(req: RunRequest, workflow_id: str) -> RunRef:
    """Who the run is, as its activities are told."""
    return RunRef(
        task_code=req.task_code,
        task_id=req.task_id,
        workflow_id=workflow_id,
        trace_id=req.trace_id,
        parent_span_id=req.parent_span_id,
        request_id=req.request_id,
        root_task_id=req.root_task_id or req.task_id,
        secrets_key=req.secrets_key,
        role=req.role,
    )


def _now_ms() -> int:
    return int(workflow.now().timestamp() * 1000)


def _code_value(status: RunStatus) -> str | None:
    code = end_code(status)
    return None if code is None else code.value
