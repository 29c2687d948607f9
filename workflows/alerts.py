"""The scheduled evaluation of the crawler's alerts (seed 004 §6): every
``alerts.interval_s`` a Temporal schedule starts this workflow; the activity moves each
alert along its episode and delivers firing/resolved messages once."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.crawl import CrawlActivities
    from artemis.run_models import AlertsInput, AlertsResult


@workflow.defn(name="EvaluateAlerts")
class AlertsWorkflow:
    @workflow.run
    async def run(self, inp: AlertsInput) -> AlertsResult:
        return await workflow.execute_activity_method(
            CrawlActivities.evaluate_alerts,
            AlertsInput(now=workflow.now().isoformat()),
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=RetryPolicy(maximum_attempts=2),
            summary="Evaluate the crawler alerts",
        )
