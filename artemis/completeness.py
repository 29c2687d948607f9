"""How a run knows it is complete (docs/architecture.md): the records delivered
reconciled against the total the source stated (a source serving one page again is
caught by its pages' fingerprints, ``artemis/paging.py``).

Pure functions (stdlib): sources, tasks and the workflow share them.
"""

from __future__ import annotations

import math
from typing import Any

from artemis.errors import ArtemisError, ErrorCode


def allowed_shortfall(expected: int, tolerance_pct: float) -> int:
    """Records that may be missing out of ``expected`` at ``tolerance_pct`` percent."""
    return math.floor(expected * max(0.0, tolerance_pct) / 100 + 1e-9)


def is_short(expected: int | None, got: int, tolerance_pct: float) -> bool:
    return expected is not None and got < expected - allowed_shortfall(expected, tolerance_pct)


def shortfall(
    who: str, expected: int | None, got: int, tolerance_pct: float, where: str
) -> dict[str, Any] | None:
    """What INCOMPLETE says when ``got`` falls short of the stated ``expected`` beyond the
    tolerance (None when it does not). More than stated is no loss (an index that grew
    while it was read)."""
    if expected is None or not is_short(expected, got, tolerance_pct):
        return None
    return {
        "message": f"{who}: expected {expected} records (the source's own count), got {got}, "
        f"short by {expected - got} beyond the tolerance of {tolerance_pct:g} %; "
        f"stopped at {where}",
        "expected_total": expected,
        "records_fetched": got,
    }


def check_complete(
    who: str, expected: int | None, got: int, tolerance_pct: float, where: str
) -> None:
    """INCOMPLETE (raised) when ``got`` falls short, as ``shortfall`` says."""
    short = shortfall(who, expected, got, tolerance_pct, where)
    if short is not None:
        raise ArtemisError(
            ErrorCode.INCOMPLETE,
            short["message"],
            details={k: v for k, v in short.items() if k != "message"},
        )
