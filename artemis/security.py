"""Where a request may point a run (SPEC §5): every URL that comes from a request — a
source base URL in params, a sink endpoint in ``output``, a callback URL — must name a
host in ``security.allowed_hosts``; URLs from config and the registry are trusted."""

from __future__ import annotations

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
    parts = urlsplit(url)
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
