"""How a task run ends: finalize (the task's hook, the sinks' finish, the CronJob's
callback), keep a run that failed with a retryable code for POST /tasks/{id}/retry, drop
its staged data, and mirror its state into task storage."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import retry_policies
from workflows.run_core import RunContext

with workflow.unsafe.imports_passed_through():
    from activities.task_run import TaskRunActivities
    from artemis.errors import ErrorCode
    from artemis.run_models import (
        CleanupRunInput,
        FinalizeInput,
        FinalizeOutcome,
        FinalizeResult,
        MirrorInput,
        RetainInput,
    )
    from artemis.run_state import RunStatus
    from artemis.temporal.failures import message_of


class Ending:
    """Finalize, keep a failed run for a retry, clean up, mirror into task storage."""

    def __init__(self, run: RunContext) -> None:
        self.run = run

    async def finalize(
        self,
        status: RunStatus,
        error_code: str | None,
        error_message: str | None,
        retain: bool = False,
    ) -> str:
        """Finalize (the task's hook, the sinks' last word, the CronJob's callback), then
        keep the run for a retry (``retain``) or drop its staged data. The callback's
        outcome."""
        self.run.enter("step_finalize")
        outcome = await self._finalize_step(status, error_code, error_message, retain)
        if retain:
            try:
                await self._retain(
                    status, error_code or ErrorCode.INTERNAL, error_message or status
                )
                return outcome
            except ActivityError as e:
                # Not kept: the run cannot be retried, its data goes as after any ending.
                self.run.log("retain_failed", error=message_of(e))
        await self._cleanup()
        return outcome

    async def _finalize_step(
        self, status: RunStatus, error_code: str | None, error_message: str | None, retain: bool
    ) -> str:
        # A local activity (the hooks, the sinks' last word and the CronJob call, retried
        # by the same policy), in the workflow task the batch loop ended in: no task-queue
        # round trip. The clean-up is a step of its own after it, so that a failed
        # clean-up can never send the finalize again.
        try:
            fin: FinalizeResult = await workflow.execute_local_activity_method(
                TaskRunActivities.finalize_run,
                FinalizeInput(
                    run=self.run.ref,
                    status=status,
                    stats=dict(self.run.state.stats),
                    error_code=error_code,
                    error_message=error_message,
                    callback=self.run.req.callback,
                    params=self.run.params,
                    output=self.run.req.output,
                    # A run kept for a retry finishes its sinks when it really ends.
                    finish_sinks=not self.run.state.parent and not retain,
                    retry_attempt=self.run.state.retry_attempt,
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=retry_policies.FINALIZE,
                summary=f"Finalize ({status}) and call the CronJob back",
            )
        except ActivityError as e:
            self.run.state.failed_step("step_finalize")
            self.run.log("finalize_failed", error=message_of(e))
            return FinalizeOutcome.ERROR.value
        self.run.state.complete("step_finalize")
        self.run.state.finalized(fin.stats)
        return fin.callback

    async def _cleanup(self) -> None:
        try:
            # A local activity (four deletes), in the workflow task that records the run's
            # end: no task-queue round trip.
            await workflow.execute_local_activity_method(
                TaskRunActivities.cleanup_run,
                # (told only once the fetching is done: an attempt that failed or was
                # stopped may have staged up to a batch past next_seq)
                CleanupRunInput(
                    run=self.run.ref,
                    pages=self.run.state.next_seq if self.run.state.fetch_done else None,
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=retry_policies.HOUSEKEEPING,
                summary="Drop the run's staged pages and secret",
            )
        except ActivityError as e:
            # Left over, the data is dropped by the clean-up loop.
            self.run.log("cleanup_failed", error=message_of(e))

    async def _retain(self, status: RunStatus, error_code: str, error_message: str) -> None:
        """Keep what POST /tasks/{id}/retry needs: the carry with the pages staged but not
        delivered (``[lowest undelivered, next fetched)``, minus those delivered above)."""
        state = self.run.state
        undelivered = (
            [[self.run.state.delivered_below, state.next_seq - 1]]
            if state.next_seq > self.run.state.delivered_below
            else []
        )
        carry = self.run.state.next_generation(undelivered=undelivered)
        await workflow.execute_activity_method(
            TaskRunActivities.retain_run,
            RetainInput(
                run=self.run.ref,
                request=dataclasses.replace(self.run.req, carry=None),
                carry=carry,
                error_code=error_code,
                error_message=error_message,
                retain_s=self.run.req.tuning.retain_failed_s,
            ),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=retry_policies.HOUSEKEEPING,
            summary=f"Keep the run's state for a retry ({status}, {error_code})",
        )
        self.run.log("run_retained", undelivered=undelivered, next_seq=state.next_seq)

    async def mirror(self, status: RunStatus, ended_ms: int | None = None) -> None:
        """Record the run's state in task storage: its status, the snapshot of its stats
        and error, and its start and end on the workflow's clock (one duration)."""
        try:
            # A local activity: a few small writes, so no task-queue round trip per record.
            await workflow.execute_local_activity_method(
                TaskRunActivities.mirror_state,
                MirrorInput(
                    run=self.run.ref,
                    status=status,
                    stats=dict(self.run.state.stats) if ended_ms is not None else {},
                    error=self.run.state.error,
                    started_ms=self.run.state.started_ms,
                    ended_ms=ended_ms,
                    steps=dict(self.run.state.steps) if ended_ms is not None else None,
                    params=self.run.req.params,
                ),
                start_to_close_timeout=timedelta(seconds=15),
                retry_policy=retry_policies.MIRROR,
                summary=f"Record `{status}` in task storage",
            )
            self.run.state.mirrored(True)
        except ActivityError as e:
            self.run.state.mirrored(False)
            self.run.log("task_store_unavailable", status=status, error=message_of(e))
