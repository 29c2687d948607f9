"""The full `artemis` command: the starter's commands (`starter/cli/`) and the
ones that run a worker — `worker` (production) and the embedded stack's `dev` and `demo`.

The worker and the stack are imported when their command runs: they load Temporal's
worker, the workflows and the API (seconds), which `artemis tasks list` does not need.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
import uvloop

from starter.cli import app as starter_app
from starter.cli import root_app, run
from starter.cli._common import ConfigOpt, _require_master_key, _settings

DataDirOpt = typer.Option(Path(".artemis"), help="state folder")
ApiPortOpt = typer.Option(8000)
TemporalPortOpt = typer.Option(7233)
UiPortOpt = typer.Option(8233)
SamplesPortOpt = typer.Option(8300)


def worker(
    config: Path | None = ConfigOpt,
    build_id: str | None = typer.Option(
        None,
        "--build-id",
        help="the build this worker polls as (default: a digest of the workflow code)",
    ),
) -> None:
    """Run one worker (production). Needs COOKIE_MASTER_KEY."""
    # lazy: importing it costs every `artemis` start-up ~1.0 s
    from workers.main import run_worker

    _require_master_key()
    settings = _settings(config)
    if build_id is not None:
        settings = settings.model_copy(
            update={"worker": settings.worker.model_copy(update={"build_id": build_id})}
        )
    # uvloop: the worker's loop is woken by every thread handing a result back (database
    # writes, a task's hooks, workflow activations): cheaper per wake-up than asyncio's
    uvloop.run(run_worker(settings))


def dev(
    config: Path | None = ConfigOpt,
    data_dir: Path = DataDirOpt,
    api_port: int = ApiPortOpt,
    temporal_port: int = TemporalPortOpt,
    ui_port: int = UiPortOpt,
    samples_port: int = SamplesPortOpt,
    no_samples: bool = typer.Option(False, "--no-samples"),
) -> None:
    """Run the whole embedded stack in the foreground until Ctrl-C."""
    # lazy: importing it costs every `artemis` start-up ~1.7 s
    from infra.devstack.stack import DevStack

    stack = DevStack(
        config, data_dir, api_port, temporal_port, ui_port, samples_port, samples=not no_samples
    )
    asyncio.run(stack.run_forever())


def demo(
    config: Path | None = ConfigOpt,
    data_dir: Path = DataDirOpt,
    api_port: int = ApiPortOpt,
    temporal_port: int = TemporalPortOpt,
    ui_port: int = UiPortOpt,
    samples_port: int = SamplesPortOpt,
    exit_: bool = typer.Option(False, "--exit", help="return when the samples are done"),
) -> None:
    """Start the embedded stack, run the sample tasks with live progress, print a summary."""
    # lazy: importing it costs every `artemis` start-up ~1.7 s
    from infra.devstack.stack import DevStack

    stack = DevStack(config, data_dir, api_port, temporal_port, ui_port, samples_port)
    ok = asyncio.run(stack.demo(stay=not exit_))
    raise typer.Exit(0 if ok else 1)


app = root_app()
# `artemis --help` lists these first, then the starter's commands in their own order.
for _command in (worker, dev, demo):
    app.command()(_command)
app.add_typer(starter_app)  # no name: its commands join this app's


def main() -> None:
    run(app)
