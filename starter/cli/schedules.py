"""`artemis schedules`: task runs Temporal starts on a calendar, through the API's
``/schedules`` (an operator or admin token; docs/schedules.md)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from starter.cli._common import (
    ConfigOpt,
    _api_url,
    _call,
    _fail,
    _parse_kv,
    _settings,
    console,
    print_table,
)

schedules_app = typer.Typer(
    help="Task runs Temporal starts on a calendar (every hour, at 02:00, a cron).",
    no_args_is_help=True,
)


class Output(StrEnum):
    table = "table"
    json = "json"


def _base(api: str | None, config: Path | None) -> tuple[str, Any]:
    settings = _settings(config)
    return f"{_api_url(settings, api)}/schedules", settings


@schedules_app.command("create")
def schedules_create(
    name: str,
    task: str | None = typer.Option(None, "--task", help="the task code, e.g. source_harvest"),
    param: list[str] = typer.Option([], "-p", "--param", help="key=value (repeatable)"),
    every: str | None = typer.Option(None, "--every", help="an interval: 90s, 15m, 1h, 1d"),
    offset: str | None = typer.Option(None, "--offset", help="with --every: 15m past each"),
    cron: str | None = typer.Option(None, "--cron", help='five fields, e.g. "0 2 * * *"'),
    at: str | None = typer.Option(None, "--at", help="every day at HH:MM"),
    time_zone: str | None = typer.Option(
        None, "--time-zone", help="IANA name (default: the provenance's, else UTC)"
    ),
    overlap: str = typer.Option("skip", "--overlap", help="skip | buffer_one"),
    catchup: str = typer.Option("1h", "--catchup", help="how late a missed start may go"),
    jitter: str = typer.Option("0", "--jitter", help="delay each start by up to this"),
    paused: bool = typer.Option(False, "--paused", help="made paused"),
    note: str | None = typer.Option(None, "--note"),
    json_body: str | None = typer.Option(None, "--json", help="the whole definition as JSON"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Make a schedule: NAME starts TASK with the params -p on a calendar."""
    base, settings = _base(api, config)
    if json_body is not None:
        try:
            body = json.loads(json_body)
        except ValueError as e:
            _fail(f"--json: not JSON ({e})")
        body.setdefault("name", name)
    else:
        given = {
            "every": every,
            "offset": offset,
            "cron": cron,
            "at": at,
            "time_zone": time_zone,
            "note": note,
        }
        body = {
            "name": name,
            **({"task": task} if task else {}),
            "params": _parse_kv(param),
            "overlap": overlap,
            "catchup_window": catchup,
            "jitter": jitter,
            "paused": paused,
            **{k: v for k, v in given.items() if v is not None},
        }
    console.print_json(data=_call("POST", base, settings, json=body)["data"])


@schedules_app.command("list")
def schedules_list(
    output: Output = typer.Option(Output.table, "-o", "--output"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """The schedules Artemis made for this task queue."""
    base, settings = _base(api, config)
    items = _call("GET", base, settings)["data"]["items"]
    if output == Output.json:
        console.print_json(data=items)
        return
    print_table(*schedules_table(items))


def schedules_table(items: list[dict[str, Any]]) -> tuple[Table, tuple[str, ...]]:
    """The schedules as a table, and the columns a narrow terminal goes without, in order."""
    table = Table(show_lines=False)
    for col in ("name", "task", "when", "state", "next start", "starts", "by"):
        table.add_column(col, no_wrap=col in ("name", "next start"))
    for s in items:
        table.add_row(
            escape(s["name"]),
            escape(str(s.get("task") or "")),
            escape(s["when"] + ("" if s["time_zone"] == "UTC" else f" ({s['time_zone']})")),
            "paused" if s["paused"] else "active",
            escape(str((s.get("next_starts") or [None])[0] or "")),
            str(s["starts"]),
            escape(str(s.get("made_by") or "")),
        )
    return table, ("by", "starts", "next start", "task")


@schedules_app.command("show")
def schedules_show(
    name: str,
    output: Output = typer.Option(Output.json, "-o", "--output"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """A schedule: what it starts, when, its next starts and how its last ones went."""
    base, settings = _base(api, config)
    data = _call("GET", f"{base}/{name}", settings)["data"]
    if output == Output.json:
        console.print_json(data=data)
        return
    for key in ("name", "task", "owner", "when", "time_zone", "overlap", "paused", "note"):
        console.print(f"{key}: {escape(str(data.get(key)))}", highlight=False)
    console.print(f"params: {escape(json.dumps(data.get('params')))}", highlight=False)
    console.print(f"next starts: {', '.join(_second(t) for t in data['next_starts'][:3])}")
    print_table(*recent_table(data.get("recent") or []))


def recent_table(recent: list[dict[str, Any]]) -> tuple[Table, tuple[str, ...]]:
    """A schedule's last starts as a table, and the columns a narrow terminal goes
    without, in order (the task id stays: it is what `tasks show` takes)."""
    table = Table(show_lines=False)
    for col in ("scheduled at", "outcome", "task id", "status / reason"):
        table.add_column(col, no_wrap=col != "status / reason")
    for r in recent:
        table.add_row(
            _second(r.get("scheduled_at")),
            str(r.get("outcome")),
            escape(str(r.get("task_id") or "")),
            escape(str(r.get("status") or r.get("reason") or "")),
        )
    return table, ("outcome", "scheduled at")


def _second(iso: str | None) -> str:
    """``2026-11-29T08:36:33.378149+00:00`` as ``2026-11-29 08:36:33Z``."""
    return f"{iso[:10]} {iso[11:19]}Z" if iso else ""


def _act(name: str, action: str, body: dict[str, Any] | None, api: str | None, config: Any) -> None:
    base, settings = _base(api, config)
    console.print_json(data=_call("POST", f"{base}/{name}/{action}", settings, json=body)["data"])


@schedules_app.command("pause")
def schedules_pause(
    name: str,
    note: str = typer.Option("", "--note", help="why (shown in the Temporal UI)"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Pause a schedule: no start until it is unpaused."""
    _act(name, "pause", {"note": note}, api, config)


@schedules_app.command("unpause")
def schedules_unpause(
    name: str,
    note: str = typer.Option("", "--note"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Unpause a schedule."""
    _act(name, "unpause", {"note": note}, api, config)


@schedules_app.command("trigger")
def schedules_trigger(name: str, api: str | None = None, config: Path | None = ConfigOpt) -> None:
    """Start the schedule's run now (the overlap policy applies)."""
    _act(name, "trigger", {}, api, config)


@schedules_app.command("delete")
def schedules_delete(name: str, api: str | None = None, config: Path | None = ConfigOpt) -> None:
    """Delete a schedule (the runs it started go on)."""
    base, settings = _base(api, config)
    # a JSON body: an API without tokens takes state changes as JSON only (CSRF)
    console.print_json(data=_call("DELETE", f"{base}/{name}", settings, json={})["data"])
