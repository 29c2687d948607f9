"""Who may call the API, as a FastAPI security dependency: with ``server.api_tokens``
set, every route but the probes (``/health``, ``/ready``: a Kubernetes probe carries no
token, and they show no secret or config value) needs ``Authorization: Bearer <token>``
— ``/openapi.json`` and ``/docs`` too. Without tokens the API is open (and the bind guard
keeps it on loopback) and every caller is the admin "default". ``/openapi.json`` declares
the scheme, so ``/docs`` offers to send it.

The token found is the request's :class:`Principal` (its name owns the runs it starts,
its role says what else it may touch): ``principal(request)``.

The same dependency refuses what a web page could send cross-site to a state-changing
route (``json_only``: CSRF)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from artemis.config import ApiToken
from artemis.errors import ArtemisError, ErrorCode
from artemis.owners import DEFAULT_OWNER

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearerToken",
    description="One of server.api_tokens (required when any is configured)",
)


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name (the owner of the runs it starts) and role."""

    name: str
    role: str

    @property
    def sees_all(self) -> bool:
        """Reads and controls every owner's runs (operator, admin)."""
        return self.role in ("operator", "admin")

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


# An API without tokens: the one caller is the admin of the default namespace.
OPEN = Principal(DEFAULT_OWNER, "admin")


async def require_token(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)
) -> None:
    """Refuse a request without a configured token (401 UNAUTHORIZED), then a state
    change that is not JSON (415); remember who called (``principal``)."""
    tokens = request.app.state.settings.server.tokens()
    given = credentials.credentials if credentials is not None else ""
    found = token_for(given, tokens) if tokens else None
    if tokens and found is None:
        raise ArtemisError(
            ErrorCode.UNAUTHORIZED, "missing or invalid bearer token (Authorization header)"
        )
    request.state.principal = OPEN if found is None else Principal(found.name, found.role)
    refused = json_only(request.method, request.headers, bool(tokens))
    if refused is not None:
        raise refused


async def require_admin(request: Request, _: None = Depends(require_token)) -> None:
    """A route for admins only (403 FORBIDDEN naming the role needed)."""
    who = principal(request)
    if not who.is_admin:
        raise ArtemisError(
            ErrorCode.FORBIDDEN,
            f"this route needs an admin token (token {who.name!r} is a {who.role})",
        )


async def require_operator(request: Request, _: None = Depends(require_token)) -> None:
    """An operator's or admin's route (403 FORBIDDEN naming the role needed)."""
    who = principal(request)
    if not who.sees_all:
        raise ArtemisError(
            ErrorCode.FORBIDDEN,
            f"this route needs an operator or admin token (token {who.name!r} is a {who.role})",
        )


def principal(request: Request) -> Principal:
    """Who made ``request`` (set by ``require_token``, which every guarded route runs)."""
    return getattr(request.state, "principal", None) or OPEN


async def refusal(request: Request) -> ArtemisError | None:
    """What ``require_token`` refuses ``request`` with, or None. For the answers FastAPI
    gives before a route's dependencies run (a JSON body it cannot parse): the token is
    still checked first, so a caller without one learns nothing else."""
    try:
        await require_token(request, await bearer(request))
    except ArtemisError as e:
        return e
    return None


def token_for(token: str, tokens: list[ApiToken]) -> ApiToken | None:
    """The configured token equal to ``token`` (compared as bytes in constant time, every
    entry looked at: a non-ASCII header is a wrong token, not a server error)."""
    raw = token.encode("utf-8", "surrogateescape")
    found = None
    for entry in tokens:
        if hmac.compare_digest(raw, entry.token.encode()) and token:
            found = entry
    return found


def json_only(method: str, headers: Any, tokens: bool) -> ArtemisError | None:
    """What a route that changes state refuses (docs/security.md): a body that is not JSON, and,
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
    403: {"description": "FORBIDDEN: the token's role may not use this route"},
    415: {
        "description": "UNSUPPORTED_MEDIA_TYPE: bodies (and, without a token, state "
        "changes) are application/json"
    },
}
