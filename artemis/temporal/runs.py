"""How a closed run ended, read from Temporal: its result, or its failure turned into the
run's status, stats and error (the same shape the run's own result has). Used by the API
(GET /tasks/{id}, the event stream) and by the clean-up loop, which records in the
task store the ending of a run that could not record it itself (terminated, say)."""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowExecutionStatus as WfStatus
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError

from artemis.run_state import RunStatus, end_error, stats_view, status_of_closed
from artemis.temporal.failures import code_of, details_of, message_of

OPEN_STATUSES = (WfStatus.RUNNING, WfStatus.CONTINUED_AS_NEW)


async def closed_run_end(handle: WorkflowHandle, status: WfStatus | None) -> dict[str, Any]:
    """{status, stats, error, duration_ms, callback} of a run whose workflow has closed
    with Temporal status ``status``."""
    try:
        result = await handle.result()
        return {
            "status": result["status"],
            "stats": result["stats"],
            "error": result.get("error"),
            "duration_ms": result.get("duration_ms"),
            "callback": result.get("callback"),
        }
    except WorkflowFailureError as e:
        cause = e.cause
        if isinstance(cause, CancelledError) or status == WfStatus.CANCELED:
            # Cancelled in Temporal before the run could answer: no counts of its own.
            return {
                "status": RunStatus.CANCELLED.value,
                "stats": stats_view(None),
                "error": end_error(RunStatus.CANCELLED, None, "workflow cancelled"),
            }
        if isinstance(cause, ApplicationError):
            # The run's own failure: its result rides in the failure's details.
            details = details_of(cause)
            return {
                "status": details.get("status", RunStatus.FAILED.value),
                "stats": details.get("stats", stats_view(None)),
                "duration_ms": details.get("duration_ms"),
                "callback": details.get("callback"),
                "error": end_error(RunStatus.FAILED, code_of(cause), message_of(cause)),
            }
        ended = status_of_closed(status.name if status is not None else None)
        return {
            "status": ended.value,
            "stats": stats_view(None),
            "error": end_error(ended, code_of(cause or e), message_of(cause or e)),
        }
