"""The starter's long-running processes: `api` and `samples serve`; and `db upgrade`.
(`artemis worker` is in `workers/cli.py`: the starter never imports a worker.)"""

from __future__ import annotations

from pathlib import Path

import typer

from artemis.heap import settle_after_startup
from starter.cli._common import ConfigOpt, _fail, _require_master_key, _settings, console

samples_app = typer.Typer(
    help="The bundled sample servers.", no_args_is_help=True, rich_markup_mode=None
)
db_app = typer.Typer(help="The Artemis database.", no_args_is_help=True, rich_markup_mode=None)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def api(config: Path | None = ConfigOpt, host: str | None = None, port: int | None = None) -> None:
    """Run the starter API (production). Needs COOKIE_MASTER_KEY."""
    # lazy: importing them costs every `artemis` start-up ~1.5 s
    import uvicorn

    from artemis.logsetup import configure_logging
    from starter.api.app import create_app

    _require_master_key()
    settings = _settings(config)
    host = host or settings.server.host
    port = port or settings.server.port
    if host not in LOOPBACK and not settings.server.api_tokens:
        _fail(f"refusing to bind {host} with no server.api_tokens configured")
    configure_logging(settings.logging)
    # The bind address decides the Host check of a loopback API without tokens.
    settings = settings.model_copy(
        update={"server": settings.server.model_copy(update={"host": host, "port": port})}
    )
    app = create_app(settings)
    settle_after_startup()  # (artemis/heap.py)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=settings.server.keep_alive_s,
    )


@samples_app.command("serve")
def samples_serve(
    port: int = typer.Option(8300, help="port on 127.0.0.1"),
    latency_ms: float = typer.Option(0.0, help="added to every quote page"),
) -> None:
    """Serve the sample quote API, sink receiver and CronJob receiver."""
    # lazy: importing them costs every `artemis` start-up ~0.2 s
    import uvicorn

    from artemis_samples.app import create_app

    console.print(f"sample servers on http://127.0.0.1:{port} (quotes, /sink, /cronjob)")
    uvicorn.run(
        create_app(latency_ms), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )


@db_app.command("upgrade")
def db_upgrade(config: Path | None = ConfigOpt) -> None:
    """Apply the database migrations."""
    # lazy: importing them costs every `artemis` start-up ~0.5 s
    from sqlalchemy.engine import make_url

    from artemis.migrate import upgrade

    settings = _settings(config)
    upgrade(settings.database.url)
    shown = make_url(settings.database.url).render_as_string(hide_password=True)
    console.print(f"database at {shown} is up to date")
