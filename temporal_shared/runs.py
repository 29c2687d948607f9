"""How a closed run ended, read from Temporal: its result, or its failure turned into the
run's status, stats and error (the same shape the run's own result has). Used by the API
(GET /tasks/{id}, the event stream) and by the clean-up loop, which records in the
task store the ending of a run that could not record it itself (terminated, say)."""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowExecutionStatus as WfStatus
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError

from artemis.run_state import end_error

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
            return {
                "status": "cancelled",
                "stats": {},
                "error": end_error("cancelled", None, "workflow cancelled"),
            }
        if isinstance(cause, ApplicationError):
            details = cause.details[0] if cause.details else {}
            details = details if isinstance(details, dict) else {}
            return {
                "status": details.get("status", "failed"),
                "stats": details.get("stats", {}),
                "duration_ms": details.get("duration_ms"),
                "callback": details.get("callback"),
                "error": end_error("failed", cause.type, cause.message),
            }
        ended = "timeout" if status == WfStatus.TIMED_OUT else "failed"
        return {"status": ended, "stats": {}, "error": end_error(ended, None, str(cause or e))}
