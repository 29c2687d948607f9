"""The scheduled timeout reclaim of seed 004 §4.4: records locked longer than
``crawler.lock_timeout_minutes`` go back to pending (or to failed after ``max_retry``),
executions whose heartbeat is that old become ``timeout``. Started every
``crawler.recovery_interval_minutes`` by a Temporal schedule created at worker start-up.
The workflow's own clock is the activity's "now", so time-skipping tests see 30 minutes
pass in an instant."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.crawl import CrawlActivities
    from artemis.run_models import ReclaimInput, ReclaimResult


@workflow.defn(name="ReclaimStaleLocks")
class ReclaimWorkflow:
    @workflow.run
    async def run(self, inp: ReclaimInput) -> ReclaimResult:
        now = workflow.now().isoformat()
        return await workflow.execute_activity_method(
            CrawlActivities.reclaim_stale_locks,
            ReclaimInput(lock_timeout_minutes=inp.lock_timeout_minutes, now=now),
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=RetryPolicy(maximum_attempts=3),
            summary=f"Release locks older than {inp.lock_timeout_minutes:g} min",
        )
