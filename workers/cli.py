"""`artemis worker`: one worker process (production). Registered with the `artemis` command
under the entry-point group ``artemis.commands`` (pyproject.toml), so that the starter's
command line never imports a worker; the worker itself is imported when the command runs
(Temporal's worker, the workflows and the activities: about a second)."""

from __future__ import annotations

from pathlib import Path

import typer
import uvloop

from starter.cli._common import ConfigOpt, _require_master_key, _settings


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
