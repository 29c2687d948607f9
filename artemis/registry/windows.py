"""The windows a registry run covers, from its contract's ``window_offset_cfg``: an update's
window from its watermark (or its lookback), a backfill's windows (calendar months or
fixed sizes, aligned in the source's time zone), the halves of a window over the result
cap, and how a window's ends are written in the source's own parameters."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from artemis.errors import ArtemisError, ErrorCode

UNITS = {
    "MINUTE": timedelta(minutes=1),
    "HOUR": timedelta(hours=1),
    "DAY": timedelta(days=1),
    "WEEK": timedelta(weeks=1),
    "MONTH": timedelta(days=30),
}
# The earliest instant a window without a start asks for.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)


def span(value: int | None, unit: str | None) -> timedelta:
    """``value`` ``unit``s (``MONTH``: 30 days); zero when no value."""
    if not value:
        return timedelta(0)
    if unit not in UNITS:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR, f"window unit {unit!r} is not one of {', '.join(UNITS)}"
        )
    return value * UNITS[unit]


def source_zone(contract: dict[str, Any] | None) -> tzinfo:
    """The provenance's ``timezone_default`` (an IANA name; default UTC)."""
    name = ((contract or {}).get("provenance") or {}).get("timezone_default") or "UTC"
    return zone(name)


def zone(name: str) -> tzinfo:
    if name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"timezone_default {name!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)",
        ) from None


def day_start(day: date | None, tz: tzinfo = UTC) -> datetime | None:
    """Midnight at the start of ``day`` in ``tz``, as a UTC instant."""
    if day is None:
        return None
    return datetime.combine(day, datetime.min.time(), tz).astimezone(UTC)


def update_window(
    win: dict[str, Any],
    mark: datetime | None,
    start: datetime | None,
    end: datetime | None,
    now: datetime,
) -> tuple[datetime | None, datetime | None]:
    """An update run's window: from the watermark minus the contract's overlap up to
    ``end`` (at most now minus the contract's lag), else now minus the lag. Without a
    watermark (the first update of a query): from ``start``, else now minus
    ``lookback``."""
    lag = timedelta(seconds=win.get("watermark_lag_seconds") or 0)
    if mark is None and start is None:
        lookback = span(win.get("lookback_value"), win.get("lookback_unit_code"))
        if not lookback:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                "params.start: the first update run of a query needs a start (there is "
                "no watermark yet, and window_offset_cfg.lookback_value is not set)",
            )
        start = now - lag - lookback
    overlap = span(win.get("overlap_value"), win.get("overlap_unit_code"))
    start = (mark - overlap) if mark is not None else start
    # Never past now minus the lag: records the source has not shown yet would be
    # skipped by the pointer that moves to this end.
    end = min(end, now - lag) if end is not None else now - lag
    return start, end


def backfill_windows(first: date, last: date, win: dict[str, Any]) -> list[tuple[date, date]]:
    """``first``..``last`` cut into the contract's windows (``iter_windows``), as a list."""
    return list(iter_windows(first, last, win))


def iter_windows(first: date, last: date, win: dict[str, Any]) -> Iterator[tuple[date, date]]:
    """``first``..``last`` cut into the contract's windows: calendar months or fixed sizes
    (at least a day), both ends inclusive, as days of the source's zone; one at a time, so
    a slice of a long range is planned without listing it all."""
    cur = first
    while cur <= last:
        nxt = _next_start(cur, win)
        end = last if nxt == date.max else min(last, nxt - timedelta(days=1))
        yield cur, end
        if end >= last:
            return
        cur = nxt


def _calendar(win: dict[str, Any]) -> str | None:
    """``MONTH`` or ``WEEK`` for calendar windows, else None (fixed sizes)."""
    unit = win.get("window_size_unit_code")
    if win.get("window_mode_code") == "CALENDAR" and unit in ("MONTH", "WEEK"):
        return str(unit)
    return None


def _step_days(win: dict[str, Any]) -> int:
    """A fixed-size window's length in days (at least one)."""
    size = span(win.get("window_size_value") or 1, win.get("window_size_unit_code") or "DAY")
    return max(1, size.days)


def _next_start(cur: date, win: dict[str, Any]) -> date:
    calendar = _calendar(win)
    if calendar == "MONTH":
        months = win.get("window_size_value") or 1
        y, m = divmod(cur.month - 1 + months, 12)
        if cur.year + y > date.max.year:
            return date.max
        return date(cur.year + y, m + 1, 1)
    if calendar == "WEEK":
        # Calendar weeks start on Monday.
        weeks = win.get("window_size_value") or 1
        return _plus_days(cur - timedelta(days=cur.weekday()), 7 * weeks)
    return _plus_days(cur, _step_days(win))


def _plus_days(day: date, days: int) -> date:
    """``day`` plus ``days``, stopping at the last date there is (the loop's end)."""
    if (date.max - day).days < days:
        return date.max
    return day + timedelta(days=days)


def count_windows(first: date, last: date, win: dict[str, Any]) -> int:
    """How many windows ``iter_windows`` yields, by arithmetic (a range of millions of days
    is counted without walking it)."""
    if last < first:
        return 0
    calendar = _calendar(win)
    if calendar == "MONTH":
        months = win.get("window_size_value") or 1
        spanned = (last.year - first.year) * 12 + last.month - first.month
        return 1 + spanned // months
    if calendar == "WEEK":
        weeks = win.get("window_size_value") or 1
        monday = first - timedelta(days=first.weekday())
        return 1 + (last - monday).days // (7 * weeks)
    step = _step_days(win)
    return -(-((last - first).days + 1) // step)


def halves(first: date, last: date) -> list[tuple[date, date]] | None:
    """``first``..``last`` in two, or None for a single day."""
    if first >= last:
        return None
    mid = first + (last - first) // 2
    return [(first, mid), (mid + timedelta(days=1), last)]


def format_instant(value: datetime, fmt: str | None, tz: tzinfo) -> str:
    """An instant as a source's parameter takes it: ``ISO`` (default: ISO 8601 in the
    source's zone), ``EPOCH`` / ``EPOCH_MS`` (seconds / milliseconds since 1970), or a
    ``strftime`` pattern applied in the source's zone."""
    local = value.astimezone(tz)
    if not fmt or fmt == "ISO":
        return local.isoformat()
    if fmt == "EPOCH":
        return str(int(value.timestamp()))
    if fmt == "EPOCH_MS":
        return str(int(value.timestamp() * 1000))
    return local.strftime(fmt)


def check_time_format(fmt: str | None) -> str | None:
    """A ``window_time_format`` that names something: ISO, EPOCH, EPOCH_MS or a pattern
    with at least one ``%`` directive."""
    if fmt is None or fmt in ("ISO", "EPOCH", "EPOCH_MS"):
        return fmt
    if "%" not in fmt:
        raise ValueError(
            f"{fmt!r} is not ISO, EPOCH, EPOCH_MS or a strftime pattern (e.g. %Y-%m-%d)"
        )
    try:
        datetime(2024, 5, 1, tzinfo=UTC).strftime(fmt)
    except ValueError as e:
        raise ValueError(f"{fmt!r}: {e}") from None
    return fmt


def window_query(
    contract: dict[str, Any], start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    """A window ``[start, end)`` in the parameters the contract names for it
    (``window_start_param_name`` / ``window_end_param_name``, written as
    ``window_time_format``); nothing when the contract names none."""
    win = contract.get("window_offset") or {}
    tz = source_zone(contract)
    fmt = win.get("window_time_format")
    out: dict[str, Any] = {}
    if start is not None and win.get("window_start_param_name"):
        out[win["window_start_param_name"]] = format_instant(start, fmt, tz)
    if end is not None and win.get("window_end_param_name"):
        out[win["window_end_param_name"]] = format_instant(end, fmt, tz)
    return out


# Columns of window_offset_cfg the paper families do not read: their APIs take a date
# filter of their own, and their pointer is the window's end.
NOT_FOR_PAPERS = (
    "window_start_param_name",
    "window_end_param_name",
    "window_time_format",
    "watermark_field_name",
    "watermark_id_field_name",
    "watermark_id_param_name",
)


def pointer_problems(row: dict[str, Any]) -> list[str]:
    """What a window_offset_cfg row's pointer settings cannot do: an ID pointer without
    the field it is read from or the parameter it is sent in, a COMPOSITE one without its
    id, id settings on a DATE pointer."""
    kind = row.get("offset_type_code") or "DATE"
    date_field = row.get("watermark_field_name") or row.get("default_date_field_name")
    out = []
    if kind == "ID":
        if not row.get("watermark_field_name"):
            out.append("an ID pointer is read from the records' watermark_field_name (e.g. id)")
        if not row.get("watermark_id_param_name"):
            out.append("an ID pointer is sent in watermark_id_param_name (e.g. since_id)")
        if row.get("watermark_id_field_name"):
            out.append(
                "watermark_id_field_name is COMPOSITE's tie-break: an ID pointer's id "
                "is watermark_field_name"
            )
    elif kind == "COMPOSITE":
        if not date_field:
            out.append(
                "a COMPOSITE pointer's timestamp is read from watermark_field_name "
                "(or default_date_field_name)"
            )
        if not row.get("watermark_id_field_name"):
            out.append("a COMPOSITE pointer's id is read from watermark_id_field_name")
    else:
        for name in ("watermark_id_field_name", "watermark_id_param_name"):
            if row.get(name):
                out.append(f"{name} is read by ID and COMPOSITE pointers, not DATE")
    return out


def window_file_problems(doc: dict[str, Any]) -> list[str]:
    """The window rows of a file, each named by its place."""
    family = {r.get("record_family_code") for r in doc.get("record_model") or []} - {None}
    out = []
    for i, row in enumerate(doc.get("window_offset_cfg") or []):
        where = f"window_offset_cfg[{i}]"
        if family:
            names = sorted(family)
            for name in NOT_FOR_PAPERS:
                if row.get(name) is not None:
                    out.append(
                        f"{where}.{name}: not read by the {names[0]} family (its API "
                        "has its own date filter; its pointer is the window's end)"
                    )
            if (row.get("offset_type_code") or "DATE") != "DATE":
                out.append(
                    f"{where}.offset_type_code: the {names[0]} family's pointer is a "
                    "DATE (the window's end)"
                )
            continue
        out += [f"{where}: {p}" for p in pointer_problems(row)]
    return out
