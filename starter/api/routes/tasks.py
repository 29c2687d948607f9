"""Task routes: start a run, read its status, cancel it."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from artemis.errors import ArtemisError, ErrorCode
from starter.api.deps import get_service, get_settings
from starter.api.envelope import envelope, error_response, read_json
from starter.service import TERMINAL, RunService, parse_run_body, ui_url

router = APIRouter(tags=["tasks"])


def _final_response(request: Request, status: dict) -> JSONResponse:
    data = {
        k: status.get(k)
        for k in (
            "task_code",
            "task_id",
            "workflow_id",
            "status",
            "duration_ms",
            "stats",
            "callback",
        )
    }
    data["error"] = status.get("error")
    if status.get("status") == "completed":
        return envelope(request, data)
    err = status.get("error") or {}
    try:
        code = ErrorCode(err.get("code", "INTERNAL"))
    except ValueError:
        code = ErrorCode.INTERNAL
    if status.get("status") == "cancelled":
        code = ErrorCode.CANCELLED
    return error_response(
        request, ArtemisError(code, err.get("message") or status["status"]), data=data
    )


@router.post(
    "/tasks/{code}/run",
    summary="Start a task run",
    responses={
        200: {"description": "sync: the run's result"},
        202: {"description": "async: accepted"},
    },
)
async def run_task(
    code: str,
    request: Request,
    mode: Literal["sync", "async"] = Query("sync"),
    service: RunService = Depends(get_service),
    settings=Depends(get_settings),
) -> JSONResponse:
    state = request.scope["state"]
    body = parse_run_body(await read_json(request))
    started = await service.start(code, body, state["trace"], state["request_id"])
    accepted = {
        "task_code": code,
        "accepted": True,
        "task_id": started.task_id,
        "workflow_id": started.workflow_id,
        "run_id": started.run_id,
        "callback_mode": started.callback_mode,
        "links": {
            "self": f"/tasks/{started.task_id}",
            "cancel": f"/tasks/{started.task_id}/cancel",
            "ui": ui_url(settings, started.workflow_id),
        },
    }
    if mode == "async":
        if started.existing_result is not None:
            accepted["status"] = started.existing_result.get("status")
        return envelope(request, accepted, status=202)
    final = await service.wait(started, settings.server.sync_timeout_s)
    if final is None or final.get("status") not in TERMINAL:
        accepted["status"] = "running"
        return envelope(request, accepted, status=202)
    return _final_response(request, final)


@router.get("/tasks/{task_id}", summary="Status, progress, stats and error of a run")
async def get_task(
    task_id: str, request: Request, service: RunService = Depends(get_service)
) -> JSONResponse:
    return envelope(request, await service.status(task_id))


async def _cancel(task_id: str, request: Request, service: RunService) -> JSONResponse:
    reason = "cancelled by request"
    raw = await read_json(request)
    if isinstance(raw, dict) and raw.get("reason") is not None:
        if not isinstance(raw["reason"], str):
            raise ArtemisError(ErrorCode.INVALID_INPUT, "body.reason: must be a string")
        reason = raw["reason"]
    return envelope(request, await service.cancel(task_id, reason), status=202)


@router.post("/tasks/{task_id}/cancel", status_code=202, summary="Cancel a run")
async def cancel_task(
    task_id: str, request: Request, service: RunService = Depends(get_service)
) -> JSONResponse:
    return await _cancel(task_id, request, service)


@router.delete("/tasks/{task_id}", status_code=202, summary="Cancel a run")
async def delete_task(
    task_id: str, request: Request, service: RunService = Depends(get_service)
) -> JSONResponse:
    return await _cancel(task_id, request, service)
