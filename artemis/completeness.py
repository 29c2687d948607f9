"""How a run knows it is complete (docs/architecture.md): loops caught by content and
the records delivered reconciled against the total the source stated.

Pure functions (stdlib, orjson): sources, tasks and the workflow share them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

import orjson

from artemis.errors import ArtemisError, ErrorCode
from artemis.jsonpaths import MISSING, contract_error, json_path_lookup


def record_keys(records: Iterable[Any], key_path: str | None = None) -> list[bytes]:
    """Each record's key: the value at ``key_path`` when given (a record without one
    breaks the contract), else the whole record."""
    if key_path:
        keys = []
        for r in records:
            value = json_path_lookup(r, key_path)
            if value is MISSING or value is None or isinstance(value, (dict, list)) or value == "":
                raise contract_error("record key", key_path, "the record's key", value)
            keys.append(orjson.dumps(value, default=str))
        return keys
    return [orjson.dumps(r, default=str, option=orjson.OPT_SORT_KEYS) for r in records]


def page_digest(records: list[Any], key_path: str | None = None) -> str | None:
    """A fingerprint of a page's record keys (None for an empty page)."""
    if not records:
        return None
    h = hashlib.sha1(usedforsecurity=False)
    for key in record_keys(records, key_path):
        h.update(key)
        h.update(b"\x00")
    return h.hexdigest()


def check_loop(previous: str | None, digest: str | None, who: str, where: str) -> None:
    """A source serving the previous page's records again is looping (SOURCE_LOOP); a
    repeated cursor alone is not (Crossref keeps one cursor for a whole session)."""
    if digest is not None and digest == previous:
        raise ArtemisError(
            ErrorCode.SOURCE_LOOP,
            f"{who}: the page of {where} holds the same records as the page before it; "
            "the source is serving one page again",
        )


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
