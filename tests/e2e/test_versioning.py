"""A deploy in the middle of a run (SPEC §4 "Versioning"): a run started on the old code
path, its worker stopped mid-run, is finished by a worker with the patched code."""

from __future__ import annotations

from collections import Counter

import pytest
from temporalio import workflow

from starter import service
from tests.conftest import new_task_id
from tests.helpers import eventually
from workers.main import running_worker
from workflows import run_core, run_fanout, run_loop
from workflows.run_ending import PATCH_CLEANUP_STEP


async def test_run_started_on_the_old_path_is_finished_by_the_patched_worker(
    make_stack, monkeypatch
):
    stack = await make_stack(worker=False, runs={"pages_per_fetch": 1})
    await stack.fault("latency", latency_ms=60)
    task_id = new_task_id()
    try:
        # The old build: no patch taken anywhere (what the code did before its patches),
        # and its API knew no flow (RunRequest.flow 0: the run asks its patches).
        with pytest.MonkeyPatch.context() as old:
            old.setattr(workflow, "patched", lambda patch_id: False)
            for module in (service, run_loop, run_fanout):  # what it starts runs with
                old.setattr(module, "CURRENT_FLOW", 0)
            old.setattr(run_core, "CURRENT_FLOW", 2**31)  # a flow it does not know
            async with running_worker(stack.settings, stack.client):
                resp = await stack.run(
                    {"meta": {"task_id": task_id}, "params": {"symbols": ["OLD"], "page_size": 2}},
                    mode="async",
                )
                assert resp.status_code == 202, resp.text

                async def fetching() -> bool:
                    data = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
                    return bool(data) and data.get("stats", {}).get("pages", 0) >= 3

                await eventually(fetching, "the old worker to fetch 3 pages")
            # the old worker is gone, mid-run
        description = await stack.client.get_workflow_handle(
            resp.json()["data"]["workflow_id"]
        ).describe()
        assert description.status is not None and description.status.name == "RUNNING"
        async with running_worker(stack.settings, stack.client):
            final = await stack.wait_status(task_id, timeout=90)
    finally:
        await stack.fault("latency", latency_ms=0)
    assert final["status"] == "completed", final
    workflow_id = resp.json()["data"]["workflow_id"]
    events = (await stack.client.get_workflow_handle(workflow_id).fetch_history()).events
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    # the patched worker reached the finalize after the deploy: it took the new path
    markers = [
        str(e.marker_recorded_event_attributes)
        for e in events
        if e.HasField("marker_recorded_event_attributes")
    ]
    assert any(PATCH_CLEANUP_STEP in m for m in markers), markers
    assert scheduled[-2:] == ["finalize_run", "cleanup_run"]
    # the run's deadline timer carries a summary for the UI
    timers = [e for e in events if e.HasField("timer_started_event_attributes")]
    assert timers and all(b"Run deadline" in e.user_metadata.summary.data for e in timers)
    # every record once per idempotency key (30 days / 2 per page)
    seen: Counter = Counter()
    for b in await stack.sink_batches(f"pull_stock_quotes/{task_id}:"):
        if b["status"] == 200:
            for r in b["records"]:
                seen[(b["idempotency_key"], r["date"])] += 1
    dates = {d for _, d in seen}
    assert len(dates) == 30 and set(seen.values()) == {1}
