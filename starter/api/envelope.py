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
LOOPBACK_BINDS = {"127.0.0.1", "localhost", "::1"}
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
# FastAPI's own pages (no route dependency reaches them): the middleware guards them.
DOC_PATHS = {"/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"}


def token_ok(authorization: str | None, tokens: list[str]) -> bool:
    """A bearer token among ``tokens`` (compared as bytes in constant time: a non-ASCII
    header is a wrong token, not a server error)."""
    given = authorization or ""
    token = given[7:].strip() if given[:7].lower() == "bearer " else ""
    raw = token.encode("utf-8", "surrogateescape")
    return bool(token) and any(hmac.compare_digest(raw, t.encode()) for t in tokens)


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
            refused = self._refused(scope, headers, bool(tokens))
            if refused is not None:
                await error_response(None, refused, state=state)(scope, receive, send_with_headers)
                return
            if tokens and path in DOC_PATHS and not token_ok(headers.get("authorization"), tokens):
                # The API's routes check the token themselves (starter/api/auth.py).
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

    def _refused(self, scope: Scope, headers: dict[str, str], tokens: bool) -> ArtemisError | None:
        """A browser's request another site made (SPEC §5): a body that is not JSON, a
        state change without JSON and without a token (CSRF), or a Host header naming
        another site on a loopback API without tokens (DNS rebinding)."""
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
        err = ArtemisError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request body exceeds server.max_body_bytes ({limit} bytes)",
        )
        await error_response(None, err, state=state)(scope, receive, send)


def json_only(method: str, headers: Any, tokens: bool) -> ArtemisError | None:
    """What a route that changes state refuses (SPEC §5): a body that is not JSON, and,
    without tokens, a request without ``Content-Type: application/json`` (a web page
    cannot send that cross-site without a preflight this API never grants: CSRF)."""
    if method not in ("POST", "PUT", "PATCH", "DELETE"):
        return None
    ctype = (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    is_json = ctype == "application/json" or ctype.endswith("+json")
    has_body = (headers.get("content-length") or "0") != "0" or "transfer-encoding" in headers
    if has_body and not is_json:
        return ArtemisError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"request bodies are application/json (got {ctype or 'no Content-Type'})",
        )
    if not has_body and not is_json and not tokens:
        return ArtemisError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "a request that changes state needs Content-Type: application/json (or a "
            "bearer token): a web page cannot send that on its own",
        )
    return None


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
