"""Frozen contracts stored once, by the digest of their content.

A run freezes its execution contract when it starts (artemis/tasks/source_harvest.py).
A backfill fans out into one child run per window: were each child's params to hold the
contract (a few KB), the parent's history would grow by a contract per window, and the
workflow task that starts many children at once would pass Temporal's payload limit
(2 MB). So the parent stores its contract here once and its children's params carry the
digest (``contract_ref``); each child reads the contract back when it prepares.

The digest names the content (SHA-256 of its canonical JSON), so storing the same
contract again is a no-op and two runs with one contract share the row. A run touches the
row each time it plans a slice of children; the cleanup (activities/housekeeping.py)
removes rows no run touched in ``runs.frozen_contract_days``.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from artemis.db import get_engine, upsert_insert, utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import RegFrozenContract

_TABLE = RegFrozenContract.__table__  # type: ignore[attr-defined]
PREFIX = "sha256:"


def canonical(body: dict[str, Any]) -> dict[str, Any]:
    """The contract as JSON gives it back (instants as ISO text), as a child's params hold
    it after crossing Temporal."""
    return orjson.loads(orjson.dumps(body, option=orjson.OPT_SORT_KEYS, default=str))


def digest_of(body: dict[str, Any]) -> str:
    data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS, default=str)
    return PREFIX + hashlib.sha256(data).hexdigest()


def store_contract(conn: Connection, body: dict[str, Any]) -> str:
    """Keep ``body`` under its digest (once: a row already there is touched) and return
    the digest."""
    digest = digest_of(body)
    now = utcnow()
    insert = upsert_insert(conn.engine)
    conn.execute(
        insert(_TABLE)
        .values(digest=digest, body_json=canonical(body), created_at=now, touched_at=now)
        .on_conflict_do_update(index_elements=["digest"], set_={"touched_at": now})
    )
    return digest


def load_contract(conn: Connection, digest: str) -> dict[str, Any]:
    """The contract stored under ``digest``; CONFIG_ERROR when it is gone (cleaned up after
    ``runs.frozen_contract_days`` without a run asking for it)."""
    row = conn.execute(select(_TABLE.c.body_json).where(_TABLE.c.digest == digest)).first()
    if row is None:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"the run's frozen contract {digest} is not in reg_frozen_contract (removed "
            "after runs.frozen_contract_days without a run asking for it): start the "
            "backfill again",
            retryable=False,
        )
    body = row[0]
    return orjson.loads(body) if isinstance(body, str | bytes) else dict(body)


def forget_untouched(conn: Connection, before: datetime) -> int:
    """Remove the contracts no run touched since ``before``; how many."""
    return int(conn.execute(delete(_TABLE).where(_TABLE.c.touched_at < before)).rowcount or 0)


def forget_old_contracts(database_url: str, days: float) -> int:
    """The cleanup's step: the contracts no run asked for in ``days``, removed."""
    with get_engine(database_url).begin() as conn:
        return forget_untouched(conn, utcnow() - timedelta(days=days))
