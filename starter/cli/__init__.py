"""The starter's command line: the commands that need no worker, one module
per command group.

`_common` (settings, failing, calling the API), `servers` (api, samples, db), `cookies`,
`audit`, `registry`, `tasks` (run, tasks …), `quarantine` (the records runs set aside)
`watch` (the run's event stream and its live view), `schedules` and `builds` (the worker builds
Temporal knows). The `artemis` command (``main``) adds the commands other packages register
under the entry-point group ``artemis.commands`` (pyproject.toml): `worker`
(workers/cli.py), `dev` and `demo` (infra/devstack/cli.py). Nothing here imports a
worker or the dev stack.

Every command module is imported at every start-up, so code that is slow to import (the
registry, the vault, the API: 0.2–1.5 s each) is imported inside the command that needs
it, marked `# lazy:` with its cost (on top of the CLI's own imports, median of five
processes); `artemis --help` takes about 1 s on the 2-core machine the tests run on.
"""

from __future__ import annotations

import signal
import sys

import typer
from rich.markup import escape

from artemis.errors import ArtemisError
from artemis.redact import redact_text
from starter.cli import audit, servers, tasks
from starter.cli._common import err_console
from starter.cli.builds import builds_app
from starter.cli.cookies import cookies_app
from starter.cli.quarantine import quarantine_app
from starter.cli.registry import registry_app
from starter.cli.schedules import schedules_app
from starter.cli.watch import StepView, iter_events, watch_task

__all__ = ["app", "guarded", "main", "root_app", "run", "watch_task", "iter_events", "StepView"]


def root_app() -> typer.Typer:
    """An empty root command as `artemis` shows it (this app, and the full one)."""
    return typer.Typer(
        help="Artemis: durable multi-source data harvesting on Temporal.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        # plain help, as `gh` and `kubectl` print it (no type tags next to every flag)
        rich_markup_mode=None,
    )


app = root_app()
# The order here is the order `artemis --help` lists them in (after the worker's commands).
for _command in (servers.api, audit.audit, tasks.run):
    app.command()(_command)
app.command("task-types")(tasks.task_types)
app.add_typer(tasks.tasks_app, name="tasks")
app.add_typer(quarantine_app, name="quarantine")
app.add_typer(servers.samples_app, name="samples")
app.add_typer(servers.db_app, name="db")
app.add_typer(registry_app, name="registry")
app.add_typer(schedules_app, name="schedules")
app.add_typer(cookies_app, name="cookies")
app.add_typer(builds_app, name="builds")


# Commands that serve until stopped: a closed output pipe must not end them.
SERVING = {"dev", "demo", "worker", "api", "samples"}


def run(command: typer.Typer) -> None:
    """Run ``command`` as a console script: errors as one line, never a traceback."""
    if not SERVING & set(sys.argv[1:2]):
        # A command that prints and exits ends quietly when its reader has gone
        # (`artemis tasks list | head`), as Unix tools do.
        try:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        except (AttributeError, ValueError):
            pass
    guarded(command)


def guarded(command: typer.Typer, args: list[str] | None = None) -> None:
    """``command`` on ``args`` (default: the process's), exiting as a console script
    does: an error is one line on stderr and status 1, never a traceback."""
    try:
        command(args=args)
    except ArtemisError as e:
        err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        sys.exit(1)
    except Exception as e:  # one line, never a traceback (which could carry secrets)
        err_console.print(
            f"[red]error:[/red] {escape(redact_text(f'{type(e).__name__}: {e}'))}",
            highlight=False,
        )
        sys.exit(1)


# The commands other packages add to `artemis` (pyproject.toml), listed first in this order.
COMMANDS_GROUP = "artemis.commands"
COMMANDS_FIRST = ("worker", "dev", "demo")


def full_app() -> typer.Typer:
    """`artemis` as installed: the commands registered under ``COMMANDS_GROUP``, then
    this app's (a command's module is imported here, its heavy parts when it runs)."""
    from importlib.metadata import entry_points

    full = root_app()
    found = sorted(
        entry_points(group=COMMANDS_GROUP),
        key=lambda ep: (COMMANDS_FIRST + (ep.name,)).index(ep.name),
    )
    for ep in found:
        full.command(ep.name)(ep.load())
    full.add_typer(app)  # no name: its commands join the root's
    return full


def main() -> None:
    run(full_app())
