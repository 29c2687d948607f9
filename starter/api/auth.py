"""Who may call the API (SPEC §5), as a FastAPI security dependency: with
``server.api_tokens`` set, every route but the probes (``/health``, ``/ready``: a
Kubernetes probe carries no token, and they show no secret or config value) needs
``Authorization: Bearer <token>`` — ``/openapi.json`` and ``/docs`` too. Without tokens
the API is open (and the bind guard keeps it on loopback). ``/openapi.json`` declares the
scheme, so ``/docs`` offers to send it.

The same dependency refuses what a web page could send cross-site to a state-changing
route (``json_only``: CSRF)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from artemis.errors import ArtemisError, ErrorCode

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearerToken",
    description="One of server.api_tokens (required when any is configured)",
)


async def require_token(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)
) -> None:
    """Refuse a request without a configured token (401 UNAUTHORIZED), then a state
    change that is not JSON (415)."""
    tokens = request.app.state.settings.server.api_tokens
    given = credentials.credentials if credentials is not None else ""
    if tokens and not token_ok(given, tokens):
        raise ArtemisError(
            ErrorCode.UNAUTHORIZED, "missing or invalid bearer token (Authorization header)"
        )
    refused = json_only(request.method, request.headers, bool(tokens))
    if refused is not None:
        raise refused


async def refusal(request: Request) -> ArtemisError | None:
    """What ``require_token`` refuses ``request`` with, or None. For the answers FastAPI
    gives before a route's dependencies run (a JSON body it cannot parse): the token is
    still checked first, so a caller without one learns nothing else."""
    try:
        await require_token(request, await bearer(request))
    except ArtemisError as e:
        return e
    return None


def token_ok(token: str, tokens: list[str]) -> bool:
    """``token`` is among ``tokens`` (compared as bytes in constant time: a non-ASCII
    header is a wrong token, not a server error)."""
    raw = token.encode("utf-8", "surrogateescape")
    return bool(token) and any(hmac.compare_digest(raw, t.encode()) for t in tokens)


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


GUARDED_RESPONSES: dict[int | str, dict] = {
    401: {"description": "UNAUTHORIZED: a bearer token is required (server.api_tokens)"},
    415: {
        "description": "UNSUPPORTED_MEDIA_TYPE: bodies (and, without a token, state "
        "changes) are application/json"
    },
}
