"""The cookie pool's state machine against an independent model, driven by hypothesis
with a frozen clock, on a real SQLite database (docs/operations.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import Engine, delete, insert, select

from artemis.crawler.cookies import CookiePool, PoolRules
from artemis.crawler.models import CookieRow
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.migrate import upgrade

T0 = datetime(2026, 11, 26, 23, 0, tzinfo=UTC)  # an hour before a date boundary
RULES = PoolRules(max_consecutive_errors=3, max_total_errors=10, cooling_duration_minutes=30)


class Model:
    """The pool's rules, written out plainly (the thresholds: ``RULES``)."""

    def __init__(self, priority: int, limit: int) -> None:
        self.status, self.consecutive, self.total = "active", 0, 0
        self.cooling_until: datetime | None = None
        self.used, self.day, self.priority, self.limit = 0, "", priority, limit

    def tick(self, now: datetime) -> None:
        if self.status == "cooling" and now >= self.cooling_until:
            self.status, self.consecutive = "active", 0
        if self.day != now.date().isoformat():
            self.day, self.used = now.date().isoformat(), 0

    def usable(self, now: datetime) -> bool:
        self.tick(now)
        return self.status == "active" and self.used < self.limit

    def outcome(self, ok: bool, now: datetime) -> None:
        self.tick(now)
        if ok:
            self.consecutive = 0
        elif self.status == "cooling":
            self.status = "banned"
        elif self.status == "active":
            self.consecutive += 1
            self.total += 1
            if self.total >= RULES.max_total_errors:
                self.status = "invalid"
            elif self.consecutive >= RULES.max_consecutive_errors:
                self.status = "cooling"
                self.cooling_until = now + timedelta(minutes=RULES.cooling_duration_minutes)


@pytest.fixture(scope="module")
def pool_engine(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('pool') / 'pool.db'}"
    upgrade(url)
    return get_engine(url)


def test_cookie_state_machine(pool_engine):
    PoolMachine.engine = pool_engine
    PoolMachine.TestCase.settings = settings(
        max_examples=100,
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    PoolMachine.TestCase().runTest()


# The pool's cookies: (priority, daily limit). Two share the top priority, one of them
# runs out within a day.
COOKIES = [(5, 4), (5, 100), (1, 100)]


def seed_pool(engine) -> list[int]:
    """An empty pool, then ``COOKIES`` (all active, unused, at T0) on platform xhs; their
    ids in order."""
    with engine.begin() as conn:
        conn.execute(delete(CookieRow.__table__))
        for i, (prio, limit) in enumerate(COOKIES):
            conn.execute(
                insert(CookieRow.__table__).values(
                    cookie_name=f"c{i}",
                    platform="xhs",
                    cookie_encrypted="x",
                    encryption_key_id="k",
                    status="active",
                    priority=prio,
                    daily_used=0,
                    daily_limit=limit,
                    usage_day="",
                    consecutive_errors=0,
                    total_errors=0,
                    created_at=T0,
                    updated_at=T0,
                )
            )
        return [r.id for r in conn.execute(select(CookieRow.id).order_by(CookieRow.id))]


class PoolMachine(RuleBasedStateMachine):
    """The pool on ``engine`` and the model side by side: each rule acts on both and
    compares their answers; the invariant compares every stored row with the model."""

    engine: Engine  # set by the test (a fixture's engine)

    def __init__(self) -> None:
        super().__init__()
        self.ids = seed_pool(self.engine)
        self.pool = CookiePool(self.engine, RULES)
        self.now = T0
        self.model = {cid: Model(p, lim) for cid, (p, lim) in zip(self.ids, COOKIES, strict=True)}

    @rule(n=st.integers(0, 2), ok=st.sampled_from([False, False, False, True]))
    def outcome(self, n: int, ok: bool) -> None:
        cid = self.ids[n]
        status = self.pool.report(cid, ok, self.now)
        self.model[cid].outcome(ok, self.now)
        assert status == self.model[cid].status

    @rule(minutes=st.sampled_from([1, 10, 29, 30, 31, 90, 600]))
    def advance(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)

    @rule()
    def acquire(self) -> None:
        usable = [cid for cid, m in self.model.items() if m.usable(self.now)]
        if not usable:
            with pytest.raises(ArtemisError) as e:
                self.pool.acquire("xhs", self.now)
            assert e.value.code == ErrorCode.COOKIE_EXHAUSTED
            return
        lease = self.pool.acquire("xhs", self.now)
        best = max(self.model[c].priority for c in usable)
        assert self.model[lease.cookie_id].priority == best
        assert lease.cookie_id in usable
        tied = [c for c in usable if self.model[c].priority == best]
        assert self.model[lease.cookie_id].used == min(self.model[c].used for c in tied)
        self.model[lease.cookie_id].used += 1

    @invariant()
    def statuses_match(self) -> None:
        with self.engine.connect() as conn:
            rows = {r.id: r for r in conn.execute(select(CookieRow.__table__))}
        for cid, m in self.model.items():
            m.tick(self.now)
            row = rows[cid]
            stored = row.status
            if stored == "cooling" and row.cooling_until <= self.now:
                stored = "active"  # applied lazily, on the next read or write
            assert stored == m.status, (cid, stored, m.status)
            if row.usage_day == m.day:
                assert row.daily_used == m.used
