"""POST /notes/details: details of several notes at once, each failing alone
(docs/api.md). The answer is a batch: items, summary, error and meta at the top."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from artemis.calls import work
from artemis.config import Settings
from artemis.crawler.platform import platform_for
from artemis.errors import ArtemisError, ErrorCode
from artemis.run_models import NoteDetailOutcome, NoteDetailsRequest
from artemis.staging import Staging
from starter.api.deps import get_service, get_settings
from starter.api.envelope import _meta
from starter.api.schemas import Envelope, NotesAnswer, NotesBody
from starter.service import RunService

router = APIRouter(tags=["notes"])

MAX_NOTES = 100


@router.post(
    "/notes/details",
    summary="Details of several notes; each fails alone",
    responses={
        200: {"model": NotesAnswer, "description": "every note fetched"},
        207: {"model": NotesAnswer, "description": "PARTIAL_FAIL: some notes failed"},
        422: {"model": Envelope[None], "description": "INVALID_INPUT naming the field"},
    },
)
async def note_details(
    request: Request,
    body: NotesBody,
    service: RunService = Depends(get_service),
    settings=Depends(get_settings),
) -> JSONResponse:
    _check_platform(settings, body.platform)
    platform, ids = body.platform, body.note_ids
    state = request.scope["state"]
    batch = uuid.uuid4().hex
    batch_key = f"notes/{batch}"
    outcomes = await _run_batch(service, settings, platform, ids, batch, state.get("request_id"))
    notes = await _staged_notes(settings, batch_key, len(ids))
    items = _items(outcomes, notes)
    failed = [i for i in items if not i["success"]]
    error, status = _batch_error(items, failed)
    answer = {
        "success": not failed,
        "items": items,
        "summary": {
            "total": len(items),
            "succeeded": len(items) - len(failed),
            "failed": len(failed),
        },
        "error": error,
        "meta": _meta(state),
    }
    return JSONResponse(answer, status_code=status)


def _check_platform(settings: Settings, platform: str) -> None:
    """INVALID_INPUT naming the body's field when the platform is not configured."""
    try:
        platform_for(settings, platform)
    except ArtemisError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, e.message.replace("params.", "body.")) from None


async def _run_batch(
    service: RunService,
    settings: Settings,
    platform: str,
    ids: list[str],
    batch: str,
    request_id: str | None,
) -> list[NoteDetailOutcome]:
    """Run the batch's NoteDetails workflow and wait for its outcomes, one per note
    (TIMEOUT_ERROR past crawler.batch_timeout_s); the notes themselves are staged under
    ``notes/<batch>``."""
    cfg = settings.crawler
    handle = await service.client.start_workflow(
        "NoteDetails",
        NoteDetailsRequest(
            platform=platform,
            note_ids=ids,
            batch_key=f"notes/{batch}",
            detail_timeout_s=cfg.detail_timeout_s,
            request_id=request_id,
        ),
        id=f"artemis/notes-details/{batch}",
        task_queue=settings.temporal.task_queue,
        result_type=list[NoteDetailOutcome],
        static_summary=f"{len(ids)} notes of {platform} (request {request_id})",
    )
    try:
        outcomes: list[NoteDetailOutcome] = await asyncio.wait_for(
            handle.result(), cfg.batch_timeout_s
        )
    except TimeoutError:
        raise ArtemisError(
            ErrorCode.TIMEOUT_ERROR,
            f"the batch did not finish within crawler.batch_timeout_s ({cfg.batch_timeout_s:g} s)",
        ) from None
    return outcomes


async def _staged_notes(settings: Settings, batch_key: str, count: int) -> dict[int, Any]:
    """The batch's fetched notes by their place in the request, read from staging and
    dropped from it."""
    staging = Staging(settings.database.url)
    staged = await work(staging.get_pages, batch_key, "note", 0, count - 1)
    await work(staging.drop_run, batch_key)
    return {seq: records[0] for seq, records in staged if records}


def _items(outcomes: list[NoteDetailOutcome], notes: dict[int, Any]) -> list[dict[str, Any]]:
    """One item per note, in the request's order: its data, or its error."""
    items: list[dict[str, Any]] = []
    for seq, o in enumerate(outcomes):
        item: dict[str, Any] = {"id": o.id, "success": o.success}
        if o.success:
            item["data"] = notes.get(seq)
        else:
            item["error"] = o.error
        item["meta"] = {"cookie_used": o.cookie_used}
        items.append(item)
    return items


def _batch_error(
    items: list[dict[str, Any]], failed: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, int]:
    """The batch's error and HTTP status: none and 200 when every note was fetched; the
    notes' one code when all failed alike; PARTIAL_FAIL otherwise."""
    error = None
    status = 200
    if failed:
        codes = {i["error"]["code"] for i in failed}
        if len(failed) == len(items) and len(codes) == 1:
            code = ErrorCode(codes.pop())
        else:
            code = ErrorCode.PARTIAL_FAIL
        error = {
            "code": code.value,
            "message": f"{len(failed)} of {len(items)} notes failed",
            "retryable": code.retryable,
        }
        status = code.http_status
    return error, status
