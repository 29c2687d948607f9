"""A literature run's params, and how the paper families ask for a date window (both ends
inclusive, day precision)."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from typing import Any

from artemis.errors import ArtemisError, ErrorCode
from artemis.tasks.source_harvest import SourceParams


class LiteratureParams(SourceParams):
    """The params of ``literature_harvest``: a registry run's (``SourceParams``)."""


def window_params(
    family: str,
    date_field: str | None,
    start: datetime | None,
    end: datetime | None,
    tz: tzinfo = UTC,
) -> dict[str, Any]:
    """The paper API's own way to ask for a date window (both ends inclusive, day
    precision): E-utilities ``mindate``/``maxdate``/``datetype``, Crossref's
    ``filter=from-…,until-…``."""
    if start is None and end is None:
        return {}
    # The days of the source's zone the instants fall on.
    lo = (start or datetime(1900, 1, 1, tzinfo=UTC)).astimezone(tz).date()
    hi = (end or datetime.now(UTC)).astimezone(tz).date()
    if family == "PUBMED":
        return {
            "mindate": lo.strftime("%Y/%m/%d"),
            "maxdate": hi.strftime("%Y/%m/%d"),
            "datetype": (date_field or "edat").lower(),
        }
    if family == "CROSSREF":
        field = (date_field or "index-date").lower()
        return {"filter": f"from-{field}:{lo.isoformat()},until-{field}:{hi.isoformat()}"}
    raise ArtemisError(ErrorCode.CONFIG_ERROR, f"no date-window mapping for family {family!r}")
