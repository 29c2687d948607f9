"""The sample quote API's contract, the CLI against a live API, and the span exporter."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tests.conftest import ROOT, new_task_id


def test_quote_api_pages_and_rejects_bad_dates(samples):
    with httpx.Client(base_url=samples.url) as http:
        first = http.get(
            "/quotes",
            params={
                "symbol": "aapl",
                "start": "2025-11-01",
                "end": "2025-11-30",
                "page": 1,
                "page_size": 25,
            },
        )
        body = first.json()
        assert body["symbol"] == "AAPL" and body["page"] == 1 and body["next_page"] == 2
        assert len(body["items"]) == 25
        assert set(body["items"][0]) == {"symbol", "date", "open", "high", "low", "close", "volume"}
        last = http.get(
            "/quotes",
            params={
                "symbol": "AAPL",
                "start": "2025-11-01",
                "end": "2025-11-30",
                "page": 2,
                "page_size": 25,
            },
        )
        assert last.json()["next_page"] is None and len(last.json()["items"]) == 5
        again = http.get(
            "/quotes",
            params={
                "symbol": "AAPL",
                "start": "2025-11-01",
                "end": "2025-11-30",
                "page": 1,
                "page_size": 25,
            },
        )
        assert again.json() == body  # deterministic data
        bad = http.get(
            "/quotes", params={"symbol": "AAPL", "start": "2025-13-01", "end": "2025-11-30"}
        )
        assert bad.status_code == 400 and "bad date" in bad.json()["error"]


def _cli(*args: str, api: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ARTEMIS_API": api, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "starter.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


async def test_cli_run_show_and_cancel(stack):
    import asyncio

    out = await asyncio.to_thread(
        _cli,
        "run",
        "pull_stock_quotes",
        "-p",
        "symbols=AAPL,MSFT",
        "-p",
        "start=2025-11-01",
        "-p",
        "end=2025-11-10",
        api=stack.api_url,
    )
    assert out.returncode == 0, out.stderr
    # -o json (the default): standard output is the result alone, a script parses it;
    # the start line and the live view go to standard error.
    assert "started pull_stock_quotes task" in out.stderr
    final = json.loads(out.stdout)
    assert final["status"] == "completed" and final["stats"]["records_emitted"] == 20

    # The live view rendered the plan steps from the event stream.
    assert "Emit to sinks" in out.stderr and "completed" in out.stderr
    shown = await asyncio.to_thread(_cli, "tasks", "show", final["task_id"], api=stack.api_url)
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed"
    with_events = await asyncio.to_thread(
        _cli, "tasks", "show", final["task_id"], "--events", api=stack.api_url
    )
    assert with_events.returncode == 0, with_events.stderr
    lines = json.loads(with_events.stdout)["events"]
    assert lines[0]["event"] == "plan_update" and lines[-1]["event"] == "complete"
    as_text = await asyncio.to_thread(
        _cli, "tasks", "show", final["task_id"], "--events", "-o", "table", api=stack.api_url
    )
    assert as_text.returncode == 0, as_text.stderr
    assert not [x for x in as_text.stdout.splitlines() if x.startswith('{"event"')]
    assert " plan_update " in as_text.stdout and " complete" in as_text.stdout
    watched = await asyncio.to_thread(_cli, "tasks", "watch", final["task_id"], api=stack.api_url)
    assert watched.returncode == 0, watched.stderr
    assert "Fetch pages" in watched.stderr and json.loads(watched.stdout)["status"] == "completed"

    cancel = await asyncio.to_thread(_cli, "tasks", "cancel", final["task_id"], api=stack.api_url)
    assert cancel.returncode == 1 and "CONFLICT" in cancel.stderr

    listed = await asyncio.to_thread(
        _cli, "tasks", "list", "--code", "pull_stock_quotes", "--limit", "200", api=stack.api_url
    )
    assert listed.returncode == 0, listed.stderr
    assert final["task_id"][:12] in listed.stdout and "completed" in listed.stdout
    # Piped, every table is plain text: no box-drawing, no padding at the ends of lines.
    for out in (listed, as_text, watched):
        drawn = set(out.stdout + out.stderr) & set("─│┃━┏┓┗┛┡┩╇┼├┤┌┐└┘")
        assert not drawn, out.stdout
        assert not [x for x in out.stdout.splitlines() if x != x.rstrip()], out.stdout
    wide = await asyncio.to_thread(
        _cli, "tasks", "list", "--code", "pull_stock_quotes", "-o", "wide", api=stack.api_url
    )
    assert wide.returncode == 0 and "task id" in wide.stdout.splitlines()[0], wide.stdout

    missing = await asyncio.to_thread(_cli, "tasks", "show", new_task_id(), api=stack.api_url)
    assert missing.returncode == 1 and "TASK_NOT_FOUND" in missing.stderr

    bad = await asyncio.to_thread(
        _cli, "run", "pull_stock_quotes", "-p", "page_size=0", api=stack.api_url
    )
    assert bad.returncode == 1 and "params.page_size" in bad.stderr


@pytest.mark.processes
def test_console_exporter_prints_spans():
    script = textwrap.dedent("""
        from opentelemetry import trace
        from artemis.config import TelemetrySettings
        from artemis.tracing import setup_telemetry
        setup_telemetry(TelemetrySettings(exporter="console", service_name="artemis-test"))
        with trace.get_tracer("t").start_as_current_span("probe-span"):
            pass
        trace.get_tracer_provider().shutdown()
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert '"name": "probe-span"' in out.stdout and "artemis-test" in out.stdout


@pytest.mark.processes
@pytest.mark.parametrize("exporter", ["console", "none"])
def test_the_apis_request_spans_only_when_spans_are_exported(exporter):
    """FastAPI's own request span is opened when spans go somewhere (here, the console)
    and skipped otherwise: with ``exporter: none`` its middleware is bypassed."""
    script = textwrap.dedent(f"""
        from fastapi.testclient import TestClient
        from opentelemetry import trace
        from artemis.config import load_settings
        from artemis.tracing import setup_telemetry
        from starter.api.app import create_app
        settings = load_settings(
            None, telemetry={{"exporter": "{exporter}", "service_name": "artemis-test"}}
        )
        setup_telemetry(settings.telemetry)
        app = create_app(settings)
        with TestClient(app, base_url="http://127.0.0.1:8000") as client:
            answer = client.get("/health")
            assert answer.status_code == 200, answer.text
        print("fastapi-telemetry", app._native_telemetry.enabled())
        trace.get_tracer_provider().shutdown()
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    if exporter == "console":
        assert "fastapi-telemetry True" in out.stdout
        assert '"name": "GET /health"' in out.stdout and "artemis-test" in out.stdout
    else:
        assert "fastapi-telemetry False" in out.stdout and '"name"' not in out.stdout


@pytest.mark.processes
@pytest.mark.parametrize("command", ["worker", "api"])
def test_worker_and_api_refuse_to_start_without_the_master_key(tmp_path, command):
    key_file = tmp_path / "keys" / "master.key"
    config = tmp_path / "c.yaml"
    config.write_text(
        f"vault: {{master_key_file: {key_file}}}\n"
        f"database: {{url: 'sqlite:///{tmp_path / 'a.db'}'}}\n"
    )
    import yaml

    assert yaml.safe_load(config.read_text())["vault"]["master_key_file"] == str(key_file)
    env = {k: v for k, v in os.environ.items() if k != "COOKIE_MASTER_KEY"}
    env.update(ARTEMIS_CONFIG=str(config), PYTHONPATH=str(ROOT))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "infra.devstack", command],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "COOKIE_MASTER_KEY" in proc.stderr + proc.stdout
    assert "secrets.token_urlsafe" in proc.stderr + proc.stdout  # how to make one
    assert not key_file.exists() and not (tmp_path / ".artemis").exists()
    assert time.monotonic() - started < 30  # generous for a loaded 2-core machine


async def test_watching_a_run_that_failed_exits_1(stack):
    await stack.fault("sink", status=400, times=1)
    resp = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["X"]}})
    data = resp.json()["data"]
    assert data["status"] == "failed", resp.text
    watched = await asyncio.to_thread(_cli, "tasks", "watch", data["task_id"], api=stack.api_url)
    assert watched.returncode == 1, watched.stderr
    assert '"status": "failed"' in watched.stdout and "SINK_ERROR" in watched.stdout


async def test_cli_conventions_prefix_ids_output_formats_cursor_task_types_and_lists(stack):
    import asyncio

    # -p symbols=ONE: one item for a list param (the params schema says it is a list)
    out = await asyncio.to_thread(
        _cli,
        "run",
        "pull_stock_quotes",
        "-p",
        "symbols=ONE",
        "-p",
        "end=2025-11-03",
        api=stack.api_url,
    )
    assert out.returncode == 0, out.stderr
    task_id = json.loads(out.stdout)["task_id"]
    # a unique prefix of the id is enough
    shown = await asyncio.to_thread(_cli, "tasks", "show", task_id[:10], api=stack.api_url)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["task_id"] == task_id
    # ... in every command that takes an id
    watched = await asyncio.to_thread(_cli, "tasks", "watch", task_id[:10], api=stack.api_url)
    assert watched.returncode == 0 and task_id in watched.stdout, watched.stderr
    resumed = await asyncio.to_thread(_cli, "tasks", "resume", task_id[:10], api=stack.api_url)
    assert resumed.returncode == 1 and f"task {task_id} has already finished" in resumed.stderr
    # an output format it does not know is refused, naming the choices
    yaml_out = await asyncio.to_thread(_cli, "tasks", "list", "-o", "yaml", api=stack.api_url)
    assert yaml_out.returncode == 2 and "table" in yaml_out.stderr and "wide" in yaml_out.stderr
    # -o json, --cursor
    page = await asyncio.to_thread(
        _cli, "tasks", "list", "--limit", "1", "-o", "json", api=stack.api_url
    )
    first = json.loads(page.stdout)
    assert len(first["items"]) == 1 and first["next_cursor"]
    more = await asyncio.to_thread(
        _cli,
        "tasks",
        "list",
        "--limit",
        "1",
        "-o",
        "json",
        "--cursor",
        first["next_cursor"],
        api=stack.api_url,
    )
    assert json.loads(more.stdout)["items"][0]["task_id"] != first["items"][0]["task_id"]
    wide = await asyncio.to_thread(_cli, "tasks", "list", "-o", "wide", api=stack.api_url)
    assert "workflow id" in wide.stdout and task_id in wide.stdout  # never cut
    # the default columns are kubectl's few (id, code, status, records, age)
    narrow = await asyncio.to_thread(_cli, "tasks", "list", "--limit", "3", api=stack.api_url)
    assert "age" in narrow.stdout and "workflow id" not in narrow.stdout
    types = await asyncio.to_thread(_cli, "task-types", api=stack.api_url)
    assert types.returncode == 0 and "pull_stock_quotes" in types.stdout
    assert "symbols*" in types.stdout  # required params starred
    # plain help: no type tags next to flags, no SPEC references
    helped = await asyncio.to_thread(_cli, "tasks", "list", "--help", api=stack.api_url)
    assert "<bool>" not in helped.stdout and "--cursor" in helped.stdout
    for group in ("registry", "cookies"):
        text = (await asyncio.to_thread(_cli, group, "--help", api=stack.api_url)).stdout
        assert "SPEC" not in text, text


def test_watch_shows_a_pause_a_wait_and_skipped_steps():
    from rich.console import Console

    from starter.cli.watch import StepView

    view = StepView("t-1")
    todos = [{"id": "step_fetch", "content": "Fetch pages", "status": "IN_PROGRESS"}]
    view.apply(
        {
            "event": "plan_update",
            "todos": [*todos, {"id": "step_emit", "content": "Emit to sinks", "status": "PENDING"}],
        }
    )
    view.apply({"event": "paused", "reason": "maintenance"})
    assert view.waiting.startswith("paused: maintenance")
    view.apply({"event": "resumed"})
    assert view.waiting == ""
    view.apply({"event": "waiting", "line": "waiting: sink http unavailable since 12:03:04"})
    assert view.changes()[-1] == "waiting: sink http unavailable since 12:03:04"  # said once
    view.apply({"event": "error", "error": {"code": "SINK_UNAVAILABLE"}})
    out = Console(width=120, record=True)
    out.print(view)
    assert "skipped" in out.export_text()  # the emit step the run never reached


@pytest.mark.processes
def test_the_cli_starts_without_the_database_layer():
    """Every CLI call starts a Python process: the commands that only talk to the API do
    not import SQLAlchemy (a third of the CLI's start before), Temporal's client or the
    logging set-up (structlog); the commands that need them import them when they run."""
    script = (
        "import sys, starter.cli; starter.cli.full_app(); print(sorted(m for m in sys.modules"
        " if m.split('.')[0] in {'sqlalchemy', 'sqlmodel', 'temporalio', 'structlog'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
