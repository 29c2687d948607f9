"""The workflow a schedule's action starts (artemis/schedules.py): one activity starts the
task run through the API's start path, another waits for the run to end, so that the
schedule's overlap policy (skip, or buffer one) applies to runs. A start the path refuses
(params no longer valid, a lock held by a run still going) fails this workflow with the
reason, where `artemis schedules show` and the Temporal UI read it; the schedule goes on
(``pause_on_failure`` is off)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, VersioningBehavior
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import retry_policies

with workflow.unsafe.imports_passed_through():
    from activities.schedules import ScheduleActivities
    from artemis.run_models import (
        STARTER_WORKFLOW,
        ScheduledRun,
        ScheduledStart,
        StartScheduled,
        scheduled_instant,
    )

# Set by Temporal on every workflow a schedule starts: the instant it was scheduled for.
SCHEDULED_AT = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
# A start that meets an outage (database, Temporal) is tried again for a while.
START_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=60),
    non_retryable_error_types=retry_policies.NON_RETRYABLE,
)
START_WITHIN = timedelta(minutes=30)
# The wait for the run's end heartbeats; a worker lost meanwhile is noticed in a minute.
WAIT_HEARTBEAT = timedelta(seconds=60)


@workflow.defn(name=STARTER_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class ScheduledStartWorkflow:
    @workflow.run
    async def run(self, start: ScheduledStart) -> ScheduledRun:
        at = (
            scheduled_instant(workflow.info().workflow_id)
            or workflow.info().typed_search_attributes.get(SCHEDULED_AT)
            or workflow.now()
        )
        try:
            run = await workflow.execute_activity_method(
                ScheduleActivities.start_scheduled_run,
                StartScheduled(start, at.isoformat()),
                schedule_to_close_timeout=START_WITHIN,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=START_RETRY,
                summary=f"start {start.task_code}",
            )
        except ActivityError as e:
            cause = e.cause
            message = getattr(cause, "message", None) or str(cause or e)
            # (a timeout's cause has a number for its type: only an error's own type is text)
            kind = cause.type if isinstance(cause, ApplicationError) and cause.type else "INTERNAL"
            raise ApplicationError(
                f"schedule {start.name}: the start was refused: {message}",
                type=kind,
                non_retryable=True,
            ) from None
        timeout = (start.timeout_s or 86400) + 3600
        return await workflow.execute_activity_method(
            ScheduleActivities.await_run_end,
            run,
            start_to_close_timeout=timedelta(seconds=timeout),
            heartbeat_timeout=WAIT_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            summary=f"wait for task {run.task_id}",
        )
