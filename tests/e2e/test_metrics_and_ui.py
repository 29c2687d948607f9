"""Prometheus metrics, the Temporal SDK's worker metrics, what the Temporal UI shows of a
run (search attributes, current details) and GET /tasks/{id} beyond Temporal's memory."""

from __future__ import annotations

import socket
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import new_task_id, serve_api, settings_with
from tests.helpers import eventually


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: dict, name: str, **labels: str) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_runs_records_activities_and_callbacks(stack):
    before = samples((await stack.http.get("/metrics")).text)
    ok_id, run_id, body = stack.callback_run(["AAPL", "TSLA"])
    assert (await stack.run(body)).json()["data"]["status"] == "completed"
    await stack.fault("quotes", status=400, times=1)
    try:
        failed = await stack.run({"meta": {"task_id": new_task_id()}, "params": {}})
        assert failed.json()["data"]["status"] == "failed"
    finally:
        await stack.fault("quotes")
    assert (await stack.http.post("/tasks/no_such_task/run", json={})).status_code == 404
    resp = await stack.http.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    after = samples(resp.text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    code = "pull_stock_quotes"
    assert delta("artemis_runs_started_total", task_code=code) == 2
    assert delta("artemis_runs_finished_total", task_code=code, status="completed") == 1
    assert delta("artemis_runs_finished_total", task_code=code, status="failed") == 1
    assert delta("artemis_run_requests_total", task_code=code, outcome="completed") == 1
    assert delta("artemis_run_requests_total", task_code=code, outcome="failed") == 1
    # An unknown code is counted once, under one label (no label per typo).
    assert delta("artemis_run_requests_total", task_code="unknown", outcome="TASK_NOT_FOUND") == 1
    assert delta("artemis_records_fetched_total", task_code=code) == 60
    assert delta("artemis_records_emitted_total", task_code=code) == 60
    assert delta("artemis_callbacks_total", kind="finalize", outcome="delivered") == 1
    assert delta("artemis_callbacks_total", kind="finalize", outcome="skipped") == 1
    assert (
        delta("artemis_activity_duration_seconds_count", activity="fetch_pages", outcome="ok") >= 1
    )
    assert (
        delta("artemis_activity_duration_seconds_count", activity="fetch_pages", outcome="error")
        == 1
    )
    assert len(await stack.finals(run_id)) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_sdk_worker_metrics_are_served_on_their_own_port(base_settings):
    from workers.client import connect
    from workers.main import running_worker

    port = free_port()
    settings = settings_with(
        base_settings,
        metrics={"sdk_port": port},
        temporal={"task_queue": f"tq-{uuid.uuid4().hex[:10]}"},
    )
    client = await connect(settings)
    async with running_worker(settings, client):
        async with httpx.AsyncClient() as http:

            async def sdk_metrics() -> str | None:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                return text if "temporal_worker_task_slots_available" in text else None

            text = await eventually(sdk_metrics, "the SDK's worker metrics", interval=0.1)
    assert settings.temporal.task_queue in text  # labelled per task queue


async def test_ui_shows_provenance_task_type_and_a_progress_line(stack):
    from temporalio.common import SearchAttributeKey

    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "params": {
                "provenance": "crossref",
                "task_type": "harvest",
                "query": "ecology",
                "start": "2025-01-01",
                "end": "2025-01-03",
            },
        },
        code="literature_harvest",
    )
    data = resp.json()["data"]
    assert data["status"] == "completed", data
    handle = stack.client.get_workflow_handle(data["workflow_id"])
    desc = await handle.describe()
    attrs = desc.typed_search_attributes
    assert attrs.get(SearchAttributeKey.for_keyword("ArtemisProvenance")) == "crossref"
    assert attrs.get(SearchAttributeKey.for_keyword("ArtemisTaskType")) == "harvest"
    assert attrs.get(SearchAttributeKey.for_keyword("ArtemisTaskCode")) == "literature_harvest"

    async def found() -> list[str]:  # visibility is eventually consistent
        query = f"ArtemisProvenance = 'crossref' AND ArtemisTaskId = '{task_id}'"
        return [w.id async for w in stack.client.list_workflows(query)]

    assert await eventually(found, "the run in visibility", interval=0.2) == [data["workflow_id"]]
    meta = await handle.query("__temporal_workflow_metadata")
    details = meta.current_details
    assert details.startswith("**completed**") and "emitted" in details


async def test_task_status_merges_live_progress_and_outlives_temporal(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 1})
    await stack.fault("latency", latency_ms=150)
    try:
        task_id = new_task_id()
        await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}}, mode="async"
        )

        async def running() -> dict | None:
            live = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
            mirrored = live.get("task_store") == "running" and live.get("progress", {}).get("pages")
            return live if mirrored else None

        live = await eventually(running, "the running run with pages, mirrored")
        assert live["source"] == "temporal" and live["status"] == "running"
        assert live["task_store"] == "running" and live["created_at"]
        assert live["progress"]["steps"][1] == {"id": "step_fetch", "status": "IN_PROGRESS"}
    finally:
        await stack.fault("latency", latency_ms=0)
    await stack.wait_status(task_id)

    async def stored() -> dict | None:  # the terminal record follows the finalize activity
        done = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
        return done if done["source"] == "task_store" else None

    done = await eventually(stored, "the terminal record in task storage")
    assert done["status"] == "completed" and done["source"] == "task_store"
    assert done["stats"]["records_emitted"] == 30 and done["duration_ms"] > 0

    # Past Temporal's retention the store still answers: an API whose Temporal namespace
    # has never heard of the run.
    from temporalio.client import Client

    blind = await Client.connect(
        stack.settings.temporal.address, namespace=f"gone-{uuid.uuid4().hex[:6]}"
    )
    server, task, url = await serve_api(stack.settings, blind)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            gone = (await http.get(f"/tasks/{task_id}")).json()
            unknown = await http.get(f"/tasks/{new_task_id()}")
    finally:
        server.should_exit = True
        await task
    assert gone["success"] and gone["data"]["status"] == "completed"
    assert gone["data"]["stats"]["records_emitted"] == 30
    assert unknown.status_code in (404, 503)  # Temporal cannot say either


async def test_a_runs_summary_in_the_ui_says_what_it_harvests(stack):
    from tests.conftest import new_task_id

    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "params": {"symbols": ["AAPL", "MSFT"], "start": "2025-11-01", "end": "2025-11-05"},
        }
    )
    desc = await stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"]).describe()
    summary = await desc.static_summary()
    assert summary == f"pull_stock_quotes · AAPL, MSFT 2025-11-01..2025-11-05 · task {task_id}"
