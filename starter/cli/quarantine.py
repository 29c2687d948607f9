"""`artemis quarantine`: the records runs set aside, through the starter API
(starter/api/routes/quarantine.py): list and show them, replay them once the model or
the task is fixed, or discard them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from artemis.config import Settings
from artemis.run_state import RunStatus
from starter.cli._common import ConfigOpt, _api_url, _call, _fail, _settings, console, print_table
from starter.cli.tasks import _resolve_id

quarantine_app = typer.Typer(
    help="The records runs set aside: list, show, replay, discard.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_COLUMNS = ("id", "key", "page/pos", "field", "code", "stage", "status", "message")
# The API's largest page: a replay's rows are read in as few calls as it allows.
_PAGE = 1000
_MESSAGE_CHARS = 80
_POLL_S = 0.5


class Status(StrEnum):
    """A quarantined row's status (artemis.quarantine.QuarantineStatus, spelt again here:
    importing that module loads SQLAlchemy, which no API-only command may)."""

    quarantined = "quarantined"
    replayed = "replayed"
    discarded = "discarded"


class Output(StrEnum):
    table = "table"
    json = "json"


def _short(text: str | None, size: int = _MESSAGE_CHARS) -> str:
    """The first line, cut to ``size`` characters."""
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= size else line[: size - 1] + "…"


def _rows_text(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _counts_line(counts: dict[str, int]) -> str:
    known = [s.value for s in Status]
    order = known + sorted(set(counts) - set(known))
    parts = [f"{s} {counts[s]}" for s in order if s in counts]
    return " · ".join(parts) if parts else "nothing quarantined"


def _page(
    base: str,
    settings: Settings,
    task_id: str,
    *,
    status: str | None = None,
    after: int = 0,
    limit: int = _PAGE,
) -> dict[str, Any]:
    query: dict[str, Any] = {"task_id": task_id, "after": after, "limit": limit}
    if status:
        query["status"] = status
    return _call("GET", f"{base}/quarantine", settings, params=query)["data"]


def _rows(
    base: str,
    settings: Settings,
    task_id: str,
    *,
    status: str | None = None,
    after: int = 0,
    until: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The run's rows after ``after``, oldest first, page by page (up to ``until``)."""
    while True:
        data = _page(base, settings, task_id, status=status, after=after)
        for row in data["items"]:
            if until is not None and row["id"] > until:
                return
            yield row
        after = data.get("next_after") or 0
        if not after:
            return


@quarantine_app.command("list")
def quarantine_list(
    task_id: str | None = typer.Argument(
        None, help="the run's task id (or a unique prefix of it); none: across your runs"
    ),
    status: Status | None = typer.Option(None, "--status", help="these rows only"),
    provenance: str | None = typer.Option(None, "--provenance", help="of this source only"),
    since: str | None = typer.Option(None, "--since", help="set aside since (ISO 8601)"),
    code: str | None = typer.Option(None, "--code", help="this error code only"),
    limit: int = typer.Option(100, "--limit", min=1, max=_PAGE),
    after: int = typer.Option(0, "--after", min=0, help="the next page (printed below)"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Quarantined records, oldest first, and how many there are by status: a run's, or
    (without a task id) those of your runs, by source, age and error code."""
    settings = _settings(config)
    base = _api_url(settings, api)
    query: dict[str, Any] = {"after": after, "limit": limit}
    if task_id is not None:
        query["task_id"] = _resolve_id(base, settings, task_id)
    given = {"status": status.value if status else None, "provenance": provenance}
    query.update({k: v for k, v in {**given, "since": since, "code": code}.items() if v})
    data = _call("GET", f"{base}/quarantine", settings, params=query)["data"]
    if output == Output.json:
        console.print_json(data=data)
        return
    print_table(*rows_table(data["items"], across=task_id is None))
    whose = data.get("task_id") or "across runs"
    console.print(f"{escape(whose)}: {_counts_line(data['counts'])}", highlight=False)
    if data.get("next_after"):
        console.print(f"more: --after {data['next_after']}", highlight=False)


@quarantine_app.command("show")
def quarantine_show(
    row_id: int = typer.Argument(..., min=1, help="the row's id (as `list` shows it)"),
    output: Output = typer.Option(Output.json, "-o", "--output"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """One quarantined record: why it was set aside, and the record itself."""
    settings = _settings(config)
    row = _call("GET", f"{_api_url(settings, api)}/quarantine/records/{row_id}", settings)["data"]
    if output == Output.json:
        console.print_json(data=row)
        return
    table = Table(show_header=False, box=None)
    table.add_column("field", style="bold")
    table.add_column("value")
    key = row.get("record_key")
    shown = {
        "id": row["id"],
        "task id": row["task_id"],
        "task code": row["task_code"],
        "provenance": row.get("provenance") or "",
        "page": row["page_seq"],
        "position": row["position"],
        "stage": row["stage"],
        "key": json.dumps(key, ensure_ascii=False) if key is not None else "",
        "code": row["error_code"],
        "field": row.get("field_path") or "",
        "message": row["message"],
        "status": row["status"],
        "replays": row["replays"],
        "replayed by": row.get("replayed_by") or "",
        "bytes": row["record_bytes"],
        "created": row["created_at"],
        "updated": row["updated_at"],
    }
    for name, value in shown.items():
        table.add_row(name, escape(str(value)))
    print_table(table)
    console.print("record:", highlight=False)
    console.print_json(data=row.get("record"))


def rows_table(items: list[dict[str, Any]], across: bool) -> tuple[Table, tuple[str, ...]]:
    """Quarantined rows as a table (``across``: with their task ids), and the columns a
    narrow terminal goes without, in order."""
    table = Table()
    for col in ("task id", *_COLUMNS) if across else _COLUMNS:
        table.add_column(col, no_wrap=col in ("id", "task id"))
    for r in items:
        key = r.get("record_key")
        table.add_row(
            *([escape(r["task_id"])] if across else []),
            str(r["id"]),
            escape(json.dumps(key, ensure_ascii=False) if key is not None else ""),
            f"{r['page_seq']}/{r['position']}",
            escape(r.get("field_path") or ""),
            escape(r["error_code"]),
            escape(str(r.get("stage") or "")),
            escape(r["status"]),
            escape(_short(r.get("message"))),
        )
    return table, ("page/pos", "stage", "field", "status", "task id")


def _wait_replay(
    base: str, settings: Settings, accepted: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """The replay's state once its workflow has ended (completed, failed, cancelled), as
    ``GET /quarantine/replay`` says; fails naming where it is after ``timeout``."""
    query = {"task_id": accepted["task_id"], "run_id": accepted.get("run_id")}
    deadline = time.monotonic() + timeout
    while True:
        state = _call("GET", f"{base}/quarantine/replay", settings, params=query)["data"]
        if state["status"] != RunStatus.RUNNING:
            return state
        if time.monotonic() > deadline:
            _fail(
                f"the replay of {accepted['task_id']} is still running after {timeout:g} s "
                f"({state.get('landed') or 0} landed so far; it goes on: workflow "
                f"{accepted['workflow_id']})"
            )
        time.sleep(_POLL_S)


@quarantine_app.command("replay")
def quarantine_replay(
    task_id: str = typer.Argument(..., help="the run's task id (or a unique prefix of it)"),
    ids: list[int] = typer.Option([], "--id", help="this row only (repeatable; default: all)"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="wait until the replay ends"),
    timeout: float = typer.Option(600, "--timeout", min=1, help="seconds to wait at most"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Judge a run's quarantined records again, by the task and record model in force now:
    those that fit land in the run's sinks (once), the rest stay quarantined. Waits for
    the replay's workflow to end: exit 0 when it completed (what landed and what is still
    bad printed), 1 when it failed or was cancelled (its reason printed)."""
    settings = _settings(config)
    base = _api_url(settings, api)
    task_id = _resolve_id(base, settings, task_id)
    wanted = set(ids)
    body: dict[str, Any] = {"task_id": task_id, **({"ids": sorted(wanted)} if wanted else {})}
    accepted = _call("POST", f"{base}/quarantine/replay", settings, json=body)["data"]
    console.print(
        f"replay of {escape(accepted['task_id'])} started · workflow "
        f"{escape(accepted['workflow_id'])} · {_rows_text(accepted['rows'])}",
        highlight=False,
    )
    if not wait:
        return
    state = _wait_replay(base, settings, accepted, timeout)
    if state["status"] != RunStatus.COMPLETED:
        error = state.get("error") or {}
        _fail(
            f"the replay {state['status']}: {error.get('code', '')}: "
            f"{error.get('message', 'no reason given')} (the rows stay quarantined)"
        )
    console.print(f"landed {state['landed']} · still bad {state['still_bad']}", highlight=False)
    counts = _page(base, settings, accepted["task_id"], limit=1)["counts"]
    console.print(f"{escape(accepted['task_id'])}: {_counts_line(counts)}", highlight=False)


@quarantine_app.command("discard")
def quarantine_discard(
    task_id: str = typer.Argument(..., help="the run's task id (or a unique prefix of it)"),
    ids: list[int] = typer.Option([], "--id", help="this row only (repeatable; default: all)"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Give up on a run's quarantined records: kept, marked discarded, never replayed."""
    settings = _settings(config)
    base = _api_url(settings, api)
    task_id = _resolve_id(base, settings, task_id)
    body: dict[str, Any] = {"task_id": task_id, **({"ids": sorted(set(ids))} if ids else {})}
    data = _call("POST", f"{base}/quarantine/discard", settings, json=body)["data"]
    console.print(f"discarded {data['discarded']} of {escape(data['task_id'])}", highlight=False)
