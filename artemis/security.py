"""Where a request may point a run (docs/security.md): every URL that comes from a request — a
source base URL in params, a sink endpoint in ``output``, a callback URL — must name a
host in ``security.allowed_hosts``; URLs from config and the registry are trusted."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from artemis.errors import ArtemisError, ErrorCode
from artemis.netguard import AddressRefused, AllowList, Resolver, Unresolvable, admitted

SETTING = "security.allowed_hosts"


def host_allowed(host: str, allowed: list[str], port: int | None = None) -> bool:
    """Exact names, IPs or CIDR networks; ``*`` allows any host, ``*.example.com`` its
    subdomains; an entry ``host:port`` (``[v6]:port``) allows that port only."""
    return AllowList(allowed).match(host, port) is not None


def check_request_url(url: str, allowed: list[str], what: str) -> str:
    """The URL's host when it may be named, else INVALID_INPUT naming the host, the field
    and the setting."""
    host, _ = url_host_port(url, what)
    check_request_host(host, allowed, what, url_host_port(url, what)[1])
    return host


def url_host_port(url: str, what: str) -> tuple[str, int]:
    """An http(s) URL's host and port (the scheme's default when none), else
    INVALID_INPUT naming ``what``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{what}: not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{what}: an http(s) URL, got {url!r}")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def check_request_host(host: str, allowed: list[str], what: str, port: int | None = None) -> None:
    if not host_allowed(host, allowed, port):
        at = f" (port {port})" if port else ""
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{what}: host {host!r}{at} is not in {SETTING} (a request may only point a run "
            f"at the hosts listed there)",
        )


async def check_resolved(
    host: str,
    allowed: list[str],
    what: str,
    port: int | None = None,
    resolver: Resolver | None = None,
) -> None:
    """The host of a request's URL resolves, and to an address a connection may go to:
    a public one, or an internal one (loopback, private, link-local, reserved, …) that a
    literal IP or CIDR entry of the allow-list contains. A name that does not resolve now
    is refused too. The worker checks again where it connects (the answer may change)."""
    try:
        await admitted(host, port, AllowList(allowed), resolver or Resolver())
    except Unresolvable as e:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT, f"{what}: {e}: a request's host must resolve when it starts"
        ) from None
    except AddressRefused as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{what}: {e}") from None


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


def same_origin(url: str, other: Any) -> bool:
    """Whether ``url`` is on the origin of ``other`` (a URL the operator configured; None
    or not a string: no origin, never the same)."""
    if not isinstance(other, str) or not other:
        return False
    try:
        return origin(url) == origin(other)
    except ValueError:
        return False


def check_same_origin(url: str, base: str, who: str) -> None:
    """A URL a source handed back (a ``Link`` header's next page, a next URL in a body)
    is followed only on the origin of the contract's base URL, where its credentials
    belong: anything else is SOURCE_CONTRACT naming the host, never the query."""
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
    digits and ``. _ : -``, never ``.`` or ``..`` (``/notes/..`` would collapse to ``/``)."""
    return bool(_SAFE_ID.match(value)) and ".." not in value and value != "."


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
        # what a server would take for the caller's session, proxy login or address
        "cookie",
        "proxy-authorization",
    }
)
# Every X-Forwarded-* header (For, Host, Proto, ...): a server behind a proxy trusts them.
RESERVED_PREFIXES = ("x-forwarded-",)


def check_header_names(names: list[str], what: str) -> None:
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,40}", str(name)):
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{what}: {str(name)[:60]!r} is not a header name (1-40 token characters)",
            )
        lowered = str(name).strip().lower()
        if lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_PREFIXES):
            raise ArtemisError(
                ErrorCode.INVALID_INPUT, f"{what}: a request may not set the {name!r} header"
            )
