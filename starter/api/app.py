"""The starter API (FastAPI): routes, error handlers and the envelope on every answer."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version as package_version
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import Client

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode, invalid_fields
from artemis.logsetup import get_logger
from artemis.temporal.client import connect
from artemis.tracing import exporting
from starter.api.auth import GUARDED_RESPONSES, refusal, require_admin, require_token
from starter.api.envelope import BodyTooLarge, RequestContextMiddleware, error_response
from starter.api.routes import (
    codec,
    events,
    health,
    notes,
    quarantine,
    registry,
    schedules,
    task_types,
    tasks,
)
from starter.service import RunService

log = get_logger("artemis.api")


def create_app(settings: Settings, client: Client | None = None) -> FastAPI:
    app = FastAPI(
        # /docs is served below from local files (no CDN), and /openapi.json next to it:
        # both behind the token like every route (ReDoc would need a CDN: none)
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        title="Artemis",
        # the installed package's version (pyproject.toml), as `pip show artemis` says
        version=package_version("artemis"),
        lifespan=_lifespan,
        description="Durable multi-source data harvesting on Temporal.",
        # FastAPI's own OpenTelemetry: one span per request (continuing the caller's
        # traceparent) when spans are exported, none otherwise (its middleware still
        # extracted the context and opened an unsampled span: 5 % of the API's CPU under
        # the accept bench); no spans per dependency/endpoint/serialization (a third of
        # the API's CPU under load), no metrics or log export (Prometheus and structlog).
        telemetry={
            "tracing": exporting(settings.telemetry),
            "operation_spans": False,
            "metrics": False,
            "logs": False,
        },
    )
    app.state.settings = settings
    app.state.service = RunService(client, settings) if client is not None else None
    _warn_of_weak_settings(settings)
    _local_docs(app)
    _include_routers(app, settings)
    _add_error_handlers(app)
    app.add_middleware(RequestContextMiddleware, settings=settings)
    if settings.temporal.payload_encryption:
        # The Temporal UI calls the codec endpoints from the browser, from its own origin.
        app.add_middleware(
            CodecCors,
            allow_origins=[settings.temporal.ui_url.rstrip("/")],
            allow_methods=["POST", "OPTIONS"],
            allow_headers=["content-type", "x-namespace", "authorization"],
            allow_credentials=True,
        )
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    checking = asyncio.create_task(_check_search_attributes(app))
    yield
    checking.cancel()
    await asyncio.gather(checking, return_exceptions=True)
    # The task-store writes still running concurrently with answers finish before the process.
    if getattr(app.state, "service", None) is not None:
        await app.state.service.drain()


async def _check_search_attributes(app: FastAPI) -> None:
    """At start, concurrently with serving: the namespace's search attributes. A missing one is a
    warning naming it and its command (``/ready`` answers 503 with the same, a start
    CONFIG_ERROR). Temporal away: nothing here (``/ready`` names it, and connects)."""
    try:
        if app.state.service is None:
            client = await asyncio.wait_for(connect(app.state.settings), 10)
            if app.state.service is None:  # a request may have connected meanwhile
                app.state.service = RunService(client, app.state.settings)
        check = app.state.service.search_attributes
        await asyncio.wait_for(check.refresh(), 10)
    except Exception as e:
        log.info("search_attributes_unchecked", error=f"{type(e).__name__}")
        return
    error = check.error()
    if error is not None:
        log.warning("search_attributes_missing", error=error.message)
    elif check.unchecked is not None:
        log.info("search_attributes_unchecked", error=check.unchecked)


def _warn_of_weak_settings(settings: Settings) -> None:
    """Log a default callback token that goes nowhere, and API tokens too short."""
    if settings.callback.default_token and not settings.callback.base_url:
        log.warning(
            "callback_default_token_unused",
            advice="callback.default_token is sent only to callback.base_url's origin: "
            "set callback.base_url (the CronJob) or give a token in each request",
        )
    short = [t.name for t in settings.server.tokens() if len(t.token) < 16]
    if short:
        log.warning(
            "api_token_short",
            tokens=short,
            advice="server.api_tokens: use 16 characters or more "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))')",
        )


def _include_routers(app: FastAPI, settings: Settings) -> None:
    """The API's routes: health open, every other one behind the token."""
    guarded: dict[str, Any] = {
        "dependencies": [Depends(require_token)],
        "responses": GUARDED_RESPONSES,
    }
    app.include_router(health.router)
    app.include_router(health.guarded, **guarded)
    app.include_router(tasks.router, **guarded)
    app.include_router(task_types.router, **guarded)
    app.include_router(events.router, **guarded)
    app.include_router(notes.router, **guarded)
    app.include_router(quarantine.router, **guarded)
    # An operator's or admin's (the route's own dependency says so).
    app.include_router(registry.router, **guarded)
    app.include_router(schedules.router, **guarded)
    if settings.temporal.payload_encryption:
        # The codec decrypts any run's payloads: admins only.
        app.include_router(
            codec.router, dependencies=[Depends(require_admin)], responses=GUARDED_RESPONSES
        )


def _add_error_handlers(app: FastAPI) -> None:
    """Every error answered in the envelope (``error_response``)."""

    @app.exception_handler(ArtemisError)
    async def _artemis_error(request: Request, exc: ArtemisError):
        if exc.http_status >= 500:
            log.warning("request_failed", error=str(exc), code=exc.code.value)
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(request, await refusal(request) or _invalid(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        refused = await refusal(request) if exc.status_code == 400 else None
        if refused is not None:
            return error_response(request, refused)
        if isinstance(exc, BodyTooLarge):
            return error_response(request, exc.error)
        return _http_error(app, request, exc)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception):
        log.exception("unhandled_error")
        return error_response(
            request, ArtemisError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
        )


def _http_error(app: FastAPI, request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own HTTP error (no route, wrong method, unreadable body) in the
    envelope, with its status and headers."""
    code = {
        404: ErrorCode.NOT_FOUND,
        401: ErrorCode.UNAUTHORIZED,
        413: ErrorCode.PAYLOAD_TOO_LARGE,
    }.get(exc.status_code, ErrorCode.INVALID_INPUT)
    err = ArtemisError(code, f"{request.method} {request.url.path}: {exc.detail}")
    resp = error_response(request, err)
    # A body that cannot be read as JSON is a bad body like any other: 422, not 400.
    resp.status_code = 422 if exc.status_code == 400 else exc.status_code
    for name, value in (exc.headers or {}).items():
        resp.headers[name] = value
    if exc.status_code == 405:
        methods = _path_methods(app, request)
        if methods:
            resp.headers["Allow"] = ", ".join(sorted(methods))
    return resp


def _path_methods(app: FastAPI, request: Request) -> set[str]:
    """Every method the request's path has (Starlette names only the first route's)."""
    methods: set[str] = set()
    pending = list(app.routes)
    while pending:
        route = pending.pop()
        inner = getattr(route, "original_router", None)
        if inner is not None:  # an included router: look at its own routes
            pending.extend(inner.routes)
            continue
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return methods


CODEC_PATHS = "/codec/"


class CodecCors:
    """CORS for the codec routes only: the Temporal UI calls them from its own origin,
    and no other route has a reason to answer a page of another origin (no
    ``Access-Control-*`` header on ``/tasks``, not even to the UI's origin)."""

    def __init__(self, app: ASGIApp, /, **options: Any) -> None:
        self.app = app
        self.cors = CORSMiddleware(app, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CODEC_PATHS):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _invalid(exc: RequestValidationError) -> ArtemisError:
    """422 INVALID_INPUT naming each bad field; a body that is not JSON says where it
    broke (FastAPI gives the offset: line and column read better)."""
    for err in exc.errors():
        if err["type"] == "json_invalid":
            at = json.JSONDecodeError(err["ctx"]["error"], exc.body or "", err["loc"][-1])
            where = f"malformed JSON at line {at.lineno} column {at.colno}: {at.msg}"
            return ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"body: {where}",
                details={"fields": [{"field": "body", "message": where}]},
            )
    return invalid_fields(exc.errors())


def swagger_ui_dir() -> str:
    """The folder of Swagger UI's files in the `swagger-ui-py` wheel (5.x: it renders
    OpenAPI 3.1, which FastAPI writes). Found without importing the package, which would
    load its web-framework adapters."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "static")


def _local_docs(app: FastAPI) -> None:
    """/openapi.json, and Swagger UI at /docs from the files of the `swagger-ui-py` wheel
    (mounted at /docs/static, so the page works with no internet). The pages need the
    token as the API does; Swagger UI's own files do not (they hold nothing of ours)."""
    app.mount(
        "/docs/static",
        StaticFiles(directory=swagger_ui_dir()),
        name="swagger-ui",
    )
    guard = [Depends(require_token)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=guard)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=guard)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="Artemis API",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="/docs/static/favicon-32x32.png",
            oauth2_redirect_url="/docs/oauth2-redirect",
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False, dependencies=guard)
    async def redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
