"""The records runs set aside (artemis/quarantine/): list and show them, replay them
once the model or the task is fixed, or discard them. A run's quarantined records are
its owner's: another owner's are not found, as its runs are not."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from artemis.calls import work
from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.owners import owner_of, task_id_for
from artemis.quarantine import store as quarantine
from artemis.run_models import (
    REPLAY_WORKFLOW_NAME,
    ReplayRequest,
    ReplayResult,
    replay_workflow_id,
)
from artemis.run_state import RunStatus
from starter.api.auth import principal, require_token
from starter.api.deps import get_service, get_settings
from starter.api.envelope import envelope
from starter.api.schemas import INVALID, Envelope, documented
from starter.service import RunService

router = APIRouter(tags=["quarantine"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Envelope[None], "description": "TASK_NOT_FOUND / NOT_FOUND"}
}


class QuarantinedRow(BaseModel):
    """One record a run set aside, and why."""

    id: int
    task_code: str
    task_id: str = Field(description="The run that was started (a backfill's, not its window's)")
    run_key: str = Field(description="The run that fetched it: `{code}/{task id}` of a window")
    provenance: str | None = None
    page_seq: int = Field(description="The page it came on")
    position: int = Field(description="Its place on that page")
    stage: str = Field(
        description="Which check set it aside: `process` (the task's process step failed on it or"
        " turned it down) or `judge` (it does not fit the record model)"
    )
    replay_from: str = Field(
        description="Where a replay judges it again from: `process` (the raw record) or `model`"
        " (the record as processed)"
    )
    record_key: dict[str, Any] | None = Field(None, description="Its key fields, when it has them")
    record: Any = Field(None, description="The record (GET /quarantine/records/{id} only)")
    record_bytes: int
    error_code: str
    field_path: str | None = None
    message: str
    status: str = Field(description="`quarantined`, `replayed` or `discarded`")
    replays: int = Field(description="How many replays judged it")
    replayed_by: str | None = Field(None, description="The replay that landed it")
    created_at: datetime
    updated_at: datetime


class QuarantineList(BaseModel):
    """GET /quarantine: a run's quarantined records (or, without a task id, those of the
    caller's runs), oldest first, and counts by status."""

    task_id: str | None = Field(None, description="The run; null: across runs")
    counts: dict[str, int]
    items: list[QuarantinedRow]
    next_after: int | None = Field(None, description="Pass as `after` for the next page")


class ReplayBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1, max_length=300)
    ids: list[Annotated[int, Field(ge=1, le=2**62)]] | None = Field(
        None, min_length=1, max_length=10_000, description="These rows only (default: all)"
    )


class ReplayAccepted(BaseModel):
    """POST /quarantine/replay: the replay's own workflow (the Temporal UI shows it)."""

    task_id: str
    workflow_id: str
    run_id: str | None = None
    rows: int = Field(description="Quarantined rows it will judge")


class DiscardAnswer(BaseModel):
    task_id: str
    discarded: int


def _task_id(request: Request, given: str) -> str:
    who = principal(request)
    return task_id_for(who.name, who.sees_all, given)


# A date, or a date and time with an optional offset: parsed exactly (a number is not an
# instant here, as pydantic's lax datetime would take it).
SINCE_PATTERN = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$"


def _instant(text: str) -> datetime:
    """``since`` as an instant (UTC unless it says its offset); 422 naming it when it is
    no date (a 13th month, say)."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"since {text!r}: {e}") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


@router.get(
    "/quarantine",
    operation_id="list_quarantine",
    summary="A run's quarantined records, or those of the caller's runs",
    responses={**documented(QuarantineList), **NOT_FOUND, **INVALID},
    dependencies=[Depends(require_token)],
)
async def list_quarantine(
    request: Request,
    task_id: str | None = Query(
        None, min_length=1, max_length=300, description="one run (default: across runs)"
    ),
    status: quarantine.QuarantineStatus | None = Query(None),
    provenance: str | None = Query(None, min_length=1, max_length=64),
    since: str | None = Query(
        None,
        pattern=SINCE_PATTERN,
        description="set aside at or after: an ISO 8601 date or date and time (UTC unless "
        "it says its offset)",
    ),
    code: str | None = Query(None, min_length=1, max_length=40, description="an error code"),
    after: int = Query(0, ge=0, le=2**62),
    limit: int = Query(100, ge=1, le=1000),
    settings: Settings = Depends(get_settings),
) -> JSONResponse:
    """Without ``task_id``: the rows of the caller's runs (an operator's or admin's: of
    every owner's), filtered by ``provenance``, ``since`` and ``code``."""
    who = principal(request)
    full = _task_id(request, task_id) if task_id is not None else None
    across = quarantine.RowFilter(
        owner=None if who.sees_all else who.name,
        provenance=provenance,
        since=_instant(since) if since else None,
        code=code,
    )
    db = settings.database.url
    which = quarantine.RowPage(
        task_id=full,
        status=status.value if status else None,
        after_id=after,
        limit=limit,
        across=across,
    )
    rows = await work(quarantine.list_rows, db, which)
    counts = await work(quarantine.counts, db, full, across)
    body = QuarantineList(
        task_id=full,
        counts=counts,
        items=[QuarantinedRow(**r) for r in rows],
        next_after=rows[-1]["id"] if len(rows) == limit else None,
    )
    return envelope(request, body.model_dump(mode="json"))


@router.get(
    "/quarantine/records/{row_id}",
    operation_id="get_quarantined",
    summary="One quarantined record, with the record itself",
    responses={**documented(QuarantinedRow), **NOT_FOUND, **INVALID},
    dependencies=[Depends(require_token)],
)
async def get_quarantined(
    request: Request,
    row_id: int = Path(ge=1, le=2**62),
    settings: Settings = Depends(get_settings),
) -> JSONResponse:
    row = await work(quarantine.get_row, settings.database.url, row_id)
    who = principal(request)
    if row is None or (owner_of(row["task_id"]) != who.name and not who.sees_all):
        raise ArtemisError(ErrorCode.NOT_FOUND, f"no quarantined record {row_id}")
    return envelope(request, QuarantinedRow(**row).model_dump(mode="json"))


@router.post(
    "/quarantine/replay",
    operation_id="replay_quarantine",
    status_code=202,
    summary="Judge a run's quarantined records again and land those that fit, once",
    responses={
        **documented(ReplayAccepted, 202),
        **NOT_FOUND,
        409: {"model": Envelope[None], "description": "CONFLICT: a replay of it is running"},
        **INVALID,
    },
    dependencies=[Depends(require_token)],
)
async def replay_quarantine(
    request: Request,
    body: ReplayBody,
    service: RunService = Depends(get_service),
    settings: Settings = Depends(get_settings),
) -> JSONResponse:
    """Each quarantined record is judged by the task and the record model in force now;
    one that fits is sent to the run's sinks under a key of its own (fixed per record,
    so a replay retried or run again lands it once) and marked `replayed`; one that
    still does not fit stays quarantined with the new reason."""
    full = _task_id(request, body.task_id)
    counts = await work(quarantine.counts, settings.database.url, full)
    waiting = counts.get(quarantine.QuarantineStatus.QUARANTINED.value, 0)
    if not counts:
        raise ArtemisError(ErrorCode.TASK_NOT_FOUND, f"run {body.task_id!r} quarantined nothing")
    state = request.scope["state"]
    workflow_id = replay_workflow_id(full)
    try:
        handle = await service.client.start_workflow(
            REPLAY_WORKFLOW_NAME,
            ReplayRequest(
                task_id=full,
                ids=body.ids,
                trace_id=state["trace"].trace_id,
                request_id=state.get("request_id"),
            ),
            id=workflow_id,
            task_queue=settings.temporal.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            static_summary=f"quarantine replay · {full}",
        )
    except WorkflowAlreadyStartedError:
        raise ArtemisError(
            ErrorCode.CONFLICT, f"a replay of {body.task_id!r} is running ({workflow_id})"
        ) from None
    answer = ReplayAccepted(
        task_id=full,
        workflow_id=workflow_id,
        run_id=handle.result_run_id,
        rows=len(body.ids) if body.ids is not None else waiting,
    )
    return envelope(request, answer.model_dump(), status=202)


class ReplayState(BaseModel):
    """The replay of a run's quarantined records, as Temporal has it."""

    task_id: str
    workflow_id: str
    run_id: str | None = None
    status: str = Field(description="`running`, `completed`, `failed`, `cancelled`, ...")
    landed: int | None = Field(None, description="records landed (so far, while running)")
    still_bad: int | None = None
    error: dict[str, Any] | None = Field(
        None, description="a failed replay: `code` and `message` (the column, what to do)"
    )


@router.get(
    "/quarantine/replay",
    operation_id="replay_state",
    summary="How the last replay of a run's quarantined records went, or goes",
    responses={**documented(ReplayState), **NOT_FOUND, **INVALID},
    dependencies=[Depends(require_token)],
)
async def replay_state(
    request: Request,
    task_id: str = Query(min_length=1, max_length=300),
    run_id: str | None = Query(
        None,
        pattern=r"^[0-9a-fA-F-]{36}$",
        description="one replay, by its Temporal run id (default: the last)",
    ),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    full = _task_id(request, task_id)
    workflow_id = replay_workflow_id(full)
    handle = service.client.get_workflow_handle(
        workflow_id, run_id=run_id, result_type=ReplayResult
    )
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise ArtemisError(
                ErrorCode.TASK_NOT_FOUND, f"no replay of {task_id!r} is known"
            ) from None
        raise
    state = ReplayState(
        task_id=full,
        workflow_id=workflow_id,
        run_id=desc.run_id,
        status=_status_word(desc.status),
    )
    if desc.status == WorkflowExecutionStatus.RUNNING:
        try:
            now = await handle.query("progress", result_type=ReplayResult)
            state.landed, state.still_bad = now.landed, now.still_bad
        except Exception:  # not answering yet: no counts
            pass
    elif desc.status == WorkflowExecutionStatus.COMPLETED:
        done = await handle.result()
        state.landed, state.still_bad = done.landed, done.still_bad
    else:
        state.error = await _replay_failure(handle)
    return envelope(request, state.model_dump())


def _status_word(status: WorkflowExecutionStatus | None) -> str:
    word = (status.name if status else "UNKNOWN").lower()
    return RunStatus.CANCELLED.value if word == "canceled" else word.replace("_", " ")


async def _replay_failure(handle: Any) -> dict[str, Any]:
    """A replay that did not complete: its failure's code and message."""
    try:
        await handle.result()
    except WorkflowFailureError as e:
        cause: Any = e.cause
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause
        return {
            "code": getattr(cause, "type", None) or "INTERNAL",
            "message": getattr(cause, "message", None) or str(cause),
        }
    except Exception as e:
        return {"code": "INTERNAL", "message": f"{type(e).__name__}: {e}"}
    return {"code": "INTERNAL", "message": "the replay ended without a result"}


@router.post(
    "/quarantine/discard",
    operation_id="discard_quarantine",
    summary="Give up on a run's quarantined records (kept, never replayed)",
    responses={**documented(DiscardAnswer), **NOT_FOUND, **INVALID},
    dependencies=[Depends(require_token)],
)
async def discard_quarantine(
    request: Request, body: ReplayBody, settings: Settings = Depends(get_settings)
) -> JSONResponse:
    full = _task_id(request, body.task_id)
    n = await work(quarantine.discard, settings.database.url, full, body.ids)
    return envelope(request, DiscardAnswer(task_id=full, discarded=n).model_dump())
