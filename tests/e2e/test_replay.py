"""Determinism: histories of real runs replay against the current workflow code."""

from __future__ import annotations

import asyncio

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from tests.conftest import new_task_id
from workflows.task_run import TaskRunWorkflow


async def _histories(stack, workflow_id: str) -> list[WorkflowHistory]:
    out = []
    async for wf in stack.client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        out.append(await stack.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
    return out


async def test_histories_of_completed_failed_cancelled_and_continued_runs_replay(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 2, "max_batches_per_run": 2})
    workflow_ids = []
    ok = await stack.run(
        {
            "meta": {"task_id": new_task_id()},
            "params": {"symbols": ["AAPL", "MSFT"], "page_size": 5},
        }
    )
    workflow_ids.append(ok.json()["data"]["workflow_id"])
    await stack.fault("sink", status=400, times=1)
    failed = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["X"]}})
    workflow_ids.append(failed.json()["data"]["workflow_id"])
    await stack.fault("latency", latency_ms=50)
    try:
        task_id = new_task_id()
        started = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": ["Y"], "page_size": 1}},
            mode="async",
        )
        await asyncio.sleep(0.8)
        await stack.http.post(f"/tasks/{task_id}/cancel")
        await stack.wait_status(task_id)
        workflow_ids.append(started.json()["data"]["workflow_id"])
    finally:
        await stack.fault("latency", latency_ms=0)

    histories = []
    for wid in workflow_ids:
        histories += await _histories(stack, wid)
    assert len(histories) >= 5  # the first run continued as new at least twice
    replayed = 0
    replayer = Replayer(workflows=[TaskRunWorkflow])
    async with replayer.workflow_replay_iterator(_aiter(histories)) as results:
        async for result in results:
            assert result.replay_failure is None, result.replay_failure
            replayed += 1
    assert replayed == len(histories)


async def _aiter(items):
    for item in items:
        yield item
