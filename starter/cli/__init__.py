"""The `artemis` command line (SPEC §12): the root app, one module per command group.

`_common` (settings, failing, calling the API), `servers` (worker, api, samples, db),
`cookies`, `audit`, `registry`, `dev` (dev, demo), `tasks` (run, tasks …) and `watch`
(the run's event stream and its live view).
"""

from __future__ import annotations

import signal
import sys

import typer

from artemis.errors import ArtemisError
from starter.cli import audit, dev, servers, tasks
from starter.cli._common import err_console
from starter.cli.cookies import cookies_app
from starter.cli.registry import registry_app
from starter.cli.watch import StepView, iter_events, watch_task

__all__ = ["app", "main", "watch_task", "iter_events", "StepView"]

app = typer.Typer(
    help="Artemis: durable multi-source data harvesting on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # plain help, as `gh` and `kubectl` print it (no type tags beside every flag)
    rich_markup_mode=None,
)
# The order here is the order `artemis --help` lists them in.
for _command in (servers.worker, servers.api, audit.audit, dev.dev, dev.demo, tasks.run):
    app.command()(_command)
app.command("task-types")(tasks.task_types)
app.add_typer(tasks.tasks_app, name="tasks")
app.add_typer(servers.samples_app, name="samples")
app.add_typer(servers.db_app, name="db")
app.add_typer(registry_app, name="registry")
app.add_typer(cookies_app, name="cookies")


# Commands that serve until stopped: a closed output pipe must not end them.
SERVING = {"dev", "demo", "worker", "api", "samples"}


def main() -> None:
    if not SERVING & set(sys.argv[1:2]):
        # A command that prints and exits ends quietly when its reader has gone
        # (`artemis tasks list | head`), as Unix tools do.
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
