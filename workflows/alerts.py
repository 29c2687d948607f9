"""The evaluation of the crawler's alerts (docs/operations.md): each worker start keeps one
execution per task queue looping every ``alerts.interval_s`` (workflows/housekeeping.py;
``alerts.enabled: false`` ends it); the activity moves each alert along its episode and
delivers firing/resolved messages once. An input without ``every_s`` runs one pass."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior

from workflows import retry_policies

with workflow.unsafe.imports_passed_through():
    from activities.crawl import CrawlActivities
    from artemis.run_models import AlertsInput, AlertsResult

from workflows.housekeeping import HousekeepingLoop


@workflow.defn(name="EvaluateAlerts", versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class AlertsWorkflow:
    def __init__(self) -> None:
        self.loop: HousekeepingLoop[AlertsInput, AlertsResult] = HousekeepingLoop(
            "alerts evaluation"
        )

    @workflow.signal(name="configure")
    def configure(self, inp: AlertsInput) -> None:
        self.loop.configure(inp)

    @workflow.run
    async def run(self, inp: AlertsInput) -> AlertsResult:
        if not self.loop.wanted(inp):
            return await self.once(inp)
        return await self.loop.run(inp, self.once, _describe, AlertsResult())

    async def once(self, inp: AlertsInput) -> AlertsResult:
        return await workflow.execute_activity_method(
            CrawlActivities.evaluate_alerts,
            AlertsInput(now=workflow.now().isoformat()),
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=retry_policies.ALERTS_PASS,
            summary="Evaluate the crawler alerts",
        )


def _describe(r: AlertsResult) -> str:
    return ", ".join(r.sent) if r.sent else "nothing to send"
