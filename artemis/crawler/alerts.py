"""The crawler's alerts (docs/operations.md), per configured platform:

- ``cookie_exhausted`` (P0): no usable cookie (active and under its daily limit);
- ``success_rate_low`` (P1): the detail fetches of the last ``success_window_minutes``
  succeed less than ``success_rate_threshold`` of the time (at least ``min_attempts``);
- ``backlog`` (P2): more than ``backlog_threshold`` pending candidates, held for
  ``backlog_minutes``.

And one for every run of the task queue (``run_stuck``, P1): a run whose workflow task
keeps failing (``artemis.temporal.runs.stuck_runs``, looked at by the activity), which
never moves by itself.

Each alert key lives an episode in ``tbl_alert_state``: ``ok`` → ``pending`` (condition
seen, waiting out its hold) → ``firing`` (the firing message delivered once) → ``ok``
(the resolve message delivered once). A message that could not be delivered is tried
again at the next evaluation, so nothing is lost and nothing is sent twice. Every
message also goes to the log (``alert_firing`` / ``alert_resolved``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, func, insert, select, update
from sqlalchemy.engine import Engine

from artemis.config import HttpClientSettings
from artemis.crawler.cookies import CookiePool
from artemis.crawler.models import AlertState, Candidate, FetchOutcome
from artemis.http import HttpClient
from artemis.logsetup import get_logger
from artemis.run_state import AlertStatus, CandidateStatus
from artemis.temporal.runs import STUCK_ATTEMPTS

log = get_logger("artemis.alerts")

_a = AlertState.__table__  # type: ignore[attr-defined]
_o = FetchOutcome.__table__  # type: ignore[attr-defined]
_c = Candidate.__table__  # type: ignore[attr-defined]


def record_outcome(engine: Engine, platform: str, ok: bool, code: str | None, at: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(insert(_o).values(platform=platform, ok=ok, code=code, at=at))


@dataclass(frozen=True)
class Check:
    key: str
    alert: str
    severity: str
    condition: bool
    value: float
    threshold: float
    hold: timedelta
    message: str


def checks(engine: Engine, settings: Any, now: datetime) -> list[Check]:
    a = settings.alerts
    pool = CookiePool(engine)
    out: list[Check] = []
    window_start = now - timedelta(minutes=a.success_window_minutes)
    with engine.connect() as conn:
        for platform in sorted(settings.crawler.platforms):
            active = pool.active_count(platform, now)
            out.append(
                Check(
                    f"cookie_exhausted:{platform}",
                    "cookie_exhausted",
                    "P0",
                    active < 1,
                    active,
                    1,
                    timedelta(0),
                    f"{platform}: {active} usable cookies",
                )
            )
            total, good = conn.execute(
                select(func.count(), func.coalesce(func.sum(case((_o.c.ok, 1), else_=0)), 0)).where(
                    _o.c.platform == platform, _o.c.at >= window_start, _o.c.at <= now
                )
            ).one()
            rate = (good / total) if total else 1.0
            out.append(
                Check(
                    f"success_rate_low:{platform}",
                    "success_rate_low",
                    "P1",
                    total >= a.min_attempts and rate < a.success_rate_threshold,
                    round(rate, 4),
                    a.success_rate_threshold,
                    timedelta(0),
                    f"{platform}: {good}/{total} detail fetches succeeded in the last "
                    f"{a.success_window_minutes:g} min",
                )
            )
            pending = conn.execute(
                select(func.count()).where(
                    _c.c.platform == platform, _c.c.status == CandidateStatus.PENDING
                )
            ).scalar_one()
            out.append(
                Check(
                    f"backlog:{platform}",
                    "backlog",
                    "P2",
                    pending > a.backlog_threshold,
                    pending,
                    a.backlog_threshold,
                    timedelta(minutes=a.backlog_minutes),
                    f"{platform}: {pending} candidates pending",
                )
            )
    return out


STUCK_PREFIX = "run_stuck:"
_KEY_CHARS = 150  # tbl_alert_state.key


def stuck_key(workflow_id: str) -> str:
    """A stuck run's alert key: its workflow id, or a digest of a long one."""
    key = STUCK_PREFIX + workflow_id
    if len(key) <= _KEY_CHARS:
        return key
    return f"{STUCK_PREFIX}sha256:{hashlib.sha256(workflow_id.encode()).hexdigest()}"


def stuck_checks(engine: Engine, stuck: list[dict[str, Any]] | None) -> list[Check]:
    """A ``run_stuck`` alert per stuck run (``stuck_runs``' answer), and the end of each
    earlier one whose run moved on or closed. ``stuck`` None (the runs could not be looked
    at): every such alert stays where it is."""
    if stuck is None:
        return []
    out = [
        Check(
            stuck_key(s["workflow_id"]),
            "run_stuck",
            "P1",
            True,
            s["attempts"],
            STUCK_ATTEMPTS,
            timedelta(0),
            f"run {s.get('task_id') or s['workflow_id']} ({s['workflow_id']}) is stuck: "
            f"{s['reason']}; {s['action']}",
        )
        for s in stuck
    ]
    current = {c.key for c in out}
    mine = _a.c.key.startswith(STUCK_PREFIX)
    with engine.begin() as conn:
        # an ended episode is forgotten: a row per run ever stuck would pile up
        conn.execute(
            delete(_a).where(mine, _a.c.status == AlertStatus.OK, _a.c.key.notin_(current))
        )
        earlier = conn.execute(select(_a.c.key).where(mine)).scalars().all()
    out += [
        Check(
            key,
            "run_stuck",
            "P1",
            False,
            0,
            STUCK_ATTEMPTS,
            timedelta(0),
            f"run {key.removeprefix(STUCK_PREFIX)} is stuck",
        )
        for key in earlier
        if key not in current
    ]
    return out


def evaluate(
    engine: Engine,
    settings: Any,
    now: datetime,
    send: Callable[[dict[str, Any]], bool],
    stuck: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One evaluation: move every alert along its episode; returns the messages sent.
    ``stuck``: the task queue's stuck runs (None: not looked at)."""
    sent: list[dict[str, Any]] = []
    with engine.begin() as conn:  # outcomes are only needed for the success window
        conn.execute(delete(_o).where(_o.c.at < now - timedelta(days=1)))
    for chk in [*checks(engine, settings, now), *stuck_checks(engine, stuck)]:
        with engine.begin() as conn:
            row = conn.execute(select(_a).where(_a.c.key == chk.key)).first()
            if row is None:
                conn.execute(insert(_a).values(key=chk.key, status=AlertStatus.OK, updated_at=now))
                row = conn.execute(select(_a).where(_a.c.key == chk.key)).one()
        status, since = row.status, row.since
        values: dict[str, Any] = {"value": chk.value, "updated_at": now}
        if chk.condition:
            if status == AlertStatus.OK:
                status, since = AlertStatus.PENDING, now
                values.update(status=status, since=since)
            if status == AlertStatus.PENDING and now - since >= chk.hold:
                message = _message(chk, AlertStatus.FIRING, since, now)
                if _deliver(send, message):
                    sent.append(message)
                    values.update(status=AlertStatus.FIRING, fired_at=now)
        elif status == AlertStatus.FIRING:
            message = _message(chk, AlertStatus.RESOLVED, since, now)
            if _deliver(send, message):
                sent.append(message)
                values.update(status=AlertStatus.OK, since=None, resolved_at=now)
        elif status == AlertStatus.PENDING:
            values.update(status=AlertStatus.OK, since=None)
        with engine.begin() as conn:
            conn.execute(update(_a).where(_a.c.key == chk.key).values(**values))
    return sent


def _message(chk: Check, status: str, since: datetime | None, now: datetime) -> dict[str, Any]:
    return {
        "alert": chk.alert,
        "key": chk.key,
        "severity": chk.severity,
        "status": status,
        "value": chk.value,
        "threshold": chk.threshold,
        "since": since.isoformat() if since else None,
        "at": now.isoformat(),
        "message": chk.message if status == AlertStatus.FIRING else f"resolved: {chk.message}",
    }


def _deliver(send: Callable[[dict[str, Any]], bool], message: dict[str, Any]) -> bool:
    ok = False
    try:
        ok = send(message)
    except Exception as e:
        log.error("alert_delivery_failed", key=message["key"], error=f"{type(e).__name__}: {e}")
    level = log.error if message["status"] == AlertStatus.FIRING else log.info
    level(f"alert_{message['status']}", delivered=ok, **{k: v for k, v in message.items()})
    return ok


def webhook_sender(url: str | None, timeout_s: float = 5.0) -> Callable[[dict[str, Any]], bool]:
    """POST each message to ``alerts.webhook_url`` (no URL: the log alone delivers it).

    ``send`` is synchronous: ``evaluate`` calls it between database transactions, in a
    thread of its own. Each message goes out through the workers' HTTP client, on an event
    loop of the call's own (an alert is rare; a client lives for the one message)."""

    async def post(message: dict[str, Any]) -> int:
        async with HttpClient(HttpClientSettings(timeout_seconds=timeout_s)) as client:
            return (await client.post(str(url), json=message)).status_code

    def send(message: dict[str, Any]) -> bool:
        if not url:
            return True
        status = asyncio.run(post(message))
        if status >= 300:
            raise RuntimeError(f"webhook answered HTTP {status}")
        return True

    return send
