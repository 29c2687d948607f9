"""Task routes: start a run, read its status, cancel it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse
from fastapi.types import DecoratedCallable
from pydantic import BaseModel

from artemis.callback import CallbackTarget
from artemis.calls import work
from artemis.errors import ArtemisError, ErrorCode
from artemis.metrics import RUN_REQUESTS
from artemis.owners import owner_of
from artemis.run_state import TERMINAL, RunStatus, StoredStatus, end_code
from artemis.taskstore import (
    StorageUnavailable,
    TaskNotFound,
    TaskStorage,
    TaskValidationError,
    make_task_storage,
)
from starter.api.auth import principal
from starter.api.deps import caller_task_id, get_service, get_settings
from starter.api.envelope import envelope, error_response
from starter.api.schemas import (
    INVALID,
    CallbackMeta,
    CancelAnswer,
    CancelBody,
    ControlAnswer,
    Envelope,
    FeedbackAnswer,
    FeedbackBody,
    PauseBody,
    RateLimitBody,
    RetryAnswer,
    RunAccepted,
    RunBody,
    RunResult,
    TaskList,
    TaskView,
    documented,
)
from starter.retries import RunRetries
from starter.run_reads import provenance_of
from starter.service import RunService, StartRequest, ui_url

router = APIRouter(tags=["tasks"])


def with_links(responses: dict, status: int, task_id: str = "$response.body#/data/task_id") -> dict:
    """OpenAPI links: what a client (or a stateful API test) can do next with the task id
    an answer holds."""
    ops = ("get_task", "task_events", "cancel_task", "pause_task", "resume_task", "task_feedback")
    responses[status]["links"] = {
        op: {"operationId": op, "parameters": {"task_id": task_id}} for op in ops
    }
    return responses


CONTROL_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": Envelope[None], "description": "TASK_NOT_FOUND"},
    409: {"model": Envelope[None], "description": "CONFLICT: the task has finished"},
    422: {"model": Envelope[None], "description": "INVALID_INPUT naming the field"},
}


def control_route(
    path: str,
    operation_id: str | None,
    summary: str,
    answer: type[BaseModel] = ControlAnswer,
    method: str = "POST",
) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """A route that signals a running task: 202 with ``answer``, or one of CONTROL_ERRORS."""
    return router.api_route(
        path,
        methods=[method],
        operation_id=operation_id,
        status_code=202,
        summary=summary,
        responses={**documented(answer, 202), **CONTROL_ERRORS},
    )


def _final_response(
    request: Request, status: dict, defaults_applied: list[str] | None = None
) -> JSONResponse:
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
    if defaults_applied is not None:
        data["defaults_applied"] = defaults_applied
    if status.get("status") == RunStatus.COMPLETED:
        return envelope(request, data)
    err = status.get("error") or {}
    code = end_code(status["status"], err.get("code")) or ErrorCode.INTERNAL
    return error_response(
        request, ArtemisError(code, err.get("message") or status["status"]), data=data
    )


@router.post(
    "/tasks/{code}/run",
    operation_id="run_task",
    summary="Start a task run",
    responses={
        **with_links(documented(RunResult, 200, "sync: the run's result"), 200),
        **with_links(documented(RunAccepted, 202, "async: accepted (or sync, running)"), 202),
        404: {"model": Envelope[None], "description": "TASK_NOT_FOUND"},
        409: {"model": Envelope[None], "description": "EXECUTION_LOCKED"},
        422: {"model": Envelope[None], "description": "INVALID_INPUT naming the field"},
        502: {"model": Envelope[RunResult], "description": "sync: the run failed (its code)"},
    },
)
async def run_task(
    code: str,
    request: Request,
    body: RunBody | None = Body(None),
    mode: Literal["sync", "async"] = Query("sync"),
    service: RunService = Depends(get_service),
    settings=Depends(get_settings),
) -> JSONResponse:
    try:
        resp, outcome = await _run(code, request, body or RunBody(), mode, service, settings)
    except ArtemisError as e:
        label = "unknown" if e.code is ErrorCode.TASK_NOT_FOUND else code
        RUN_REQUESTS.labels(label, e.code.value).inc()
        raise
    RUN_REQUESTS.labels(code, outcome).inc()
    return resp


def _start_request(body: RunBody) -> StartRequest:
    """What the body asks the service to start (the params are checked by the task)."""
    meta, cb = body.meta, body.callback
    callback = None
    if cb is not None or meta.run_id is not None:
        cb = cb or CallbackMeta()
        callback = CallbackTarget(
            caller_run_id=str(meta.run_id) if meta.run_id is not None else None,
            base_url=cb.base_url,
            override_host=cb.override_host,
            override_port=cb.override_port,
            auth_header=cb.auth_header,
        )
    return StartRequest(
        params=body.given_params.task_params(),
        task_id=meta.task_id,
        request_id=meta.request_id,
        timeout_s=meta.timeout_s,
        output=body.output,
        callback=callback,
        callback_token=cb.auth_token if cb is not None else None,
    )


async def _run(
    code: str, request: Request, body: RunBody, mode: str, service: RunService, settings: Any
) -> tuple[JSONResponse, str]:
    """The run route's answer and its outcome for the metric: accepted (async), running
    (sync, still running at the sync timeout) or how the run ended."""
    state = request.scope["state"]
    ask = dataclasses.replace(_start_request(body), role=principal(request).role)
    started = await service.start(
        code,
        ask,
        state["trace"],
        state["request_id"],
        owner=principal(request).name,
    )
    # the params the request left out that task_defaults.<code> gave the run
    applied = sorted(set(settings.task_defaults.get(code, {})) - set(ask.params or {}))
    accepted = {
        "task_code": code,
        "accepted": True,
        "task_id": started.task_id,
        "workflow_id": started.workflow_id,
        "run_id": started.run_id,
        "callback_mode": started.callback_mode,
        "defaults_applied": applied,
        "links": {
            "self": f"/tasks/{started.task_id}",
            "cancel": f"/tasks/{started.task_id}/cancel",
            "ui": ui_url(settings, started.workflow_id),
        },
    }
    if mode == "async":
        if started.existing_result is not None:
            accepted["status"] = started.existing_result.get("status")
        return envelope(request, accepted, status=202), "accepted"
    final = await service.wait(started, settings.server.sync_timeout_s)
    if final is None or final.get("status") not in TERMINAL:
        accepted["status"] = RunStatus.RUNNING.value
        return envelope(request, accepted, status=202), RunStatus.RUNNING.value
    return _final_response(request, final, applied), str(final["status"])


@router.get(
    "/tasks/{task_id}",
    operation_id="get_task",
    summary="Status, progress, stats and error of a run",
    responses={**documented(TaskView), 404: CONTROL_ERRORS[404], **INVALID},
)
async def get_task(
    request: Request,
    task_id: str = Depends(caller_task_id),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    # The answer is a TaskView: its status one of RunStatus, checked on the way out.
    view = TaskView.model_validate({**await service.status(task_id), "owner": owner_of(task_id)})
    return envelope(request, view.model_dump(mode="json", exclude_unset=True))


@control_route("/tasks/{task_id}/cancel", "cancel_task", "Cancel a run", CancelAnswer)
async def cancel_task(
    request: Request,
    task_id: str = Depends(caller_task_id),
    body: CancelBody | None = Body(None),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    reason = (body or CancelBody()).reason
    return envelope(request, await service.cancel(task_id, reason), status=202)


@control_route("/tasks/{task_id}", None, "Cancel a run", CancelAnswer, method="DELETE")
async def delete_task(
    request: Request,
    task_id: str = Depends(caller_task_id),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    return envelope(request, await service.cancel(task_id, CancelBody().reason), status=202)


def _store(request: Request) -> TaskStorage:
    app = request.app
    if getattr(app.state, "task_store", None) is None:
        app.state.task_store = make_task_storage(app.state.settings)
    return app.state.task_store


@router.post(
    "/tasks/{task_id}/retry",
    operation_id="retry_task",
    status_code=202,
    summary="Finish a run that failed with a retryable code",
    responses={
        **documented(RetryAnswer, 202),
        404: CONTROL_ERRORS[404],
        409: {
            "model": Envelope[None],
            "description": "CONFLICT: the run is running, completed, cancelled, or failed "
            "with a code no retry can fix (named in the message)",
        },
        410: {
            "model": Envelope[None],
            "description": "GONE: the run's kept state was cleaned up (runs.retain_failed_s)",
        },
        **INVALID,
    },
)
async def retry_task(
    request: Request,
    task_id: str = Depends(caller_task_id),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    """A run that failed SOURCE_UNAVAILABLE, SINK_UNAVAILABLE, INTERNAL or TIMEOUT_ERROR
    starts again under the same task id from its last checkpoint: the pages it delivered
    are neither fetched nor sent again, the rest go out under the idempotency keys they
    would have had, its stats go on, and the CronJob gets one finalize for the finished
    run."""
    state = request.scope["state"]
    answer = await RunRetries(service).retry(task_id, state["trace"], state["request_id"])
    return envelope(request, answer, status=202)


@control_route("/tasks/{task_id}/pause", "pause_task", "Pause a running task")
async def pause_task(
    request: Request,
    task_id: str = Depends(caller_task_id),
    body: PauseBody | None = Body(None),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    """Nothing is fetched while paused; the batch in flight finishes first."""
    reason = (body or PauseBody()).reason
    return envelope(request, await service.control(task_id, "pause", reason), status=202)


@control_route("/tasks/{task_id}/resume", "resume_task", "Resume a paused task")
async def resume_task(
    request: Request,
    task_id: str = Depends(caller_task_id),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    return envelope(request, await service.control(task_id, "resume"), status=202)


@control_route(
    "/tasks/{task_id}/rate-limit", "rate_limit_task", "Set a running task's requests per second"
)
async def rate_limit_task(
    request: Request,
    body: RateLimitBody,
    task_id: str = Depends(caller_task_id),
    service: RunService = Depends(get_service),
) -> JSONResponse:
    """The source's requests per second from the next batch on."""
    return envelope(request, await service.control(task_id, "rate", body.qps), status=202)


@router.get(
    "/tasks",
    operation_id="list_tasks",
    summary="Runs from task storage, newest first",
    responses={
        **with_links(documented(TaskList), 200, "$response.body#/data/items/0/task_id"),
        **INVALID,
    },
)
async def list_tasks(
    request: Request,
    status: StoredStatus | None = Query(None),
    code: str | None = Query(None, max_length=100),
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, max_length=500),
    owner: str | None = Query(
        None,
        max_length=32,
        description="only this owner's runs (an operator's or admin's filter; a client "
        "always sees its own runs only)",
    ),
) -> JSONResponse:
    who = principal(request)
    if not who.sees_all:
        owner = who.name
    try:
        items, nxt = await work(
            _store(request).list,
            status=status,
            code=code,
            limit=limit,
            cursor=cursor,
            owner=owner,
        )
    except TaskValidationError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"cursor: {e}") from None
    except StorageUnavailable as e:
        raise ArtemisError(ErrorCode.NOT_READY, f"task storage unavailable: {e}") from None
    return envelope(
        request,
        {
            "items": [
                {**json.loads(d.model_dump_json()), "provenance": provenance_of(d.payload)}
                for d in items
            ],
            "next_cursor": nxt,
        },
    )


@router.post(
    "/tasks/{task_id}/feedback",
    operation_id="task_feedback",
    summary="Record a user's verdict on a run",
    responses={**documented(FeedbackAnswer), 404: CONTROL_ERRORS[404], 422: CONTROL_ERRORS[422]},
)
async def task_feedback(
    request: Request, body: FeedbackBody, task_id: str = Depends(caller_task_id)
) -> JSONResponse:
    try:
        data = await work(_store(request).record_feedback, task_id, body.status, body.comment)
    except TaskNotFound:
        raise ArtemisError(
            ErrorCode.TASK_NOT_FOUND, f"no task with id {task_id!r} in task storage"
        ) from None
    except TaskValidationError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"body.status: {e}") from None
    return envelope(request, json.loads(data.model_dump_json()))
