"""The `artemis` command line (SPEC §12)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from artemis.config import Settings, load_settings
from artemis.errors import ArtemisError
from starter.service import TERMINAL

app = typer.Typer(
    help="Artemis: durable multi-source data harvesting on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
tasks_app = typer.Typer(help="Operate runs.", no_args_is_help=True)
samples_app = typer.Typer(help="The bundled sample servers.", no_args_is_help=True)
db_app = typer.Typer(help="The Artemis database.", no_args_is_help=True)
registry_app = typer.Typer(help="The provenance registry (SPEC §8).", no_args_is_help=True)
cookies_app = typer.Typer(help="The crawler's cookie pool (SPEC §10).", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
app.add_typer(samples_app, name="samples")
app.add_typer(db_app, name="db")
app.add_typer(registry_app, name="registry")
app.add_typer(cookies_app, name="cookies")

console = Console(stderr=False)
err_console = Console(stderr=True)

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config (else ARTEMIS_CONFIG)")


def _settings(config: Path | None, **overrides: Any) -> Settings:
    return load_settings(config, **overrides)


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)


def _require_master_key() -> None:
    """A cluster process never makes up its own key: API and workers must share one."""
    from artemis.vault import MASTER_KEY_ENV, master_key_missing

    value = os.environ.get(MASTER_KEY_ENV, "")
    if not value:
        _fail(master_key_missing())
    if len(value) < 32:
        _fail(f"{MASTER_KEY_ENV} is too short: at least 32 characters")


# -- servers ---------------------------------------------------------------------------------
@app.command()
def worker(config: Path | None = ConfigOpt) -> None:
    """Run one worker (production). Needs COOKIE_MASTER_KEY."""
    from workers.main import run_worker

    _require_master_key()
    settings = _settings(config)
    asyncio.run(run_worker(settings))


@app.command()
def api(config: Path | None = ConfigOpt, host: str | None = None, port: int | None = None) -> None:
    """Run the starter API (production). Needs COOKIE_MASTER_KEY."""
    import uvicorn

    from artemis.logsetup import configure_logging
    from starter.api.app import create_app

    _require_master_key()
    settings = _settings(config)
    host = host or settings.server.host
    port = port or settings.server.port
    if host not in ("127.0.0.1", "localhost", "::1") and not settings.server.api_tokens:
        _fail(f"refusing to bind {host} with no server.api_tokens configured")
    configure_logging(settings.logging)
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None, access_log=False)


@samples_app.command("serve")
def samples_serve(
    port: int = typer.Option(8300, help="port on 127.0.0.1"),
    latency_ms: float = typer.Option(0.0, help="added to every quote page"),
) -> None:
    """Serve the sample quote API, sink receiver and CronJob receiver."""
    import uvicorn

    from artemis.samples.app import create_app

    console.print(f"sample servers on http://127.0.0.1:{port} (quotes, /sink, /cronjob)")
    uvicorn.run(
        create_app(latency_ms), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )


@db_app.command("upgrade")
def db_upgrade(config: Path | None = ConfigOpt) -> None:
    """Apply the database migrations."""
    from artemis.migrate import upgrade

    settings = _settings(config)
    upgrade(settings.database.url)
    console.print(f"database at {settings.database.url} is up to date")


# -- cookies ------------------------------------------------------------------------------------
@cookies_app.command("add")
def cookies_add(
    platform: str = typer.Option(..., "--platform", help="the platform it logs in to"),
    name: str = typer.Option(..., "--name", help="a unique name (adding it again replaces it)"),
    priority: int = typer.Option(0, "--priority", help="higher is used first"),
    daily_limit: int = typer.Option(500, "--daily-limit", help="requests per UTC day"),
    config: Path | None = ConfigOpt,
) -> None:
    """Store a cookie, encrypted. The cookie string (`web_session=…`) is read from stdin,
    never from the command line (argv is visible to every user of the machine)."""
    from artemis.crawler.cookies import add_cookie
    from artemis.crawler.vault import vault_for

    if sys.stdin.isatty():
        err_console.print("paste the cookie, then Ctrl-D:")
    value = sys.stdin.read()
    if not value.strip():
        _fail("no cookie on stdin (e.g. `artemis cookies add ... < cookie.txt`)")
    settings = _settings(config)
    vault = vault_for(settings)
    outcome = add_cookie(vault.engine, vault, platform, name, value, priority, daily_limit)
    console.print(f"cookie {name} for {platform}: {outcome} (encrypted)")


@cookies_app.command("list")
def cookies_list(
    platform: str | None = typer.Option(None, "--platform"), config: Path | None = ConfigOpt
) -> None:
    """The pool: status, priority, today's use and errors (never the values)."""
    from artemis.crawler.cookies import list_cookies

    settings = _settings(config)
    table = Table()
    cols = ("name", "platform", "status", "priority", "used today", "errors", "cooling until")
    for col in cols:
        table.add_column(col)
    for c in list_cookies(_registry_engine(settings), platform):
        table.add_row(
            str(c["cookie_name"]),
            str(c["platform"]),
            str(c["status"]),
            str(c["priority"]),
            f"{c['daily_used']}/{c['daily_limit']}",
            f"{c['consecutive_errors']} in a row, {c['total_errors']} in all",
            str(c["cooling_until"] or ""),
        )
    console.print(table)


@cookies_app.command("disable")
def cookies_disable(name: str, config: Path | None = ConfigOpt) -> None:
    """Take a cookie out of the pool."""
    from artemis.crawler.cookies import set_cookie_status

    set_cookie_status(_registry_engine(_settings(config)), name, "disabled")
    console.print(f"cookie {name}: disabled")


@cookies_app.command("enable")
def cookies_enable(name: str, config: Path | None = ConfigOpt) -> None:
    """Put a cookie back in the pool (active, error counts cleared)."""
    from artemis.crawler.cookies import set_cookie_status

    set_cookie_status(_registry_engine(_settings(config)), name, "active")
    console.print(f"cookie {name}: active")


@cookies_app.command("rotate-key")
def cookies_rotate_key(
    new_master_key_env: str | None = typer.Option(
        None,
        "--new-master-key-env",
        help="name of an environment variable holding the new master key; without it the "
        "key is renewed under the current master key (a new salt)",
    ),
    config: Path | None = ConfigOpt,
) -> None:
    """Re-encrypt every cookie, credential secret and run secret under a new key
    (MultiFernet) and retire the old keys."""
    from artemis.crawler.vault import vault_for
    from artemis.vault import RunSecrets

    new_master = None
    if new_master_key_env:
        raw = os.environ.get(new_master_key_env)
        if not raw:
            _fail(f"--new-master-key-env: ${new_master_key_env} is not set")
        new_master = (raw or "").encode()
    settings = _settings(config)
    vault = vault_for(settings)
    readable = [vault.master, *vault.previous]
    result = vault.rotate(new_master)
    # The run secrets (callback tokens of open runs) move too; payloads already in Temporal
    # histories stay readable through COOKIE_MASTER_KEYS_READ.
    run_secrets = RunSecrets(
        settings.database.url, masters=[new_master or vault.master, *readable]
    ).rotate_all()
    console.print_json(
        data={
            "new_key_id": result.new_key_id,
            "rows": result.rows,
            "run_secrets": run_secrets,
            "retired": result.retired,
        }
    )
    if new_master_key_env:
        err_console.print(
            f"every worker and API needs COOKIE_MASTER_KEY = ${new_master_key_env} and the "
            "old key in COOKIE_MASTER_KEYS_READ until no history needs it (README: Keys and "
            "rotation on a cluster)"
        )


# -- audit ---------------------------------------------------------------------------------------
@app.command()
def audit(
    histories: int = typer.Option(
        200, "--histories", help="how many recent Artemis workflow histories to scan (0: none)"
    ),
    config: Path | None = ConfigOpt,
) -> None:
    """Scan the database, the log files and Temporal histories for secrets in clear; print
    JSON with `passed` and the findings (never the secrets); exit 1 when it fails."""
    from artemis.audit import Auditor, Finding
    from artemis.crawler.vault import vault_for

    settings = _settings(config)
    auditor = Auditor()
    vault = vault_for(settings)
    auditor.learn_database_secrets(vault.engine, vault)
    auditor.scan_database(vault.engine)
    if settings.logging.output == "file":
        auditor.scan_logs(settings.logging.file.path)
    if histories > 0:
        try:
            auditor.scan_histories(asyncio.run(_histories(settings, histories)))
        except Exception as e:  # an audit that could not look does not pass
            auditor.report.findings.append(
                Finding("temporal", f"histories not scanned: {type(e).__name__}: {e}")
            )
    report = auditor.report
    console.print_json(data=report.to_dict())
    if histories > 0:
        # The Temporal SDK's core runtime can abort (SIGABRT) while the interpreter tears
        # down after asyncio.run closed its loop (seen once in six suite runs): the report
        # is complete once printed, so leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if report.passed else 1)
    raise typer.Exit(0 if report.passed else 1)


async def _histories(settings: Settings, limit: int) -> list[tuple[str, str]]:
    from workers.client import connect

    client = await connect(settings)
    out: list[tuple[str, str]] = []
    async for wf in client.list_workflows("WorkflowId STARTS_WITH 'artemis/'", limit=limit):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        out.append((f"{wf.id}/{wf.run_id}", history.to_json()))
    return out


# -- provenance registry -------------------------------------------------------------------------
def _registry_engine(settings: Settings):
    from artemis.db import get_engine

    return get_engine(settings.database.url)


def _key_file(settings: Settings) -> str:
    return settings.vault.get("master_key_file", ".artemis/master.key")


@registry_app.command("import")
def registry_import(file: Path, config: Path | None = ConfigOpt) -> None:
    """Create or update one provenance from a YAML file (all of it or nothing)."""
    from artemis.registry.yaml_io import import_yaml

    settings = _settings(config)
    if not file.is_file():
        _fail(f"no such file: {file}")
    report = import_yaml(
        _registry_engine(settings), file.read_text(), _key_file(settings), source=str(file)
    )
    console.print_json(data=report.to_dict())


@registry_app.command("export")
def registry_export(code: str, config: Path | None = ConfigOpt) -> None:
    """Print one provenance as YAML (secrets only as their environment variable names)."""
    from artemis.registry.yaml_io import export_yaml

    settings = _settings(config)
    sys.stdout.write(export_yaml(_registry_engine(settings), code))


@registry_app.command("contract")
def registry_contract(
    code: str,
    task_type: str | None = typer.Option(None, "--task-type", help="harvest|update|backfill"),
    at: str | None = typer.Option(None, "--at", help="ISO timestamp (default now, UTC)"),
    usage: str = typer.Option("SEARCH", "--usage", help="endpoint usage"),
    config: Path | None = ConfigOpt,
) -> None:
    """Print the execution contract resolved for CODE, a task type and an instant."""
    from artemis.registry.resolve import resolve_contract

    settings = _settings(config)
    with _registry_engine(settings).connect() as conn:
        contract = resolve_contract(conn, code, task_type, at, usage.upper())
    console.print_json(data=contract.public())


@registry_app.command("check")
def registry_check(config: Path | None = ConfigOpt) -> None:
    """Overlaps, TASK rows without task type, missing endpoints; exit 1 when any."""
    from artemis.registry.writes import check_registry

    settings = _settings(config)
    with _registry_engine(settings).connect() as conn:
        findings = check_registry(conn)
    console.print_json(data={"passed": not findings, "findings": findings})
    if findings:
        raise typer.Exit(1)


@registry_app.command("close")
def registry_close(
    table: str,
    row_id: int,
    at: str | None = typer.Option(None, "--at", help="ISO timestamp"),
    config: Path | None = ConfigOpt,
) -> None:
    """End a row's interval at --at (default now)."""
    from artemis.registry.writes import close_row

    settings = _settings(config)
    with _registry_engine(settings).begin() as conn:
        close_row(conn, table, row_id, at)
    console.print_json(data={"closed": {"table": table, "id": row_id}})


@registry_app.command("reopen")
def registry_reopen(table: str, row_id: int, config: Path | None = ConfigOpt) -> None:
    """Make a closed row open-ended again (refused when that overlaps another row)."""
    from artemis.registry.writes import reopen_row

    settings = _settings(config)
    with _registry_engine(settings).begin() as conn:
        reopen_row(conn, table, row_id)
    console.print_json(data={"reopened": {"table": table, "id": row_id}})


@registry_app.command("switch")
def registry_switch(
    table: str,
    old_id: int,
    at: str = typer.Option(..., "--at", help="when the new row takes over"),
    set_: list[str] = typer.Option([], "--set", help="column=value (JSON ok)"),
    config: Path | None = ConfigOpt,
) -> None:
    """Gray switch: a copy of OLD_ID with --set changes takes over at --at; the old closes."""
    from artemis.registry.writes import gray_switch

    settings = _settings(config)
    with _registry_engine(settings).begin() as conn:
        new_id = gray_switch(conn, table, old_id, _parse_kv(set_), at)
    console.print_json(
        data={"switched": {"table": table, "old_id": old_id, "new_id": new_id, "at": at}}
    )


@registry_app.command("rollback")
def registry_rollback(
    table: str,
    new_id: int,
    old_id: int,
    at: str | None = typer.Option(None, "--at", help="default now"),
    config: Path | None = ConfigOpt,
) -> None:
    """Undo a switch: close NEW_ID and put OLD_ID's configuration back in force."""
    from artemis.registry.writes import rollback

    settings = _settings(config)
    with _registry_engine(settings).begin() as conn:
        in_force = rollback(conn, table, new_id, old_id, at)
    console.print_json(
        data={"rolled_back": {"table": table, "closed": new_id, "in_force": in_force}}
    )


# -- the embedded stack ------------------------------------------------------------------------
@app.command()
def dev(
    config: Path | None = ConfigOpt,
    data_dir: Path = typer.Option(Path(".artemis"), help="state folder"),
    api_port: int = typer.Option(8000),
    temporal_port: int = typer.Option(7233),
    ui_port: int = typer.Option(8233),
    samples_port: int = typer.Option(8300),
    no_samples: bool = typer.Option(False, "--no-samples"),
) -> None:
    """Run the whole embedded stack in the foreground until Ctrl-C."""
    from starter.devstack import DevStack

    stack = DevStack(
        config, data_dir, api_port, temporal_port, ui_port, samples_port, samples=not no_samples
    )
    asyncio.run(stack.run_forever())


@app.command()
def demo(
    config: Path | None = ConfigOpt,
    data_dir: Path = typer.Option(Path(".artemis"), help="state folder"),
    api_port: int = typer.Option(8000),
    temporal_port: int = typer.Option(7233),
    ui_port: int = typer.Option(8233),
    samples_port: int = typer.Option(8300),
    exit_: bool = typer.Option(False, "--exit", help="return when the samples are done"),
) -> None:
    """Start the embedded stack, run the sample tasks with live progress, print a summary."""
    from starter.devstack import DevStack

    stack = DevStack(config, data_dir, api_port, temporal_port, ui_port, samples_port)
    ok = asyncio.run(stack.demo(stay=not exit_))
    raise typer.Exit(0 if ok else 1)


# -- runs through the API -------------------------------------------------------------------------
def _api_url(settings: Settings, api: str | None) -> str:
    return (
        api
        or os.environ.get("ARTEMIS_API")
        or f"http://{settings.server.host}:{settings.server.port}"
    )


def _headers(settings: Settings) -> dict[str, str]:
    token = os.environ.get("ARTEMIS_API_TOKEN") or (settings.server.api_tokens or [None])[0]
    return {"Authorization": f"Bearer {token}"} if token else {}


def _call(method: str, url: str, settings: Settings, **kw: Any) -> dict[str, Any]:
    try:
        resp = httpx.request(method, url, headers=_headers(settings), timeout=30, **kw)
    except httpx.HTTPError as e:
        _fail(f"cannot reach the Artemis API at {url}: {e}")
    data = _json_of(resp, f"{method} {url}")
    if (
        not data.get("success")
        and data.get("error")
        and resp.status_code >= 400
        and not data.get("data")
    ):
        e = data["error"]
        _fail(f"{e.get('code')}: {e.get('message')}")
    return data


def _json_of(resp: httpx.Response, what: str) -> dict[str, Any]:
    try:
        return resp.json()
    except ValueError:
        _fail(f"{what} answered {resp.status_code} without JSON")
        raise  # unreachable: _fail exits


def _call_error(resp: httpx.Response, what: str) -> None:
    """Exit with the API's error code and message."""
    e = _json_of(resp, what).get("error") or {}
    _fail(f"{e.get('code', resp.status_code)}: {e.get('message', what)}")


def _parse_kv(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            _fail(f"-p expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value.split(",") if "," in value else value
    return out


_ICONS = {
    "PENDING": "[dim]○ pending[/dim]",
    "IN_PROGRESS": "[yellow]◐ in progress[/yellow]",
    "COMPLETED": "[green]● completed[/green]",
    "ERROR": "[red]✖ error[/red]",
}


def iter_events(
    base: str, task_id: str, settings: Settings, follow: bool = True
) -> Iterator[dict[str, Any]]:
    """The run's SSE events; reconnects with Last-Event-ID when the connection drops."""
    last: str | None = None
    failures = 0
    while True:
        headers = {**_headers(settings), **({"Last-Event-ID": last} if last else {})}
        params = {} if follow else {"follow": "false"}
        try:
            with httpx.stream(
                "GET",
                f"{base}/tasks/{task_id}/events",
                headers=headers,
                params=params,
                timeout=httpx.Timeout(30, read=None),
            ) as resp:
                if resp.status_code != 200:
                    resp.read()
                    _call_error(resp, f"GET {base}/tasks/{task_id}/events")
                sse_id = None
                for line in resp.iter_lines():
                    if line.startswith("id: "):
                        sse_id = line[4:]
                    elif line.startswith("data: "):
                        failures = 0
                        last = sse_id
                        event = json.loads(line[6:])
                        yield event
                        if event.get("event") in ("complete", "error", "cancelled"):
                            return
            if not follow:
                return
        except httpx.HTTPError as e:
            failures += 1
            if failures > 5:
                _fail(f"lost the event stream of {task_id}: {e}")
            time.sleep(min(2.0, 0.2 * 2**failures))


class StepView:
    """A live table of the run's plan steps, counters and latest activity."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.todos: list[dict[str, str]] = []
        self.counters: dict[str, Any] = {}
        self.last = ""
        self.ended: dict[str, Any] | None = None

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "plan_update":
            self.todos = ev.get("todos", [])
        elif kind == "progress":
            self.counters = ev
        elif kind in ("activity_start", "activity_result"):
            what = (
                "started" if kind == "activity_start" else ("failed" if ev.get("error") else "done")
            )
            detail = ""
            if kind == "activity_result" and ev.get("error"):
                err = ev.get("data") or {}
                detail = f" · {err.get('code')}: {err.get('message')}"
            self.last = escape(
                f"{ev.get('activity')} ({ev.get('summary')}) "
                f"attempt {ev.get('attempt')} {what}{detail}"
            )
        elif kind in ("complete", "error", "cancelled"):
            self.ended = ev

    def __rich__(self) -> Table:
        table = Table(title=f"task {self.task_id}", show_header=False, box=None)
        table.add_column("step")
        table.add_column("status")
        for t in self.todos:
            table.add_row(t.get("content", t["id"]), _ICONS.get(t["status"], t["status"]))
        c = self.counters
        if c:
            total = c.get("total") or 0
            units = f"{c.get('current', 0)}/{total} units · " if total else ""
            table.add_row(
                "progress",
                f"{units}{c.get('pages', 0)} pages · "
                f"{c.get('records_fetched', 0)} fetched · {c.get('records_emitted', 0)} emitted",
            )
        if self.last:
            table.add_row("latest", self.last)
        if self.ended:
            table.add_row("result", f"[bold]{self.ended.get('event')}[/bold]")
        return table


def watch_task(base: str, task_id: str, settings: Settings, quiet: bool = False) -> dict[str, Any]:
    """Show the run's steps live (from its event stream) until it ends; return its status."""
    view = StepView(task_id)
    with (
        Live(view, console=console, refresh_per_second=8, transient=False)
        if not quiet
        else nullcontext()
    ):
        for ev in iter_events(base, task_id, settings):
            view.apply(ev)
    if not quiet:
        console.line()
    # The terminal event comes a moment before the workflow closes: wait for the record.
    deadline = time.monotonic() + 30
    while True:
        data = _call("GET", f"{base}/tasks/{task_id}", settings)["data"]
        if (
            data.get("status") in TERMINAL
            and data.get("completed_at")
            or time.monotonic() > deadline
        ):
            return data
        time.sleep(0.2)


@app.command()
def run(
    code: str,
    param: list[str] = typer.Option([], "-p", "--param", help="key=value"),
    json_body: str | None = typer.Option(None, "--json", help="full request body"),
    async_: bool = typer.Option(False, "--async", help="return once accepted"),
    api: str | None = typer.Option(None, help="API base URL"),
    config: Path | None = ConfigOpt,
) -> None:
    """Start a run through the API, show its progress live, print the result."""
    settings = _settings(config)
    base = _api_url(settings, api)
    if json_body:
        try:
            body = json.loads(json_body)
        except ValueError as e:
            _fail(f"--json is not valid JSON: {e}")
    else:
        body = {"params": _parse_kv(param)}
    data = _call("POST", f"{base}/tasks/{code}/run?mode=async", settings, json=body)["data"]
    task_id = data["task_id"]
    console.print(f"started [bold]{code}[/bold] task {task_id} · workflow {data['workflow_id']}")
    console.print(f"UI: {data['links']['ui']}")
    if async_:
        console.print_json(data=data)
        return
    final = watch_task(base, task_id, settings)
    console.print_json(data=final)
    if final.get("status") != "completed":
        raise typer.Exit(1)


@tasks_app.command("list")
def tasks_list(
    status: str | None = typer.Option(None, "--status", help="pending|running|completed|..."),
    code: str | None = typer.Option(None, "--code", help="task code"),
    limit: int = typer.Option(20, "--limit"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Runs from task storage, newest first."""
    settings = _settings(config)
    query = {
        "limit": limit,
        **({"status": status} if status else {}),
        **({"code": code} if code else {}),
    }
    data = _call("GET", f"{_api_url(settings, api)}/tasks", settings, params=query)["data"]
    table = Table(show_lines=False)
    for col in ("task id", "code", "status", "records", "started", "completed", "error"):
        table.add_column(col)
    for t in data["items"]:
        table.add_row(
            t["task_id"],
            t["task_code"],
            t["status"],
            str((t.get("result") or {}).get("records_emitted", "")),
            (t.get("started_at") or "")[:19],
            (t.get("completed_at") or "")[:19],
            (t.get("error") or {}).get("code", ""),
        )
    console.print(table)
    if data.get("next_cursor"):
        console.print(f"more: --cursor {data['next_cursor']}")


@tasks_app.command("show")
def tasks_show(
    task_id: str,
    events: bool = typer.Option(False, "--events", help="also print the run's events so far"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Status, progress, stats and error of a run (and with --events, its event stream)."""
    settings = _settings(config)
    base = _api_url(settings, api)
    console.print_json(data=_call("GET", f"{base}/tasks/{task_id}", settings)["data"])
    if events:
        for ev in iter_events(base, task_id, settings, follow=False):
            console.print(json.dumps(ev, ensure_ascii=False), highlight=False, soft_wrap=True)


@tasks_app.command("cancel")
def tasks_cancel(
    task_id: str,
    reason: str = typer.Option("cancelled from the CLI", "--reason"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Ask a run to stop (the `cancel` signal)."""
    settings = _settings(config)
    console.print_json(
        data=_call(
            "POST",
            f"{_api_url(settings, api)}/tasks/{task_id}/cancel",
            settings,
            json={"reason": reason},
        )["data"]
    )


def _control(task_id: str, path: str, body: dict, api: str | None, config: Path | None) -> None:
    settings = _settings(config)
    url = f"{_api_url(settings, api)}/tasks/{task_id}/{path}"
    console.print_json(data=_call("POST", url, settings, json=body)["data"])


@tasks_app.command("pause")
def tasks_pause(
    task_id: str,
    reason: str = typer.Option("paused from the CLI", "--reason"),
    api: str | None = None,
    config: Path | None = ConfigOpt,
) -> None:
    """Pause a running task: nothing is fetched until it is resumed (the batch in flight
    finishes first)."""
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
def tasks_watch(task_id: str, api: str | None = None, config: Path | None = ConfigOpt) -> None:
    """Follow a run live (its steps, counters and latest activity) until it ends."""
    settings = _settings(config)
    final = watch_task(_api_url(settings, api), task_id, settings)
    console.print_json(data=final)


def main() -> None:
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    except (AttributeError, ValueError):
        pass
    try:
        app()
    except ArtemisError as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False)
        sys.exit(1)
    except Exception as e:  # one line, never a traceback (which could carry secrets)
        from artemis.logsetup import redact_text

        err_console.print(
            f"[red]error:[/red] {redact_text(f'{type(e).__name__}: {e}')}", highlight=False
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
