"""What a provenance's HTTP transport and credentials may say: the closed sets of their
codes and the rules a row must keep. The file models refuse a row that breaks one at
import (the reason is the error), and a run meeting such a row written another way (a
switch, a hand) stops with CONFIG_ERROR before a request goes out: nothing is stored that
Artemis would then ignore or half-honour.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from typing import Any
from urllib.parse import urlsplit

# How a credential's secret is sent. The paired types hold a second secret
# (``principal_env``): the user of BASIC and of a SESSION_TOKEN login, the OAuth2 client id.
OAUTH2 = "OAUTH2_CLIENT_CREDENTIALS"
OAUTH2_REFRESH = "OAUTH2_REFRESH_TOKEN"
SESSION = "SESSION_TOKEN"
AUTH_TYPES = (
    "API_KEY_QUERY",
    "API_KEY_HEADER",
    "BEARER",
    "BASIC",
    OAUTH2,
    OAUTH2_REFRESH,
    SESSION,
)
PAIRED_AUTH_TYPES = ("BASIC", OAUTH2, OAUTH2_REFRESH, SESSION)
# The types whose secrets go to the provenance's TOKEN endpoint only, and whose source
# requests carry what it answered (an access token, a session token).
TOKEN_AUTH_TYPES = (OAUTH2, OAUTH2_REFRESH, SESSION)
OAUTH2_TYPES = (OAUTH2, OAUTH2_REFRESH)
# RFC 6749 §2.3.1: the client id and secret in an HTTP Basic header (the method every
# authorization server supports), or as form fields of the token request's body; NONE:
# a public client, which sends its client id in the form and has no secret (a refresh
# token's client only: client credentials always authenticate). The names are OAuth's
# own (RFC 7591 token_endpoint_auth_method).
TOKEN_AUTH_METHODS = ("CLIENT_SECRET_BASIC", "CLIENT_SECRET_POST", "NONE")
PUBLIC_CLIENT = "NONE"
# A SESSION_TOKEN login's answer: where the token is when token_jsonpath is left out.
DEFAULT_TOKEN_JSONPATH = "$.token"
# One rate gate per provenance, per credential or per endpoint.
BUCKET_GRANULARITIES = ("GLOBAL", "PER_KEY", "PER_ENDPOINT")
# The usage of the endpoint that issues OAuth2 access tokens.
TOKEN_USAGE = "TOKEN"

# Headers a provenance's default_headers_json may not carry: a value there is written in
# the registry file in clear (a credential seals its secret), or is set by another field.
_SECRET_HEADERS = ("authorization", "proxy-authorization", "cookie")
_OWN_HEADERS = {"accept-encoding": "accept_compress"}


def url_problem(url: str, what: str, schemes: tuple[str, ...] = ("http", "https")) -> str | None:
    """Why ``url`` cannot be a proxy or token URL: not one of ``schemes``, no host, or a
    user and password in it (a secret in the registry file)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as e:
        return f"{what} is not a valid URL ({e})"
    if parts.scheme not in schemes or not parts.hostname:
        shown = " or ".join(f"{s}://" for s in schemes)
        return f"{what} must be an {shown} URL, got {url.split('@')[-1]!r}"
    if parts.username is not None or parts.password is not None:
        return (
            f"{what} carries a user or password: the registry file would hold a secret "
            "in clear (a login at the proxy is not supported; use one that admits the "
            "workers by address)"
            if what == "proxy_url"
            else f"{what} carries a user or password: a secret in the registry file"
        )
    return None


def is_loopback_host(host: str | None) -> bool:
    """``localhost``, an address of 127.0.0.0/8 or ``::1``: a host whose traffic never
    leaves the machine."""
    if not host:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback  # ::ffff:127.0.0.1
    return ip.is_loopback


def file_kind(mode: int) -> str:
    """What an ``os.stat`` mode says a path is: ``regular file``, ``directory``, ``FIFO``,
    ``character device``, ``block device``, ``socket`` or ``special file``."""
    for test, kind in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return kind
    return "special file"


def ca_bundle_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a CA bundle: not absolute, or (where it exists here) not a
    regular file. A FIFO would block the TLS set-up's read for ever and ``/dev/zero``
    never end it; a path that does not exist here may exist on the workers (the run
    checks it there)."""
    if not path.startswith("/"):
        return f"tls_ca_bundle_path must be an absolute path on the workers, got {path!r}"
    try:
        kind = file_kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None
    if kind != "regular file":
        return (
            f"tls_ca_bundle_path must name a regular file (a PEM bundle), and {path!r} is a {kind}"
        )
    return None


def token_url_problem(url: str, what: str) -> str | None:
    """Why ``url`` cannot be an OAuth2 token endpoint: ``url_problem``'s reasons, or an
    ``http://`` URL to a host other than this machine's loopback. The token request
    carries the client secret (RFC 6749 §2.3.1 and §3.2 require TLS there): in clear on
    the wire, anyone on the path could take the client and mint tokens of their own."""
    why = url_problem(url, what)
    if why:
        return why
    parts = urlsplit(url)
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        return (
            f"{what} must be an https:// URL: the token request carries the client "
            "secret, which http:// would send in clear (RFC 6749 §3.2; http:// is "
            f"accepted on loopback only), got {url.split('@')[-1]!r}"
        )
    return None


def http_cfg_problem(row: dict[str, Any]) -> str | None:
    """Why an ``http_cfg`` row cannot act as written (None: it can)."""
    if row.get("prefer_http2"):
        return (
            "prefer_http2: true is not supported: the workers' HTTP client (aiohttp) "
            "speaks HTTP/1.1 only; leave it out or set it false"
        )
    proxy = row.get("proxy_url")
    if proxy is not None:
        # An http:// proxy (an https source goes through it by CONNECT); TLS to the proxy
        # itself is not offered.
        why = url_problem(proxy, "proxy_url", ("http",))
        if why:
            return why
    bundle = row.get("tls_ca_bundle_path")
    if bundle is not None:
        if row.get("tls_verify_enabled") is False:
            return (
                "tls_ca_bundle_path verifies certificates against that CA, "
                "tls_verify_enabled: false verifies none: set one of them"
            )
        why = ca_bundle_path_problem(bundle)
        if why:
            return why
    for name, value in (row.get("default_headers_json") or {}).items():
        lowered = str(name).lower()
        if lowered in _SECRET_HEADERS:
            return (
                f"default_headers_json: {name} would be a secret in the registry file: "
                "declare a credential (its secret is sealed)"
            )
        if lowered in _OWN_HEADERS:
            return f"default_headers_json: {name} is set by {_OWN_HEADERS[lowered]}"
        if value is not None and not isinstance(value, str | int | float):
            return f"default_headers_json: {name} must be a text value (null removes it)"
    for name in ("timeout_connect_millis", "timeout_read_millis"):
        value = row.get(name)
        if value is not None and value <= 0:
            return f"{name} must be positive (leave it out for the client's default)"
    return None


def credential_problem(
    row: dict[str, Any],
    principal_key: str = "principal_env",
    client_secret_key: str = "client_secret_env",
) -> str | None:
    """Why a credential row's auth fields do not go together (None: they do).
    ``principal_key`` and ``client_secret_key`` are the names the second and third
    secrets have where the row comes from: the file's ``principal_env`` and
    ``client_secret_env``, the table's ``*_env_name``."""
    kind = row.get("auth_type_code")
    principal = row.get(principal_key)
    if kind in PAIRED_AUTH_TYPES and not principal:
        what = {"BASIC": "the user", SESSION: "the login's user"}.get(kind, "the client id")
        return f"{kind} needs {principal_key} ({what}) as well as secret_env"
    if kind not in PAIRED_AUTH_TYPES and principal:
        return f"{principal_key} is for {', '.join(PAIRED_AUTH_TYPES)} credentials, not {kind}"
    method = row.get("token_auth_method_code")
    if method is not None and kind not in OAUTH2_TYPES:
        return f"token_auth_method_code is for {' and '.join(OAUTH2_TYPES)} credentials, not {kind}"
    if method == PUBLIC_CLIENT and kind != OAUTH2_REFRESH:
        return (
            f"token_auth_method_code {PUBLIC_CLIENT} (a public client) is for "
            f"{OAUTH2_REFRESH} credentials: client credentials always authenticate"
        )
    client_secret = row.get(client_secret_key)
    if client_secret and kind != OAUTH2_REFRESH:
        return f"{client_secret_key} is for {OAUTH2_REFRESH} credentials, not {kind}"
    if kind == OAUTH2_REFRESH and method == PUBLIC_CLIENT and client_secret:
        return (
            f"token_auth_method_code {PUBLIC_CLIENT} sends no client secret: leave out "
            f"{client_secret_key}, or name how it is sent"
        )
    if kind == OAUTH2_REFRESH and method != PUBLIC_CLIENT and not client_secret:
        return (
            f"{kind} needs {client_secret_key} (the client secret; secret_env is the refresh "
            f"token), or token_auth_method_code: {PUBLIC_CLIENT} for a public client"
        )
    if row.get("token_jsonpath") is not None and kind != SESSION:
        return f"token_jsonpath is for {SESSION} credentials, not {kind}"
    return None


def basic_user_problem(user: str) -> str | None:
    """RFC 7617 §2: the user of HTTP Basic may not contain a colon."""
    if ":" in user:
        return "a BASIC user may not contain ':' (RFC 7617)"
    return None
