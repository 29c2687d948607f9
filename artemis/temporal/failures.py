"""Reading Temporal failures, by exception type (``temporalio.exceptions``), never by
message text. Shared by the task-run workflow (an activity's or a child run's failure)
and the API (a closed run's failure, ``artemis.temporal.runs``).

- ``code_of``: the failure's error code: the root ``ApplicationError``'s type (the
  activity boundary sets it from ``ErrorCode``), ``TIMEOUT_ERROR`` for Temporal's own
  timeouts (start-to-close, heartbeat, schedule-to-close, a workflow's run timeout),
  ``INTERNAL`` otherwise (a cancellation too: the run's own stop is decided by the
  workflow, not read from a failure).
- ``message_of``, ``details_of``: its message and its first detail (a dict, or {}).

Imports temporalio and ``artemis.errors`` only: the workflow sandbox passes it through.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    FailureError,
    TimeoutError,
)

from artemis.errors import ErrorCode


def _chain(e: BaseException) -> Iterator[BaseException]:
    """The failure and its causes, outermost first (Temporal's ``cause`` chain, then
    Python's ``__cause__`` for anything else)."""
    cur: BaseException | None = e
    while cur is not None:
        yield cur
        cur = cur.cause if isinstance(cur, FailureError) else cur.__cause__


def root_application_error(e: BaseException) -> ApplicationError | None:
    """The first ``ApplicationError`` in the chain (what our code raised), if any."""
    return next((x for x in _chain(e) if isinstance(x, ApplicationError)), None)


def code_of(e: BaseException) -> str:
    """The error code a failure carries (see the module docstring)."""
    app = root_application_error(e)
    if app is not None and app.type:
        return app.type
    for x in _chain(e):
        if isinstance(x, TimeoutError):
            return ErrorCode.TIMEOUT_ERROR.value
    return ErrorCode.INTERNAL.value


def message_of(e: BaseException) -> str:
    """What went wrong, in the words of the code that failed."""
    app = root_application_error(e)
    if app is not None:
        return app.message
    cause = e.cause if isinstance(e, FailureError) else None
    return str(cause or e)


def details_of(e: BaseException) -> dict[str, Any]:
    """The first detail of the root ``ApplicationError`` when it is a dict, else {}."""
    app = root_application_error(e)
    details = app.details[0] if app is not None and app.details else None
    return details if isinstance(details, dict) else {}


def is_retryable(e: BaseException) -> bool:
    """A failure another attempt may fix: an ``ApplicationError`` not marked
    non-retryable (False for anything else: a timeout or cancellation is Temporal's)."""
    app = root_application_error(e)
    return app is not None and not app.non_retryable


def was_cancelled(e: ActivityError) -> bool:
    """The activity ended acknowledging its cancellation (no result)."""
    return isinstance(e.cause, CancelledError)
