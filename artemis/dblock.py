"""A named lock held across every worker process, kept in one row of the Artemis
database (SQLite or PostgreSQL): ``named_lock``.

Taking it is one atomic statement: insert the name's row, or take over a row whose lease
has ended; a row held by another live lease is left alone and the statement answers
nothing. The holder deletes its row when done. A holder that dies holding it (a killed
worker) keeps the others out until its lease ends, never longer, so the lease is longer
than anything done under the lock may take. No transaction stays open while the lock is
held: SQLite's one write lock is never held across a network call, and a PostgreSQL
connection is not kept for the wait. Lease ends are instants on the database's clock,
which every worker shares whatever its host's clock says.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import Column, Float, String, text
from sqlalchemy.engine import Engine
from sqlmodel import Field, SQLModel

from artemis.calls import statement
from artemis.logsetup import get_logger

log = get_logger(__name__)

# The database's clock in epoch seconds, per dialect.
DB_NOW = {
    "postgresql": "EXTRACT(EPOCH FROM clock_timestamp())",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
# How often a waiter asks again: from the first interval up to the last.
_FIRST_POLL_S = 0.02
_LAST_POLL_S = 0.25


class NamedLockRow(SQLModel, table=True):
    __tablename__ = "named_lock"

    name: str = Field(sa_column=Column(String(200), primary_key=True))
    # Who holds it: one value per taking, so a holder whose lease ended and was taken
    # over cannot release the new holder's lock.
    holder: str = Field(sa_column=Column(String(64), nullable=False))
    # The lease ends at this instant (epoch seconds on the database's clock).
    lease_until: float = Field(sa_column=Column(Float, nullable=False))


class LockBusy(Exception):
    """The lock stayed held by others longer than the caller would wait."""


class NamedLock:
    """``async with NamedLock(engine, name, lease_s).held(max_wait):`` one holder at a
    time across every process sharing ``engine``'s database."""

    def __init__(self, engine: Engine, name: str, lease_s: float) -> None:
        self.engine = engine
        self.name = name
        self.lease_s = lease_s
        self.holder = uuid.uuid4().hex
        now = DB_NOW[engine.dialect.name]
        self._take = text(
            f"INSERT INTO named_lock (name, holder, lease_until) "
            f"VALUES (:name, :holder, {now} + :lease) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
            f"lease_until = excluded.lease_until WHERE named_lock.lease_until <= {now} "
            "RETURNING holder"
        )
        self._release = text("DELETE FROM named_lock WHERE name = :name AND holder = :holder")

    def try_take(self) -> bool:
        """Take the lock if nobody holds it (or a holder's lease has ended)."""
        with self.engine.begin() as conn:
            row = conn.execute(
                self._take, {"name": self.name, "holder": self.holder, "lease": self.lease_s}
            ).first()
        return row is not None

    def release(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(self._release, {"name": self.name, "holder": self.holder})

    @asynccontextmanager
    async def held(self, max_wait: float) -> AsyncIterator[None]:
        """Hold the lock for the block; ``LockBusy`` when others held it for more than
        ``max_wait`` seconds."""
        deadline = time.monotonic() + max_wait
        poll = _FIRST_POLL_S
        while not await statement(self.engine, self.try_take):
            if time.monotonic() >= deadline:
                raise LockBusy(f"lock {self.name!r} held by others for over {max_wait:.0f} s")
            await asyncio.sleep(poll)
            poll = min(poll * 1.5, _LAST_POLL_S)
        try:
            yield
        finally:
            try:
                await statement(self.engine, self.release)
            except Exception as e:  # the lease ends it anyway
                log.warning("named_lock_not_released", lock=self.name, error=type(e).__name__)
