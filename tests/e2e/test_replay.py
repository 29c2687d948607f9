"""Determinism: histories of real runs replay against the current workflow code."""

from __future__ import annotations

from collections import Counter

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from tests.conftest import new_task_id
from tests.helpers import ending, eventually
from workflows.task_run import TaskRunWorkflow


async def _histories(stack, workflow_id: str, last: str) -> list[WorkflowHistory]:
    """Every run of ``workflow_id``: each continued as new but the last, which ended as
    ``last`` — so a run that ended some other way cannot make the replay pass."""
    out = []
    async for wf in stack.client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        out.append(await stack.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
    endings = Counter(ending(h) for h in out)
    expected = Counter({"WORKFLOW_EXECUTION_CONTINUED_AS_NEW": len(out) - 1, last: 1})
    assert endings == expected, (workflow_id, endings)
    return out


async def test_histories_of_completed_failed_cancelled_and_continued_runs_replay(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 2, "max_batches_per_run": 2})
    ok = await stack.run(
        {
            "meta": {"task_id": new_task_id()},
            "params": {"symbols": ["AAPL", "MSFT"], "page_size": 5},
        }
    )
    assert ok.json()["data"]["status"] == "completed", ok.text
    await stack.fault("sink", status=400, times=1)
    failed = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["X"]}})
    assert failed.json()["data"]["status"] == "failed", failed.text
    await stack.fault("latency", latency_ms=50)
    try:
        task_id = new_task_id()
        started = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": ["Y"], "page_size": 1}},
            mode="async",
        )

        async def fetching() -> bool:
            data = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
            return bool(data and data.get("stats", {}).get("records_fetched", 0) > 0)

        await eventually(fetching, "the run to start fetching")
        await stack.http.post(f"/tasks/{task_id}/cancel")
        cancelled = await stack.wait_status(task_id)
        assert cancelled["status"] == "cancelled", cancelled
    finally:
        await stack.fault("latency", latency_ms=0)

    # A cancel through the API ends the run "cancelled", and CANCELED in Temporal.
    histories = await _histories(
        stack, ok.json()["data"]["workflow_id"], "WORKFLOW_EXECUTION_COMPLETED"
    )
    assert len(histories) >= 3  # the first run continued as new at least twice
    histories += await _histories(
        stack, failed.json()["data"]["workflow_id"], "WORKFLOW_EXECUTION_FAILED"
    )
    histories += await _histories(
        stack, started.json()["data"]["workflow_id"], "WORKFLOW_EXECUTION_CANCELED"
    )
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
