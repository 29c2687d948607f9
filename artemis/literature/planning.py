"""A literature run's params and the windows it covers: the date window an API is asked
for, an update run's window from its watermark, a backfill's windows and the halves of a
window over the result cap (each a child run's params)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from artemis.bounds import OutageTolerance
from artemis.errors import ArtemisError, ErrorCode

_UNITS = {
    "MINUTE": timedelta(minutes=1),
    "HOUR": timedelta(hours=1),
    "DAY": timedelta(days=1),
    "WEEK": timedelta(weeks=1),
    "MONTH": timedelta(days=30),
}


class LiteratureParams(BaseModel):
    model_config = {"extra": "forbid"}

    provenance: str = Field(min_length=1)
    task_type: Literal["harvest", "update", "backfill"] = "harvest"
    start: date | None = None
    end: date | None = None
    query: str | None = None
    page_size: int | None = Field(None, ge=1, le=10_000)
    parallelism: int | None = Field(None, ge=1, le=32)  # backfill: windows run at once
    # The shortfall against the source's stated total this run accepts (percent); default:
    # the registry's pagination_cfg.completeness_tolerance_pct, else 0.
    completeness_tolerance_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    # How long an outage of the source or a sink is waited out (SPEC §4 "Outages");
    # default: the registry's retry_cfg.outage_tolerance_millis, else
    # runs.outage_tolerance_s. 0: fail fast.
    outage_tolerance_s: OutageTolerance = None
    # Filled by prepare_params: the frozen contract and the window actually harvested.
    contract: dict[str, Any] | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    parent: str | None = None  # the task id of the run that fanned this one out

    @model_validator(mode="after")
    def _window(self) -> LiteratureParams:
        if self.start and self.end and self.end < self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start})")
        return self


def _span(value: int | None, unit: str | None) -> timedelta:
    if not value:
        return timedelta(0)
    if unit not in _UNITS:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR, f"window unit {unit!r} is not one of {', '.join(_UNITS)}"
        )
    return value * _UNITS[unit]


def day_start(day: date | None) -> datetime | None:
    """Midnight (UTC) at the start of ``day``."""
    return datetime.combine(day, datetime.min.time(), UTC) if day else None


def window_params(
    code: str, date_field: str | None, start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    """The API's own way to ask for a date window (both ends inclusive, day precision)."""
    if start is None and end is None:
        return {}
    lo = (start or datetime(1900, 1, 1, tzinfo=UTC)).date()
    hi = (end or datetime.now(UTC)).date()
    if code == "eutils":
        return {
            "mindate": lo.strftime("%Y/%m/%d"),
            "maxdate": hi.strftime("%Y/%m/%d"),
            "datetype": (date_field or "edat").lower(),
        }
    if code == "crossref":
        field = (date_field or "index-date").lower()
        return {"filter": f"from-{field}:{lo.isoformat()},until-{field}:{hi.isoformat()}"}
    raise ArtemisError(ErrorCode.CONFIG_ERROR, f"no date-window mapping for provenance {code!r}")


def update_window(
    win: dict[str, Any],
    mark: datetime | None,
    start: datetime | None,
    end: datetime | None,
    now: datetime,
) -> tuple[datetime | None, datetime | None]:
    """An update run's window: from the watermark minus the contract's overlap (the first
    run: from ``start``) up to ``end``, else now minus the contract's lag."""
    lag = timedelta(seconds=win.get("watermark_lag_seconds") or 0)
    if mark is None and start is None:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            "params.start: the first update run of a query needs a "
            "start (there is no watermark yet)",
        )
    overlap = _span(win.get("overlap_value"), win.get("overlap_unit_code"))
    start = (mark - overlap) if mark is not None else start
    end = end or (now - lag)
    return start, end


def backfill_windows(first: date, last: date, win: dict[str, Any]) -> list[tuple[date, date]]:
    """``first``..``last`` cut into the contract's windows: calendar months or fixed sizes
    (at least a day), both ends inclusive."""
    windows: list[tuple[date, date]] = []
    cur = first
    while cur <= last:
        if (
            win.get("window_mode_code") == "CALENDAR"
            and win.get("window_size_unit_code") == "MONTH"
        ):
            months = win.get("window_size_value") or 1
            y, m = divmod(cur.month - 1 + months, 12)
            nxt = date(cur.year + y, m + 1, 1)
        else:
            span = _span(
                win.get("window_size_value") or 1, win.get("window_size_unit_code") or "DAY"
            )
            nxt = cur + max(timedelta(days=1), span)
        windows.append((cur, min(last, nxt - timedelta(days=1))))
        cur = nxt
    return windows


def halves(first: date, last: date) -> list[tuple[date, date]] | None:
    """``first``..``last`` in two, or None for a single day."""
    if first >= last:
        return None
    mid = first + (last - first) // 2
    return [(first, mid), (mid + timedelta(days=1), last)]


def child_params(p: LiteratureParams, start: date, end: date, parent: str) -> dict[str, Any]:
    """A child run's params: ``p``'s query and frozen contract over ``start``..``end``."""
    return {
        "provenance": p.provenance,
        "task_type": "harvest",
        "query": p.query,
        "page_size": p.page_size,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "contract": p.contract,
        "completeness_tolerance_pct": p.completeness_tolerance_pct,
        "outage_tolerance_s": p.outage_tolerance_s,
        "window_start": None,
        "window_end": None,
        "parent": parent,
    }
