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


def test_a_wide_task_list_fits_80_columns_without_an_empty_column():
    """The widest list at 80 and 100 columns: no column narrower than its header (a rich
    table squeezed past its width draws empty columns), no line past the width; the
    columns that leave go in DROPPED's order."""
    import io

    from rich.console import Console
    from rich.table import Table

    from starter.cli._common import print_table
    from starter.cli.tasks import _WIDE, DROPPED

    row = (
        "t-0123456789abcdef0123456789abcdef",
        "pull_stock_quotes",
        "catalog",
        "completed",
        "20",
        "5m",
        "2026-11-29T08:00:00",
        "2026-11-29T08:00:05",
        "",
        "artemis/pull_stock_quotes/t-0123456789abcdef0123456789abcdef",
    )
    for width, kept in ((80, 4), (100, 7), (240, 10)):
        table = Table()
        for col in _WIDE:
            table.add_column(col, no_wrap=col in ("task id", "workflow id"))
        table.add_row(*row)
        buf = io.StringIO()
        out = Console(file=buf, width=width, force_terminal=True, color_system=None)
        print_table(table, out, drop=DROPPED)
        lines = buf.getvalue().splitlines()
        assert max(len(x) for x in lines) <= width, buf.getvalue()
        headers = [h.strip() for h in lines[1].strip("┃").split("┃")]
        assert len(headers) == kept and all(headers), (width, headers)
        assert headers == [c for c in _WIDE if c in headers]
        gone = {c for c in _WIDE if c not in headers}
        assert gone == set(DROPPED[: len(gone)]), gone
