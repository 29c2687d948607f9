"""Apply the Alembic migrations under ``artemis/migrations`` to a database URL."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from artemis.db import get_engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    # Make sure the SQLite folder exists and WAL is on before Alembic connects.
    get_engine(url).connect().close()
    command.upgrade(alembic_config(url), revision)
