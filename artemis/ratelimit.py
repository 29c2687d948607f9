"""Rate limits that hold across every worker process: a GCRA gate per key (e.g. per
provenance) kept in one row of the Artemis database.

Each request reserves its slot with one atomic statement — the row's *theoretical arrival
time* ``tat`` moves on by ``1/qps`` — and waits until the slot is due: at most ``burst``
requests ahead of the steady rate, so no 1-s window holds more than ``qps + burst`` and a
busy source sees ``qps`` sustained, however many processes share it. The database's own
clock is used, so hosts with skewed clocks still agree.

A gate can also be closed until an instant (``close_for``): a source whose own headers
say its budget is spent (artemis/registry/limit_headers.py). The instant is kept on the
row (``closed_until``, only ever moved later), so every worker waits for it; the slots
reserved meanwhile start from it, ``burst`` of them at once and then ``qps``. A gate
without a rate (``qps`` None) only closes.

An in-process token bucket (``TokenBucket``) remains for limits that belong to one run in
one process (an operator's live rate for a source without a registry limit).
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import Column, Float, String, text
from sqlmodel import Field, SQLModel

from artemis.calls import work
from artemis.db import get_engine


class RateGateRow(SQLModel, table=True):
    __tablename__ = "rate_gate"

    key: str = Field(sa_column=Column(String(200), primary_key=True))
    tat: float = Field(sa_column=Column(Float, nullable=False))
    # No request passes before this instant (epoch seconds on the database's clock).
    closed_until: float | None = Field(default=None, sa_column=Column(Float, nullable=True))


_NOW = {
    "postgresql": "EXTRACT(EPOCH FROM clock_timestamp())",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
_GREATEST = {"postgresql": "GREATEST", "sqlite": "MAX"}


class GateClosed(Exception):
    """The gate stays closed longer than the caller would wait (``acquire(max_wait)``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"rate gate closed for {seconds:.1f} s")
        self.seconds = seconds


class RateGate:
    """``await gate.acquire()`` before each request: ``qps`` sustained, ``burst`` ahead
    (``qps`` None: no pacing), never while the gate is closed."""

    def __init__(
        self, database_url: str, key: str, qps: float | None, burst: int | None = None
    ) -> None:
        self.engine = get_engine(database_url)
        self.key = key
        self.set_rate(qps, burst)
        # This process's latest closing (monotonic clock): an answer that closes no later
        # writes nothing.
        self._closed_mono = 0.0
        dialect = self.engine.dialect.name
        now, greatest = _NOW[dialect], _GREATEST[dialect]
        closed = "COALESCE(rate_gate.closed_until, 0)"
        # One statement: reserve the next slot (none before the gate opens), answer it,
        # the instant the gate opens and the database's clock.
        self._reserve = text(
            f"INSERT INTO rate_gate (key, tat) VALUES (:key, {now} + :t) "
            f"ON CONFLICT (key) DO UPDATE SET tat = {greatest}(rate_gate.tat, {now}, {closed}) "
            f"+ :t RETURNING tat, closed_until, {now} AS now"
        )
        self._close = text(
            f"INSERT INTO rate_gate (key, tat, closed_until) VALUES (:key, {now}, {now} + :s) "
            f"ON CONFLICT (key) DO UPDATE SET closed_until = {greatest}({closed}, {now} + :s)"
        )

    def set_rate(self, qps: float | None, burst: int | None = None) -> None:
        if qps is not None and qps <= 0:
            raise ValueError("qps must be positive")
        self.qps = qps
        self.burst = max(1, burst or 1)

    def _reserve_slot(self) -> tuple[float, float]:
        """Seconds to wait before the request reserved now may go, and of those the
        seconds until the gate opens."""
        t = 1.0 / self.qps if self.qps else 0.0
        with self.engine.begin() as conn:
            tat, closed_until, now = conn.execute(self._reserve, {"key": self.key, "t": t}).one()
        closed = max(0.0, float(closed_until or 0) - float(now))
        return max(float(tat) - self.burst * t - float(now), closed), closed

    async def acquire(self, max_wait: float | None = None) -> None:
        """Wait for this request's slot; a gate closed for more than ``max_wait`` seconds
        raises ``GateClosed`` instead (the caller waits elsewhere)."""
        wait, closed = await work(self._reserve_slot)
        if max_wait is not None and closed > max_wait:
            raise GateClosed(closed)
        if wait > 0:
            await asyncio.sleep(wait)

    def _close_for(self, seconds: float) -> None:
        # SQLite's clock counts whole milliseconds: one more keeps the reopened gate from
        # letting a request go a fraction of a millisecond before the reset.
        with self.engine.begin() as conn:
            conn.execute(self._close, {"key": self.key, "s": seconds + 0.001})

    async def close_for(self, seconds: float) -> bool:
        """Close the gate for ``seconds`` from now, for every process (a later closing
        already there stays); False when this process had closed it as long already."""
        until = time.monotonic() + seconds
        # Answers of one window name one reset: the first closes, the rest agree.
        if until <= self._closed_mono + 0.01:
            return False
        await work(self._close_for, seconds)
        self._closed_mono = until
        return True


_gates: dict[tuple[str, str], RateGate] = {}


def gate_for(database_url: str, key: str, qps: float | None, burst: int | None = None) -> RateGate:
    """This process's gate for ``key`` (its rate follows the latest contract)."""
    gate = _gates.get((database_url, key))
    if gate is None:
        gate = _gates[(database_url, key)] = RateGate(database_url, key, qps, burst)
    elif gate.qps != qps or gate.burst != max(1, burst or 1):
        gate.set_rate(qps, burst)
    return gate


class TokenBucket:
    """An in-process token bucket: ``qps`` with bursts up to ``burst``, one process."""

    def __init__(self, qps: float, burst: int | None = None) -> None:
        if qps <= 0:
            raise ValueError("qps must be positive")
        self.qps = qps
        self.capacity = float(max(1, burst or 1))
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self._lock = asyncio.Lock()

    def set_rate(self, qps: float, burst: int | None = None) -> None:
        self.qps = qps
        self.capacity = float(max(1, burst or 1))
        self.tokens = min(self.tokens, self.capacity)

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.qps)
                self.updated = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.qps)

    def idle_full(self, now: float) -> bool:
        """Unused long enough to be full again: a new bucket would behave the same."""
        return not self._lock.locked() and now - self.updated >= self.capacity / self.qps


_buckets: dict[str, TokenBucket] = {}


def bucket_for(key: str, qps: float, burst: int | None = None) -> TokenBucket:
    """The process-wide bucket for ``key`` (its rate follows the latest contract).

    Buckets of runs that ended are dropped here: one unused long enough to have filled
    up again is the same as a new one, so dropping it loses nothing."""
    now = time.monotonic()
    for name in [k for k, b in _buckets.items() if k != key and b.idle_full(now)]:
        del _buckets[name]
    bucket = _buckets.get(key)
    if bucket is None:
        bucket = _buckets[key] = TokenBucket(qps, burst)
    elif bucket.qps != qps or bucket.capacity != max(1, burst or 1):
        bucket.set_rate(qps, burst)
    return bucket
