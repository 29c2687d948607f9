"""GET /tasks/{task_id}/events: the run's events as Server-Sent Events (docs/architecture.md).

The stream replays the run's recorded events through the plan tracker, sends those after
``Last-Event-ID`` (header, or ``?last_event_id=`` for clients that cannot set headers),
then tails the event log until the terminal event, after which it closes. A run that
ended without recording its end (terminated in Temporal) gets its terminal event from
the task store or Temporal. ``?follow=false`` returns what is recorded so far and closes.

Streams are bounded: an API process serves at most ``server.sse_max_streams_per_token``
per token name and ``server.sse_max_streams`` in all (429 past either), and a stream
ends after ``server.sse_max_lifetime_s`` (the client resumes with ``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from artemis.calls import work_on
from artemis.errors import ArtemisError, ErrorCode
from artemis.events import EventLog, OutEvent, PlanTracker, cursor_of, now_ms
from artemis.logsetup import get_logger
from starter.api.auth import principal
from starter.api.deps import caller_task_id, get_service, get_settings
from starter.api.schemas import INVALID, Envelope
from starter.service import RunService

router = APIRouter(tags=["tasks"])
log = get_logger("artemis.api.events")

CLOSED_CHECK_S = 1.0

# The event log is read on threads of this pool, not asyncio's default one: hundreds of
# open streams, each polling several times a second, would otherwise queue the API's
# other blocking calls (a start's secrets, the task store) behind their reads. A stream
# waits for its read before it sleeps, so at most one read per stream is queued; the
# pool's size bounds the database connections the streams use at once.
POLL_THREADS = 4
_poll_pool: ThreadPoolExecutor | None = None

R = TypeVar("R")


async def _read(fn: Callable[..., R], *args: Any) -> R:
    global _poll_pool
    if _poll_pool is None:
        _poll_pool = ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="sse-poll")
    return await work_on(_poll_pool, fn, *args)


class StreamSlots:
    """The event streams one API process serves: at most ``per_token`` per token name
    and ``total`` in all."""

    def __init__(self, per_token: int, total: int) -> None:
        self.per_token = per_token
        self.total = total
        self.open: Counter[str] = Counter()
        self.count = 0

    def take(self, who: str) -> Callable[[], None]:
        """A slot for one stream of token ``who``; the call returned gives it back (once).
        429 TOO_MANY_REQUESTS when ``who`` or the process has no slot left."""
        if self.open[who] >= self.per_token:
            raise ArtemisError(
                ErrorCode.TOO_MANY_REQUESTS,
                f"token {who!r} already has {self.per_token} event streams open "
                "(server.sse_max_streams_per_token): close one first",
            )
        if self.count >= self.total:
            raise ArtemisError(
                ErrorCode.TOO_MANY_REQUESTS,
                f"this API process already serves {self.total} event streams "
                "(server.sse_max_streams): try again later",
            )
        self.open[who] += 1
        self.count += 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.count -= 1
                self.open[who] -= 1
                if not self.open[who]:
                    del self.open[who]

        return release


def _slots(request: Request) -> StreamSlots:
    state = request.app.state
    if getattr(state, "sse_slots", None) is None:
        server = state.settings.server
        state.sse_slots = StreamSlots(server.sse_max_streams_per_token, server.sse_max_streams)
    return state.sse_slots


class HeldStream(EventSourceResponse):
    """An event stream that gives its slot back when it ends, however it ends (the run's
    end, its lifetime, the client gone, the server stopping) — or, never sent, when it
    is collected."""

    def __init__(self, *args: Any, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._release = release
        weakref.finalize(self, release)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


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
        429: {
            "model": Envelope[None],
            "description": "TOO_MANY_REQUESTS: the token (server.sse_max_streams_per_token) "
            "or the API process (server.sse_max_streams) has no event stream left",
        },
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
    await _check_known(events, service, task_id)
    tail = Tail(follow, settings.events.poll_interval_ms / 1000, settings.server.sse_max_lifetime_s)
    keepalive_s = settings.events.keepalive_s
    release = _slots(request).take(principal(request).name)
    try:
        # sse-starlette frames the events, sends a comment ping every keepalive_s, notices
        # a client that went away and sets the no-cache / no-buffering headers.
        return HeldStream(
            _stream(events, service, task_id, after, tail),
            ping=keepalive_s,
            sep="\n",
            release=release,
        )
    except BaseException:
        release()
        raise


async def _check_known(events: EventLog, service: RunService, task_id: str) -> None:
    """404 TASK_NOT_FOUND for a task id with no event, no record and no workflow."""
    recorded = await _read(events.since, task_id, 0, 1)
    if not recorded and await service.record(task_id) is None:
        if await service.find(task_id) is None:
            raise ArtemisError(ErrorCode.TASK_NOT_FOUND, f"no task with id {task_id!r}")


@dataclass(frozen=True)
class Tail:
    """How a stream follows a run: ``follow`` (else the events so far only), every
    ``poll_s`` seconds, for at most ``lifetime_s`` seconds."""

    follow: bool
    poll_s: float
    lifetime_s: float


async def _stream(
    events: EventLog,
    service: RunService,
    task_id: str,
    after: tuple[int, int],
    tail: Tail,
) -> AsyncIterator[ServerSentEvent]:
    """The run's events after the cursor ``after``; when ``tail.follow``, the log
    tailed until the run ends (its terminal event made up when it did not record one) or
    the stream's lifetime is reached."""
    follow, poll_s, lifetime_s = tail.follow, tail.poll_s, tail.lifetime_s
    tracker = PlanTracker(task_id)
    seq = 0
    checked = time.monotonic()
    ends_at = checked + lifetime_s

    async def drain() -> AsyncIterator[ServerSentEvent]:
        nonlocal seq
        while True:
            raws = await _read(events.since, task_id, seq)
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
            end = await _closed_end(service, task_id)
            if end is not None:
                async for chunk in drain():  # what was written just before it closed
                    yield chunk
                for ev in tracker.synthetic_end(end.pop("status"), end, now_ms()):
                    if ev.cursor > after:
                        yield sse(ev)
                return
        if now >= ends_at:
            # A clean end: the client reconnects with the last id it got.
            log.info("events_stream_lifetime", task_id=task_id, lifetime_s=lifetime_s)
            yield ServerSentEvent(comment="stream lifetime reached: reconnect with Last-Event-ID")
            return
        await asyncio.sleep(poll_s)


async def _closed_end(service: RunService, task_id: str) -> dict[str, Any] | None:
    """How the run ended, None while it is open or when that cannot be told now."""
    try:
        return await service.closed_end(task_id)
    except Exception as e:  # Temporal or the store away: keep tailing the log
        log.warning("events_end_check_failed", task_id=task_id, error=str(e))
        return None
