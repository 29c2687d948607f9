"""The workflow mirrors each run's state into task storage (issue 4, item 2)."""

from __future__ import annotations

from artemis.taskstore.sql import SqlTaskStorage
from tests.conftest import new_task_id


async def test_completed_and_failed_runs_are_recorded_in_task_storage(stack):
    store = SqlTaskStorage(stack.settings.database.url)
    task_id = new_task_id()
    resp = await stack.run({"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}})
    assert resp.json()["data"]["status"] == "completed"
    data = store.load(task_id)
    assert data.status == "completed" and data.task_code == "pull_stock_quotes"
    assert data.workflow_id == f"artemis/pull_stock_quotes/{task_id}"
    assert data.result["records_emitted"] == 30
    assert data.started_at is not None and data.completed_at >= data.started_at
    assert data.version >= 2  # pending -> running -> completed

    await stack.fault("sink", status=400, times=1)
    failed_id = new_task_id()
    resp = await stack.run({"meta": {"task_id": failed_id}, "params": {"symbols": ["AAPL"]}})
    assert resp.json()["data"]["status"] == "failed"
    failed = store.load(failed_id)
    assert failed.status == "failed" and failed.error["code"] == "SINK_ERROR"
    assert failed.completed_at is not None
