"""Liveness and readiness."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text

from artemis.calls import work
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.metrics import exposition
from starter.api.deps import get_service
from starter.api.envelope import envelope, error_response
from starter.api.schemas import Envelope, Health, Ready, documented
from starter.service import RunService

router = APIRouter(tags=["health"])
# Routes besides the probes that need the token when one is configured.
guarded = APIRouter(tags=["health"])
log = get_logger("artemis.api")


@router.get("/health", summary="Liveness (no token)", responses=documented(Health))
async def health(request: Request) -> JSONResponse:
    return envelope(request, {"status": "ok"})


def _down(what: str, e: BaseException) -> str:
    # The full error (it may name hosts, ports or a URL) goes to the log only: a probe
    # answers without a token, so it shows which dependency is down and nothing more.
    log.warning("dependency_unreachable", dependency=what, error=f"{type(e).__name__}: {e}")
    return f"unreachable ({type(e).__name__})"


@router.get(
    "/ready",
    summary="Readiness: Temporal, its search attributes and the database (no token)",
    responses={
        **documented(Ready),
        503: {"model": Envelope[Ready], "description": "NOT_READY, naming what is down"},
    },
)
async def ready(request: Request) -> JSONResponse:
    """Answered from a probe at most one second old: an unauthenticated caller cannot
    make the API reconnect to Temporal or open database threads faster than that."""
    state = request.app.state
    lock = getattr(state, "ready_lock", None)
    if lock is None:
        lock = state.ready_lock = asyncio.Lock()
    async with lock:  # concurrent callers share one probe
        cached = getattr(state, "ready_probe", None)
        if cached is None or time.monotonic() - cached[0] >= READY_CACHE_S:
            checks = await _probe(request)
            # stamped when the probe ends: a slow probe (a dependency down) is not stale
            state.ready_probe = cached = (time.monotonic(), checks)
    checks = dict(cached[1])
    failing = {k: v for k, v in checks.items() if v != "ok" and not v.startswith(UNCHECKED)}
    if not failing:
        return envelope(request, {"status": "ready", "checks": checks})
    return error_response(
        request,
        ArtemisError(
            ErrorCode.NOT_READY,
            "not ready: " + ", ".join(f"{k} {v}" for k, v in failing.items()),
        ),
        data={"checks": checks},
    )


READY_CACHE_S = 1.0
# A check Temporal would not answer (no permission to list the namespace's search
# attributes, say): shown, and not a reason to take the API out of service.
UNCHECKED = "unchecked"


async def _probe(request: Request) -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        service = await get_service(request)
        await asyncio.wait_for(service.client.service_client.check_health(), 5)
        checks["temporal"] = "ok"
        checks["search_attributes"] = await _search_attributes(service)
    except Exception as e:
        checks["temporal"] = _down("temporal", e)
    try:

        def _db() -> None:
            with get_engine(request.app.state.settings.database.url).connect() as conn:
                conn.execute(text("SELECT 1"))

        await asyncio.wait_for(work(_db), 5)
        checks["database"] = "ok"
    except Exception as e:
        checks["database"] = _down("database", e)
    return checks


async def _search_attributes(service: RunService) -> str:
    """Whether the namespace has the search attributes runs need: "ok", or the missing
    ones with the command that registers each (the operator's to run; names and the
    namespace only). Checked afresh, so that a registration since heals the API."""
    try:
        await asyncio.wait_for(service.search_attributes.refresh(), 5)
    except TimeoutError:
        return f"{UNCHECKED} (TimeoutError)"
    error = service.search_attributes.error()
    if error is not None:  # logged at start, and by each start it refuses
        return error.message
    if service.search_attributes.unchecked is not None:
        return f"{UNCHECKED} ({service.search_attributes.unchecked})"
    return "ok"


@guarded.get(
    "/metrics",
    summary="Prometheus metrics (text exposition format)",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
        404: {"model": Envelope[None], "description": "metrics.enabled is off"},
    },
)
async def metrics(request: Request) -> Response:
    if not request.app.state.settings.metrics.enabled:
        raise ArtemisError(ErrorCode.NOT_FOUND, "metrics are disabled (metrics.enabled)")
    body, content_type = exposition()
    return Response(body, media_type=content_type)
