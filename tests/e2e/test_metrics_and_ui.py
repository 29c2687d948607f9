"""Prometheus metrics, the Temporal SDK's worker metrics, what the Temporal UI shows of a
run (search attributes, current details) and GET /tasks/{id} beyond Temporal's memory."""

from __future__ import annotations

import json
import socket
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from artemis.run_models import SA_PROVENANCE, SA_TASK_CODE, SA_TASK_ID, SA_TASK_TYPE
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
    from artemis.temporal.client import connect
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
    assert attrs.get(SearchAttributeKey.for_keyword(SA_PROVENANCE)) == "crossref"
    assert attrs.get(SearchAttributeKey.for_keyword(SA_TASK_TYPE)) == "harvest"
    assert attrs.get(SearchAttributeKey.for_keyword(SA_TASK_CODE)) == "literature_harvest"

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


async def test_the_runs_link_lists_task_runs_and_no_housekeeping(stack):
    """The link `artemis dev`/`demo` prints for the UI's list carries the runs-only
    filter; given to `temporal workflow list`, that filter lists the task runs and none
    of the housekeeping loops (which the unfiltered list shows)."""
    import asyncio
    import json
    import subprocess
    from urllib.parse import parse_qs, urlsplit

    from infra.devserver import temporal_binary
    from starter.service import RUNS_QUERY, ui_list_url

    url = ui_list_url(stack.settings)
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == stack.settings.temporal.ui_url
    assert parts.path == f"/namespaces/{stack.settings.temporal.namespace}/workflows"
    assert parse_qs(parts.query)["query"] == [RUNS_QUERY] == ['WorkflowType = "TaskRunWorkflow"']
    task_id = new_task_id()
    resp = await stack.run({"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}})
    assert resp.json()["data"]["status"] == "completed", resp.text
    queue = stack.settings.temporal.task_queue

    def listed(query: str) -> list[tuple[str, str]]:
        out = subprocess.run(
            [temporal_binary(), "workflow", "list", "-o", "json", "--query", query]
            + ["--address", stack.settings.temporal.address],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        items = (
            json.loads(out) if out.startswith("[") else [json.loads(x) for x in out.splitlines()]
        )
        return sorted((w["type"]["name"], w["execution"]["workflowId"]) for w in items)

    async def both() -> tuple | None:
        runs = await asyncio.to_thread(listed, f"({RUNS_QUERY}) AND TaskQueue = '{queue}'")
        every = await asyncio.to_thread(listed, f"TaskQueue = '{queue}'")
        return (runs, every) if runs and len(every) >= 4 else None

    runs, every = await eventually(both, "the run and the loops in the list", interval=0.2)
    assert runs == [("TaskRunWorkflow", f"artemis/pull_stock_quotes/{task_id}")]
    assert {t for t, _ in every} == {
        "TaskRunWorkflow",
        "CleanupOldTasks",
        "ReclaimStaleLocks",
        "EvaluateAlerts",
    }
    assert len(every) == 4  # one row per housekeeping job, not one per tick


def _temporal_json(settings, *args: str):
    """``temporal <args> -o json`` against the test's server, as an operator runs it."""
    import json
    import subprocess

    from infra.devserver import temporal_binary

    out = subprocess.run(
        [temporal_binary(), *args, "--address", settings.temporal.address, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout.strip()
    if args[:2] == ("workflow", "list"):  # one JSON object a line, or a JSON array
        return (
            json.loads(text)
            if text.startswith("[")
            else [json.loads(x) for x in text.splitlines() if x.strip()]
        )
    return json.loads(text)


def _payload_value(payload):
    """A search attribute's value as `temporal -o json` prints it (a JSON payload, its
    data base64-encoded, or already decoded by the CLI)."""
    import base64

    data = payload.get("data", payload) if isinstance(payload, dict) else payload
    if isinstance(data, str):
        try:
            return json.loads(base64.b64decode(data))
        except ValueError:
            return data
    return data


async def test_the_ui_pieces_seen_through_the_temporal_cli(make_stack):
    """What the UI shows, read with `temporal workflow describe/list` (no screenshot):
    a run's summary names what it harvests and its task id; its search attributes; the
    runs-only list filter the demo prints; two crawls of one lock told apart by their
    task ids."""
    from urllib.parse import parse_qs, urlsplit

    from starter.service import ui_list_url
    from tests.e2e.test_crawl import crawl_stack

    stack, platform = await crawl_stack(make_stack, {"sample-a": 5})
    await stack.samples_http.post("/_control/platform", json={"notes_per_keyword": 3})
    crawls = []
    for n in range(2):
        task_id = new_task_id()
        resp = await stack.run(
            {
                "meta": {"task_id": task_id},
                "params": {"platform": platform, "keywords": [f"ui{n}"]},
            },
            code="crawl_notes",
        )
        assert resp.json()["data"]["status"] == "completed", resp.text
        crawls.append((task_id, resp.json()["data"]["workflow_id"]))
    quotes_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": quotes_id},
            "params": {"symbols": ["IBM"], "start": "2025-11-03", "end": "2025-11-04"},
        }
    )
    quotes_wf = resp.json()["data"]["workflow_id"]
    s = stack.settings

    desc = _temporal_json(s, "workflow", "describe", "-w", quotes_wf)
    summary = desc["executionConfig"]["userMetadata"]["summary"]
    assert summary == f"pull_stock_quotes · IBM 2025-11-03..2025-11-04 · task {quotes_id}"
    fields = desc["workflowExecutionInfo"]["searchAttributes"]["indexedFields"]
    attrs = {k: _payload_value(v) for k, v in fields.items()}
    assert attrs[SA_TASK_CODE] == "pull_stock_quotes", attrs
    assert attrs[SA_TASK_ID] == quotes_id, attrs

    # the list filter the demo prints, run as the UI runs it: task runs only
    query = parse_qs(urlsplit(ui_list_url(s)).query)["query"][0]
    listed = _temporal_json(
        s, "workflow", "list", "-q", f"{query} AND ArtemisTaskId = '{quotes_id}'"
    )
    assert len(listed) == 1 and listed[0]["execution"]["workflowId"] == quotes_wf, listed
    types = {w["type"]["name"] for w in _temporal_json(s, "workflow", "list", "-q", query)}
    assert types == {"TaskRunWorkflow"}, types

    # two crawls of one lock: each a task run of its own id, listed with the task runs;
    # the lock is a workflow of another type, named apart, an execution per holder
    for task_id, wf in crawls:
        assert wf == f"artemis/crawl_notes/{task_id}"
        (row,) = _temporal_json(
            s, "workflow", "list", "-q", f"{query} AND ArtemisTaskId = '{task_id}'"
        )
        assert row["execution"]["workflowId"] == wf, row
        run = _temporal_json(s, "workflow", "describe", "-w", wf)
        assert run["executionConfig"]["userMetadata"]["summary"].endswith(f"task {task_id}")
        (held,) = _temporal_json(
            s,
            "workflow",
            "list",
            "-q",
            f"WorkflowType = 'ExecutionLock' AND ArtemisTaskId = '{task_id}'",
        )
        assert held["execution"]["workflowId"] == f"artemis/lock/crawl_notes:{platform}", held
