"""Registry credentials: which environment variables may hold one, where it is sent and how.

A credential names its secret by environment variable (``secret_env``); the import reads
that variable, seals its value and the worker later sends it to the provenance's base URL.
Whoever writes a registry file therefore chooses a variable of the importing process and
a destination. The service's own secrets must never be among those variables, or one file
(``secret_env: COOKIE_MASTER_KEY`` with ``base_url_default`` elsewhere) ships the master key
to any host. The rule lives here only: the file models, the row writes, the import and the
run-time contract all ask ``refused_secret_env``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from artemis.errors import ArtemisError, ErrorCode
from artemis.vault import MASTER_KEY_ENV, PREVIOUS_KEYS_ENV

# The service's own variables, by exact name or prefix (compared upper-cased: proxies are
# often lower-case, and some platforms fold the case of environment names). Each entry
# says why it is the service's: a credential holding it would send it to the provenance.
RESERVED_ENV: tuple[tuple[str, str], ...] = (
    (MASTER_KEY_ENV, "the vault's master key"),
    (PREVIOUS_KEYS_ENV, "the vault's previous master keys"),
    ("COOKIE_MASTER_*", "the vault's master keys"),
    ("ARTEMIS_*", "Artemis's own settings and tokens (ARTEMIS__*, ARTEMIS_API_TOKEN, …)"),
    ("DATABASE_URL", "the database's credentials"),
    ("*_DATABASE_URL", "a database's credentials"),
    ("PG*", "the database's credentials (libpq)"),
    ("POSTGRES_*", "the database's credentials"),
    ("TEMPORAL_*", "Temporal's address and credentials"),
    ("REDIS_*", "Redis's address and credentials"),
    ("AWS_*", "cloud credentials"),
    ("GOOGLE_*", "cloud credentials"),
    ("GCP_*", "cloud credentials"),
    ("GCLOUD_*", "cloud credentials"),
    ("CLOUDSDK_*", "cloud credentials"),
    ("AZURE_*", "cloud credentials"),
    ("SSL_*", "the TLS trust settings"),
    ("OTEL_*", "the telemetry exporter's settings (OTLP headers carry its credentials)"),
    ("*_PROXY", "the proxy settings (a proxy URL may carry a password)"),
)
# A POSIX environment variable name (and the column's width).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _matches(name: str, pattern: str) -> bool:
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    if pattern.startswith("*"):
        return name.endswith(pattern[1:])
    return name == pattern


def refused_secret_env(name: str) -> str | None:
    """Why ``name`` may not be a credential's ``secret_env`` (None: it may)."""
    if not _NAME.fullmatch(name):
        return f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, ≤ 100)"
    upper = name.upper()
    for pattern, why in RESERVED_ENV:
        if _matches(upper, pattern):
            return (
                f"{name} is one of the service's own variables ({pattern}: {why}); a "
                "credential's secret_env names a variable set for that credential only"
            )
    return None


def check_secret_env(
    name: str | None, code: ErrorCode = ErrorCode.INVALID_INPUT, label: str = "secret_env"
) -> None:
    """Refuse a reserved or malformed ``secret_env`` (``code``: INVALID_INPUT for a file or a
    write, CONFIG_ERROR for a row met when a run uses its contract)."""
    why = refused_secret_env(name) if name is not None else None
    if why:
        raise ArtemisError(code, f"{label} {why}")


# Where each auth type puts the secret, and the name used when the row gives none.
PLACEMENT: dict[str, tuple[str, str]] = {
    "API_KEY_QUERY": ("query", "api_key"),
    "API_KEY_HEADER": ("header", "X-API-Key"),
    "BEARER": ("header", "Authorization"),
    "BASIC": ("header", "Authorization"),
    # The access token fetched from the TOKEN endpoint (the secret goes there only).
    "OAUTH2_CLIENT_CREDENTIALS": ("header", "Authorization"),
    "OAUTH2_REFRESH_TOKEN": ("header", "Authorization"),
    # The session token a login at the TOKEN endpoint answers.
    "SESSION_TOKEN": ("header", "Authorization"),
}


def placement(row: dict[str, Any]) -> tuple[str, str]:
    """``(query|header, name)``: where a credential row's secret goes."""
    kind = row.get("auth_type_code")
    if kind not in PLACEMENT:
        raise ArtemisError(ErrorCode.CONFIG_ERROR, f"auth_type_code {kind!r} is unknown")
    where, default = PLACEMENT[kind]
    return where, row.get("param_or_header_name") or default


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the default port written out)."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or {"https": 443, "http": 80}.get(scheme)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port else "")
