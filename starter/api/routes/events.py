"""GET /tasks/{task_id}/events: the run's events as Server-Sent Events (SPEC §6).

The stream replays the run's recorded events through the plan tracker, sends those after
``Last-Event-ID`` (header, or ``?last_event_id=`` for clients that cannot set headers),
then tails the event log until the terminal event, after which it closes. A run that
ended without recording its end (terminated in Temporal) gets its terminal event from
the task store or Temporal. ``?follow=false`` returns what is recorded so far and closes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from artemis.errors import ArtemisError, ErrorCode
from artemis.events import EventLog, OutEvent, PlanTracker, cursor_of, now_ms
from artemis.logsetup import get_logger
from starter.api.deps import caller_task_id, get_service, get_settings
from starter.api.schemas import INVALID, Envelope
from starter.service import RunService

router = APIRouter(tags=["tasks"])
log = get_logger("artemis.api.events")

CLOSED_CHECK_S = 1.0


def sse(ev: OutEvent) -> ServerSentEvent:
    data = json.dumps(ev.payload, separators=(",", ":"), ensure_ascii=False)
    return ServerSentEvent(data, id=ev.sse_id)


def _log(request: Request) -> EventLog:
    app = request.app
    if getattr(app.state, "event_log", None) is None:
        app.state.event_log = EventLog(app.state.settings.database.url)
    return app.state.event_log


@router.get(
    "/tasks/{task_id}/events",
    operation_id="task_events",
    summary="The run's events (Server-Sent Events) until it ends",
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "required": ["event"],
                        "properties": {"event": {"type": "string"}},
                    }
                }
            },
            "description": "one `id:` and one `data:` line per event; data is a JSON object "
            "whose `event` is plan_update, activity_start, activity_result, progress, "
            "paused, resumed, rate_changed, complete, error or cancelled",
        },
        404: {"model": Envelope[None], "description": "TASK_NOT_FOUND"},
        **INVALID,
    },
)
async def task_events(
    request: Request,
    task_id: str = Depends(caller_task_id),
    last_event_id: str | None = Query(None, max_length=40),
    follow: bool = Query(True),
    service: RunService = Depends(get_service),
    settings=Depends(get_settings),
) -> EventSourceResponse:
    events = _log(request)
    after = cursor_of(request.headers.get("last-event-id") or last_event_id)
    recorded = await asyncio.to_thread(events.since, task_id, 0, 1)
    if not recorded and await service.record(task_id) is None:
        if await service.find(task_id) is None:
            raise ArtemisError(ErrorCode.TASK_NOT_FOUND, f"no task with id {task_id!r}")
    poll_s = settings.events.poll_interval_ms / 1000
    keepalive_s = settings.events.keepalive_s

    async def stream() -> AsyncIterator[ServerSentEvent]:
        tracker = PlanTracker(task_id)
        seq = 0
        checked = time.monotonic()

        async def drain() -> AsyncIterator[ServerSentEvent]:
            nonlocal seq
            while True:
                raws = await asyncio.to_thread(events.since, task_id, seq)
                for raw in raws:
                    seq = raw.seq
                    for ev in tracker.feed(raw):
                        if ev.cursor > after:
                            yield sse(ev)
                if len(raws) < 1000 or tracker.finished:
                    return

        while True:
            async for chunk in drain():
                yield chunk
            if tracker.finished or not follow:
                return
            now = time.monotonic()
            if now - checked >= CLOSED_CHECK_S:
                checked = now
                try:
                    end = await service.closed_end(task_id)
                except Exception as e:  # Temporal or the store away: keep tailing the log
                    log.warning("events_end_check_failed", task_id=task_id, error=str(e))
                    end = None
                if end is not None:
                    async for chunk in drain():  # what was written just before it closed
                        yield chunk
                    for ev in tracker.synthetic_end(end.pop("status"), end, now_ms()):
                        if ev.cursor > after:
                            yield sse(ev)
                    return
            await asyncio.sleep(poll_s)

    # sse-starlette frames the events, sends a comment ping every keepalive_s, notices a
    # client that went away and sets the no-cache / no-buffering headers.
    return EventSourceResponse(stream(), ping=keepalive_s, sep="\n")
