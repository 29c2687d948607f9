"""`artemis builds`: the worker builds Temporal knows for this task queue, which one new
runs start on, and moving new runs to another (artemis/temporal/versioning.py).

A run stays on the build it started on; `promote` changes where new runs start."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from artemis.config import Settings
from starter.cli._common import ConfigOpt, _fail, _settings, console, print_table

builds_app = typer.Typer(
    help="Worker builds: list them, make one current.", no_args_is_help=True, rich_markup_mode=None
)


class Output(StrEnum):
    table = "table"
    json = "json"


def _deployment(settings: Settings) -> tuple[str, str]:
    queue = settings.temporal.task_queue
    return settings.temporal.deployment_name or queue, queue


async def _list(settings: Settings) -> list[dict[str, Any]]:
    # lazy: the Temporal client costs every `artemis` start-up ~0.55 s
    from artemis.temporal.client import connect
    from artemis.temporal.versioning import builds, code_build_id

    client = await connect(settings)
    deployment, queue = _deployment(settings)
    mine = settings.worker.build_id or code_build_id()
    return [
        {
            "build_id": b.build_id,
            "status": b.status,
            "polled": b.polled,
            "stranded": b.stranded,
            "created_at": b.created_at,
            "this_code": b.build_id == mine,
        }
        for b in await builds(client, deployment, queue)
    ]


def _exit(code: int) -> None:
    # The SDK's core runtime can abort while the interpreter tears down after
    # asyncio.run (see starter/cli/audit.py): the answer is printed, leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def builds_table(rows: list[dict[str, Any]]) -> tuple[Table, tuple[str, ...]]:
    """The builds as a table, and the columns a narrow terminal goes without, in order."""
    table = Table("build", "status", "polled", "created", "note")
    table.columns[0].no_wrap = True  # copied whole into `builds promote`
    for r in rows:
        note = "this code" if r["this_code"] else ""
        if r["stranded"]:
            note = "runs wait for a worker of this build"
        table.add_row(
            r["build_id"], r["status"], "yes" if r["polled"] else "no", r["created_at"], note
        )
    return table, ("created", "polled")


@builds_app.command("list")
def list_builds(
    output: Output = typer.Option(Output.table, "--output", "-o"),
    config: Path | None = ConfigOpt,
) -> None:
    """The deployment's builds, newest first; exit 1 when runs wait on a build that no
    worker polls (stranded)."""
    settings = _settings(config)
    rows = asyncio.run(_list(settings))
    if output is Output.json:
        console.print_json(json.dumps(rows))
    else:
        print_table(*builds_table(rows))
    _exit(1 if any(r["stranded"] for r in rows) else 0)


@builds_app.command("id")
def build_id(
    explain_: bool = typer.Option(
        False, "--explain", help="also list the modules the digest is taken of"
    ),
    config: Path | None = ConfigOpt,
) -> None:
    """The build a worker started here polls as (worker.build_id, else the digest of the
    workflow code in this installation)."""
    from artemis.temporal.versioning import worker_build

    settings = _settings(config)
    t = settings.temporal
    console.print(worker_build(t.deployment_name, t.task_queue, settings.worker.build_id).build_id)
    if explain_:
        explain()


def explain(out: Console | None = None) -> None:
    """The modules the code's build id is a digest of (what the workflows execute), with
    their lines, and that digest (on ``out``, standard output unless told)."""
    from artemis.temporal.versioning import ROOT, code_build_id, workflow_modules

    modules = sorted(workflow_modules().items())
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules}
    out = out or console
    out.print(
        f"the code's build id {code_build_id()}: a digest of Temporal's SDK version and of "
        f"{len(modules)} modules, {sum(lines.values())} lines:",
        highlight=False,
    )
    for name, path in modules:
        where = path.relative_to(ROOT).as_posix()
        out.print(f"  {name:<34} {lines[name]:>5}  {where}", highlight=False, soft_wrap=True)


@builds_app.command("promote")
def promote(
    build_id: str = typer.Argument(..., help="the build new runs start on from now"),
    wait_s: float = typer.Option(30.0, "--wait", help="how long to wait for its worker"),
    config: Path | None = ConfigOpt,
) -> None:
    """Make BUILD_ID the build new runs start on (its worker must be polling). Runs
    already started stay on their builds."""
    settings = _settings(config)

    async def go() -> str:
        # lazy: the Temporal client costs every `artemis` start-up ~0.55 s
        from artemis.temporal.client import connect
        from artemis.temporal.versioning import build_of, make_current

        client = await connect(settings)
        build = build_of(_deployment(settings)[0], build_id)
        return await make_current(client, build, replace=True, polled=False, timeout=wait_s)

    try:
        current = asyncio.run(go())
    except Exception as e:
        _fail(str(e))
        return
    console.print(f"current build: {current}", highlight=False)
    _exit(0)
