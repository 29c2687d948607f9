"""The response envelope of SPEC §5 and the ASGI middleware that gives every request a
request id, a trace, authentication, a body-size limit and log context."""

from __future__ import annotations

import hmac
import json
import time
import uuid
from typing import Any

import structlog
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.tracing import TraceContext, extract_trace

log = get_logger("artemis.api")

# The probes answer without a token (a Kubernetes probe carries none); they never show a
# secret or a config value.
OPEN_PATHS = {"/health", "/ready"}


def _meta(state: dict[str, Any]) -> dict[str, Any]:
    trace: TraceContext | None = state.get("trace")
    started = state.get("started")
    return {
        "request_id": state.get("request_id"),
        "trace_id": trace.trace_id if trace else None,
        "latency_ms": round((time.perf_counter() - started) * 1000, 2) if started else None,
    }


def envelope(
    request: Request | None,
    data: Any = None,
    *,
    status: int = 200,
    error: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
) -> JSONResponse:
    st = state if state is not None else (request.scope.get("state", {}) if request else {})
    body = {"success": error is None, "data": data, "error": error, "meta": _meta(st)}
    return JSONResponse(body, status_code=status)


def error_response(
    request: Request | None,
    err: ArtemisError,
    *,
    data: Any = None,
    state: dict[str, Any] | None = None,
) -> JSONResponse:
    payload = err.to_dict()
    if err.details.get("fields"):
        payload["fields"] = err.details["fields"]
    return envelope(request, data, status=err.code.http_status, error=payload, state=state)


class RequestContextMiddleware:
    """Pure ASGI so that it can refuse an over-long body while it streams in."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request_id = headers.get("x-request-id") or uuid.uuid4().hex
        trace = extract_trace(headers.get("traceparent"))
        state = scope.setdefault("state", {})
        state.update(request_id=request_id, trace=trace, started=time.perf_counter())
        structlog.contextvars.bind_contextvars(
            request_id=request_id, trace_id=trace.trace_id, span_id=trace.span_id
        )

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [
                    (b"x-request-id", request_id.encode("latin-1")),
                    (b"traceparent", trace.traceparent().encode()),
                ]
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        try:
            path = scope["path"]
            tokens = self.settings.server.api_tokens
            if tokens and path not in OPEN_PATHS:
                given = headers.get("authorization", "")
                token = given[7:].strip() if given.lower().startswith("bearer ") else ""
                if not any(hmac.compare_digest(token, t) for t in tokens):
                    err = ArtemisError(
                        ErrorCode.UNAUTHORIZED,
                        "missing or invalid bearer token (Authorization header)",
                    )
                    await error_response(None, err, state=state)(scope, receive, send_with_headers)
                    return
            limit = self.settings.server.max_body_bytes
            declared = headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > limit:
                await self._too_large(scope, receive, send_with_headers, state, limit)
                return
            received = 0
            too_large = False

            async def limited_receive() -> Message:
                nonlocal received, too_large
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > limit:
                        too_large = True
                        raise _BodyTooLarge()
                return message

            try:
                await self.app(scope, limited_receive, send_with_headers)
            except _BodyTooLarge:
                await self._too_large(scope, receive, send_with_headers, state, limit)
        finally:
            log.info(
                "http_request",
                method=scope.get("method"),
                path=scope.get("path"),
                latency_ms=_meta(state)["latency_ms"],
            )
            structlog.contextvars.clear_contextvars()

    @staticmethod
    async def _too_large(
        scope: Scope, receive: Receive, send: Send, state: dict, limit: int
    ) -> None:
        err = ArtemisError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request body exceeds server.max_body_bytes ({limit} bytes)",
        )
        await error_response(None, err, state=state)(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


async def read_json(request: Request) -> Any:
    """The request body as JSON; malformed JSON is a 422 naming where it broke."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"body: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}",
        ) from None
    except UnicodeDecodeError:
        raise ArtemisError(ErrorCode.INVALID_INPUT, "body: not UTF-8 text") from None
