"""A source's own rate-limit headers (``rate_limit_cfg.ratelimit_headers_code``): when an
answer says the source's budget is spent, the provenance's gate is closed until the
budget comes back, for every worker (``artemis.ratelimit.RateGate.close_for``).

Two styles are read, each as its public documents write it:

- ``X_RATELIMIT``: ``X-RateLimit-Remaining`` (requests left in the current window) and
  ``X-RateLimit-Reset``. GitHub's REST API writes the reset as "the time at which the
  current rate limit window resets in UTC epoch seconds" (docs.github.com, "Rate limits
  for the REST API"; ``X-RateLimit-Reset: 1372700873``), as do Twitter/X, Smartsheet and
  Auth0; others write the seconds left (Unipile ``x-ratelimit-reset: 24``, WHOOP) or
  milliseconds (Prisjakt). ``reset_format_code`` says which. A comma list (Brave's
  ``X-RateLimit-Remaining: 1, 1000`` with ``X-RateLimit-Reset: 1, 1419704``: one value
  per window) is read pairwise. The names are configurable: the early IETF drafts'
  ``RateLimit-Remaining`` / ``RateLimit-Reset`` (draft-ietf-httpapi-ratelimit-headers-06
  and before, seconds left) are this style under other names.
- ``IETF``: the ``RateLimit`` and ``RateLimit-Policy`` fields of
  draft-ietf-httpapi-ratelimit-headers. Since draft -08 (draft-10 §4, §3) ``RateLimit``
  is a Structured Fields List of service limit Items, ``"default";r=50;t=30``: ``r`` the
  remaining quota units (required), ``t`` the seconds until more quota is made available
  (optional, delay-seconds); ``RateLimit-Policy`` is a List of quota policies,
  ``"default";q=100;w=60`` (``w`` the window in seconds). Draft -07 (§3.1, §3.5) wrote
  ``RateLimit`` as a Dictionary, ``limit=100, remaining=50, reset=30`` (``reset`` in
  seconds), with ``RateLimit-Policy: 100;w=60``. Both are read. A limit without ``t`` is
  closed for its policy's window ``w`` (the policy of the same name; in draft -07 the one
  whose quota is the ``limit``); without either nothing is known and nothing closes.
  "Malformed RateLimit header fields MUST be ignored" (draft-10 §7): so they are.

An answer whose remaining is at most ``remaining_reserve_value`` (default 0) closes the
gate until its reset instant; an answer with more remaining changes nothing. Requests
already past the gate when the budget runs out still reach the source: with ``n``
requests in flight across the workers, a reserve of ``n - 1`` keeps them inside the
budget. A 429 answer's ``Retry-After`` closes the gate too ("the Retry-After field MUST
take precedence", draft-10 §7). A reset more than ``MAX_CLOSED_S`` away is read as that
long (draft-10 §8.5.1: clients "can set thresholds that they consider reasonable"), so
a misread value cannot shut a provenance for years.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from artemis.http import Answer, retry_after_seconds

HEADER_STYLES = ("NONE", "X_RATELIMIT", "IETF")
RESET_FORMATS = ("DELTA_SECONDS", "EPOCH_SECONDS", "DELTA_MILLIS", "EPOCH_MILLIS")
# The names each style reads when the row names none: (remaining, reset, policy).
DEFAULT_NAMES = {
    "X_RATELIMIT": ("X-RateLimit-Remaining", "X-RateLimit-Reset", None),
    "IETF": ("RateLimit", None, "RateLimit-Policy"),
}
# GitHub's, the most common ``X-RateLimit-Reset`` writer: epoch seconds.
DEFAULT_RESET_FORMAT = "EPOCH_SECONDS"
# The longest a single answer closes the gate: a day covers the daily quotas sources
# document; a reset read in the wrong format (an epoch taken as seconds left) would
# otherwise close the provenance for decades.
MAX_CLOSED_S = 86_400.0
# The columns that only act with header reading on.
HEADER_COLUMNS = (
    "remaining_header_name",
    "reset_header_name",
    "policy_header_name",
    "reset_format_code",
    "remaining_reserve_value",
)
# RFC 9110 §5.1: a field name is a token.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def rate_limit_problems(row: dict[str, Any]) -> list[str]:
    """Why a ``rate_limit_cfg`` row's header columns cannot act as written (empty: they
    can)."""
    style = row.get("ratelimit_headers_code") or "NONE"
    if style == "NONE":
        given = [c for c in HEADER_COLUMNS if row.get(c) is not None]
        return [f"{c} is read only with ratelimit_headers_code X_RATELIMIT or IETF" for c in given]
    if style not in HEADER_STYLES:
        return [f"ratelimit_headers_code must be one of {', '.join(HEADER_STYLES)}"]
    problems = []
    for column in ("remaining_header_name", "reset_header_name", "policy_header_name"):
        name = row.get(column)
        if name is not None and not _TOKEN.match(name):
            problems.append(f"{column} {name!r} is not an HTTP field name")
    if style == "IETF":
        if row.get("reset_header_name") is not None:
            problems.append("reset_header_name: IETF's reset is the RateLimit field's t")
        if row.get("reset_format_code") not in (None, "DELTA_SECONDS"):
            problems.append("reset_format_code: IETF's t is DELTA_SECONDS (draft §4.1.2)")
    elif row.get("policy_header_name") is not None:
        problems.append("policy_header_name is read only with ratelimit_headers_code IETF")
    fmt = row.get("reset_format_code")
    if fmt is not None and fmt not in RESET_FORMATS:
        problems.append(f"reset_format_code must be one of {', '.join(RESET_FORMATS)}")
    reserve = row.get("remaining_reserve_value")
    if reserve is not None and reserve < 0:
        problems.append("remaining_reserve_value must be 0 or more")
    return problems


@dataclass(frozen=True)
class LimitHeaders:
    """How one provenance's answers say its budget is spent."""

    style: str
    remaining_name: str
    reset_name: str | None
    policy_name: str | None
    reset_format: str
    reserve: float

    @classmethod
    def of(cls, rl: dict[str, Any]) -> LimitHeaders | None:
        """The contract's ``rate_limit`` as header reading; None when it reads none."""
        style = rl.get("ratelimit_headers_code") or "NONE"
        if style == "NONE":
            return None
        remaining, reset, policy = DEFAULT_NAMES[style]
        return cls(
            style=style,
            remaining_name=rl.get("remaining_header_name") or remaining,
            reset_name=(rl.get("reset_header_name") or reset) if style != "IETF" else None,
            policy_name=(rl.get("policy_header_name") or policy) if style == "IETF" else None,
            reset_format=rl.get("reset_format_code")
            or ("DELTA_SECONDS" if style == "IETF" else DEFAULT_RESET_FORMAT),
            reserve=float(rl.get("remaining_reserve_value") or 0),
        )

    def closed_for(self, answer: Answer, now: float | None = None) -> float | None:
        """Seconds the gate stays closed after ``answer`` (``now``: this host's epoch
        clock, for an epoch reset); None: the answer closes nothing."""
        now = time.time() if now is None else now
        if self.style == "IETF":
            limits = ietf_limits(answer.headers, self.remaining_name, self.policy_name)
        else:
            limits = self._x_limits(answer.headers, now)
        spent: list[float | None] = [r for left, r in limits if left <= self.reserve]
        after = retry_after_seconds(answer) if answer.status_code == 429 else None
        if after is not None:
            spent = [after]  # "the Retry-After field MUST take precedence" (draft-10 §7)
        waits = [w for w in spent if w is not None and w > 0]
        return min(max(waits), MAX_CLOSED_S) if waits else None

    def _x_limits(self, headers: Mapping[str, str], now: float) -> list[tuple[float, float]]:
        """(remaining, seconds until reset) per window the X-RateLimit headers name."""
        remaining = _numbers(headers.get(self.remaining_name))
        resets = _numbers(headers.get(self.reset_name or ""))
        scale = 1000.0 if self.reset_format.endswith("MILLIS") else 1.0
        epoch = self.reset_format.startswith("EPOCH")
        return [
            (left, reset / scale - now if epoch else reset / scale)
            for left, reset in zip(remaining, resets, strict=False)
        ]


def _numbers(value: str | None) -> list[float]:
    """A header's comma-separated numbers; one that is not a number makes the whole value
    unreadable (pairs would no longer line up)."""
    if not value:
        return []
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        return []


def ietf_limits(
    headers: Mapping[str, str], field: str, policy_field: str | None
) -> list[tuple[float, float]]:
    """(remaining, seconds until more quota) per service limit of a ``RateLimit`` field,
    draft -08 and later (``"name";r=..;t=..``) or draft -07 (``limit=, remaining=,
    reset=``); a limit without a reset takes its policy's window."""
    windows = {
        name: float(params["w"])
        for name, params in _members(headers.get(policy_field or "") or "")
        if _is_number(params.get("w"))
    }
    members = _members(headers.get(field) or "")
    if any(name.startswith("=") for name, _ in members):
        # Draft -07: a Dictionary, one service limit in it.
        d = {name[1:]: p.get("", "") for name, p in members if name.startswith("=")}
        keys = {"r": "remaining", "t": "reset"}
        members = [(d.get("limit", ""), {k: d[v] for k, v in keys.items() if v in d})]
    out = []
    for name, params in members:
        if not _is_number(params.get("r")):
            continue  # malformed: ignored
        reset = float(params["t"]) if _is_number(params.get("t")) else windows.get(name)
        if reset is not None:
            out.append((float(params["r"]), reset))
    return out


def _is_number(value: str | None) -> bool:
    return value is not None and re.fullmatch(r"\d+(\.\d+)?", value) is not None


_MEMBER = re.compile(
    r'\s*("(?:[^"\\]|\\.)*"|[^,;"]*)((?:;[^,;"]*(?:"(?:[^"\\]|\\.)*")?)*)\s*(?:,|$)'
)


def _members(value: str) -> list[tuple[str, dict[str, str]]]:
    """A Structured Fields List (or Dictionary) read loosely: each member's bare item
    (a string unquoted) and its parameters. A Dictionary member ``key=value`` is given as
    ``("=key", {"": value})``. Anything unreadable yields nothing."""
    out: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while pos < len(value):
        m = _MEMBER.match(value, pos)
        if m is None or m.end() == pos:
            return []
        pos = m.end()
        item, rest = m.group(1).strip(), m.group(2)
        params = {}
        for part in filter(None, (p.strip() for p in rest.split(";"))):
            key, _, val = part.partition("=")
            params[key.strip()] = val.strip().strip('"')
        if "=" in item and not item.startswith('"'):
            key, _, val = item.partition("=")
            out.append((f"={key.strip()}", {"": val.strip()}))
        else:
            out.append((item.strip('"'), params))
    return out
