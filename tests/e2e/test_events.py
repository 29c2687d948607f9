"""The SSE event stream of real runs, read over HTTP (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from httpx_sse import aconnect_sse

from artemis.db import SinkFile, get_engine
from artemis.events import ACTIVITY_STEP, cursor_of
from artemis.run_state import STEPS
from tests.conftest import new_task_id
from tests.helpers import eventually


async def read_sse(
    base_url: str,
    task_id: str,
    last_event_id: str | None = None,
    opened: asyncio.Event | None = None,
    **params: Any,
) -> list[dict[str, Any]]:
    """Every event until the server closes the stream (each with its SSE id as ``_sse``);
    ``opened`` is set once the server has answered (the stream is open)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        async with aconnect_sse(
            http, "GET", f"/tasks/{task_id}/events", headers=headers, params=params
        ) as source:
            resp = source.response
            assert resp.status_code == 200, await resp.aread()
            assert resp.headers["content-type"].startswith("text/event-stream")
            if opened is not None:
                opened.set()
            async for sse in source.aiter_sse():
                events.append({"_sse": sse.id, **json.loads(sse.data)})
    return events


def plan_states(events: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {t["id"]: t["status"] for t in e["todos"]} for e in events if e["event"] == "plan_update"
    ]


def assert_ids_unique_and_increasing(events: list[dict[str, Any]]) -> None:
    """Unique, increasing SSE ids; unique payload ids except the plan's stable id."""
    cursors = [cursor_of(e["_sse"]) for e in events]
    assert cursors == sorted(set(cursors))
    plan_ids = {e["id"] for e in events if e["event"] == "plan_update"}
    assert len(plan_ids) == 1
    others = [e["id"] for e in events if e["event"] != "plan_update"]
    assert len(others) == len(set(others))


def assert_activity_events_follow_the_plan(
    events: list[dict[str, Any]], fetch_results: int
) -> None:
    """The planId of each activity event is the plan step of its activity; every step
    starts, in the plan's order (process and emit with the fetch that streams its pages
    to the sinks: no activity of their own); ``fetch_results`` fetch activities ended."""
    acts = [e for e in events if e["event"] in ("activity_start", "activity_result")]
    assert acts and all(e["planId"] == ACTIVITY_STEP[e["activity"]] for e in acts)
    first_start: dict[str, int] = {}
    for i, e in enumerate(events):
        if e["event"] == "activity_start":
            first_start.setdefault(e["planId"], i)
    assert [s for s in STEPS if s in first_start] == sorted(first_start, key=first_start.get)
    assert set(first_start) == {"step_prepare", "step_fetch", "step_finalize"}
    first_shown: dict[str, int] = {}
    for i, plan in enumerate(plan_states(events)):
        for step, status in plan.items():
            if status != "PENDING":
                first_shown.setdefault(step, i)
    assert sorted(first_shown, key=lambda s: (first_shown[s], STEPS.index(s))) == list(STEPS)
    fetches = [e for e in acts if e["event"] == "activity_result" and e["planId"] == "step_fetch"]
    assert len(fetches) == fetch_results


async def test_stream_of_a_live_run_orders_steps_ends_once_and_resumes(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 2})
    await stack.fault("latency", latency_ms=30)
    try:
        task_id = new_task_id()
        resp = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL", "MSFT"]}},
            mode="async",
        )
        assert resp.status_code == 202, resp.text
        events = await read_sse(stack.api_url, task_id)  # attached while the run is live
    finally:
        await stack.fault("latency", latency_ms=0)

    assert events[0]["event"] == "plan_update"
    first = plan_states(events)[0]
    assert first["step_prepare"] == "IN_PROGRESS"
    assert all(first[s] == "PENDING" for s in STEPS[1:])
    assert events[-1]["event"] == "complete" and events[-1]["status"] == "completed"
    assert [e["event"] for e in events].count("complete") == 1
    assert plan_states(events)[-1] == dict.fromkeys(STEPS, "COMPLETED")

    assert_ids_unique_and_increasing(events)
    assert_activity_events_follow_the_plan(events, fetch_results=3)  # 6 pages, 2 a fetch
    progress = [e for e in events if e["event"] == "progress"]
    assert progress and all(p["planId"] in STEPS for p in progress)
    assert progress[-1]["records_emitted"] == 60 and progress[-1]["records_fetched"] == 60

    # Resume from the middle: exactly the rest, no duplicates; and the finished run replays.
    middle = events[len(events) // 2]
    rest = await read_sse(stack.api_url, task_id, last_event_id=middle["_sse"])
    assert rest == events[len(events) // 2 + 1 :]
    assert await read_sse(stack.api_url, task_id) == events
    by_query = await read_sse(stack.api_url, task_id, last_event_id=events[-2]["_sse"])
    assert by_query == events[-1:]


async def test_a_step_that_fails_then_recovers_goes_error_then_completed(make_stack):
    # per batch: an emit activity of its own, whose failed attempt the plan shows (a page
    # the stream could not send goes to that activity, tests/e2e/test_runs.py)
    stack = await make_stack(runs={"emit_while_fetching": False})
    task_id = new_task_id()
    await stack.fault("sink", status=503, times=1)
    try:
        # outage_tolerance_s 0: the emit activity's own retry policy takes the 503 (with a
        # tolerance the run waits instead: tests/e2e/test_outages.py)
        resp = await stack.run(
            {
                "meta": {"task_id": task_id},
                "params": {"symbols": ["TSLA"], "outage_tolerance_s": 0},
            }
        )
        assert resp.status_code == 200 and resp.json()["data"]["status"] == "completed"
    finally:
        await stack.fault("sink")
    events = await read_sse(stack.api_url, task_id)
    emit = [p["step_emit"] for p in plan_states(events)]
    assert "ERROR" in emit
    assert emit[emit.index("ERROR") + 1 :].count("COMPLETED") >= 1
    assert emit[-1] == "COMPLETED"
    failed = [e for e in events if e["event"] == "activity_result" and e["error"]]
    assert failed and failed[0]["planId"] == "step_emit"
    assert failed[0]["data"]["code"] == "SINK_ERROR"
    retried = [e for e in events if e["event"] == "activity_start" and e["attempt"] == 2]
    assert retried and retried[0]["planId"] == "step_emit"
    assert events[-1]["event"] == "complete"


async def test_stream_spans_continue_as_new_and_a_failed_run_ends_with_error(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 1, "max_batches_per_run": 2})
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": ["NFLX"], "page_size": 5}}
    )
    assert resp.status_code == 200 and resp.json()["data"]["stats"]["pages"] == 6
    events = await read_sse(stack.api_url, task_id)
    fetched = [
        e for e in events if e["event"] == "activity_result" and e["activity"] == "fetch_pages"
    ]
    assert len(fetched) == 6  # three workflow executions, one stream
    assert events[-1]["event"] == "complete" and events[-1]["stats"]["records_emitted"] == 30

    failed_id = new_task_id()
    await stack.fault("quotes", status=400, times=1)
    try:
        resp = await stack.run({"meta": {"task_id": failed_id}, "params": {"symbols": ["AAPL"]}})
        assert resp.json()["data"]["status"] == "failed"
    finally:
        await stack.fault("quotes")
    events = await read_sse(stack.api_url, failed_id)
    assert events[-1]["event"] == "error" and events[-1]["error"]["code"] == "SOURCE_ERROR"
    assert plan_states(events)[-1]["step_fetch"] == "ERROR"


async def test_terminated_run_is_read_from_temporal_and_recorded_by_the_cleanup(make_stack):
    stack = await make_stack(worker=False)  # nobody picks the run up
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}}, mode="async"
    )
    assert resp.status_code == 202
    await listed_as_pending(stack, task_id)
    await stream_stays_open_until_terminated(stack, task_id, resp.json()["data"]["workflow_id"])
    # A read never writes: the API answers from Temporal, the store still says pending.
    from artemis.taskstore.sql import SqlTaskStorage

    store = SqlTaskStorage(stack.settings.database.url)
    shown = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
    assert shown["status"] == "failed" and shown["task_store"] == "pending"
    assert store.load(task_id).status == "pending"
    # The clean-up schedule's workflow is the owner of that repair: it records the end ...
    await cleanup_records_the_end_and_forgets_stale_sink_files(stack, task_id)
    healed = store.load(task_id)
    assert healed is not None and healed.status == "failed" and healed.completed_at
    assert healed.error["code"] == "INTERNAL"
    after = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
    assert after["status"] == "failed" and after["source"] == "task_store"

    missing = await stack.http.get(f"/tasks/{new_task_id()}/events")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "TASK_NOT_FOUND"


async def listed_as_pending(stack, task_id: str) -> None:
    """The run is listed as pending right away (written concurrently with the answer), though no
    worker has picked it up."""

    async def listed() -> bool:
        page = (await stack.http.get("/tasks", params={"status": "pending", "limit": 500})).json()
        return task_id in [t["task_id"] for t in page["data"]["items"]]

    await eventually(listed, "the pending record", timeout=10)


async def stream_stays_open_until_terminated(stack, task_id: str, workflow_id: str) -> None:
    """The stream of a run no worker started opens and stays open; terminating the
    workflow ends it with the plan and one error: the run failed."""
    opened = asyncio.Event()
    reader = asyncio.create_task(read_sse(stack.api_url, task_id, opened=opened))
    await asyncio.wait_for(opened.wait(), 30)
    # open, and it stays open while the run has not started (a window, not a wait)
    done, _ = await asyncio.wait({reader}, timeout=0.5)
    assert not done
    await stack.client.get_workflow_handle(workflow_id).terminate("test")
    events = await asyncio.wait_for(reader, 30)
    assert [e["event"] for e in events] == ["plan_update", "error"]
    assert events[-1]["status"] == "failed"


async def cleanup_records_the_end_and_forgets_stale_sink_files(stack, task_id: str) -> None:
    """One pass of the clean-up workflow reconciles the terminated run and forgets what
    the files sink wrote for runs that never reached a finalize and went quiet for longer
    than a run may last (30 days) — but not for a run still writing, however old."""
    from artemis.run_models import CleanupInput
    from workers.main import running_worker
    from workflows.cleanup import CleanupWorkflow

    engine = get_engine(stack.settings.database.url)
    quiet = f"pull_stock_quotes/{task_id}"
    live = f"pull_stock_quotes/{task_id}-live"  # began 31 days ago, wrote a page today
    with engine.begin() as conn:
        for run_key, seq, age in (
            (quiet, 0, timedelta(days=31)),
            (live, 0, timedelta(days=31)),
            (live, 1, timedelta(minutes=1)),
        ):
            conn.execute(
                LEDGER.insert().values(
                    run_key=run_key,
                    sink="files",
                    seq=seq,
                    path=f"/lake/files-{seq:06d}.jsonl",
                    records=3,
                    bytes=99,
                    written_at=datetime.now(UTC) - age,
                )
            )
    async with running_worker(stack.settings, stack.client):
        done = await stack.client.execute_workflow(
            CleanupWorkflow.run,
            CleanupInput(hours=24, reconcile_after_s=0),
            id=f"cleanup-{task_id}",
            task_queue=stack.settings.temporal.task_queue,
        )
    # this run (the session's database may hold another test's run a worker never
    # finished; the record of this one is checked by the caller)
    assert done.runs_reconciled >= 1
    assert done.sink_files_forgotten >= 1
    assert ledger_rows(engine, quiet) == 0
    assert ledger_rows(engine, live) == 2  # a run still writing keeps every record


LEDGER = SinkFile.__table__  # type: ignore[attr-defined]


def ledger_rows(engine: sa.Engine, run_key: str) -> int:
    """The files sink's ledger rows of ``run_key``."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).select_from(LEDGER).where(LEDGER.c.run_key == run_key)
        ).scalar_one()
