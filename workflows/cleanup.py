"""The clean-up: removes terminal tasks (and leftover staged pages, old events) older
than ``hours`` from task storage. Each worker start keeps one execution per task queue
looping every ``task_store.cleanup_interval_minutes`` (workflows/housekeeping.py); an
input without ``every_s`` runs one pass."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior

from workflows import retry_policies

with workflow.unsafe.imports_passed_through():
    from activities.housekeeping import HousekeepingActivities
    from artemis.run_models import CleanupInput, CleanupResult

from workflows.housekeeping import HousekeepingLoop


@workflow.defn(name="CleanupOldTasks", versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class CleanupWorkflow:
    def __init__(self) -> None:
        self.loop: HousekeepingLoop[CleanupInput, CleanupResult] = HousekeepingLoop("clean-up")

    @workflow.signal(name="configure")
    def configure(self, inp: CleanupInput) -> None:
        self.loop.configure(inp)

    @workflow.run
    async def run(self, inp: CleanupInput) -> CleanupResult:
        if not self.loop.wanted(inp):
            return await self.once(inp)
        return await self.loop.run(inp, self.once, _describe, CleanupResult(0, 0))

    async def once(self, inp: CleanupInput) -> CleanupResult:
        return await workflow.execute_activity_method(
            HousekeepingActivities.cleanup_old_tasks,
            inp,
            start_to_close_timeout=timedelta(minutes=10),
            retry_policy=retry_policies.CLEANUP_PASS,
            summary=f"Remove terminal tasks older than {inp.hours:g} h",
        )


def _describe(r: CleanupResult) -> str:
    return (
        f"{r.tasks_removed} tasks, {r.staged_pages_removed} staged pages, "
        f"{r.events_removed} events removed, {r.runs_reconciled} runs reconciled"
    )
