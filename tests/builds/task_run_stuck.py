"""Broken builds of the task run, for tests/e2e/test_search_attributes_and_stuck.py. After
one timer (a workflow task that completes), the next workflow task fails: its code raises
an exception that is not an ``ApplicationError``, or its command carries a payload past
Temporal's limit. Temporal retries such a task for ever, as it does one that no longer
replays the history."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from artemis.run_models import RunRequest, RunResult

from workflows.task_run import WORKFLOW_NAME, TaskRunWorkflow

BUG = "a bug in the workflow code"


@workflow.defn(name=WORKFLOW_NAME, versioning_behavior=VersioningBehavior.PINNED)
class StuckTaskRun(TaskRunWorkflow):
    @workflow.run
    async def run(self, req: RunRequest) -> RunResult:
        await workflow.sleep(0.01)
        raise RuntimeError(f"{BUG} (task {req.task_id})")


# Past Temporal's 2 MB payload limit (the SDK refuses to send it: TMPRL1103).
TOO_LARGE = 2_500_000


@workflow.defn(name=WORKFLOW_NAME, versioning_behavior=VersioningBehavior.PINNED)
class OversizedTaskRun(TaskRunWorkflow):
    """A run whose command carries a payload past the limit: its result, here (the issue's
    was a local activity's result)."""

    @workflow.run
    async def run(self, req: RunRequest) -> RunResult:
        await workflow.sleep(0.01)
        return {"status": "completed", "padding": "x" * TOO_LARGE}  # type: ignore[return-value]
