"""Operator controls (docs/api.md): pause, resume and a new rate for a running task, through
the API and the CLI; nothing is fetched while paused; the stream records each control."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from tests.conftest import ROOT, new_task_id
from tests.helpers import eventually


async def _requests(stack, symbol: str) -> int:
    calls = (await stack.samples_http.get("/_quotes/calls")).json()
    return sum(1 for c in calls if c["symbol"] == symbol)


def _cli(stack, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "starter.cli", "tasks", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ARTEMIS_API": stack.api_url, "COLUMNS": "200"},
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def _no_fetch_running(stack, workflow_id: str) -> None:
    """No fetch activity is scheduled or running for the run: nothing can ask its source."""
    desc = await stack.client.get_workflow_handle(workflow_id).describe()
    pending = [a.activity_type.name for a in desc.raw_description.pending_activities]
    assert "fetch_pages" not in pending, pending


async def _fetching_run(stack, prefix: str, requests: int) -> tuple[str, str]:
    """(task id, symbol) of a run of 30 one-record pages, started and seen fetching."""
    symbol = f"{prefix}{new_task_id()[-6:].upper()}"
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": [symbol], "page_size": 1}},
        mode="async",
    )
    assert resp.status_code == 202, resp.text

    async def fetching() -> bool:
        return await _requests(stack, symbol) >= requests

    await eventually(fetching, "the run to fetch")
    return task_id, symbol


async def test_pause_rate_and_resume_through_the_api_and_the_cli(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 2})
    await stack.fault("latency", latency_ms=50)
    try:
        task_id, symbol = await _fetching_run(stack, "C", requests=3)
        paused = await stack.http.post(f"/tasks/{task_id}/pause", json={"reason": "maintenance"})
        assert paused.status_code == 202, paused.text
        assert paused.json()["data"]["action"] == "paused"

        async def shows_paused() -> bool:
            data = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
            return data.get("paused") is True and data["progress"]["stage"] == "paused"

        await eventually(shows_paused, "the run to pause")
        # the fetch in flight has stopped: nothing can ask the source while paused
        await _no_fetch_running(stack, paused.json()["data"]["workflow_id"])
        # the CLI in a thread: the API under test is served by this event loop
        rated = await asyncio.to_thread(_cli, stack, "rate", task_id, "4")
        assert rated["action"] == "rate_changed" and rated["qps"] == 4.0

        async def shows_rate() -> bool:
            return (await stack.http.get(f"/tasks/{task_id}")).json()["data"].get("qps") == 4.0

        await eventually(shows_rate, "the new rate")
        resumed = await asyncio.to_thread(_cli, stack, "resume", task_id)
        assert resumed["action"] == "resumed"
        final = await stack.wait_status(task_id, timeout=90)
    finally:
        await stack.fault("latency", latency_ms=0)
    assert final["status"] == "completed" and final["stats"]["records_emitted"] == 30
    assert await _requests(stack, symbol) == 30  # each page once, nothing lost to the pause
    resp = await stack.http.get(f"/tasks/{task_id}/events", params={"follow": "false"})
    kinds = [json.loads(x[5:])["event"] for x in resp.text.splitlines() if x.startswith("data:")]
    assert kinds.index("paused") < kinds.index("rate_changed") < kinds.index("resumed")
    assert kinds[-1] == "complete"
    # finished: 409; unknown: 404
    assert (await stack.http.post(f"/tasks/{task_id}/resume")).status_code == 409
    assert (await stack.http.post(f"/tasks/{new_task_id()}/pause")).status_code == 404


async def test_control_bodies_are_checked(stack):
    task_id = new_task_id()
    for path, body, field in (
        ("rate-limit", {"qps": 0}, "body.qps"),
        ("rate-limit", {"qps": "fast"}, "body.qps"),
        ("rate-limit", {"qps": 1, "burst": 2}, "body.burst"),
        ("pause", {"reason": 5}, "body.reason"),
    ):
        resp = await stack.http.post(f"/tasks/{task_id}/{path}", json=body)
        assert resp.status_code == 422, (path, body)
        assert field in resp.json()["error"]["message"]


async def test_a_pause_stops_the_fetch_in_flight_at_its_next_page(make_stack):
    """Against a slow source (400 ms a page, batches of 20 pages) a pause reaches the
    fetch in flight through its heartbeat: the run shows `pausing`, the fetch stops at its
    next page boundary with its checkpoint, then `paused` — and from then on the source
    is asked nothing; after the resume every page is asked once."""
    stack = await make_stack(runs={"pages_per_fetch": 20})
    await stack.fault("latency", latency_ms=400)
    try:
        task_id, symbol = await _fetching_run(stack, "P", requests=2)
        at_pause = await _requests(stack, symbol)
        paused = await stack.http.post(f"/tasks/{task_id}/pause", json={"reason": "slow"})
        assert paused.status_code == 202, paused.text
        seen: list[str] = []

        async def shows_paused() -> bool:
            data = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
            seen.append(data["status"])
            return data["status"] == "paused"

        await eventually(shows_paused, "the run to pause", timeout=60, interval=0.05)
        at_paused = await _requests(stack, symbol)
        # the batch in flight did not run on to its 20 pages: the page in flight and
        # those asked before the heartbeat's answer (at most a second: 2-3 pages)
        assert at_paused - at_pause <= 5, (at_pause, at_paused)
        assert "pausing" in seen and set(seen) <= {"running", "pausing", "paused"}, seen
        # paused: no fetch is running any more, so the source is asked nothing now
        await _no_fetch_running(stack, paused.json()["data"]["workflow_id"])
        assert await _requests(stack, symbol) == at_paused
        resumed = await stack.http.post(f"/tasks/{task_id}/resume")
        assert resumed.status_code == 202, resumed.text
        final = await stack.wait_status(task_id, timeout=120)
    finally:
        await stack.fault("latency", latency_ms=0)
    assert final["status"] == "completed" and final["stats"]["records_emitted"] == 30, final
    assert await _requests(stack, symbol) == 30  # the page in flight was kept, not asked again
