"""Where a request may point a run (SPEC §5): every URL that comes from a request — a
source base URL in params, a sink endpoint in ``output``, a callback URL — must name a
host in ``security.allowed_hosts``; URLs from config and the registry are trusted."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from artemis.errors import ArtemisError, ErrorCode

SETTING = "security.allowed_hosts"


def _entry(entry: str) -> tuple[str, int | None]:
    """An allow-list entry as (host, pinned port or None): ``host``, ``host:port``,
    ``[v6]:port``; a bare IPv6 address has no port."""
    entry = entry.lower().strip()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        if port.isdigit():
            return host, int(port)
    return entry, None


def _match(host: str, port: int | None, allowed: list[str]) -> str | None:
    """How ``host`` (and ``port``) is allowed: "exact" (named), "wildcard", or None."""
    host = host.lower().strip("[]")
    how = None
    for raw in allowed:
        name, pinned = _entry(raw)
        if pinned is not None and port is not None and pinned != port:
            continue
        if name == host:
            return "exact"
        if name == "*" or (name.startswith("*.") and host.endswith(name[1:])):
            how = "wildcard"
    return how


def host_allowed(host: str, allowed: list[str], port: int | None = None) -> bool:
    """Exact names or IPs; ``*`` allows any host, ``*.example.com`` its subdomains; an
    entry ``host:port`` (``[v6]:port``) allows that port only."""
    return _match(host, port, allowed) is not None


def check_request_url(url: str, allowed: list[str], what: str) -> str:
    """The URL's host when it may be reached, else INVALID_INPUT naming the host, the
    field and the setting."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{what}: not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{what}: an http(s) URL, got {url!r}")
    port = port or (443 if parts.scheme == "https" else 80)
    check_request_host(parts.hostname, allowed, what, port)
    return parts.hostname


def check_request_host(host: str, allowed: list[str], what: str, port: int | None = None) -> None:
    if not host_allowed(host, allowed, port):
        at = f" (port {port})" if port else ""
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{what}: host {host!r}{at} is not in {SETTING} (a request may only point a run "
            f"at the hosts listed there)",
        )


def _internal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Not a public address: loopback, private, link-local, shared (100.64/10, where
    some clouds keep their metadata service), reserved, multicast, unspecified."""
    return not ip.is_global or ip.is_multicast


async def check_resolved(host: str, allowed: list[str], what: str) -> None:
    """A host allowed by a wildcard (``*``, ``*.example.com``) must not resolve to a
    loopback, private or link-local address (169.254.169.254, 10.x, 127.x, ...) unless
    the allow-list names that address: DNS cannot turn an allowed name into a way to
    the machine's own ports or the cloud's metadata service. Named hosts are trusted."""
    import asyncio
    import socket

    if _match(host, None, allowed) != "wildcard":
        return
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        # an internal address matched only by a wildcard: not unless it is named
        if _internal(literal):
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{what}: {literal} is an internal address (loopback, private or "
                f"link-local), which {SETTING} does not name",
            )
        return
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM), 5
        )
    except (OSError, TimeoutError):
        return  # unresolvable now: the request itself will fail (an outage), not reach in
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if _internal(ip) and _match(str(ip), None, allowed) != "exact":
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{what}: host {host!r} resolves to the internal address {ip} (loopback, "
                f"private or link-local), which {SETTING} does not name",
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
    }
)


def check_header_names(names: list[str], what: str) -> None:
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,40}", str(name)):
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{what}: {str(name)[:60]!r} is not a header name (1-40 token characters)",
            )
        if str(name).strip().lower() in RESERVED_HEADERS:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT, f"{what}: a request may not set the {name!r} header"
            )
