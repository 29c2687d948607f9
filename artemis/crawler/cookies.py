"""The crawler's cookie pool (docs/operations.md): which cookie a request uses, and what
its outcome does.

State machine (constants from ``crawler`` settings)::

    active --(max_consecutive_errors in a row)--> cooling --(cooling_duration)--> active
      |                                             |
      |(max_total_errors in all)                    |(an error while cooling)
      v                                             v
    invalid                                       banned

``daily_used`` counts requests per UTC day against ``daily_limit`` and starts again at the
date boundary. The highest ``priority`` usable cookie is picked (then the least used
today, then the oldest); none usable is ``COOKIE_EXHAUSTED``. The transitions are pure
functions of a row and a clock (:func:`apply_outcome`, :func:`refresh`), so the tests drive
them with a frozen clock; the pool applies them in short transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.engine import Engine

from artemis.crawler.models import CookieRow
from artemis.db import utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.run_state import CookieStatus

_t = CookieRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class PoolRules:
    max_consecutive_errors: int = 3
    max_total_errors: int = 10
    cooling_duration_minutes: float = 30.0


@dataclass
class CookieState:
    """The parts of a cookie row the state machine reads and writes."""

    status: str = CookieStatus.ACTIVE.value
    consecutive_errors: int = 0
    total_errors: int = 0
    cooling_until: datetime | None = None
    daily_used: int = 0
    daily_limit: int = 500
    usage_day: str = ""


def day_of(now: datetime) -> str:
    return now.date().isoformat()


def refresh(s: CookieState, now: datetime) -> CookieState:
    """Time-driven transitions: a cooled-down cookie is active again; a new day resets
    the daily count."""
    if s.status == CookieStatus.COOLING and s.cooling_until is not None and now >= s.cooling_until:
        s.status, s.consecutive_errors, s.cooling_until = CookieStatus.ACTIVE, 0, None
    if s.usage_day != day_of(now):
        s.usage_day, s.daily_used = day_of(now), 0
    return s


def usable(s: CookieState, now: datetime) -> bool:
    refresh(s, now)
    return s.status == CookieStatus.ACTIVE and s.daily_used < s.daily_limit


def apply_outcome(s: CookieState, ok: bool, now: datetime, rules: PoolRules) -> CookieState:
    """What one request's outcome does to its cookie."""
    refresh(s, now)
    if ok:
        s.consecutive_errors = 0
        return s
    if s.status in (CookieStatus.INVALID, CookieStatus.BANNED, CookieStatus.DISABLED):
        return s
    if s.status == CookieStatus.COOLING:
        s.status = CookieStatus.BANNED
        return s
    s.consecutive_errors += 1
    s.total_errors += 1
    if s.total_errors >= rules.max_total_errors:
        s.status = CookieStatus.INVALID
    elif s.consecutive_errors >= rules.max_consecutive_errors:
        s.status = CookieStatus.COOLING
        s.cooling_until = now + timedelta(minutes=rules.cooling_duration_minutes)
    return s


def _state(row: object) -> CookieState:
    return CookieState(
        status=row.status,  # type: ignore[attr-defined]
        consecutive_errors=row.consecutive_errors,  # type: ignore[attr-defined]
        total_errors=row.total_errors,  # type: ignore[attr-defined]
        cooling_until=row.cooling_until,  # type: ignore[attr-defined]
        daily_used=row.daily_used,  # type: ignore[attr-defined]
        daily_limit=row.daily_limit,  # type: ignore[attr-defined]
        usage_day=row.usage_day,  # type: ignore[attr-defined]
    )


def _values(s: CookieState, now: datetime) -> dict[str, object]:
    return {
        "status": s.status,
        "consecutive_errors": s.consecutive_errors,
        "total_errors": s.total_errors,
        "cooling_until": s.cooling_until,
        "daily_used": s.daily_used,
        "usage_day": s.usage_day,
        "updated_at": now,
    }


@dataclass(frozen=True)
class Lease:
    """One request's use of a cookie: its id and name (the name is safe to log and to
    return as ``meta.cookie_used``; the value stays encrypted until the request)."""

    cookie_id: int
    cookie_name: str
    ciphertext: str
    key_id: str


class CookiePool:
    def __init__(self, engine: Engine, rules: PoolRules | None = None) -> None:
        self.engine = engine
        self.rules = rules or PoolRules()

    def acquire(self, platform: str, now: datetime, exclude: set[int] | None = None) -> Lease:
        """Take the best usable cookie and count its use, atomically (a compare-and-set on
        ``daily_used``: two workers racing for the last use of a cookie cannot both win)."""
        exclude = exclude or set()
        for _ in range(20):
            with self.engine.begin() as conn:
                rows = conn.execute(
                    select(_t).where(
                        _t.c.platform == platform,
                        or_(
                            _t.c.status == CookieStatus.ACTIVE,
                            and_(_t.c.status == CookieStatus.COOLING, _t.c.cooling_until <= now),
                        ),
                    )
                ).all()
                # Ordered on today's use: a count stored yesterday is zero now.
                candidates = [
                    (row, s)
                    for row in rows
                    if row.id not in exclude and usable(s := _state(row), now)
                ]
                candidates.sort(key=lambda rs: (-rs[0].priority, rs[1].daily_used, rs[0].id))
                for row, s in candidates:
                    before = (row.daily_used, row.usage_day, row.status)
                    s.daily_used += 1
                    done = conn.execute(
                        update(_t)
                        .where(
                            _t.c.id == row.id,
                            _t.c.daily_used == before[0],
                            _t.c.usage_day == before[1],
                            _t.c.status == before[2],
                        )
                        .values(**_values(s, now), last_used_at=now)
                    ).rowcount
                    if done:
                        return Lease(
                            row.id, row.cookie_name, row.cookie_encrypted, row.encryption_key_id
                        )
                    break  # lost a race: read again
                else:
                    raise ArtemisError(
                        ErrorCode.COOKIE_EXHAUSTED,
                        f"no usable cookie for platform {platform!r} "
                        "(all cooling, invalid, banned or over their daily limit)",
                        retryable=False,
                    )
        raise ArtemisError(
            ErrorCode.COOKIE_EXHAUSTED, f"cookie pool of {platform!r} too contended", retryable=True
        )

    def report(self, cookie_id: int, ok: bool, now: datetime) -> str:
        """Apply one request's outcome; returns the cookie's new status."""
        for _ in range(20):
            with self.engine.begin() as conn:
                row = conn.execute(select(_t).where(_t.c.id == cookie_id)).first()
                if row is None:
                    raise ArtemisError(ErrorCode.NOT_FOUND, f"no cookie with id {cookie_id}")
                s = apply_outcome(_state(row), ok, now, self.rules)
                done = conn.execute(
                    update(_t)
                    .where(
                        _t.c.id == cookie_id,
                        _t.c.updated_at == row.updated_at,
                        _t.c.total_errors == row.total_errors,
                        _t.c.consecutive_errors == row.consecutive_errors,
                        _t.c.status == row.status,
                    )
                    .values(**_values(s, now))
                ).rowcount
                if done:
                    return s.status
        raise ArtemisError(ErrorCode.INTERNAL, f"cookie {cookie_id}: too many concurrent updates")

    def active_count(self, platform: str | None, now: datetime) -> int:
        with self.engine.connect() as conn:
            q = select(_t)
            if platform:
                q = q.where(_t.c.platform == platform)
            return sum(1 for row in conn.execute(q) if usable(_state(row), now))


# -- administration (`artemis cookies ...`) ---------------------------------------------------
def parse_cookie(value: str) -> str:
    """A cookie header value (``web_session=…; a1=…``), refused with a clear error when it
    is not one. The value itself never appears in the message."""
    value = value.strip()
    pairs = [p.strip() for p in value.split(";") if p.strip()]
    if not pairs or any("=" not in p or not p.split("=", 1)[0].strip() for p in pairs):
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            "cookie: expected `name=value` pairs separated by `;` (e.g. web_session=…)",
        )
    if any(ch in value for ch in "\r\n"):
        raise ArtemisError(ErrorCode.INVALID_INPUT, "cookie: must be a single line")
    return "; ".join(pairs)


def add_cookie(
    vault: Any,
    platform: str,
    name: str,
    value: str,
    priority: int = 0,
    daily_limit: int = 500,
) -> str:
    """Store (or replace, by name) a cookie, encrypted by ``vault`` in its database; a
    replaced cookie starts afresh (active, no errors). Returns ``created`` or
    ``replaced``."""
    engine: Engine = vault.engine
    if daily_limit < 1:
        raise ArtemisError(ErrorCode.INVALID_INPUT, "--daily-limit: must be at least 1")
    token, key_id = vault.encrypt(parse_cookie(value))
    now = utcnow()
    values = {
        "platform": platform,
        "cookie_encrypted": token,
        "encryption_key_id": key_id,
        "status": CookieStatus.ACTIVE,
        "priority": priority,
        "daily_limit": daily_limit,
        "consecutive_errors": 0,
        "total_errors": 0,
        "cooling_until": None,
        "updated_at": now,
    }
    with engine.begin() as conn:
        done = conn.execute(update(_t).where(_t.c.cookie_name == name).values(**values)).rowcount
        if done:
            return "replaced"
        conn.execute(
            _t.insert().values(
                cookie_name=name,
                daily_used=0,
                usage_day="",
                created_at=now,
                **values,
            )
        )
    return "created"


def list_cookies(engine: Engine, platform: str | None = None) -> list[dict[str, object]]:
    """Everything about the cookies but their values."""
    q = select(_t).order_by(_t.c.platform, _t.c.priority.desc(), _t.c.id)
    if platform:
        q = q.where(_t.c.platform == platform)
    with engine.connect() as conn:
        return [
            {k: v for k, v in row._mapping.items() if k not in ("cookie_encrypted",)}
            for row in conn.execute(q)
        ]


def set_cookie_status(engine: Engine, name: str, status: str) -> None:
    """Disable (or re-enable as active) a cookie by name."""
    if status not in (CookieStatus.DISABLED, CookieStatus.ACTIVE):
        raise ArtemisError(ErrorCode.INVALID_INPUT, "status: must be disabled or active")
    values: dict[str, object] = {"status": status, "updated_at": utcnow()}
    if status == CookieStatus.ACTIVE:
        values.update(consecutive_errors=0, total_errors=0, cooling_until=None)
    with engine.begin() as conn:
        if not conn.execute(update(_t).where(_t.c.cookie_name == name).values(**values)).rowcount:
            raise ArtemisError(ErrorCode.NOT_FOUND, f"no cookie named {name!r}")
