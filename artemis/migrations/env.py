"""Alembic environment: runs migrations against the URL given by artemis.migrate."""

from alembic import context
from sqlalchemy import pool
from sqlmodel import SQLModel

import artemis.crawler.models  # noqa: F401  (registers the crawler tables)
import artemis.dblock  # noqa: F401  (registers named_lock)
import artemis.events  # noqa: F401  (registers run_event)
import artemis.quarantine.store  # noqa: F401  (registers the quarantine and drift tables)
import artemis.ratelimit  # noqa: F401  (registers rate_gate)
import artemis.registry.models  # noqa: F401  (registers the registry tables)
import artemis.taskstore.sql  # noqa: F401  (registers async_tasks)
from artemis.db import get_engine

config = context.config
target_metadata = SQLModel.metadata
url = config.get_main_option("sqlalchemy.url")


def run_migrations_offline() -> None:
    context.configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    assert url, "sqlalchemy.url is not set"
    engine = get_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


_ = pool
if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
