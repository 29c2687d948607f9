"""How a closed run ended, read from Temporal: its result, or its failure turned into the
run's status, stats and error (the same shape the run's own result has). Used by the API
(GET /tasks/{id}, the event stream) and by the clean-up loop, which records in the
task store the ending of a run that could not record it itself (terminated, say).
And why an open run does not move when its workflow task keeps failing (``stuck_of``,
``stuck_runs``: GET /tasks/{id}, `artemis audit`, the ``run_stuck`` alert)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import TimeoutType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.client import WorkflowExecutionStatus as WfStatus
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from artemis.redact import redact_text
from artemis.run_models import SA_TASK_ID, WORKFLOW_NAME
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


# -- stuck runs ----------------------------------------------------------------------------
# A workflow task that fails (an exception the workflow does not turn into a failure of
# the run, a command past Temporal's payload limit, code that no longer replays the
# history) is retried by Temporal for ever and the run never moves. Counted from the
# pending task's attempt: the first retry follows at once (a worker lost mid-task heals on
# it), the third attempt about ten seconds later.
STUCK_ATTEMPTS = 3
# How far back (events) the reason is looked for in the run's history, read newest first.
STUCK_REASON_EVENTS = 1000
# The open task runs a scan describes at most (newest first), and how many at a time.
STUCK_SCAN_LIMIT = 1000
STUCK_SCAN_CONCURRENCY = 8
STUCK_MESSAGE_CHARS = 500
STUCK_DOCS = "docs/operations.md#stuck-runs"

# What to do, by the cause Temporal recorded (the default: the worker log's traceback).
_STUCK_ACTIONS = {
    "NON_DETERMINISTIC_ERROR": "the code no longer replays the run's history (changed "
    "without a patch under the same build id): run a worker of the build the run is pinned "
    "to, or terminate the run and start the task again",
    "PAYLOADS_TOO_LARGE": "a command carries a payload past Temporal's limit: terminate "
    "the run (it cannot go on) and start it again with fewer windows or ids",
    "GRPC_MESSAGE_TOO_LARGE": "a workflow task's answer is past Temporal's message limit: "
    "terminate the run and start it again smaller",
    "BAD_SEARCH_ATTRIBUTES": "a search attribute the run sets is not registered: register "
    "it (GET /ready names the command); the run goes on by itself",
}
_DEFAULT_ACTION = (
    "the worker log has the traceback: terminate the run and start the task again, or "
    "move it to a build with the fix (temporal workflow update-options)"
)


async def stuck_of(client: Client, desc: WorkflowExecutionDescription) -> dict[str, Any] | None:
    """Why an open run does not move, when its workflow task keeps failing: {attempts,
    cause, failure_type, message, since, reason, action}; None when it is not stuck."""
    pending = desc.raw_description.pending_workflow_task
    if desc.status not in OPEN_STATUSES or pending.attempt < STUCK_ATTEMPTS:
        return None
    last = await last_task_problem(client, desc.id, desc.run_id)
    cause = last.get("cause", "UNKNOWN")
    message = redact_text(last.get("message") or "")[:STUCK_MESSAGE_CHARS]
    what = f"{last['failure_type']}: {message}" if last.get("failure_type") else message
    return {
        "attempts": pending.attempt,
        "cause": cause,
        "failure_type": last.get("failure_type"),
        "message": message,
        "since": last.get("since"),
        "reason": f"its workflow task failed {pending.attempt} times in a row ({cause}"
        + (f": {what})" if what else ")"),
        "action": f"{_STUCK_ACTIONS.get(cause, _DEFAULT_ACTION)} ({STUCK_DOCS})",
    }


async def last_task_problem(client: Client, workflow_id: str, run_id: str | None) -> dict:
    """The latest workflow-task failure or timeout in the run's history, read newest first
    (a long history is not read whole): {cause, failure_type, message, since}, or {} when
    none is in the last ``STUCK_REASON_EVENTS`` events (or the run has since moved on)."""
    req = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id or ""),
        maximum_page_size=200,
    )
    read = 0
    while read < STUCK_REASON_EVENTS:
        page = await client.workflow_service.get_workflow_execution_history_reverse(req)
        for event in page.history.events:
            if event.HasField("workflow_task_completed_event_attributes"):
                return {}
            problem = await _task_problem(client, event)
            if problem is not None:
                return problem
        read += len(page.history.events)
        if not page.next_page_token:
            break
        req.next_page_token = page.next_page_token
    return {}


async def _task_problem(client: Client, event: HistoryEvent) -> dict[str, Any] | None:
    since = event.event_time.ToDatetime(UTC).isoformat()
    if event.HasField("workflow_task_timed_out_event_attributes"):
        kind = TimeoutType.Name(event.workflow_task_timed_out_event_attributes.timeout_type)
        return {
            "cause": "TIMED_OUT",
            "failure_type": None,
            "message": f"workflow task timed out ({kind.removeprefix('TIMEOUT_TYPE_')})",
            "since": since,
        }
    if not event.HasField("workflow_task_failed_event_attributes"):
        return None
    attrs = event.workflow_task_failed_event_attributes
    failure = attrs.failure
    codec = client.data_converter.payload_codec
    if codec is not None:  # encrypted common attributes, when the converter encodes them
        await codec.decode_failure(failure)
    cause = WorkflowTaskFailedCause.Name(attrs.cause).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")
    return {
        "cause": cause,
        "failure_type": failure.application_failure_info.type or None,
        "message": failure.message,
        "since": since,
    }


async def stuck_runs(client: Client, task_queue: str) -> list[dict[str, Any]]:
    """The open task runs of ``task_queue`` whose workflow task keeps failing, each with
    {workflow_id, run_id, task_id} and its ``stuck_of`` answer. Looked for among the runs
    Temporal marks itself (``TemporalReportedProblems``, after 5 failures in a row by
    default: found however many runs are open) and the newest open runs (found from the
    third attempt on); at most ``STUCK_SCAN_LIMIT`` of each are described."""
    base = (
        f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Running' "
        f"AND TaskQueue = '{task_queue}'"
    )
    found: dict[tuple[str, str | None], Any] = {}
    for query in (f"{base} AND TemporalReportedProblems IS NOT NULL", base):
        try:
            async for wf in client.list_workflows(query, limit=STUCK_SCAN_LIMIT):
                found.setdefault((wf.id, wf.run_id), wf)
        except RPCError as e:  # a server without the attribute: the scan alone
            if e.status != RPCStatusCode.INVALID_ARGUMENT:
                raise
    gate = asyncio.Semaphore(STUCK_SCAN_CONCURRENCY)

    async def check(wf: Any) -> dict[str, Any] | None:
        async with gate:
            handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
            try:
                stuck = await stuck_of(client, await handle.describe())
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:  # closed and gone meanwhile
                    return None
                raise
        if stuck is None:
            return None
        task_id = wf.typed_search_attributes.get(SearchAttributeKey.for_keyword(SA_TASK_ID))
        return {"workflow_id": wf.id, "run_id": wf.run_id, "task_id": task_id, **stuck}

    answers = await asyncio.gather(*(check(wf) for wf in found.values()))
    return [a for a in answers if a is not None]


def largest_workflow_task(events: Iterable[HistoryEvent]) -> int:
    """The most payload bytes one workflow task of a history sent: the commands it
    completed with (activities, child starts, markers, continue-as-new) are the events
    that name its WorkflowTaskCompleted event. Temporal refuses a workflow task past 2 MiB
    (docs/performance.md, "Bounded payloads")."""
    per_task: dict[int, int] = {}
    for event in events:
        attrs = event.WhichOneof("attributes")
        if attrs is None:
            continue
        body = getattr(event, attrs)
        completed = getattr(body, "workflow_task_completed_event_id", 0)
        if completed:
            per_task[completed] = per_task.get(completed, 0) + body.ByteSize()
    return max(per_task.values(), default=0)
