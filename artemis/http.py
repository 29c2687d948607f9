"""The one HTTP client factory, and the mapping of transport failures onto error codes."""

from __future__ import annotations

from typing import Any

import httpx

from artemis.config import HttpClientSettings
from artemis.errors import ArtemisError, ErrorCode


def make_client(settings: HttpClientSettings, **overrides) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
    )
    kwargs: dict[str, Any] = dict(
        timeout=httpx.Timeout(settings.timeout_seconds),
        verify=settings.verify_ssl,
        headers=dict(settings.headers),
        limits=limits,
        # Never followed: a redirect could lead a request-supplied URL past the allow-list
        # (security.allowed_hosts); a 3xx is an answer like any other.
        follow_redirects=False,
    )
    kwargs.update(overrides)
    return httpx.AsyncClient(**kwargs)


def transport_error(code: ErrorCode, what: str, exc: httpx.HTTPError) -> ArtemisError:
    """Turn a transport failure into a retryable error naming what was being done."""
    if isinstance(exc, httpx.TimeoutException):
        return ArtemisError(
            ErrorCode.TIMEOUT_ERROR if code is ErrorCode.TIMEOUT_ERROR else code,
            f"{what}: timed out ({type(exc).__name__})",
            retryable=True,
        )
    return ArtemisError(code, f"{what}: {type(exc).__name__}: {exc}", retryable=True)


RETRYABLE_STATUSES = (408, 425, 429)


def status_error(code: ErrorCode, what: str, response: httpx.Response) -> ArtemisError:
    """An error answer: 408/425/429 and 5xx may pass on retry; any other 4xx cannot."""
    status = response.status_code
    return ArtemisError(
        code,
        f"{what} answered {status}: {response.text[:300]}",
        retryable=status in RETRYABLE_STATUSES or status >= 500,
        details={"status": status},
        retry_after_s=retry_after_seconds(response),
    )


def retry_after_seconds(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from datetime import UTC, datetime
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
