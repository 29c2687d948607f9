"""`artemis run` and `artemis tasks`: runs through the starter API (docs/api.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from artemis.run_state import RunStatus
from starter.cli._common import (
    ConfigOpt,
    _api_url,
    _call,
    _call_status,
    _fail,
    _parse_kv,
    _settings,
    console,
    err_console,
    print_table,
)
from starter.cli.watch import iter_events, watch_task

tasks_app = typer.Typer(help="Operate runs.", no_args_is_help=True, rich_markup_mode=None)

# kubectl-style: the default columns fit a terminal; -o wide adds the rest.
_COLUMNS = ("task id", "code", "source", "status", "records", "age")
_WIDE = (*_COLUMNS, "started", "completed", "error", "workflow id")
# The columns a narrow terminal goes without, first to last (the task id, code, status and
# records always stay).
DROPPED = ("workflow id", "started", "completed", "error", "source", "age")


class Output(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"


class RunOutput(StrEnum):
    """How a command that prints one run prints it."""

    json = "json"
    table = "table"


def print_run(data: dict[str, Any], output: RunOutput) -> None:
    """One run: its JSON as the API gave it, or its main fields as a two-column table."""
    if output is RunOutput.json:
        console.print_json(data=data)
        return
    stats = data.get("stats") or {}
    error = data.get("error") or {}
    stuck = data.get(RunStatus.STUCK.value) or {}
    rows = [
        ("task", f"{data.get('task_code')} {data.get('task_id')}"),
        ("status", str(data.get("status"))),
        # a run whose workflow task keeps failing: why, and what to do
        (RunStatus.STUCK.value, stuck.get("reason")),
        ("action", stuck.get("action")),
        ("provenance", data.get("provenance")),
        ("started", data.get("started_at")),
        ("ended", data.get("completed_at")),
        ("duration", f"{data['duration_ms']} ms" if data.get("duration_ms") is not None else None),
        ("pages", stats.get("pages")),
        ("fetched", stats.get("records_fetched")),
        ("emitted", stats.get("records_emitted")),
        ("quarantined", stats.get("records_quarantined") or None),
        ("error", f"{error.get('code')}: {error.get('message')}" if error else None),
        ("build", data.get("build")),
        ("workflow", data.get("workflow_id")),
    ]
    table = Table(show_header=False, box=None)
    for name, value in rows:
        if value is not None:
            table.add_row(name, escape(str(value)))
    print_table(table)


class TypesOutput(StrEnum):
    table = "table"
    json = "json"


def _age(started: str | None) -> str:
    """``5s``, ``3m``, ``2h``, ``4d`` since ``started`` (ISO), as kubectl shows an age."""
    if not started:
        return ""
    try:
        then = datetime.fromisoformat(started)
    except ValueError:
        return ""
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    s = max(0, int((datetime.now(UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _run_body(json_body: str | None, param: list[str]) -> dict[str, Any]:
    if not json_body:
        return {"params": _parse_kv(param)}
    try:
        return json.loads(json_body)
    except ValueError as e:
        _fail(f"--json is not valid JSON: {e}")
        raise  # unreachable: _fail exits


def run(
    code: str,
    param: list[str] = typer.Option(
        [],
        "-p",
        "--param",
        help="key=value, repeatable; a list: key=a,b (one item for a list param: "
        "key=a); JSON values as JSON: key='[\"a\"]'",
    ),
    json_body: str | None = typer.Option(None, "--json", help="full request body"),
    async_: bool = typer.Option(False, "--async", help="return once accepted"),
    output: RunOutput = typer.Option(RunOutput.json, "-o", "--output", help="the result's form"),
    api: str | None = typer.Option(None, help="API base URL"),
    config: Path | None = ConfigOpt,
) -> None:
    """Start a run through the API, show its progress live, print the result."""
    settings = _settings(config)
    base = _api_url(settings, api)
    body = _run_body(json_body, param)
    if param and not json_body:
        body["params"] = _as_schema(base, settings, code, body["params"])
    data = _call("POST", f"{base}/tasks/{code}/run?mode=async", settings, json=body)["data"]
    task_id = data["task_id"]
    # With -o json standard output holds the result alone; what a person reads meanwhile
    # goes to standard error.
    said = err_console if output is RunOutput.json else console
    said.print(
        f"started [bold]{escape(code)}[/bold] task {escape(task_id)} · "
        f"workflow {escape(data['workflow_id'])}"
    )
    if data.get("defaults_applied"):
        applied = ", ".join(data["defaults_applied"])
        said.print(f"from task_defaults.{escape(code)}: {escape(applied)}", highlight=False)
    # the link on a line of its own, never folded: copied whole on a narrow terminal too
    said.print("UI:", highlight=False)
    said.print(data["links"]["ui"], markup=False, highlight=False, soft_wrap=True)
    if async_:
        print_run(data, output)
        return
    final = watch_task(base, task_id, settings, to=said)
    print_run(final, output)
    if final.get("status") != RunStatus.COMPLETED:
        raise typer.Exit(1)


def _as_schema(base: str, settings: Any, code: str, params: dict[str, Any]) -> dict[str, Any]:
    """-p values shaped as the task's params schema says: a single value for a list
    param (``-p symbols=MSFT``) is a list of one."""
    try:
        schema = _call("GET", f"{base}/task-types/{code}", settings)["data"]["params_schema"]
    except (SystemExit, KeyError, TypeError):
        return params  # an unknown code: the run call says so
    props = schema.get("properties") or {}
    out = dict(params)
    for key, value in params.items():
        spec = props.get(key) or {}
        kinds = {spec.get("type")} | {a.get("type") for a in spec.get("anyOf", [])}
        if "array" in kinds and not isinstance(value, list):
            out[key] = [value]
        elif isinstance(value, list) and kinds & {"string"} and "array" not in kinds:
            out[key] = ",".join(str(v) for v in value)  # a string param keeps its commas
    return out


def task_types(
    code: str | None = typer.Argument(None, help="one task code (else all)"),
    output: TypesOutput = typer.Option(TypesOutput.table, "-o", "--output"),
    api: str | None = typer.Option(None, help="API base URL"),
    config: Path | None = ConfigOpt,
) -> None:
    """The task codes a run can start, with their params."""
    settings = _settings(config)
    base = _api_url(settings, api)
    path = f"/task-types/{code}" if code else "/task-types"
    data = _call("GET", f"{base}{path}", settings)["data"]
    items = [data] if code else list(data)
    if output == "json":
        console.print_json(data=data)
        return
    print_table(*types_table(items))


def types_table(items: list[dict[str, Any]]) -> tuple[Table, tuple[str, ...]]:
    """Task types as a table; every column folds (none leaves: there are three)."""
    table = Table()
    for col in ("code", "summary", "params (required*)"):
        table.add_column(col, no_wrap=col == "code")
    for t in items:
        schema = t.get("params_schema") or {}
        required = set(schema.get("required") or [])
        names = [f"{n}*" if n in required else n for n in (schema.get("properties") or {})]
        table.add_row(t.get("code", ""), t.get("summary", ""), ", ".join(names))
    return table, ()


def _resolve_id(base: str, settings: Any, task_id: str) -> str:
    """A task id, or a unique prefix of one (as the list shows them cut)."""
    if _call_status("GET", f"{base}/tasks/{task_id}", settings) != 404:
        return task_id
    matches: list[str] = []
    cursor = None
    for _ in range(10):  # the 2,000 newest runs
        query = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        data = _call("GET", f"{base}/tasks", settings, params=query)["data"]
        matches += [t["task_id"] for t in data["items"] if t["task_id"].startswith(task_id)]
        cursor = data.get("next_cursor")
        if not cursor:
            break
    if len(matches) == 1:
        return matches[0]
    if matches:
        _fail(f"{task_id!r} is the start of {len(matches)} task ids: " + ", ".join(matches[:5]))
    return task_id  # the API's own TASK_NOT_FOUND


def _task_row(t: dict[str, Any], wide: bool) -> tuple[str, ...]:
    row = (
        t["task_id"],
        t["task_code"],
        t.get("provenance") or "",
        t["status"],
        str((t.get("result") or {}).get("records_emitted", "")),
        _age(t.get("started_at") or t.get("created_at")),
    )
    if not wide:
        return row
    return (
        *row,
        (t.get("started_at") or "")[:19],
        (t.get("completed_at") or "")[:19],
        (t.get("error") or {}).get("code", ""),
        t.get("workflow_id", ""),
    )


def runs_table(items: list[dict[str, Any]], wide: bool) -> tuple[Table, tuple[str, ...]]:
    """Runs as a table, and the columns a narrow terminal goes without, in order."""
    table = Table(show_lines=False)
    for col in _WIDE if wide else _COLUMNS:
        # ids are never cut: every command takes a unique prefix besides
        table.add_column(col, no_wrap=col in ("task id", "workflow id", "code"))
    for t in items:
        table.add_row(*_task_row(t, wide))
    return table, DROPPED


@tasks_app.command("list")
def tasks_list(
    status: str | None = typer.Option(None, "--status", help="pending|running|completed|..."),
    code: str | None = typer.Option(None, "--code", help="task code"),
    limit: int = typer.Option(20, "--limit"),
    cursor: str | None = typer.Option(None, "--cursor", help="the next page (printed below)"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Runs from task storage, newest first."""
    settings = _settings(config)
    query = {
        "limit": limit,
        **({"status": status} if status else {}),
        **({"code": code} if code else {}),
        **({"cursor": cursor} if cursor else {}),
    }
    data = _call("GET", f"{_api_url(settings, api)}/tasks", settings, params=query)["data"]
    if output == "json":
        console.print_json(data=data)
        return
    print_table(*runs_table(data["items"], wide=output == Output.wide))
    if data.get("next_cursor"):
        # the token on a line of its own, never wrapped: it is copied whole
        console.print("more:", highlight=False)
        console.print(f"--cursor {data['next_cursor']}", highlight=False, soft_wrap=True)


@tasks_app.command("show")
def tasks_show(
    task_id: str,
    events: bool = typer.Option(False, "--events", help="also print the run's events so far"),
    output: RunOutput = typer.Option(RunOutput.json, "-o", "--output"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Status, progress, stats and error of a run (and with --events, its event stream).
    ID may be a unique prefix of a task id."""
    settings = _settings(config)
    base = _api_url(settings, api)
    task_id = _resolve_id(base, settings, task_id)
    data = _call("GET", f"{base}/tasks/{task_id}", settings)["data"]
    seen = list(iter_events(base, task_id, settings, follow=False)) if events else None
    if output is RunOutput.json:
        # one document: the run, and with --events its events under "events"
        console.print_json(data=data if seen is None else {**data, "events": seen})
        return
    print_run(data, output)
    for ev in seen or []:
        console.print(event_line(ev), highlight=False, soft_wrap=True)


def event_line(ev: dict[str, Any]) -> str:
    """An event as one line of text: its time, its kind and its fields."""
    skip = {"event", "timestamp", "task_id", "id"}
    ms = ev.get("timestamp")
    at = (
        datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
        if isinstance(ms, int | float)
        else ""
    )
    rest = " ".join(
        f"{k}={_todos(v) if k == 'todos' else _value(v)}"
        for k, v in ev.items()
        if k not in skip and v not in (None, "", [], {})
    )
    return escape(f"{at} {ev.get('event', '?')} {rest}".strip())


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _todos(todos: Any) -> str:
    """A plan's steps in a word each: ``prepare:COMPLETED,fetch:IN_PROGRESS,...``."""
    if not isinstance(todos, list) or not all(isinstance(t, dict) for t in todos):
        return _value(todos)
    steps = (f"{str(t.get('id', '')).removeprefix('step_')}:{t.get('status')}" for t in todos)
    return ",".join(steps)


def _control(task_id: str, path: str, body: dict, api: str | None, config: Path | None) -> None:
    settings = _settings(config)
    base = _api_url(settings, api)
    url = f"{base}/tasks/{_resolve_id(base, settings, task_id)}/{path}"
    console.print_json(data=_call("POST", url, settings, json=body)["data"])


@tasks_app.command("cancel")
def tasks_cancel(
    task_id: str,
    reason: str = typer.Option("cancelled from the CLI", "--reason"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Ask a run to stop (the `cancel` signal)."""
    _control(task_id, "cancel", {"reason": reason}, api, config)


@tasks_app.command("retry")
def tasks_retry(task_id: str, api: str | None = None, config: Path | None = ConfigOpt) -> None:
    """Finish a run that failed SOURCE_UNAVAILABLE, SINK_UNAVAILABLE, INTERNAL or
    TIMEOUT_ERROR from its last checkpoint (what it delivered is not fetched or sent
    again)."""
    _control(task_id, "retry", {}, api, config)


@tasks_app.command("pause")
def tasks_pause(
    task_id: str,
    reason: str = typer.Option("paused from the CLI", "--reason"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Pause a running task: the fetch in flight stops at its next page (`pausing`), then
    nothing is fetched until it is resumed (`paused`)."""
    _control(task_id, "pause", {"reason": reason}, api, config)


@tasks_app.command("resume")
def tasks_resume(task_id: str, api: str | None = None, config: Path | None = ConfigOpt) -> None:
    """Resume a paused task."""
    _control(task_id, "resume", {}, api, config)


@tasks_app.command("rate")
def tasks_rate(
    task_id: str,
    qps: float = typer.Argument(..., help="requests per second at the source"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Set a running task's request rate (from its next batch on)."""
    _control(task_id, "rate-limit", {"qps": qps}, api, config)


@tasks_app.command("watch")
def tasks_watch(
    task_id: str,
    output: RunOutput = typer.Option(RunOutput.json, "-o", "--output", help="the result's form"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Follow a run live (its steps, counters and latest activity) until it ends; exits 1
    when it ended other than completed (failed, cancelled, timed out), as `artemis run`."""
    settings = _settings(config)
    base = _api_url(settings, api)
    said = err_console if output is RunOutput.json else console
    final = watch_task(base, _resolve_id(base, settings, task_id), settings, to=said)
    print_run(final, output)
    if final.get("status") != RunStatus.COMPLETED:
        raise typer.Exit(1)
