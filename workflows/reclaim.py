"""The timeout reclaim (docs/operations.md): records locked longer than
``crawler.lock_timeout_minutes`` go back to pending (or to failed after ``max_retry``),
executions whose heartbeat is that old become ``timeout``. Each worker start keeps one
execution per task queue looping every ``crawler.recovery_interval_minutes``
(workflows/housekeeping.py); an input without ``every_s`` runs one pass. The
workflow's own clock is the activity's "now", so time-skipping tests see 30 minutes pass
in an instant."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior

from workflows import retry_policies

with workflow.unsafe.imports_passed_through():
    from activities.crawl import CrawlActivities
    from artemis.run_models import ReclaimInput, ReclaimResult

from workflows.housekeeping import HousekeepingLoop


@workflow.defn(name="ReclaimStaleLocks", versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class ReclaimWorkflow:
    def __init__(self) -> None:
        self.loop: HousekeepingLoop[ReclaimInput, ReclaimResult] = HousekeepingLoop("reclaim")

    @workflow.signal(name="configure")
    def configure(self, inp: ReclaimInput) -> None:
        self.loop.configure(inp)

    @workflow.run
    async def run(self, inp: ReclaimInput) -> ReclaimResult:
        if not self.loop.wanted(inp):
            return await self.once(inp)
        return await self.loop.run(inp, self.once, _describe, ReclaimResult(0, 0, 0))

    async def once(self, inp: ReclaimInput) -> ReclaimResult:
        now = workflow.now().isoformat()
        return await workflow.execute_activity_method(
            CrawlActivities.reclaim_stale_locks,
            ReclaimInput(lock_timeout_minutes=inp.lock_timeout_minutes, now=now),
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=retry_policies.RECLAIM_PASS,
            summary=f"Release locks older than {inp.lock_timeout_minutes:g} min",
        )


def _describe(r: ReclaimResult) -> str:
    return (
        f"{r.records_pending} records back to pending, {r.records_failed} failed, "
        f"{r.executions_timed_out} executions timed out"
    )
