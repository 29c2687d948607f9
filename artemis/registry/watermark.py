"""Incremental pointers (``reg_prov_watermark``): read at the start of an update run,
advanced only when the run completes (never backwards)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from artemis.db import utcnow
from artemis.registry.models import RegProvWatermark
from artemis.registry.resolve import as_utc

_t = RegProvWatermark.__table__  # type: ignore[attr-defined]


def read_watermark(
    conn: Connection, provenance_id: int, task_type: str, key: str
) -> datetime | None:
    value = conn.execute(
        select(_t.c.watermark_value).where(
            _t.c.provenance_id == provenance_id,
            _t.c.task_type == task_type,
            _t.c.watermark_key == (key or "default"),
        )
    ).scalar()
    return as_utc(value) if value is not None else None


def advance_watermark(
    conn: Connection, provenance_id: int, task_type: str, key: str, value: datetime, run_id: str
) -> bool:
    """Move the pointer forward to ``value``; returns False when it was already past it."""
    key = key or "default"
    current = read_watermark(conn, provenance_id, task_type, key)
    if current is None:
        conn.execute(
            _t.insert().values(
                provenance_id=provenance_id,
                task_type=task_type,
                watermark_key=key,
                watermark_value=as_utc(value),
                last_run_id=run_id,
                updated_at=utcnow(),
            )
        )
        return True
    if as_utc(value) <= current:
        return False
    conn.execute(
        update(_t)
        .where(
            _t.c.provenance_id == provenance_id,
            _t.c.task_type == task_type,
            _t.c.watermark_key == key,
        )
        .values(watermark_value=as_utc(value), last_run_id=run_id, updated_at=utcnow())
    )
    return True
