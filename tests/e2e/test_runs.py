"""End-to-end runs of pull_stock_quotes through the API, a worker and a real Temporal."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.conftest import new_task_id
from tests.helpers import patch_traces

NOV_DAYS = 30  # 2025-11-01 .. 2025-11-30 inclusive


def records_by_key(batches: list[dict]) -> dict[str, list]:
    return {b["idempotency_key"]: b["records"] for b in batches if b["status"] == 200}


def delivered(batches: list[dict]) -> Counter:
    """How many times each (symbol, date) reached the sink under distinct batch keys."""
    counts: Counter = Counter()
    for records in records_by_key(batches).values():
        for r in records:
            counts[(r["symbol"], r["date"])] += 1
    return counts


async def test_sync_run_delivers_every_record_exactly_once(stack):
    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "body": {"symbols": ["AAPL", "MSFT"], "start": "2025-11-01", "end": "2025-11-30"},
        }
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["success"] is True and body["error"] is None
    data = body["data"]
    assert data["status"] == "completed"
    assert data["task_id"] == task_id
    assert data["workflow_id"] == f"artemis/pull_stock_quotes/{task_id}"
    assert data["stats"]["records_fetched"] == 2 * NOV_DAYS
    assert data["stats"]["records_emitted"] == 2 * NOV_DAYS
    assert data["stats"]["pages"] == 2 * 3  # 30 days at page_size 10
    batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    counts = delivered(batches)
    assert len(counts) == 2 * NOV_DAYS
    assert set(counts.values()) == {1}
    assert len(batches) == 6 and all(b["status"] == 200 for b in batches)
    assert body["meta"]["request_id"] and body["meta"]["trace_id"]


async def test_async_run_accepted_then_completes(stack):
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": ["TSLA"]}}, mode="async"
    )
    assert resp.status_code == 202, resp.text
    data = resp.json()["data"]
    assert data["accepted"] is True and data["task_id"] == task_id
    assert data["workflow_id"] == f"artemis/pull_stock_quotes/{task_id}"
    assert data["run_id"] and data["links"]["self"] == f"/tasks/{task_id}"
    final = await stack.wait_status(task_id)
    assert final["status"] == "completed"
    assert final["stats"]["records_emitted"] == NOV_DAYS
    counts = delivered(await stack.sink_batches(f"pull_stock_quotes/{task_id}:"))
    assert len(counts) == NOV_DAYS and set(counts.values()) == {1}


async def test_repeated_task_id_attaches_to_the_same_run(stack):
    task_id = new_task_id()
    body = {"meta": {"task_id": task_id}, "params": {"symbols": ["IBM"]}}
    first, second = await asyncio.gather(
        stack.run(body, mode="async"), stack.run(body, mode="async")
    )
    assert first.json()["data"]["run_id"] == second.json()["data"]["run_id"]
    await stack.wait_status(task_id)
    again = await stack.run(body)  # after it finished: the recorded result
    assert again.status_code == 200
    assert again.json()["data"]["status"] == "completed"
    counts = delivered(await stack.sink_batches(f"pull_stock_quotes/{task_id}:"))
    assert set(counts.values()) == {1} and len(counts) == NOV_DAYS


async def test_sink_503_a_few_times_recovers(stack):
    task_id = new_task_id()
    await stack.fault("sink", status=503, times=3)
    resp = await stack.run({"meta": {"task_id": task_id}, "params": {"symbols": ["AMZN"]}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"]["status"] == "completed"
    batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    assert sum(1 for b in batches if b["status"] == 503) == 3
    counts = delivered(batches)
    assert len(counts) == NOV_DAYS and set(counts.values()) == {1}
    # a retried batch is sent again under the same key
    keys = [b["idempotency_key"] for b in batches]
    failed_keys = {b["idempotency_key"] for b in batches if b["status"] == 503}
    assert failed_keys <= {k for k in keys if keys.count(k) > 1}


async def test_sink_400_fails_the_run_with_sink_error_and_failed_finalize(stack):
    task_id = new_task_id()
    run_id = f"cron-{task_id}"
    await stack.fault("sink", status=400, times=1)
    resp = await stack.run(
        {
            "meta": {
                "task_id": task_id,
                "run_id": run_id,
                "callback": {"base_url": f"{stack.samples_url}/cronjob/runs"},
            },
            "params": {"symbols": ["ORCL"]},
        }
    )
    assert resp.status_code == 502, resp.text
    body = resp.json()
    assert body["success"] is False
    assert body["error"]["code"] == "SINK_ERROR"
    assert body["data"]["status"] == "failed"
    assert "400" in body["error"]["message"]
    shown = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
    assert shown["status"] == "failed" and shown["error"]["code"] == "SINK_ERROR"
    # What the Temporal UI shows first: the code and the message, no stack trace, no paths
    history = await stack.client.get_workflow_handle(body["data"]["workflow_id"]).fetch_history()
    failure = history.events[-1].workflow_execution_failed_event_attributes.failure
    assert failure.application_failure_info.type == "SINK_ERROR" and "400" in failure.message
    assert failure.stack_trace == "" and "/work" not in str(failure) and ".py" not in str(failure)
    finals = [c for c in await stack.cronjob_calls(run_id) if c["kind"] == "callback"]
    assert len(finals) == 1
    assert finals[0]["body"]["result"] == "failed"
    assert (
        "SINK" in finals[0]["body"]["error_message"] or "400" in finals[0]["body"]["error_message"]
    )
    # the 400 was not retried: one attempt at that page (pages in flight with it,
    # emit_concurrency of them, may have been delivered, each under its own key)
    batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    refused = [b["idempotency_key"] for b in batches if b["status"] == 400]
    assert len(refused) == 1
    assert [b["idempotency_key"] for b in batches].count(refused[0]) == 1
    assert len(batches) <= stack.settings.runs.emit_concurrency


async def test_continue_as_new_keeps_every_record(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 1, "max_batches_per_run": 2})
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": ["NFLX"], "page_size": 5}}
    )
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "completed" and data["stats"]["pages"] == 6
    counts = delivered(await stack.sink_batches(f"pull_stock_quotes/{task_id}:"))
    assert len(counts) == NOV_DAYS and set(counts.values()) == {1}
    handle = stack.client.get_workflow_handle(data["workflow_id"])
    runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{data['workflow_id']}'")]
    assert len(runs) >= 3, "expected the run to continue as new at least twice"
    assert (await handle.describe()).status.name == "COMPLETED"
    # each generation on the current code's flow: no patch marker, no TemporalChangeVersion
    assert await patch_traces(stack.client, data["workflow_id"]) == []


async def test_quote_api_503_then_recovers_and_4xx_fails_with_source_error(stack):
    task_id = new_task_id()
    await stack.fault("quotes", status=503, times=2)
    resp = await stack.run({"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}})
    assert resp.status_code == 200 and resp.json()["data"]["status"] == "completed"
    counts = delivered(await stack.sink_batches(f"pull_stock_quotes/{task_id}:"))
    assert len(counts) == NOV_DAYS and set(counts.values()) == {1}

    task_id = new_task_id()
    await stack.fault("quotes", status=404, times=1)
    resp = await stack.run({"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}})
    assert resp.status_code == 502
    err = resp.json()["error"]
    assert err["code"] == "SOURCE_ERROR" and "404" in err["message"]
    assert "quotes:AAPL" in err["message"]


async def test_sync_run_longer_than_sync_timeout_answers_202_and_goes_on(make_stack):
    stack = await make_stack(server={"sync_timeout_s": 0.5})
    await stack.fault("latency", latency_ms=30)
    try:
        task_id = new_task_id()
        resp = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"], "page_size": 1}}
        )
        assert resp.status_code == 202, resp.text
        assert resp.json()["data"]["status"] == "running"
        final = await stack.wait_status(task_id)
        assert final["status"] == "completed" and final["stats"]["records_emitted"] == NOV_DAYS
    finally:
        await stack.fault("latency", latency_ms=0)
