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


_TID = "t-0123456789abcdef0123456789abcdef"
_AT = "2026-11-29T08:00:05+00:00"


def _every_table() -> dict[str, tuple[object, tuple[str, ...]]]:
    """Each table the CLI prints, filled with rows as long as real ones get."""
    from starter.cli import builds, cookies, quarantine, schedules, tasks

    run = {
        "task_id": _TID,
        "task_code": "pull_stock_quotes",
        "provenance": "catalog",
        "status": "completed",
        "result": {"records_emitted": 20},
        "started_at": _AT,
        "completed_at": _AT,
        "error": {"code": "SOURCE_UNAVAILABLE"},
        "workflow_id": f"artemis/pull_stock_quotes/{_TID}",
    }
    row = {
        "task_id": _TID,
        "id": 12345,
        "record_key": {"id": 1234567, "repo": "octo/artemis"},
        "page_seq": 12,
        "position": 40,
        "field_path": "owner.login",
        "error_code": "RECORD_MODEL",
        "stage": "judge",
        "status": "quarantined",
        "message": "record column 'owner.login': Input should be a valid string (got null)",
    }
    schedule = {
        "name": "nightly-pubmed-harvest",
        "task": "source_harvest",
        "when": "cron 0 2 * * *",
        "time_zone": "Europe/Amsterdam",
        "paused": False,
        "next_starts": [_AT],
        "starts": 412,
        "made_by": "config",
    }
    build = {
        "build_id": "1.1.0+3f9c2a7b41d0e5f6",
        "status": "current",
        "polled": True,
        "created_at": _AT,
        "this_code": False,
        "stranded": True,
    }
    cookie = {
        "cookie_name": "xhs-account-primary-07",
        "platform": "xiaohongshu",
        "status": "active",
        "priority": 10,
        "daily_used": 120,
        "daily_limit": 500,
        "consecutive_errors": 0,
        "total_errors": 3,
        "cooling_until": _AT,
    }
    kind = {
        "code": "source_harvest",
        "summary": "Harvest one provenance of the registry into its sinks, page by page",
        "params_schema": {"required": ["provenance"], "properties": dict.fromkeys("abcdefgh")},
    }
    recent = {"scheduled_at": _AT, "outcome": "started", "task_id": _TID, "status": "completed"}
    return {
        "tasks list": tasks.runs_table([run] * 3, wide=False),
        "tasks list -o wide": tasks.runs_table([run] * 3, wide=True),
        "task-types": tasks.types_table([kind]),
        "quarantine list": quarantine.rows_table([row] * 3, across=False),
        "quarantine list (across)": quarantine.rows_table([row] * 3, across=True),
        "schedules list": schedules.schedules_table([schedule] * 2),
        "schedules show": schedules.recent_table([recent] * 2),
        "builds list": builds.builds_table([build] * 2),
        "cookies list": cookies.cookies_table([cookie] * 2),
    }


_TABLES = [
    "tasks list",
    "tasks list -o wide",
    "task-types",
    "quarantine list",
    "quarantine list (across)",
    "schedules list",
    "schedules show",
    "builds list",
    "cookies list",
]


def test_the_list_of_tables_is_whole():
    assert sorted(_every_table()) == sorted(_TABLES)


@pytest.mark.parametrize("name", _TABLES)
@pytest.mark.parametrize("width", [80, 100, 240])
def test_every_table_fits_the_terminal_without_an_empty_column(name, width):
    """Every CLI table at 80, 100 and 240 columns: no line past the width, every kept column's
    header whole on the header line (a column squeezed to nothing shows none), the
    columns that left are the first of its stated order, and no body cell is blank."""
    from rich.console import Console

    from starter.cli._common import _plain, print_table

    table, drop = _every_table()[name]
    names = [_plain(c.header) for c in table.columns]
    buf = io.StringIO()
    out = Console(file=buf, width=width, force_terminal=True, color_system=None)
    print_table(table, drop, out)
    lines = buf.getvalue().splitlines()
    assert max(len(x) for x in lines) <= width, buf.getvalue()
    headers = [h.strip() for h in lines[1].strip("┃").split("┃")]
    assert all(headers) and headers == [n for n in names if n in headers], buf.getvalue()
    gone = [n for n in names if n not in headers]
    assert set(gone) == set([d for d in drop if d in names][: len(gone)]), (gone, drop)
    body = [line for line in lines[3:] if line.startswith("│")]
    assert body, buf.getvalue()
    for line in body:
        cells = line.strip("│").split("│")
        assert len(cells) == len(headers), line


def test_piped_tables_are_plain_text():
    """Not a terminal: no box-drawing, no padding at a line's end, every column."""
    from rich.console import Console

    from starter.cli._common import _plain, print_table

    for name, (table, drop) in _every_table().items():
        names = [_plain(c.header) for c in table.columns]
        buf = io.StringIO()
        print_table(table, drop, Console(file=buf, width=80, force_terminal=False))
        text = buf.getvalue()
        assert not set(text) & set("│┃━─┏┓┗┛┡┩└┘╇╈┼"), (name, text)
        assert all(line == line.rstrip() for line in text.splitlines()), name
        header = text.splitlines()[0]
        assert header.startswith(names[0]) and all(n in header for n in names), (name, header)
