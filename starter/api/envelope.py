"""The response envelope (docs/api.md) and the ASGI middleware that gives every request a
request id, a trace, the Host check, a body-size limit, log context and its access-log
line. Who may call is not decided here: ``starter/api/auth.py``'s security dependency."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import structlog
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.tracing import TraceContext, extract_trace

log = get_logger("artemis.api")

LOOPBACK_BINDS = {"127.0.0.1", "localhost", "::1"}
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}


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
    return envelope(request, data, status=err.http_status, error=payload, state=state)


# A caller's X-Request-ID reaches log lines, the Temporal UI's details and the headers of
# the worker's outgoing requests: only a plain token of this shape is kept.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id_of(given: str | None) -> str:
    """The caller's request id when it is a plain token, else a new one (never an error:
    a bad id is the caller's to fix, not a reason to refuse the request)."""
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


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
        request_id = request_id_of(headers.get("x-request-id"))
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
            refused = self._refused(headers, bool(self.settings.server.api_tokens))
            if refused is not None:
                await error_response(None, refused, state=state)(scope, receive, send_with_headers)
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
                        raise BodyTooLarge(limit)
                return message

            try:
                await self.app(scope, limited_receive, send_with_headers)
            except BodyTooLarge:  # raised where no exception handler answers it
                await self._too_large(scope, receive, send_with_headers, state, limit)
        finally:
            log.info(
                "http_request",
                method=scope.get("method"),
                path=scope.get("path"),
                latency_ms=_meta(state)["latency_ms"],
            )
            structlog.contextvars.clear_contextvars()

    def _refused(self, headers: dict[str, str], tokens: bool) -> ArtemisError | None:
        """A browser's request another site made (docs/security.md): a Host header naming another
        site on a loopback API without tokens (DNS rebinding). What a page could send
        cross-site in a body is refused by the routes (``auth.json_only``)."""
        if not tokens and self.settings.server.host in LOOPBACK_BINDS:
            host = headers.get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name.strip("[]").lower() not in LOOPBACK_NAMES:
                return ArtemisError(
                    ErrorCode.MISDIRECTED_REQUEST,
                    f"Host {host!r} is not this API's (a loopback API without "
                    "server.api_tokens answers only localhost, 127.0.0.1 and [::1])",
                )
        return None

    @staticmethod
    async def _too_large(
        scope: Scope, receive: Receive, send: Send, state: dict, limit: int
    ) -> None:
        err = BodyTooLarge(limit).error
        await error_response(None, err, state=state)(scope, receive, send)


class BodyTooLarge(StarletteHTTPException):
    """The body grew past ``server.max_body_bytes`` while it streamed in. An HTTP
    exception because FastAPI reads a body model's body before the route runs and passes
    those on (any other error there becomes a 400); the app answers it with ``error``."""

    def __init__(self, limit: int) -> None:
        self.error = ArtemisError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request body exceeds server.max_body_bytes ({limit} bytes)",
        )
        super().__init__(413, self.error.message)
