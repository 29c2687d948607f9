"""The scheduled clean-up: removes terminal tasks (and leftover staged pages) older than
`hours` from task storage. Started by a Temporal schedule created at worker start-up."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.task_run import TaskRunActivities
    from artemis.run_models import CleanupInput, CleanupResult


@workflow.defn(name="CleanupOldTasks")
class CleanupWorkflow:
    @workflow.run
    async def run(self, inp: CleanupInput) -> CleanupResult:
        return await workflow.execute_activity_method(
            TaskRunActivities.cleanup_old_tasks,
            inp,
            start_to_close_timeout=timedelta(minutes=10),
            retry_policy=RetryPolicy(maximum_attempts=3),
            summary=f"Remove terminal tasks older than {inp.hours} h",
        )
