"""CLI error messages are plain text: brackets in them are shown as they are."""

from __future__ import annotations

import io
import json

import pytest
import typer

from starter.cli import _common


def test_an_error_message_with_brackets_is_printed_as_it_is(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(_common.err_console, "file", out)
    with pytest.raises(typer.Exit):
        _common._fail("params.symbols: expected list[str], got '[bold]x'")
    assert out.getvalue().strip() == "error: params.symbols: expected list[str], got '[bold]x'"


def test_a_run_prints_as_json_or_as_a_table(monkeypatch):
    from starter.cli import tasks

    run = {
        "task_code": "pull_stock_quotes",
        "task_id": "t-1",
        "status": "failed",
        "duration_ms": 1200,
        "stats": {"pages": 3, "records_fetched": 6, "records_emitted": 4},
        "error": {"code": "SINK_ERROR", "message": "sink answered 400 for [page 2]"},
        "workflow_id": "artemis/pull_stock_quotes/t-1",
    }
    out = io.StringIO()
    monkeypatch.setattr(tasks.console, "file", out)
    tasks.print_run(run, tasks.RunOutput.json)
    assert json.loads(out.getvalue()) == run
    out.seek(0)
    out.truncate()
    tasks.print_run(run, tasks.RunOutput.table)
    lines = [" ".join(line.split()) for line in out.getvalue().splitlines()]
    assert "status failed" in lines and "duration 1200 ms" in lines
    assert "error SINK_ERROR: sink answered 400 for [page 2]" in lines
    assert not any(line.startswith(("provenance", "quarantined", "build")) for line in lines)
