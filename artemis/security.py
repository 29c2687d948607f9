"""Where a request may point a run (SPEC §5): every URL that comes from a request — a
source base URL in params, a sink endpoint in ``output``, a callback URL — must name a
host in ``security.allowed_hosts``; URLs from config and the registry are trusted."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from artemis.errors import ArtemisError, ErrorCode

SETTING = "security.allowed_hosts"


def host_allowed(host: str, allowed: list[str]) -> bool:
    """Exact names or IPs; ``*`` allows any host, ``*.example.com`` its subdomains."""
    host = host.lower().strip("[]")
    for entry in allowed:
        entry = entry.lower().strip("[]")
        if entry == "*" or entry == host:
            return True
        if entry.startswith("*.") and host.endswith(entry[1:]):
            return True
    return False


def check_request_url(url: str, allowed: list[str], what: str) -> str:
    """The URL's host when it may be reached, else INVALID_INPUT naming the host, the
    field and the setting."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port out of range)
    except ValueError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{what}: not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{what}: an http(s) URL, got {url!r}")
    check_request_host(parts.hostname, allowed, what)
    return parts.hostname


def check_request_host(host: str, allowed: list[str], what: str) -> None:
    if not host_allowed(host, allowed):
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{what}: host {host!r} is not in {SETTING} (a request may only point a run at "
            f"the hosts listed there)",
        )


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port made explicit for http(s)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def check_same_origin(url: str, base: str, who: str) -> None:
    """A URL a source handed back (a ``Link`` header's next page, a next URL in a body)
    is followed only on the origin of the contract's base URL, where its credentials
    belong (SPEC §5): anything else is SOURCE_CONTRACT naming the host, never the query."""
    if origin(url) == origin(base):
        return
    scheme, host, port = origin(url)
    raise ArtemisError(
        ErrorCode.SOURCE_CONTRACT,
        f"{who}: the source's next page is on another origin ({scheme}://{host}:{port}), "
        f"not the source's own ({'://'.join(origin(base)[:2])}:{origin(base)[2]}): "
        "it is not followed and no credential is sent there",
        details={"host": host},
    )


_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def is_safe_id(value: str) -> bool:
    """An id that may become a URL path segment (a note id, a CronJob run id): letters,
    digits and ``. _ : -``, never ``..`` (``/notes/..`` would collapse to ``/``)."""
    return bool(_SAFE_ID.match(value)) and ".." not in value


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def is_bare_host(value: str) -> bool:
    """A host name or an IP address, nothing else (no path, query, port or user part)."""
    try:
        ipaddress.ip_address(value.strip("[]"))
        return True
    except ValueError:
        return bool(_HOSTNAME.match(value))


# Headers Artemis sets itself: a request may not supply or shadow them.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "idempotency-key",
        "traceparent",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "x-request-id",
    }
)


def check_header_names(names: list[str], what: str) -> None:
    for name in names:
        if str(name).strip().lower() in RESERVED_HEADERS:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT, f"{what}: a request may not set the {name!r} header"
            )
