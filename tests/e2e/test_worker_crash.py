"""A worker killed with SIGKILL mid-fetch: a fresh worker finishes the run, nothing lost."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.conftest import new_task_id, settings_with, start_worker_process, write_config
from tests.helpers import eventually, stop_processes

HEARTBEAT_S = 2.0
# The activities a worker can die in the middle of (the batch loop's).
LONG_RUNNING = {"fetch_pages", "process_batch", "emit_batch"}


async def test_sigkill_mid_fetch_then_fresh_worker_finishes_with_nothing_lost(make_stack, tmp_path):
    # The API only: the workers are real processes that we can kill.
    stack = await make_stack(
        worker=False, runs={"pages_per_fetch": 20, "heartbeat_timeout_s": HEARTBEAT_S}
    )
    # A fetch of 20 pages here takes about 2.5 s; its heartbeats start after the
    # throttle interval (activities/run_base.py Heartbeat), so a short one lets the test
    # see the second fetch heartbeat before it ends. The run's last 40 pages take about
    # 5 s: time for a loaded machine's test process to hold the next request before the
    # run has fetched them all (at 40 ms a page a CI run once missed it).
    config = worker_config(stack, tmp_path, worker={"heartbeat_throttle_s": 0.2})
    await stack.fault("latency", latency_ms=120)
    first = start_worker_process(config, tmp_path / "worker1.out")
    second = None
    try:
        task_id, run_id, handle = await start_quotes_run(stack)
        await inside_the_second_batch(stack, task_id, handle)
        # Hold the next quotes request: the fetch stops where it is however long the test
        # process takes to get to the kill on a loaded machine.
        await stack.fault("quotes", hang=True, for_s=120)
        stats = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]["stats"]
        assert 0 < stats["records_fetched"] < 60
        first.send_signal(signal.SIGKILL)
        first.wait(10)  # gone: its activity in flight is lost, found by its heartbeat timeout
        await stack.fault("quotes")  # the held request ends; later ones are answered
        second = start_worker_process(config, tmp_path / "worker2.out")
        final = await stack.wait_status(task_id, timeout=90)
        assert final["status"] == "completed", final
        assert final["stats"]["records_emitted"] == 60
    finally:
        await stack.fault("latency", latency_ms=0)
        await stack.fault("quotes")
        stop_processes(first, second)

    await every_record_delivered_once(stack, task_id, expected=60)
    finals = await stack.finals(run_id)
    assert len(finals) == 1 and finals[0]["body"]["result"] == "success"
    history = await stack.client.get_workflow_handle(final["workflow_id"]).fetch_history()
    retried_after_heartbeat_timeout(history)
    emitted_while_fetching(history)
    log = (tmp_path / "worker.log").read_text()
    assert "fetch_resumed" in log


async def test_sigkill_before_the_first_heartbeat_resumes_from_the_staged_cursor(
    make_stack, tmp_path
):
    """Killed before its fetch sent a heartbeat (activities/run_base.py Heartbeat holds
    them back for the first interval): the retry has no heartbeat details. The streaming
    fetch resumes from the cursor staged with its last page and sends the staged pages
    again under the same keys: every record reaches the sink once per key, and the run
    counts each once."""
    # The first heartbeat would go 8 s into the attempt (the throttle, half the heartbeat
    # timeout) and the run's 60 pages take 9 s at 150 ms each, in one batch: the kill comes
    # long before either, a few pages in, even when a loaded machine's test process takes
    # seconds to see the third page at the sink (a CI run once took 3 s, another 5).
    stack = await make_stack(
        worker=False,
        runs={"pages_per_fetch": 200, "fetch_max_seconds": 60, "heartbeat_timeout_s": 16},
    )
    config = worker_config(stack, tmp_path, worker={"heartbeat_throttle_s": 8.0})
    await stack.fault("latency", latency_ms=150)
    first = start_worker_process(config, tmp_path / "worker1.out")
    second = None
    try:
        task_id, run_id, handle = await start_quotes_run(stack)

        async def pages_delivered() -> bool:
            sent = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
            return len([b for b in sent if b["status"] == 200]) >= 3

        await eventually(pages_delivered, "a few pages delivered", interval=0.01)
        desc = await handle.describe()
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        await stack.fault("latency", latency_ms=0)
        fetches = [
            a
            for a in desc.raw_description.pending_activities
            if a.activity_type.name == "fetch_pages"
        ]
        assert fetches, "the fetch was not in flight"
        assert not fetches[0].heartbeat_details.payloads, "a heartbeat was sent before the kill"
        second = start_worker_process(config, tmp_path / "worker2.out")
        final = await stack.wait_status(task_id, timeout=90)
        assert final["status"] == "completed", final
        assert final["stats"]["records_emitted"] == 60
        assert final["stats"]["records_fetched"] == 60
    finally:
        await stack.fault("latency", latency_ms=0)
        stop_processes(first, second)

    await every_record_delivered_once(stack, task_id, expected=60)
    sent = Counter(
        b["idempotency_key"]
        for b in await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
        if b["status"] == 200
    )
    assert max(sent.values()) >= 2, "no page went again: the retry did not start over"
    finals = await stack.finals(run_id)
    assert len(finals) == 1 and finals[0]["body"]["result"] == "success"
    resumed = [
        json.loads(line)
        for line in (tmp_path / "worker.log").read_text().splitlines()
        if '"fetch_resumed"' in line
    ]
    assert any(r.get("source") == "staging" and r["next_seq"] >= 3 for r in resumed), resumed


async def start_quotes_run(stack) -> tuple[str, str, Any]:
    """An async run of 60 one-record pages (AAPL and MSFT) with a callback: its task id,
    its callback's run id and its workflow handle."""
    task_id, run_id, body = stack.callback_run(["AAPL", "MSFT"], page_size=1)
    resp = await stack.run(body, mode="async")
    assert resp.status_code == 202, resp.text
    return task_id, run_id, stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"])


def worker_config(stack, tmp_path: Path, **overrides: Any) -> Path:
    """The config file of the test's worker processes: the stack's settings (its task
    queue), their log in worker.log, and ``overrides``."""
    settings = settings_with(
        stack.settings,
        logging={"output": "file", "file": {"path": str(tmp_path / "worker.log")}},
        **overrides,
    )
    return write_config(tmp_path / "worker.yaml", settings)


async def inside_the_second_batch(stack, task_id: str, handle) -> dict:
    """Wait until the first batch is done and a later fetch has heartbeated a page of its
    own (the moment to kill the worker in the middle of a batch); the run's stats then."""

    async def check() -> dict | None:
        stats = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]["stats"]
        if stats.get("records_fetched", 0) < 20:
            return None
        desc = await handle.describe()
        beats = [
            json.loads(a.heartbeat_details.payloads[0].data)
            for a in desc.raw_description.pending_activities
            if a.activity_type.name == "fetch_pages" and a.heartbeat_details.payloads
        ]
        return stats if any(b["next_seq"] > 20 for b in beats) else None

    return await eventually(check, "the second fetch to heartbeat a page", interval=0.02)


async def every_record_delivered_once(stack, task_id: str, expected: int) -> None:
    """Every (symbol, date) of the run reached the sink once; a batch delivered again
    came under the same key with the same records."""
    batches = [
        b for b in await stack.sink_batches(f"pull_stock_quotes/{task_id}:") if b["status"] == 200
    ]
    by_key: dict[str, list] = {}
    for b in batches:
        if b["idempotency_key"] in by_key:
            assert by_key[b["idempotency_key"]] == b["records"]
        by_key[b["idempotency_key"]] = b["records"]
    counts: Counter = Counter()
    for records in by_key.values():
        for r in records:
            counts[(r["symbol"], r["date"])] += 1
    assert len(counts) == expected and set(counts.values()) == {1}


def retried_after_heartbeat_timeout(history) -> None:
    """The fetch activity was retried after the crash (and resumed from its heartbeat);
    every activity that can be lost with its worker tells Temporal it is alive, so a batch
    being processed when the worker died runs again after seconds, not after its
    start-to-close timeout (a CI run once waited those 120 s for it)."""
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(attempts) >= 2
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    checked = [a for a in scheduled if a.activity_type.name in LONG_RUNNING]
    assert "fetch_pages" in {a.activity_type.name for a in checked}
    assert all(a.heartbeat_timeout.ToTimedelta().total_seconds() == HEARTBEAT_S for a in checked)


def emitted_while_fetching(history) -> None:
    """Every page went to the sink from the fetch that staged it (the stream): no batch
    was left to process_batch / emit_batch, before the crash or after it."""
    names = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert "fetch_pages" in names and not names & {"process_batch", "emit_batch"}, names


async def test_sigterm_lets_the_batch_finish_exits_0_and_no_page_is_fetched_twice(
    make_stack, tmp_path
):
    stack = await make_stack(
        worker=False, runs={"pages_per_fetch": 20, "heartbeat_timeout_s": HEARTBEAT_S}
    )
    config = worker_config(stack, tmp_path, worker={"graceful_shutdown_s": 20})
    await stack.fault("latency", latency_ms=40)
    first = start_worker_process(config, tmp_path / "worker1.out")
    second = None
    symbols = [f"T{new_task_id()[-6:].upper()}", f"U{new_task_id()[-6:].upper()}"]
    try:
        task_id = new_task_id()
        resp = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": symbols, "page_size": 1}},
            mode="async",
        )
        assert resp.status_code == 202, resp.text

        async def fetched_5() -> bool:
            data = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
            return bool(data and data.get("stats", {}).get("records_fetched", 0) >= 5)

        await eventually(fetched_5, "the run to fetch 5 records", interval=0.02)
        stopped_at = time.monotonic()
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0  # a clean exit ...
        # ... within the graceful window (20 s), with slack for a loaded 2-core machine
        assert time.monotonic() - stopped_at < 20 + 15
        second = start_worker_process(config, tmp_path / "worker2.out")
        final = await stack.wait_status(task_id, timeout=120)
        assert final["status"] == "completed", final
        assert final["stats"]["records_emitted"] == 60
    finally:
        await stack.fault("latency", latency_ms=0)
        stop_processes(first, second)
    calls = (await stack.samples_http.get("/_quotes/calls")).json()
    pages = Counter((c["symbol"], c["page"]) for c in calls if c["symbol"] in symbols)
    assert len(pages) == 60 and set(pages.values()) == {1}, pages.most_common(3)
    log = (tmp_path / "worker.log").read_text()
    assert "worker_stopping" in log and "worker_stopped" in log
