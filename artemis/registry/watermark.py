"""Incremental pointers (``reg_prov_watermark``): read at the start of an update run,
advanced only when the run completes (never backwards)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Connection

from artemis.db import utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import RegProvWatermark, RegProvWatermarkSeen
from artemis.registry.resolve import as_utc

_t = RegProvWatermark.__table__  # type: ignore[attr-defined]


def read_watermark(
    conn: Connection, provenance_id: int, task_type: str, key: str
) -> datetime | None:
    """The watermark's instant (None: no update of the query has completed)."""
    return read_pointer(conn, provenance_id, task_type, key)[0]


# -- pointers read from the records (offset_type_code DATE / ID / COMPOSITE) ----------------
_seen = RegProvWatermarkSeen.__table__  # type: ignore[attr-defined]


def read_pointer(
    conn: Connection, provenance_id: int, task_type: str, key: str
) -> tuple[datetime | None, Any]:
    """The watermark's instant and its cursor (an ID pointer's id, a COMPOSITE pointer's
    ``[instant, id]``; None for a window's end)."""
    row = conn.execute(
        select(_t.c.watermark_value, _t.c.watermark_cursor).where(
            _t.c.provenance_id == provenance_id,
            _t.c.task_type == task_type,
            _t.c.watermark_key == (key or "default"),
        )
    ).first()
    if row is None:
        return None, None
    cursor = json.loads(row.watermark_cursor) if row.watermark_cursor else None
    return as_utc(row.watermark_value), cursor


def pointer_field(win: dict[str, Any]) -> str | None:
    """The record field an update's pointer is read from: ``watermark_field_name``, else
    (a DATE or COMPOSITE pointer) the source's date field, ``default_date_field_name``."""
    if win.get("watermark_field_name"):
        return str(win["watermark_field_name"])
    if (win.get("offset_type_code") or "DATE") != "ID" and win.get("default_date_field_name"):
        return str(win["default_date_field_name"])
    return None


def pointer_of(record: dict[str, Any], win: dict[str, Any], tz: tzinfo = UTC) -> Any:
    """A record's pointer value: its ``watermark_field_name`` (DATE: an instant, ID: an
    id), or ``[instant, id]`` (COMPOSITE); None when the record lacks it. ``tz``: the
    source's zone, which a timestamp written without an offset is in."""
    kind = win.get("offset_type_code") or "DATE"
    field = pointer_field(win)
    value = record.get(field) if field else None
    if value is None:
        return None
    if kind == "ID":
        return _id(value, field)
    instant = _instant(value, field, tz, win.get("window_time_format"))
    if kind == "COMPOSITE":
        id_field = win.get("watermark_id_field_name")
        ident = record.get(id_field) if id_field else None
        return [instant, None if ident is None else _id(ident, id_field)]
    return instant


def _id(value: Any, field: str | None) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"record field {field!r} holds {value!r}: an ID pointer reads an integer or a string",
        )
    return value


def _instant(value: Any, field: str | None, tz: tzinfo = UTC, fmt: str | None = None) -> str:
    """A record's timestamp: ISO 8601, or a number of seconds (milliseconds with
    ``window_time_format: EPOCH_MS``) since 1970 where the source writes its times so."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = value / 1000 if fmt == "EPOCH_MS" else value
        try:
            return datetime.fromtimestamp(seconds, UTC).isoformat()
        except (OverflowError, OSError, ValueError):
            pass
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"record field {field!r} holds {str(value)[:60]!r}: a DATE pointer reads an "
            "ISO 8601 timestamp or a number of seconds since 1970 (milliseconds with "
            "window_time_format EPOCH_MS)",
        ) from None
    if parsed.tzinfo is None:
        # A source that writes its times without an offset writes its own wall clock (the
        # zone its window parameters are written in): read as UTC, a zone east of UTC
        # would put the pointer ahead of the records and the next update would skip some.
        parsed = parsed.replace(tzinfo=tz)
    return parsed.astimezone(UTC).isoformat()


def _order(value: Any) -> tuple[Any, ...]:
    """Pointer values in order: instants by time, ids numerically (an id written as a
    string of digits too: "100" after "99") before other strings."""
    if isinstance(value, list):
        return (_order(value[0]), _order(value[1]) if value[1] is not None else ())
    if isinstance(value, int):
        return (0, value, "")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return (0, int(value), "")
    if isinstance(value, str) and value[:4].isdigit() and "T" in value:
        return (1, as_utc(value).timestamp(), "")
    return (2, 0, str(value))


def largest(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present, key=_order) if present else None


def note_seen(conn: Connection, provenance_id: int, run_id: str, key: str, value: Any) -> None:
    """Keep a batch's largest pointer for the run's end."""
    conn.execute(
        _seen.insert().values(
            provenance_id=provenance_id,
            run_id=run_id,
            watermark_key=key or "default",
            seen_value=json.dumps(value),
            created_at=utcnow(),
        )
    )


def take_seen(conn: Connection, provenance_id: int, run_id: str, key: str) -> Any:
    """The largest pointer the run's batches saw (None: none), its rows removed."""
    where = (
        _seen.c.provenance_id == provenance_id,
        _seen.c.run_id == run_id,
        _seen.c.watermark_key == (key or "default"),
    )
    values = [
        json.loads(v) for v in conn.execute(select(_seen.c.seen_value).where(*where)).scalars()
    ]
    conn.execute(delete(_seen).where(*where))
    return largest(values)


def drop_seen(conn: Connection, provenance_id: int, run_id: str) -> None:
    conn.execute(
        delete(_seen).where(_seen.c.provenance_id == provenance_id, _seen.c.run_id == run_id)
    )


@dataclass(frozen=True)
class PointerKey:
    """Which watermark: a provenance's, for one task type, under one key (a query's; ""
    for the default)."""

    provenance_id: int
    task_type: str
    key: str = ""


def advance_pointer(
    conn: Connection, pointer: PointerKey, value: datetime, cursor: Any, run_id: str
) -> bool:
    """Move the watermark to ``value`` with ``cursor`` (an ID or COMPOSITE pointer), never
    backwards: a cursor at or before the current one leaves it."""
    provenance_id, task_type = pointer.provenance_id, pointer.task_type
    key = pointer.key or "default"
    current, old = read_pointer(conn, provenance_id, task_type, key)
    if current is None:
        conn.execute(
            _t.insert().values(
                provenance_id=provenance_id,
                task_type=task_type,
                watermark_key=key,
                watermark_value=as_utc(value),
                watermark_cursor=None if cursor is None else json.dumps(cursor),
                last_run_id=run_id,
                updated_at=utcnow(),
            )
        )
        return True
    if cursor is not None and old is not None and _order(cursor) <= _order(old):
        return False
    if cursor is None and as_utc(value) <= current:
        return False
    conn.execute(
        update(_t)
        .where(
            _t.c.provenance_id == provenance_id,
            _t.c.task_type == task_type,
            _t.c.watermark_key == key,
        )
        .values(
            watermark_value=max(as_utc(value), current),
            watermark_cursor=None if cursor is None else json.dumps(cursor),
            last_run_id=run_id,
            updated_at=utcnow(),
        )
    )
    return True
