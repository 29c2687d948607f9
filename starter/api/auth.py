"""Who may call the API (SPEC §5): with ``server.api_tokens`` set, every route but the
probes needs ``Authorization: Bearer <token>``. A FastAPI security dependency, so
``/openapi.json`` declares the scheme and ``/docs`` offers to send it."""

from __future__ import annotations

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from artemis.errors import ArtemisError, ErrorCode
from starter.api.envelope import json_only, token_ok

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearerToken",
    description="One of server.api_tokens (required when any is configured)",
)


async def require_token(
    request: Request, _declared: HTTPAuthorizationCredentials | None = Security(bearer)
) -> None:
    """Refuse a request without a configured token (401 UNAUTHORIZED), then a state
    change that is not JSON (415). The header is read whole here (``HTTPBearer`` only
    declares the scheme)."""
    tokens = request.app.state.settings.server.api_tokens
    if tokens and not token_ok(request.headers.get("authorization"), tokens):
        raise ArtemisError(
            ErrorCode.UNAUTHORIZED, "missing or invalid bearer token (Authorization header)"
        )
    refused = json_only(request.method, request.headers, bool(tokens))
    if refused is not None:
        raise refused


GUARDED_RESPONSES: dict[int | str, dict] = {
    401: {"description": "UNAUTHORIZED: a bearer token is required (server.api_tokens)"},
    415: {
        "description": "UNSUPPORTED_MEDIA_TYPE: bodies (and, without a token, state "
        "changes) are application/json"
    },
}
