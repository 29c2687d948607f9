"""Outages of the things a run talks to (docs/architecture.md): which failures are one, the
words an operator reads while a run waits, and how long to wait before the next attempt.

A transient failure — a 5xx, 408, 425 or 429 answer, a refused or reset connection, a
DNS failure, a read that timed out, a database that cannot be reached — of a source, a
sink or the run's own staging store does not fail a run: the activity reports it
(``FetchResult.outage`` / ``EmitResult.outage``, or a failure whose details name the
dependency) and the workflow waits on a Temporal timer, backing off up to
``runs.retry_max_interval_s``, for as long as the dependency has been failing less than
the run's outage tolerance. Anything else (another 4xx, SOURCE_CONTRACT, a schema
mismatch, ...) is permanent and fails the run at once.

Stdlib, ``artemis.errors`` and ``artemis.run_models`` only: the workflow imports it.
"""

from __future__ import annotations

from datetime import datetime
from http import HTTPStatus
from types import MappingProxyType
from typing import Any

from artemis.errors import ArtemisError, ErrorCode
from artemis.redact import redact_text
from artemis.run_models import Outage

# The codes a dependency's transient failure carries (when the error is retryable).
TRANSIENT_CODES = frozenset(
    {
        ErrorCode.SOURCE_ERROR,
        ErrorCode.SINK_ERROR,
        ErrorCode.TIMEOUT_ERROR,
        ErrorCode.NETWORK_ERROR,
        ErrorCode.PLATFORM_ERROR,
        ErrorCode.INTERNAL,  # only with a ``dependency`` detail: the staging store
    }
)

# What a run fails with when a dependency stays down past its tolerance.
UNAVAILABLE = MappingProxyType(
    {
        "source": ErrorCode.SOURCE_UNAVAILABLE,
        "sink": ErrorCode.SINK_UNAVAILABLE,
        "store": ErrorCode.INTERNAL,
    }
)

# The 4xx answers that may pass on retry (Request Timeout, Too Early, Too Many Requests);
# every 5xx may too.
TRANSIENT_4XX = frozenset({408, 425, 429})


def is_transient_status(status: int) -> bool:
    """An error answer a later attempt may not get: 408, 425, 429 or any 5xx."""
    return status in TRANSIENT_4XX or status >= 500


def status_reason(status: int) -> str:
    """``503 Service Unavailable``: a status with its phrase."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def outage_of(e: BaseException, dependency: str, name: str) -> Outage | None:
    """The outage ``e`` is, when it is a transient failure of ``dependency`` (``source``,
    ``sink``); a failure naming its own dependency (the staging store) says so itself.
    None: not an outage (permanent, or not ours to wait out)."""
    if not isinstance(e, ArtemisError) or not e.retryable or e.code not in TRANSIENT_CODES:
        return None
    own = e.details.get("dependency")
    if own:
        dependency, name = str(own), str(e.details.get("dependency_name") or own)
    elif e.code is ErrorCode.INTERNAL:
        return None  # a bug is not an outage
    if e.details.get("sink"):
        name = str(e.details["sink"])
    return Outage(
        dependency=dependency,
        name=name,
        reason=str(e.details.get("reason") or e.code.value),
        message=redact_text(e.message),
        code=e.code.value,
        retry_after_s=e.retry_after_s,
    )


def outage_from_details(details: dict[str, Any], message: str, code: str) -> Outage | None:
    """The outage an activity's failure names in its details (``dependency`` set by the
    domain: the staging store unreachable), as the workflow reads it."""
    dependency = details.get("dependency")
    if not dependency:
        return None
    return Outage(
        dependency=str(dependency),
        name=str(details.get("dependency_name") or dependency),
        reason=str(details.get("reason") or code),
        message=message,
        code=code,
        retry_after_s=None,
    )


def next_delay(
    attempt: int,
    initial_s: float,
    backoff: float,
    maximum_s: float,
    retry_after_s: float | None,
    remaining_s: float,
) -> float:
    """The wait before attempt ``attempt + 1`` (``attempt`` failed, from 1): exponential
    from ``initial_s``, capped at ``maximum_s``; a ``Retry-After`` is honoured up to that
    cap; never past the tolerance's end (one more attempt is made right there)."""
    delay = min(initial_s * backoff ** max(attempt - 1, 0), maximum_s)
    if retry_after_s:
        delay = max(delay, min(retry_after_s, maximum_s))
    return max(0.05, min(delay, max(remaining_s, 0.0) + 0.05))


def waiting_line(waiting: dict[str, Any], now: datetime | None = None) -> str:
    """``waiting: sink http unavailable since 12:03:04 (503 Service Unavailable), attempt
    7, next in 60 s`` — the one line every view of a waiting run shows."""
    since = str(waiting.get("since") or "")
    clock = since[11:19] if len(since) >= 19 else since
    line = (
        f"waiting: {waiting.get('dependency')} {waiting.get('name')} unavailable since "
        f"{clock} ({waiting.get('reason')}), attempt {waiting.get('attempt')}"
    )
    nxt = waiting.get("next_attempt_at")
    if nxt and now is not None:
        try:
            left = (datetime.fromisoformat(str(nxt)) - now).total_seconds()
            return f"{line}, next in {max(0, round(left))} s"
        except ValueError:
            pass
    if waiting.get("next_in_s") is not None:
        return f"{line}, next in {round(float(waiting['next_in_s']))} s"
    return line
