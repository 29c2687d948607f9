"""`artemis cookies`: the crawler's cookie pool (docs/operations.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from artemis.config import Settings
from artemis.run_state import CookieStatus
from starter.cli._common import (
    ConfigOpt,
    _fail,
    _registry_engine,
    _settings,
    console,
    err_console,
    print_table,
)

cookies_app = typer.Typer(
    help="The crawler's cookie pool.", no_args_is_help=True, rich_markup_mode=None
)

_COLUMNS = ("name", "platform", "status", "priority", "used today", "errors", "cooling until")


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
    # lazy: importing it costs every `artemis` start-up ~0.3 s
    from artemis.crawler.cookies import add_cookie
    from artemis.crawler.vault import vault_for

    if sys.stdin.isatty():
        err_console.print("paste the cookie, then Ctrl-D:")
    value = sys.stdin.read()
    if not value.strip():
        _fail("no cookie on stdin (e.g. `artemis cookies add ... < cookie.txt`)")
    settings = _settings(config)
    vault = vault_for(settings)
    outcome = add_cookie(vault, platform, name, value, priority, daily_limit)
    console.print(f"cookie {name} for {platform}: {outcome} (encrypted)")


def _cookie_row(c: dict[str, Any]) -> tuple[str, ...]:
    return (
        str(c["cookie_name"]),
        str(c["platform"]),
        str(c["status"]),
        str(c["priority"]),
        f"{c['daily_used']}/{c['daily_limit']}",
        f"{c['consecutive_errors']} in a row, {c['total_errors']} in all",
        str(c["cooling_until"] or ""),
    )


@cookies_app.command("list")
def cookies_list(
    platform: str | None = typer.Option(None, "--platform"), config: Path | None = ConfigOpt
) -> None:
    """The pool: status, priority, today's use and errors (never the values)."""
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.crawler.cookies import list_cookies

    settings = _settings(config)
    print_table(*cookies_table(list_cookies(_registry_engine(settings), platform)))


def cookies_table(cookies: list[dict[str, Any]]) -> tuple[Table, tuple[str, ...]]:
    """The pool as a table, and the columns a narrow terminal goes without, in order."""
    table = Table()
    for col in _COLUMNS:
        table.add_column(col, no_wrap=col == "name")
    for c in cookies:
        table.add_row(*_cookie_row(c))
    return table, ("cooling until", "priority", "platform")


def _set_status(name: str, status: str, config: Path | None) -> None:
    # lazy: importing it costs every `artemis` start-up ~0.25 s
    from artemis.crawler.cookies import set_cookie_status

    set_cookie_status(_registry_engine(_settings(config)), name, status)
    console.print(f"cookie {name}: {status}")


@cookies_app.command("disable")
def cookies_disable(name: str, config: Path | None = ConfigOpt) -> None:
    """Take a cookie out of the pool."""
    _set_status(name, CookieStatus.DISABLED, config)


@cookies_app.command("enable")
def cookies_enable(name: str, config: Path | None = ConfigOpt) -> None:
    """Put a cookie back in the pool (active, error counts cleared)."""
    _set_status(name, CookieStatus.ACTIVE, config)


def _new_master(env_name: str | None) -> bytes | None:
    """The new master key named by --new-master-key-env (None: renew under the current)."""
    if not env_name:
        return None
    raw = os.environ.get(env_name)
    if not raw:
        _fail(f"--new-master-key-env: ${env_name} is not set")
    return (raw or "").encode()


def _rotate(settings: Settings, new_master: bytes | None) -> dict[str, Any]:
    # lazy: importing it costs every `artemis` start-up ~0.3 s
    from artemis.crawler.vault import vault_for
    from artemis.vault import RunSecrets

    vault = vault_for(settings)
    readable = [vault.master, *vault.previous]
    result = vault.rotate(new_master)
    # The run secrets (callback tokens of open runs) move too; payloads already in Temporal
    # histories stay readable through COOKIE_MASTER_KEYS_READ.
    run_secrets = RunSecrets(
        settings.database.url, masters=[new_master or vault.master, *readable]
    ).rotate_all()
    return {
        "new_key_id": result.new_key_id,
        "rows": result.rows,
        "run_secrets": run_secrets,
        "retired": result.retired,
    }


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
    """Re-encrypt every cookie, credential secret, stored refresh or access token and run
    secret under a new key (MultiFernet) and retire the old keys."""
    new_master = _new_master(new_master_key_env)
    console.print_json(data=_rotate(_settings(config), new_master))
    if new_master_key_env:
        err_console.print(
            f"every worker and API needs COOKIE_MASTER_KEY = ${new_master_key_env} and the "
            "old key in COOKIE_MASTER_KEYS_READ until no history needs it (docs/operations.md, "
            "Keys and rotation)"
        )
