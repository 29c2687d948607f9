"""The embedded stack's commands, `artemis dev` and `artemis demo`: registered with the
`artemis` command (starter/cli) under the entry-point group ``artemis.commands``
(pyproject.toml), so that the product's command line never imports the dev stack.

The stack is imported when its command runs: it loads Temporal's worker, the workflows
and the API (seconds), which `artemis tasks list` does not need.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from starter.cli._common import ConfigOpt

DataDirOpt = typer.Option(Path(".artemis"), help="state folder")
ApiPortOpt = typer.Option(8000)
TemporalPortOpt = typer.Option(7233)
UiPortOpt = typer.Option(8233)
SamplesPortOpt = typer.Option(8300)


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
