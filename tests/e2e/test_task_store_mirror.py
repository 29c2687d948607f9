"""The workflow mirrors each run's state into task storage."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from artemis.config import TaskStoreSettings
from artemis.events import EventLog, RunEvent
from artemis.taskstore import TaskData
from artemis.taskstore.sql import SqlTaskStorage
from tests.conftest import new_task_id
from tests.helpers import ending, eventually


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


async def test_get_tasks_lists_runs_by_status_and_code_and_feedback_is_stored(stack):
    code = "pull_stock_quotes"
    ok_id, bad_id = new_task_id(), new_task_id()
    await stack.run({"meta": {"task_id": ok_id}, "params": {"symbols": ["AAPL"]}})
    await stack.fault("sink", status=400, times=1)
    await stack.run({"meta": {"task_id": bad_id}, "params": {"symbols": ["AAPL"]}})
    listed = (await stack.http.get("/tasks", params={"code": code, "limit": 500})).json()
    ids = [t["task_id"] for t in listed["data"]["items"]]
    assert ids.index(bad_id) < ids.index(ok_id)  # newest first
    failed = (await stack.http.get("/tasks", params={"status": "failed", "limit": 500})).json()
    assert bad_id in [t["task_id"] for t in failed["data"]["items"]]
    assert ok_id not in [t["task_id"] for t in failed["data"]["items"]]
    page = (await stack.http.get("/tasks", params={"limit": 1})).json()["data"]
    assert len(page["items"]) == 1 and page["next_cursor"]
    nxt = (
        await stack.http.get("/tasks", params={"limit": 1, "cursor": page["next_cursor"]})
    ).json()
    assert nxt["data"]["items"][0]["task_id"] != page["items"][0]["task_id"]
    bad = await stack.http.get("/tasks", params={"status": "sleeping"})
    assert bad.status_code == 422 and "status" in bad.json()["error"]["message"]
    bad = await stack.http.get("/tasks", params={"cursor": "zzz"})
    assert bad.status_code == 422 and "cursor" in bad.json()["error"]["message"]

    fb = await stack.http.post(
        f"/tasks/{ok_id}/feedback", json={"status": "success", "comment": "checked"}
    )
    assert fb.status_code == 200 and fb.json()["data"]["feedback"]["status"] == "success"
    assert SqlTaskStorage(stack.settings.database.url).load(ok_id).feedback["comment"] == "checked"
    assert (
        await stack.http.post(f"/tasks/{ok_id}/feedback", json={"status": "great"})
    ).status_code == 422
    missing = await stack.http.post(f"/tasks/{new_task_id()}/feedback", json={"status": "failed"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "TASK_NOT_FOUND"


async def test_cleanup_loop_removes_old_terminal_tasks_only(make_stack):
    """The clean-up runs as one looping workflow per task queue (started by the worker):
    its next pass, one interval later, removes the old terminal task and its events and
    keeps the rest; stopped, its history replays."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.worker import Replayer

    from workers.main import housekeeping_jobs, stop_housekeeping_loop
    from workflows.cleanup import CleanupWorkflow

    stack = await make_stack(task_store={"cleanup_interval_minutes": 0.02})  # every 1.2 s
    queue = stack.settings.temporal.task_queue
    (job,) = [j for j in housekeeping_jobs(stack.settings) if j.name == "cleanup"]
    assert job.inp.every_s == 1.2 and job.inp.hours == TaskStoreSettings().ttl_hours
    store = SqlTaskStorage(stack.settings.database.url)
    events = EventLog(stack.settings.database.url)
    old_done, old_running, recent = old_and_recent_tasks(store, events)
    # One pass drops the old task, then (a few statements later) its events: wait for both.
    await eventually(
        lambda: store.load(old_done) is None and events.since(old_done) == [],
        "the clean-up to remove the old task and its events",
    )
    assert store.load(old_running) is not None and store.load(recent) is not None
    assert len(events.since(recent)) == 1

    handle = stack.client.get_workflow_handle(job.workflow_id(queue))

    async def two_passes() -> bool:
        history = await handle.fetch_history()
        done = [e for e in history.events if e.HasField("activity_task_completed_event_attributes")]
        return len(done) >= 2

    await eventually(two_passes, "a second pass of the same execution")

    async def listed() -> list:  # one execution, still running: one clean-up row
        query = f"WorkflowType = 'CleanupOldTasks' AND TaskQueue = '{queue}'"
        return [(w.id, w.status) async for w in stack.client.list_workflows(query)]

    rows = await eventually(listed, "the clean-up loop in the list")
    assert rows == [(job.workflow_id(queue), WorkflowExecutionStatus.RUNNING)]
    assert await stop_housekeeping_loop(stack.client, job, queue)
    await asyncio.wait_for(handle.result(), 60)
    history = await handle.fetch_history()
    assert ending(history) == "WORKFLOW_EXECUTION_COMPLETED"
    await Replayer(workflows=[CleanupWorkflow]).replay_workflow(history)


def old_and_recent_tasks(store: SqlTaskStorage, events: EventLog) -> tuple[str, str, str]:
    """Three tasks: one completed 30 hours ago (with an event as old), one running since
    then, one just completed (with an event of now); their ids in that order."""
    old = datetime.now(UTC) - timedelta(hours=30)
    old_done, old_running, recent = new_task_id(), new_task_id(), new_task_id()
    store.save(
        old_done, TaskData(task_id=old_done, status="completed", result={}, completed_at=old)
    )
    store.save(old_running, TaskData(task_id=old_running, status="running", started_at=old))
    store.save(
        recent,
        TaskData(task_id=recent, status="completed", result={}, completed_at=datetime.now(UTC)),
    )
    old_event = events.append(old_done, "progress", {"pages": 1}, "step_fetch")
    events.append(recent, "progress", {"pages": 1}, "step_fetch")
    with events.engine.begin() as conn:
        conn.execute(
            update(RunEvent.__table__).where(RunEvent.seq == old_event).values(created_at=old)
        )
    return old_done, old_running, recent
