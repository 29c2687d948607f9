"""A later build's task run, for tests/e2e/test_worker_builds.py: one timer before
anything else, with no patch. A history of the current code does not replay on it."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from artemis.run_models import RunRequest, RunResult

from workflows.task_run import WORKFLOW_NAME, TaskRunWorkflow


@workflow.defn(name=WORKFLOW_NAME, versioning_behavior=VersioningBehavior.PINNED)
class TaskRunB(TaskRunWorkflow):
    @workflow.run
    async def run(self, req: RunRequest) -> RunResult:
        await workflow.sleep(0.01)
        return await super().run(req)
