"""A replay of one run's quarantined records, as a run of its own: durable (each batch
of rows is an activity, retried while a sink is down), visible in the Temporal UI
(its summary counts what landed) and cancellable (a Temporal cancel stops it between
rows; what landed stays landed)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior

from workflows import retry_policies

with workflow.unsafe.imports_passed_through():
    from activities.quarantine import QuarantineActivities
    from artemis.run_models import (
        REPLAY_WORKFLOW_NAME,
        ReplayBatchInput,
        ReplayRequest,
        ReplayResult,
    )


@workflow.defn(name=REPLAY_WORKFLOW_NAME, versioning_behavior=VersioningBehavior.PINNED)
class QuarantineReplayWorkflow:
    def __init__(self) -> None:
        self._totals = ReplayResult()

    @workflow.query(name="progress")
    def progress(self) -> ReplayResult:
        return self._totals

    @workflow.run
    async def run(self, req: ReplayRequest) -> ReplayResult:
        totals = self._totals
        while True:
            got = await workflow.execute_activity_method(
                QuarantineActivities.replay_quarantined,
                ReplayBatchInput(
                    task_id=req.task_id,
                    after_id=totals.next_after,
                    limit=req.batch,
                    ids=req.ids,
                    trace_id=req.trace_id,
                    request_id=req.request_id,
                ),
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=timedelta(seconds=60),
                retry_policy=retry_policies.REPLAY,
                summary=f"Replay quarantined records after row {totals.next_after}",
            )
            totals.landed += got.landed
            totals.still_bad += got.still_bad
            totals.next_after = got.next_after
            workflow.set_current_details(
                f"**replay** of `{req.task_id}` · {totals.landed} landed · "
                f"{totals.still_bad} still bad"
            )
            if got.done:
                totals.done = True
                return totals
