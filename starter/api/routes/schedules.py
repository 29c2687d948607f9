"""``/schedules``: task runs Temporal starts on a calendar (docs/schedules.md), for an
operator or admin token. A schedule made here belongs to the token that made it, and
its runs start with that token's role (starter/schedules.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from artemis.schedules import NAME_PATTERN, ScheduleDef
from starter.api.auth import principal, require_operator
from starter.api.deps import get_service
from starter.api.envelope import envelope
from starter.api.schemas import INVALID, Envelope, documented
from starter.schedules import ScheduleService
from starter.service import RunService

router = APIRouter(tags=["schedules"], dependencies=[Depends(require_operator)])

NAME = Path(pattern=NAME_PATTERN, description="the schedule's name")
MISSING: dict[int | str, dict[str, Any]] = {
    404: {"model": Envelope[None], "description": "NOT_FOUND: no schedule of that name"}
}


class ScheduleView(BaseModel):
    """A schedule as Temporal holds it: what it starts, when, its state and its starts."""

    name: str
    schedule_id: str
    made_by: str | None = Field(None, description="`api` or `config`")
    owner: str | None = Field(None, description="whose runs it starts")
    task: str | None = None
    params: dict[str, Any] | None = None
    when: str = Field(description="`every 1h`, `cron 0 2 * * *`, `at 02:00 every day`")
    time_zone: str
    jitter_s: float
    overlap: str
    catchup_window_s: float | None = None
    paused: bool
    note: str | None = None
    next_starts: list[str | None]
    starts: int = Field(description="starts so far")
    skipped_overlap: int
    missed_catchup: int
    recent: list[dict[str, Any]] | None = Field(
        None,
        description="the last starts, newest first: `scheduled_at`, `outcome` (`started`, "
        "`start failed`, `running`), the run's `task_id` and `status`, or the `reason`",
    )


class ScheduleAction(BaseModel):
    """What was done to a schedule."""

    name: str
    triggered: bool | None = None
    deleted: bool | None = None


class ScheduleList(BaseModel):
    items: list[ScheduleView]


class NoteBody(BaseModel):
    note: str = Field("", max_length=500, description="why (shown in the Temporal UI)")


def schedules(service: RunService = Depends(get_service)) -> ScheduleService:
    return ScheduleService(service)


@router.post(
    "/schedules",
    operation_id="create_schedule",
    summary="Make a schedule",
    status_code=201,
    responses={**documented(ScheduleView, 201), **INVALID, 409: {"model": Envelope[None]}},
)
async def create_schedule(
    request: Request, body: ScheduleDef, book: ScheduleService = Depends(schedules)
) -> JSONResponse:
    who = principal(request)
    view = await book.create(body, who.name, who.role)
    return envelope(request, view, status=201)


@router.get(
    "/schedules",
    operation_id="list_schedules",
    summary="The schedules Artemis made for this task queue",
    responses=documented(ScheduleList),
)
async def list_schedules(
    request: Request, book: ScheduleService = Depends(schedules)
) -> JSONResponse:
    return envelope(request, {"items": await book.list()})


@router.get(
    "/schedules/{name}",
    operation_id="get_schedule",
    summary="A schedule, its next starts and its last starts",
    responses={**documented(ScheduleView), **MISSING},
)
async def get_schedule(
    request: Request, name: str = NAME, book: ScheduleService = Depends(schedules)
) -> JSONResponse:
    return envelope(request, await book.show(name))


@router.post(
    "/schedules/{name}/pause",
    operation_id="pause_schedule",
    summary="Pause a schedule",
    responses={**documented(ScheduleView), **MISSING},
)
async def pause_schedule(
    request: Request,
    name: str = NAME,
    body: NoteBody = Body(default_factory=NoteBody),
    book: ScheduleService = Depends(schedules),
) -> JSONResponse:
    return envelope(request, await book.pause(name, body.note or "paused by request"))


@router.post(
    "/schedules/{name}/unpause",
    operation_id="unpause_schedule",
    summary="Unpause a schedule",
    responses={**documented(ScheduleView), **MISSING},
)
async def unpause_schedule(
    request: Request,
    name: str = NAME,
    body: NoteBody = Body(default_factory=NoteBody),
    book: ScheduleService = Depends(schedules),
) -> JSONResponse:
    return envelope(request, await book.unpause(name, body.note or "unpaused by request"))


@router.post(
    "/schedules/{name}/trigger",
    operation_id="trigger_schedule",
    summary="Start the schedule's run now",
    status_code=202,
    responses={**documented(ScheduleAction, 202), **MISSING},
)
async def trigger_schedule(
    request: Request, name: str = NAME, book: ScheduleService = Depends(schedules)
) -> JSONResponse:
    return envelope(request, await book.trigger(name), status=202)


@router.delete(
    "/schedules/{name}",
    operation_id="delete_schedule",
    summary="Delete a schedule (the runs it started go on)",
    responses={**documented(ScheduleAction), **MISSING},
)
async def delete_schedule(
    request: Request, name: str = NAME, book: ScheduleService = Depends(schedules)
) -> JSONResponse:
    return envelope(request, await book.delete(name))
