"""`artemis registry`: the provenance registry (docs/registry.md)."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from artemis.config import Settings
from starter.cli._common import ConfigOpt, _fail, _parse_kv, _registry_engine, _settings, console

registry_app = typer.Typer(
    help="The provenance registry.", no_args_is_help=True, rich_markup_mode=None
)


def _key_file(settings: Settings) -> str:
    return settings.vault.master_key_file


def _engine(config: Path | None):
    return _registry_engine(_settings(config))


@registry_app.command("import")
def registry_import(file: Path, config: Path | None = ConfigOpt) -> None:
    """Create or update one provenance from a YAML file (all of it or nothing). The report
    lists each credential with the origins its secret is sent to and how (never the value)."""
    # lazy: importing it costs every `artemis` start-up ~0.6 s
    from artemis.registry.yaml_io import check_size, import_yaml

    settings = _settings(config)
    if not file.is_file():
        _fail(f"no such file: {file}")
    # Before reading it: an oversized file is refused without being loaded.
    check_size(file.stat().st_size, str(file))
    report = import_yaml(
        _registry_engine(settings), file.read_text(), _key_file(settings), source=str(file)
    )
    console.print_json(data=report.to_dict())


@registry_app.command("export")
def registry_export(code: str, config: Path | None = ConfigOpt) -> None:
    """Print one provenance as YAML (secrets only as their environment variable names)."""
    # lazy: importing it costs every `artemis` start-up ~0.6 s
    from artemis.registry.yaml_io import export_yaml

    sys.stdout.write(export_yaml(_engine(config), code))


class ContractOutput(StrEnum):
    json = "json"
    table = "table"


@registry_app.command("contract")
def registry_contract(
    code: str,
    task_type: str | None = typer.Option(None, "--task-type", help="harvest|update|backfill"),
    at: str | None = typer.Option(None, "--at", help="ISO timestamp (default now, UTC)"),
    usage: str = typer.Option("SEARCH", "--usage", help="endpoint usage"),
    output: ContractOutput = typer.Option(
        ContractOutput.json, "-o", "--output", help="json, or table: a line per row and resource"
    ),
    config: Path | None = ConfigOpt,
) -> None:
    """Print the execution contract resolved for CODE, a task type and an instant; a
    provenance of several resources with its tree of resources."""
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.registry.resolve import resolve_contract
    from artemis.registry.tree import resource_problems

    with _engine(config).connect() as conn:
        contract = resolve_contract(conn, code, task_type, at, usage.upper())
    if output == ContractOutput.json:
        console.print_json(data=contract.public())
        return
    for line in _contract_lines(contract.public(), resource_problems(contract)):
        typer.echo(line)


def _contract_lines(public: dict[str, Any], problems: list[str]) -> list[str]:
    """The contract as text: its provenance and instant, one line per dimension (the row
    in force, or -), then each resource indented under its parent, named by its path from
    the root (``repos → issues → comments``) with its request and place."""
    code = public["provenance"].get("provenance_code")
    out = [f"provenance {code}  task_type {public['task_type'] or '-'}  at {public['at']}"]
    for key in ("endpoint", "pagination", "window_offset", "record_model", "http"):
        out.append(f"{key}: {_row_line(public.get(key))}")
    for key in ("batching", "retry", "rate_limit", "credential"):
        out.append(f"{key}: {_row_line(public.get(key), brief=True)}")
    resources = public.get("resources") or {}
    if resources:
        out.append("resources:")
        out += [f"  {line}" for line in _tree_lines(resources)]
    else:
        out.append(f"place: {code}")
    out += [f"problem: {p}" for p in problems]
    return out


def _row_line(row: dict[str, Any] | None, brief: bool = False) -> str:
    if row is None:
        return "-"
    scope = row.get("scope_code") or "?"
    if row.get("task_type"):
        scope += f"/{row['task_type']}"
    text = f"id={row.get('id')} {scope} from {row.get('effective_from')}"
    if row.get("effective_to"):
        text += f" to {row['effective_to']}"
    if brief:
        return text
    if row.get("endpoint_usage_code"):
        text += f"  {row.get('endpoint_name')}: {_request(row)}"
    elif row.get("pagination_mode_code"):
        text += f"  {row['pagination_mode_code']}"
    return text


def _request(endpoint: dict[str, Any]) -> str:
    return f"{endpoint.get('http_method_code') or 'GET'} {endpoint.get('path_template') or ''}"


def _tree_lines(resources: dict[str, dict[str, Any]]) -> list[str]:
    """Each resource under its parent (depth first, in the contract's order); a resource
    whose parents are missing or a cycle last."""
    children: dict[str | None, list[str]] = {}
    for name, res in resources.items():
        parent = res.get("parent")
        children.setdefault(parent if parent in resources else None, []).append(name)
    out: list[str] = []
    shown: set[str] = set()

    def walk(name: str, path: list[str]) -> None:
        res = resources[name]
        shown.add(name)
        page = (res.get("pagination") or {}).get("pagination_mode_code") or "-"
        chain = " → ".join([*path, name])
        out.append(
            f"{'  ' * len(path)}{chain}  {_request(res['endpoint'])}  paging {page}  "
            f"place {res.get('place')}"
        )
        for child in children.get(name, []):
            if child not in shown:
                walk(child, [*path, name])

    for root in children.get(None, []):
        if not resources[root].get("parent"):
            walk(root, [])
    for name, res in resources.items():
        if name not in shown:  # its parents are missing or a cycle: the problems say which
            out.append(
                f"{name} (under no root: parent {res.get('parent')})  "
                f"{_request(res['endpoint'])}  place {res.get('place')}"
            )
    return out


class PreviewOutput(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


@registry_app.command("preview")
def registry_preview(
    target: str = typer.Argument(..., metavar="FILE|CODE", help="a registry file, or a code"),
    resource: str | None = typer.Option(
        None, "--resource", help="the resource to preview (default: the only or root one)"
    ),
    pages: int = typer.Option(2, "--pages", min=1, max=10, help="how many pages to fetch"),
    output: PreviewOutput = typer.Option(
        PreviewOutput.table,
        "-o",
        "--output",
        help="table; json: everything; yaml: the drafted record model only",
    ),
    config: Path | None = ConfigOpt,
) -> None:
    """Fetch the first pages of a source as a run would (same client, credentials, rate
    gate and paging), write nothing, and show the requests, the records, how paging goes
    on, what the record model would set aside or leave out, and a drafted model. A FILE
    is previewed without being imported (its secrets read from this environment)."""
    from starter.cli.preview import as_json, as_table, run_preview

    report = run_preview(_settings(config), target, resource, pages)
    if output == PreviewOutput.json:
        sys.stdout.write(as_json(report))
    elif output == PreviewOutput.yaml:
        if not report.get("drafted_yaml"):
            _fail(f"no model drafted: {report.get('draft_problem')}")
        sys.stdout.write(report["drafted_yaml"])
    else:
        sys.stdout.write(as_table(report))


@registry_app.command("check")
def registry_check(config: Path | None = ConfigOpt) -> None:
    """Overlaps, TASK rows without task type, missing endpoints; exit 1 when any."""
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.registry.writes import check_registry

    with _engine(config).connect() as conn:
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
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.registry.writes import close_row

    with _engine(config).begin() as conn:
        close_row(conn, table, row_id, at)
    console.print_json(data={"closed": {"table": table, "id": row_id}})


@registry_app.command("reopen")
def registry_reopen(table: str, row_id: int, config: Path | None = ConfigOpt) -> None:
    """Make a closed row open-ended again (refused when that overlaps another row)."""
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.registry.writes import reopen_row

    with _engine(config).begin() as conn:
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
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.registry.writes import gray_switch

    with _engine(config).begin() as conn:
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
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.registry.writes import rollback

    with _engine(config).begin() as conn:
        in_force = rollback(conn, table, new_id, old_id, at)
    console.print_json(
        data={"rolled_back": {"table": table, "closed": new_id, "in_force": in_force}}
    )


@registry_app.command("schema")
def registry_schema(
    json_schema: bool = typer.Option(
        False, "--json", help="the JSON Schema (for an editor's YAML language server)"
    ),
) -> None:
    """Every section and field of a registry YAML file, with its type and meaning."""
    # lazy: importing it costs every `artemis` start-up ~0.55 s
    from artemis.registry.file_models import json_schema as schema
    from artemis.registry.file_models import reference

    if json_schema:
        sys.stdout.write(json.dumps(schema(), indent=2) + "\n")
    else:
        sys.stdout.write(reference())
