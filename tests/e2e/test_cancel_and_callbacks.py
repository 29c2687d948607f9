"""Cancellation (signal and Temporal's own), the CronJob callback protocol and tracing."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import text

from artemis.db import get_engine
from tests.conftest import new_task_id
from tests.helpers import eventually
from workflows import retry_policies

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
async def slow_samples(samples):
    """60 ms per quote page while the test runs."""
    async with httpx.AsyncClient(base_url=samples.url) as http:
        await http.post("/_control/latency", json={"latency_ms": 60})
        yield
        await http.post("/_control/latency", json={"latency_ms": 0})


@pytest.fixture
async def slow_quotes(slow_samples, stack):
    return stack


async def _wait_fetching(stack, task_id: str) -> None:
    async def fetching() -> bool:
        data = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
        return bool(data and data.get("stats", {}).get("records_fetched", 0) > 0)

    await eventually(fetching, "the run to start fetching", timeout=30)


SLOW_SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "META"]  # 150 pages at page_size 1


async def test_cancel_by_signal_ends_cancelled_with_failed_finalize(
    slow_samples, make_stack, app_log
):
    # Fetch batches of 50 pages (3 s, one symbol at a time): the cancellation reaches the
    # running fetch activity through its heartbeat, and the activity cleans up.
    stack = await make_stack(runs={"pages_per_fetch": 50, "fetch_concurrency": 1})
    task_id, run_id, body = stack.callback_run(SLOW_SYMBOLS, page_size=1)
    resp = await stack.run(body, mode="async")
    assert resp.status_code == 202
    await _wait_fetching(stack, task_id)
    cancel = await stack.http.post(f"/tasks/{task_id}/cancel", json={"reason": "operator said so"})
    assert cancel.status_code == 202, cancel.text
    assert cancel.json()["data"]["cancel_requested"] is True
    final = await stack.wait_status(task_id, timeout=30)
    assert final["status"] == "cancelled"
    assert final["error"]["code"] == "CANCELLED"
    assert final["stats"]["records_fetched"] < 150, json.dumps(final)
    # the pages the fetch sent on before it stopped count: what the sink took is what the
    # run says it emitted (each page once)
    taken = {
        b["idempotency_key"]: len(b["records"])
        for b in await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
        if b["status"] == 200
    }
    assert taken and final["stats"]["records_emitted"] == sum(taken.values()), json.dumps(final)
    finals = await stack.finals(run_id)
    assert [c["body"] for c in finals] == [
        {"result": "failed", "error_message": "cancelled: operator said so"}
    ]
    # Temporal's list shows it cancelled too
    handle = stack.client.get_workflow_handle(final["workflow_id"])
    assert (await handle.describe()).status.name == "CANCELED"
    again = await stack.http.post(f"/tasks/{task_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "CONFLICT"
    assert "already finished (cancelled)" in again.json()["error"]["message"]  # its own word
    # the in-flight fetch activity saw the cancellation and the staged pages were dropped
    lines = [json.loads(line) for line in app_log.read_text().splitlines() if task_id in line]
    assert any(line["event"] == "fetch_cancelled" for line in lines)
    with get_engine(stack.settings.database.url).connect() as conn:
        left = conn.execute(
            text("SELECT COUNT(*) FROM staged_page WHERE run_key = :k"),
            {"k": f"pull_stock_quotes/{task_id}"},
        ).scalar()
    assert left == 0


async def test_cancel_stops_between_batches_even_when_the_activity_never_sees_it(
    slow_samples, make_stack
):
    # Short fetches and a long heartbeat timeout (heartbeats throttled to ~24 s): the
    # cancellation lands between batches or on an activity that is already finishing (whose
    # result may then still arrive); either way the run must stop within a batch or two.
    stack = await make_stack(runs={"pages_per_fetch": 2, "heartbeat_timeout_s": 30})
    task_id, run_id, body = stack.callback_run(SLOW_SYMBOLS, page_size=1)
    await stack.run(body, mode="async")
    await _wait_fetching(stack, task_id)
    await stack.http.post(f"/tasks/{task_id}/cancel", json={"reason": "stop"})
    final = await stack.wait_status(task_id, timeout=30)
    assert final["status"] == "cancelled"
    assert final["stats"]["records_fetched"] < 150, json.dumps(final)  # not run to the end
    # Counted in batches from the moment the cancellation reached the workflow (its
    # history), not in records since the request: on a loaded machine it may take a while.
    events = (await stack.client.get_workflow_handle(final["workflow_id"]).fetch_history()).events
    (signalled,) = [
        n
        for n, e in enumerate(events)
        if e.HasField("workflow_execution_cancel_requested_event_attributes")
    ]
    fetches_after = [
        e
        for e in events[signalled:]
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "fetch_pages"
    ]
    assert len(fetches_after) <= 1, len(fetches_after)
    assert [c["body"] for c in await stack.finals(run_id)] == [
        {"result": "failed", "error_message": "cancelled: stop"}
    ]


async def test_delete_cancels_too(slow_quotes):
    stack = slow_quotes
    task_id = new_task_id()
    await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL", "MSFT"], "page_size": 1}},
        mode="async",
    )
    await _wait_fetching(stack, task_id)
    resp = await stack.http.delete(f"/tasks/{task_id}")
    assert resp.status_code == 202
    assert (await stack.wait_status(task_id, timeout=30))["status"] == "cancelled"


async def test_temporal_cancellation_ends_cancelled_with_failed_finalize(slow_quotes):
    stack = slow_quotes
    task_id, run_id, body = stack.callback_run(SLOW_SYMBOLS, page_size=1)
    resp = await stack.run(body, mode="async")
    await _wait_fetching(stack, task_id)
    handle = stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"])
    await handle.cancel()
    final = await stack.wait_status(task_id, timeout=30)
    assert final["status"] == "cancelled"
    assert (await handle.describe()).status.name == "CANCELED"
    finals = await stack.finals(run_id)
    assert len(finals) == 1
    assert finals[0]["body"]["result"] == "failed"
    assert finals[0]["body"]["error_message"].startswith("cancelled")


async def test_deadline_ends_in_timeout_with_failed_timeout_finalize(slow_quotes):
    stack = slow_quotes
    task_id, run_id, body = stack.callback_run(SLOW_SYMBOLS, page_size=1)
    body["meta"]["timeout_s"] = 1.5
    resp = await stack.run(body)
    assert resp.status_code == 504, resp.text
    assert resp.json()["data"]["status"] == "timeout"
    assert resp.json()["error"]["code"] == "TIMEOUT_ERROR"
    finals = await stack.finals(run_id)
    assert [c["body"] for c in finals] == [
        {"result": "failed_timeout", "error_message": "callback_deadline_exceeded"}
    ]


async def test_success_finalize_once_with_token_and_stats_and_no_token_in_history(stack, app_log):
    token = "s3cret-callback-token-value"
    task_id, run_id, body = stack.callback_run(["AAPL", "MSFT"], callback={"auth_token": token})
    resp = await stack.run(body)
    assert resp.status_code == 200, resp.text
    calls = await stack.cronjob_calls(run_id)
    finals = [c for c in calls if c["kind"] == "callback"]
    assert len(finals) == 1
    assert finals[0]["body"]["result"] == "success" and finals[0]["body"]["code"] == 200
    stats = json.loads(finals[0]["body"]["body"])
    assert stats["records_emitted"] == 60 and stats["pages"] == 6
    assert all(c["token"] == token for c in calls)
    progress = [c for c in calls if c["kind"] == "progress"]
    assert progress and progress[-1]["body"]["current"] == progress[-1]["body"]["total"] == 2
    handle = stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"])
    history = json.dumps((await handle.fetch_history()).to_json_dict())
    assert token not in history
    assert token not in resp.text
    log = app_log.read_text()
    assert task_id in log and token not in log  # the run did log, and never the token


async def test_progress_is_throttled_but_the_last_is_sent(make_stack):
    stack = await make_stack(callback={"progress_min_interval_ms": 60_000})
    task_id, run_id, body = stack.callback_run(["A", "B", "C", "D"], page_size=5)
    await stack.run(body)
    calls = [c for c in await stack.cronjob_calls(run_id) if c["kind"] == "progress"]
    keys = [c["idempotency_key"] for c in calls]
    assert len(set(keys)) == len(keys) and all(
        k.startswith(f"pull_stock_quotes/{task_id}:progress:") for k in keys
    )
    progress = [c["body"] for c in calls]
    assert progress[0]["current"] == 0 and progress[-1] == {
        "current": 4,
        "total": 4,
        "message": progress[-1]["message"],
    }
    assert len(progress) == 2


async def test_finalize_retries_after_half_one_and_two_seconds_then_gives_up(stack, app_log):
    task_id, run_id, body = stack.callback_run(["AAPL"])
    await stack.fault("cronjob", status=503, times=10)
    resp = await stack.run(body)
    await stack.fault("cronjob")
    assert resp.status_code == 200 and resp.json()["data"]["status"] == "completed"
    assert resp.json()["data"]["callback"] == "gave_up"
    finals = await stack.finals(run_id)
    assert len(finals) == 4
    # every attempt of the one finalize call under one Idempotency-Key
    assert {c["idempotency_key"] for c in finals} == {f"pull_stock_quotes/{task_id}:finalize"}
    # The schedule is the finalize's retry policy (a local activity: Temporal's retries,
    # run by the worker; history records the attempt it ended on) ...
    policy = retry_policies.FINALIZE
    assert policy.initial_interval.total_seconds() == 0.5
    assert policy.backoff_coefficient == 2.0 and policy.maximum_attempts == 4
    assert policy.maximum_interval is not None
    assert policy.maximum_interval.total_seconds() == 2.0
    history = await stack.client.get_workflow_handle(
        resp.json()["data"]["workflow_id"]
    ).fetch_history()
    markers = [
        e.marker_recorded_event_attributes.details
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    (finalized,) = [
        data
        for data in (json.loads(d["data"].payloads[0].data) for d in markers)
        if data["activity_type"] == "finalize_run"
    ]
    assert finalized["attempt"] == 4
    # ... and the CronJob saw it kept, by its own clock: each try came its wait after the one
    # before, not sooner and not several times later (4x: room for a loaded 2-core machine).
    gaps = [b["at"] - a["at"] for a, b in zip(finals, finals[1:], strict=False)]
    for gap, expected in zip(gaps, (0.5, 1.0, 2.0), strict=True):
        assert expected * 0.8 <= gap <= expected * 4, gaps
    lines = [json.loads(line) for line in app_log.read_text().splitlines() if run_id in line]
    assert any(line["event"] == "callback_finalize_gave_up" for line in lines)


async def test_finalize_recovers_after_two_5xx(stack):
    task_id, run_id, body = stack.callback_run(["AAPL"])
    await stack.fault("cronjob", status=502, times=2)
    resp = await stack.run(body)
    assert resp.json()["data"]["callback"] == "delivered"
    finals = await stack.finals(run_id)
    assert [c["status"] for c in finals] == [502, 502, 200]
    assert {c["idempotency_key"] for c in finals} == {f"pull_stock_quotes/{task_id}:finalize"}


async def test_clean_up_is_its_own_step_after_the_finalize(stack):
    """The clean-up after a delivered finalize is its own step (cleanup_run, a local
    activity for runs started on the current code), so its failure and retries can never send the
    finalize again. It drops the run's data in one transaction: its staged pages and
    its secret (the CronJob token) are gone."""
    from artemis.staging import Staging
    from artemis.vault import RunSecrets

    task_id, run_id, body = stack.callback_run(
        ["AAPL"], callback={"auth_token": "tok-0123456789abcdef"}
    )
    resp = await stack.run(body)
    assert resp.json()["data"]["callback"] == "delivered"
    assert len(await stack.finals(run_id)) == 1
    history = await stack.client.get_workflow_handle(
        resp.json()["data"]["workflow_id"]
    ).fetch_history()
    steps = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        if e.HasField("activity_task_scheduled_event_attributes")
        else json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)[
            "activity_type"
        ]
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        or (
            e.HasField("marker_recorded_event_attributes")
            and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
        )
    ]
    # the finalize, then the clean-up, then the final record in task storage
    assert steps[-3:] == ["finalize_run", "cleanup_run", "mirror_state"], steps
    assert {c["token"] for c in await stack.finals(run_id)} == {"tok-0123456789abcdef"}
    staging = Staging(stack.settings.database.url)
    assert staging.get_pages(f"pull_stock_quotes/{task_id}", "raw", 0, 100) == []
    secrets = RunSecrets(stack.settings.database.url, stack.settings.vault.master_key_file)
    assert secrets.get(f"pull_stock_quotes/{task_id}", "callback_token") is None


async def test_finalize_4xx_is_not_retried(stack):
    task_id, run_id, body = stack.callback_run(["AAPL"])
    await stack.fault("cronjob", status=400, times=1)
    resp = await stack.run(body)
    assert resp.json()["data"]["status"] == "completed"
    assert resp.json()["data"]["callback"] == "rejected"
    finals = await stack.finals(run_id)
    assert [c["status"] for c in finals] == [400]


async def test_callback_override_host_and_port(stack):
    port = int(stack.samples_url.rsplit(":", 1)[1])
    override = {
        "base_url": "http://localhost:1/cronjob/runs",
        "override_host": "127.0.0.1",
        "override_port": port,
    }
    task_id, run_id, body = stack.callback_run(["AAPL"], callback=override)
    resp = await stack.run(body)
    assert resp.json()["data"]["callback"] == "delivered"
    assert len(await stack.finals(run_id)) == 1


async def test_callback_host_outside_allow_list_is_refused(stack):
    resp = await stack.run(
        {
            "meta": {"run_id": "r1", "callback": {"base_url": "http://169.254.169.254/latest"}},
            "params": {"symbols": ["AAPL"]},
        }
    )
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "INVALID_INPUT"
    assert "security.allowed_hosts" in resp.json()["error"]["message"]


async def test_inbound_trace_id_reaches_sink_callback_and_logs(stack, app_log):
    task_id, run_id, body = stack.callback_run(["AAPL"])
    resp = await stack.run(
        body,
        headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01", "X-Request-ID": "req-42"},
    )
    assert resp.status_code == 200
    assert resp.json()["meta"]["trace_id"] == TRACE_ID
    assert resp.headers["x-request-id"] == "req-42"
    batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    spans = set()
    for b in batches:
        version, trace, span, flags = b["traceparent"].split("-")
        assert trace == TRACE_ID
        spans.add(span)
        assert b["request_id"] == "req-42"
    assert len(spans) == len(batches)  # a new span for every hop
    calls = await stack.cronjob_calls(run_id)
    assert calls and all(c["traceparent"].split("-")[1] == TRACE_ID for c in calls)
    lines = [json.loads(line) for line in app_log.read_text().splitlines() if TRACE_ID in line]
    events = {line["event"] for line in lines}
    assert {
        "run_started",
        "fetch_batch_done",
        "stream_emit_done",  # the pages went to the sink concurrently with the fetch
        "run_finished",
        "callback_finalize_success",
    } <= events
    for line in lines:
        for field in (
            "timestamp",
            "level",
            "logger",
            "caller",
            "event",
            "trace_id",
            "span_id",
            "request_id",
            "task_code",
            "task_id",
            "workflow_id",
        ):
            assert field in line, (field, line)
    # The run's trace rides in its input into the workflow (its log lines carry it);
    # Temporal's own OpenTelemetry header is written only when spans are exported
    # (tests/unit/test_payload_converter.py checks the client's interceptors).
    handle = stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"])
    started = (await handle.fetch_history()).events[0].workflow_execution_started_event_attributes
    assert "_tracer-data" not in started.header.fields
    wf_lines = [line for line in lines if line["logger"] == "temporalio.workflow"]
    assert wf_lines and all(line["task_id"] == task_id for line in wf_lines)
    assert all(line["trace_id"] == TRACE_ID for line in wf_lines)
