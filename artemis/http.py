"""The workers' one HTTP client, and the types its callers see.

aiohttp does the work underneath; nothing of it leaves this module. Callers get an
:class:`Answer` (with :class:`Headers`) or one of the :class:`TransportError` family
(``artemis/transport_errors.py``, with the error code each becomes), into which every
aiohttp, OS and TLS failure is mapped here, once (``_mapped``); an answer that is an error
becomes one here (``status_error``). URLs: ``artemis/urls.py``.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import os
import re
import socket
import ssl
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode
from urllib.request import getproxies, proxy_bypass_environment  # type: ignore[attr-defined]

import aiohttp
import certifi
import yarl

from artemis import jsonio
from artemis.config import HttpClientSettings, SecuritySettings
from artemis.errors import ArtemisError, ErrorCode
from artemis.netguard import AddressRefused, AllowList, Resolver, Unresolvable, admitted, parse_ip
from artemis.outage import is_transient_status, status_reason
from artemis.redact import redact_text
from artemis.registry.http_rules import file_kind, is_loopback_host
from artemis.transport_errors import (
    AddressNotAllowed,
    AnswerTooLarge,
    CABundleError,
    CertificateRejected,
    ConnectError,
    ConnectTimeout,
    InvalidURL,
    ProtocolError,
    ProxyRefused,
    ReadTimeout,
    TransportError,
)
from artemis.urls import Params, encode_url, query_pairs, with_params


class Headers(Mapping[str, str]):
    """An answer's headers: names case-insensitive (iterated lower-case), the values of a
    repeated header joined with ", " (RFC 9110 §5.3), so ``Link`` or ``Set-Cookie`` sent
    twice reads as one value."""

    __slots__ = ("_values",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        values: dict[str, str] = {}
        for name, value in items.items() if isinstance(items, Mapping) else items:
            key = name.lower()
            values[key] = f"{values[key]}, {value}" if key in values else value
        self._values = values

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Headers({self._values!r})"


class Answer:
    """One HTTP answer, read whole: what the sources, sinks and the callback look at
    (``status_code``, ``headers``, ``content``, ``text``, ``json()``, ``url``)."""

    __slots__ = ("status_code", "headers", "content", "url", "_charset")

    def __init__(
        self,
        status_code: int,
        headers: Headers,
        content: bytes = b"",
        url: str = "",
        charset: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content
        self.url = url
        self._charset = charset

    @property
    def text(self) -> str:
        return self._decode(self.content)

    def head(self, chars: int) -> str:
        """The body's first ``chars`` characters, decoded from a prefix of it only: an
        error text needs a few hundred characters of a body that may be many MiB."""
        return self._decode(self.content[: chars * 4])[:chars]

    def _decode(self, raw: bytes) -> str:
        charset = self._charset or "utf-8"
        try:
            codecs.lookup(charset)
        except LookupError:  # a charset nobody knows (``utf8mb4``): read as UTF-8
            charset = "utf-8"
        return raw.decode(charset, errors="replace")

    def json(self) -> Any:
        try:
            return jsonio.loads(self.content)
        except ValueError:
            # What orjson refuses and the stdlib reads (a BOM, UTF-16, NaN, huge integers).
            return json.loads(self.content)  # bytes: the stdlib detects BOM and UTF-16/32


@dataclass(frozen=True)
class Transport:
    """How one source's requests travel where its configuration differs from the
    client's settings (a registry provenance's ``http_cfg``).

    ``proxy``: an ``http://`` proxy for every request (an https URL goes through it by
    CONNECT), instead of the environment's. ``verify`` false: no certificate check;
    ``ca_bundle``: a PEM file the certificates are checked against instead of the trust
    store. ``connect_timeout``: seconds a connection (TCP and TLS handshake) may take.
    ``compress`` false: ``Accept-Encoding: identity`` (else the encodings the client
    decodes are offered). ``read_timeout``: seconds a read may wait (else the client's
    ``timeout_seconds``); ``max_bytes``: the largest answer read (else the client's
    ``max_body_bytes``)."""

    proxy: str | None = None
    verify: bool = True
    ca_bundle: str | None = None
    connect_timeout: float | None = None
    compress: bool = True
    read_timeout: float | None = None
    max_bytes: int | None = None


class Form(dict[str, Any]):
    """A request body sent as a urlencoded form (a list value: the name once a value),
    with its Content-Type unless the request's headers name one."""


def timed(transport: Transport | None, timeout: float | None) -> Transport | None:
    """``transport`` with the read timeout ``timeout`` (None: as it is)."""
    if timeout is None:
        return transport
    return replace(transport or Transport(), read_timeout=timeout)


class HttpClient:
    """The workers' HTTP client for sources, sinks and callbacks.

    aiohttp underneath: on this project's bench (loopback, 100-record JSON pages) a GET or
    POST cost 0.15-0.20 ms of CPU against httpx's 0.69-0.83 ms, and a harvest's worker is
    CPU-bound on its requests (two per page). The surface is what the callers use
    (``get``/``post``/``request`` with ``params``, ``headers``, a ``body`` (a ``Form``)
    or ``json``, ``timeout``, and a ``Transport`` for the rest). URLs go out
    percent-encoded by the WHATWG URL standard's sets (``encode_url``); TLS trusts
    certifi's bundle (or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``); proxies come from
    ``HTTP(S)_PROXY``/``ALL_PROXY``/``NO_PROXY`` (never for a loopback destination).
    Redirects are never followed (a 3xx could lead a request-supplied URL past
    ``security.allowed_hosts``) and no cookie is kept between requests (a crawler's
    cookie belongs to the one request that names it).

    Timeouts: a request's read timeout (its transport's ``read_timeout``, a provenance's
    ``timeout_read_millis``; ``timeout=`` of ``get`` and ``post``), else
    ``timeout_seconds``, is T; its transport's ``connect_timeout`` (a provenance's
    ``timeout_connect_millis``), else T, is C. A connection must be made within C (and
    had, a pooled one waited for included, within the larger of C and T) and no single
    read may wait longer than T; besides, the answer's headers must arrive within that
    connect bound plus T of the start, the upload included (aiohttp has no write timeout:
    a hung upload is cut there), and its body must be read whole within T of the headers,
    so an answer that trickles in a byte at a time is a :class:`ReadTimeout` too.

    A request's ``transport=`` sets a proxy, TLS verification and compression for that
    request (:class:`Transport`)."""

    def __init__(
        self,
        settings: HttpClientSettings,
        security: SecuritySettings | None = None,
        *,
        guard_hosts: list[str] | None = None,
    ) -> None:
        self._settings = settings
        # ``guard_hosts``: this client is for URLs a request supplied (``guarded()``):
        # each connection goes to an address that allow-list admits, resolved here, and
        # never through a proxy from the environment.
        self._security = security
        self._guard = (
            (AllowList(guard_hosts), Resolver(security.dns_server if security else None))
            if guard_hosts is not None
            else None
        )
        self._guarded: dict[tuple[str, ...], HttpClient] = {}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxies: dict[str, str] = {}
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.timeout_seconds,
            sock_read=settings.timeout_seconds,
        )

    def _open(self) -> aiohttp.ClientSession:
        # A session belongs to the event loop it was made in: made on first use, and again
        # when the client is used from another loop.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            s = self._settings
            self._loop = loop
            # Proxies from the environment, resolved here: aiohttp's own lookup
            # (trust_env) would also read ~/.netrc on every request and send its passwords.
            self._proxies = getproxies() if self._guard is None else {}
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=s.max_connections,
                    ssl=_ssl_context() if s.verify_ssl else False,
                    resolver=_GuardedResolver(*self._guard) if self._guard else None,
                ),
                headers=dict(s.headers),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                raise_for_status=False,
            )
        return self._session

    def guarded(self, allowed_hosts: list[str] | None = None) -> HttpClient:
        """The client for URLs a request supplied (a source base URL in its params, a sink
        endpoint or callback URL other than the operator's): the same settings, with the
        address of every connection checked against ``allowed_hosts`` (default:
        ``security.allowed_hosts``)."""
        if self._guard is not None:
            return self
        if allowed_hosts is None:
            allowed_hosts = (self._security or SecuritySettings()).allowed_hosts
        key = tuple(allowed_hosts)
        if key not in self._guarded:
            self._guarded[key] = HttpClient(
                self._settings, self._security, guard_hosts=list(allowed_hosts)
            )
        return self._guarded[key]

    def _proxy_for(self, url: yarl.URL) -> str | None:
        """The environment's proxy for ``url``; never for a loopback destination, whose
        traffic (a token request to a local authorization server, client secret
        included) would otherwise leave the machine, in clear for an ``http://`` URL."""
        if not self._proxies or is_loopback_host(url.raw_host):
            return None
        proxy = self._proxies.get(url.scheme) or self._proxies.get("all")
        if not proxy or proxy_bypass_environment(url.raw_host, self._proxies):
            return None
        return proxy

    async def get(
        self,
        url: str,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        transport: Transport | None = None,
    ) -> Answer:
        """``request("GET", …)``; ``timeout``: the read timeout (``timed``)."""
        return await self.request(
            "GET", url, params=params, headers=headers, transport=timed(transport, timeout)
        )

    async def post(
        self,
        url: str,
        *,
        body: bytes | str | Form | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        transport: Transport | None = None,
    ) -> Answer:
        """``request("POST", …)``, with ``json`` as its body when given; ``timeout``: the
        read timeout (``timed``)."""
        if json is not None:
            body = jsonio.dumps(json)
            headers = {"Content-Type": "application/json", **(headers or {})}
        return await self.request(
            "POST", url, body=body, headers=headers, transport=timed(transport, timeout)
        )

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Params = None,
        body: bytes | str | Form | None = None,
        headers: Mapping[str, str] | None = None,
        transport: Transport | None = None,
    ) -> Answer:
        """One request, its answer read whole; raises only :class:`TransportError`s.
        ``body``: bytes or text as they are, a ``Form`` urlencoded."""
        timeout = transport.read_timeout if transport is not None else None
        max_bytes = transport.max_bytes if transport is not None else None
        try:
            full = with_params(url, params)
            target = encode_url(full)
        except ValueError as e:
            raise _mapped(e, url) from e
        if self._guard is not None:
            self._check_named(target)
        send_headers = dict(headers or {})
        sent = _form_body(body, send_headers)
        session = self._open()
        wait = self._settings.timeout_seconds if timeout is None else timeout
        proxy = self._proxy_for(target)
        tls: ssl.SSLContext | bool = True  # True: the connector's own (the settings')
        if transport is not None:
            proxy = transport.proxy or proxy
            tls = _tls_for(transport)
            _accept_encoding(transport, send_headers)
        connect = _connect_bound(transport, wait)
        limit = self._settings.max_body_bytes if max_bytes is None else max_bytes
        # aiohttp's connect and sock_read bound a connection and every single read; these
        # deadlines bound the whole answer, so one that trickles in is a timeout too: its
        # headers within connect + read timeout of the request, its body within the read
        # timeout of the headers.
        deadline = asyncio.timeout(connect + wait)
        headers_in = False
        try:
            async with deadline:
                async with session.request(
                    method,
                    target,
                    data=sent,
                    headers=send_headers,
                    allow_redirects=False,
                    proxy=proxy,
                    ssl=tls,
                    timeout=self._timeout_for(timeout, transport, connect, wait),
                ) as resp:
                    headers_in = True
                    deadline.reschedule(asyncio.get_running_loop().time() + wait)
                    return _answer(resp, await _read_bounded(resp, limit), full)
        except TimeoutError as e:
            raise _timed_out(e, deadline, headers_in, wait, full) from e
        except (aiohttp.ClientError, ValueError, OSError) as e:
            raise _mapped(e, full) from e

    def _timeout_for(
        self, timeout: float | None, transport: Transport | None, connect: float, wait: float
    ) -> aiohttp.ClientTimeout:
        """aiohttp's timeouts for one request: the session's own unless the request sets
        a read or a connect timeout."""
        sock_connect = transport.connect_timeout if transport is not None else None
        if timeout is None and sock_connect is None:
            return self._timeout
        return aiohttp.ClientTimeout(
            total=None, connect=connect, sock_connect=sock_connect, sock_read=wait
        )

    def _check_named(self, target: yarl.URL) -> None:
        """A guarded request's host is in the allow-list, and an IP literal is an address
        it admits (a name's addresses are checked by the resolver, on each connection)."""
        assert self._guard is not None
        allow = self._guard[0]
        host, port = target.raw_host or "", target.port
        if allow.match(host, port) is None:
            raise AddressNotAllowed(
                f"host {host!r} (port {port}) is not in security.allowed_hosts",
                reason="address not allowed",
            )
        ip = parse_ip(host)
        if ip is not None and not allow.admits(ip, port):
            raise AddressNotAllowed(
                f"{ip} is an internal address that no IP or CIDR entry of "
                "security.allowed_hosts contains",
                reason="address not allowed",
            )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        for guarded in self._guarded.values():
            await guarded.aclose()

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def make_client(
    settings: HttpClientSettings, security: SecuritySettings | None = None
) -> HttpClient:
    """The workers' client; with ``security``, its ``guarded()`` sibling can be had."""
    return HttpClient(settings, security)


class _GuardedResolver(aiohttp.abc.AbstractResolver):
    """aiohttp's resolver step for a guarded client: only admitted addresses are returned,
    so the connection is made to an address that was checked (no second lookup)."""

    def __init__(self, allow: AllowList, resolver: Resolver) -> None:
        self._allow = allow
        self._resolver = resolver

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        try:
            ips = await admitted(host, port, self._allow, self._resolver)
        except Unresolvable as e:
            raise socket.gaierror(socket.EAI_NONAME, str(e)) from None
        out: list[aiohttp.abc.ResolveResult] = []
        for ip in ips:
            fam = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            if family in (socket.AF_INET, socket.AF_INET6) and fam != family:
                continue
            out.append(
                {
                    "hostname": host,
                    "host": str(ip),
                    "port": port,
                    "family": fam,
                    "proto": 0,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        if not out:
            raise socket.gaierror(socket.EAI_NONAME, f"{host!r}: no admitted address")
        return out

    async def close(self) -> None:
        return None


def _ssl_context() -> ssl.SSLContext:
    """What TLS trusts: the operator's bundle (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), else
    certifi's (a slim image may have no system store at all)."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    return ssl.create_default_context(cafile=certifi.where())


@functools.lru_cache(maxsize=32)
def _ca_bundle_file_context(path: str, mtime_ns: int) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=path)


def _ca_bundle_context(path: str) -> ssl.SSLContext:
    """A context trusting the CAs of the PEM file at ``path`` only (read again when the
    file changes). A file that cannot be read, is not a regular file or holds no
    certificate is a :class:`CABundleError`."""
    try:
        info = os.stat(path)
        kind = file_kind(info.st_mode)
        if kind != "regular file":
            # A FIFO would block the read for ever, /dev/zero never end it.
            raise CABundleError(
                f"CA bundle {path}: a {kind}, not a regular file (a PEM bundle)",
                reason="CA bundle not a regular file",
            )
        return _ca_bundle_file_context(path, info.st_mtime_ns)
    except (OSError, ssl.SSLError) as e:
        raise CABundleError(f"CA bundle {path}: {type(e).__name__}: {e}") from None


def ca_bundle_problem(path: str) -> str | None:
    """Why the CA bundle at ``path`` cannot verify anything (None: it can)."""
    try:
        _ca_bundle_context(path)
    except ConnectError as e:
        return str(e)
    return None


def _header_value(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # RFC 9110's historical charset for field values
        return raw.decode("latin-1")


def _form_body(body: bytes | str | Form | None, headers: dict[str, str]) -> bytes | str | None:
    """A request's body: a ``Form`` urlencoded (with its Content-Type unless the caller
    named one in ``headers``; an empty one: no body), else the body as it is."""
    if not isinstance(body, Form):
        return body
    if not body:
        return None
    body = urlencode(query_pairs(body))
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    return body


def _tls_for(transport: Transport) -> ssl.SSLContext | bool:
    """A transport's TLS: no verification, its CA bundle, or (True) the connector's own."""
    if not transport.verify:
        return False
    if transport.ca_bundle:
        return _ca_bundle_context(transport.ca_bundle)
    return True


def _accept_encoding(transport: Transport, headers: dict[str, str]) -> None:
    """A transport without compression asks for ``identity`` unless the caller asked."""
    if not transport.compress and not any(k.lower() == "accept-encoding" for k in headers):
        headers["Accept-Encoding"] = "identity"


def _connect_bound(transport: Transport | None, wait: float) -> float:
    """The bound of a connection (a pooled one waited for included): the larger of the
    transport's connect timeout and the read timeout ``wait``; ``wait`` without one."""
    if transport is None or transport.connect_timeout is None:
        return wait
    return max(wait, transport.connect_timeout)


def _answer(resp: aiohttp.ClientResponse, payload: bytes, url: str) -> Answer:
    return Answer(
        resp.status,
        Headers((k.decode("latin-1"), _header_value(v)) for k, v in resp.raw_headers),
        payload,
        url,
        resp.charset,
    )


def _timed_out(
    e: TimeoutError, deadline: asyncio.Timeout, headers_in: bool, wait: float, url: str
) -> TransportError:
    """A timeout as ours: the whole answer's deadline passed (no headers, or a body not
    read whole, in time) or one of aiohttp's own bounds."""
    if deadline.expired():
        what = "body not read whole" if headers_in else "no answer headers"
        return ReadTimeout(f"{what} within {wait:g} s (read timeout)")
    return _mapped(e, url)


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, decompressed, read as a stream and refused once it passes ``limit``:
    a small gzip that inflates to gigabytes never reaches the worker's memory whole."""
    declared = resp.content_length
    encoded = (resp.headers.get("Content-Encoding") or "identity").lower() != "identity"
    if declared is not None and declared > limit and not encoded:
        raise AnswerTooLarge(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)


# --- URLs -----------------------------------------------------------------------------

# The WHATWG URL standard's percent-encode sets (what browsers and httpx send): a byte
# outside them is encoded, an escape already there ("%2F") is kept as it is — a signed or
# next-page URL goes out byte for byte.
_QUERY = re.compile(r"\?[^\s'\"]*")


def _mapped(e: BaseException, url: str) -> TransportError:
    """An aiohttp, OS, TLS or URL failure as ours: the one place that knows aiohttp's
    exceptions. The text never carries a query: aiohttp puts the whole URL into some of
    its messages."""
    if isinstance(e, aiohttp.ClientResponseError):
        text = f"{type(e).__name__}: {e.status}, {e.message}"
    else:
        text = str(e) or type(e).__name__
    text = _QUERY.sub("?…", text)
    if isinstance(getattr(e, "os_error", None), AddressRefused):
        return AddressNotAllowed(str(e.os_error), reason="address not allowed")  # type: ignore[attr-defined]
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return ConnectTimeout(text)
    if isinstance(e, TimeoutError):  # aiohttp's ServerTimeoutError (a read) is one
        return ReadTimeout(text)
    if isinstance(getattr(e, "os_error", None), socket.gaierror):
        return ConnectError(text, reason="name not resolved")
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return _rejected(e.certificate_error, text)
    if isinstance(e, aiohttp.ClientSSLError):
        return ConnectError(text, reason="TLS handshake failed")
    if isinstance(e, aiohttp.ClientHttpProxyError) and not is_transient_status(e.status):
        return ProxyRefused(text, status=e.status)
    if isinstance(e, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        return ConnectError(text, reason="proxy unreachable")
    if isinstance(e, aiohttp.ClientConnectorError):
        refused = isinstance(e.os_error, ConnectionRefusedError)
        return ConnectError(text, reason="connection refused" if refused else None)
    if isinstance(e, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return ProtocolError(text)
    if isinstance(e, aiohttp.ClientResponseError):
        return ProtocolError(text, reason="malformed answer")
    if isinstance(e, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError | ValueError):
        return InvalidURL(f"invalid request to {url.split('?', 1)[0]!r}: {text}")
    reset = isinstance(e, ConnectionResetError) or "reset" in text.lower()
    return TransportError(text, reason="connection reset" if reset else None)


# OpenSSL's verify results (X509_V_ERR_*) by the check that failed: no issuer the trust
# store holds (2, 18, 19, 20, 21, 27), the certificate expired (10), or it is for another
# host name (62) or IP address (64).
_CERT_CHECKS = {
    **dict.fromkeys((2, 18, 19, 20, 21, 27), ("untrusted", "TLS certificate not trusted")),
    10: ("expired", "TLS certificate expired"),
    62: ("hostname", "TLS hostname mismatch"),
    64: ("hostname", "TLS hostname mismatch"),
}


def _rejected(cert_error: BaseException, text: str) -> CertificateRejected:
    """A failed certificate verification as the check that failed (its OpenSSL verify
    code); Python's own host name check (an ``ssl.CertificateError`` without a code)
    is a host name mismatch too."""
    code = getattr(cert_error, "verify_code", None)
    if code is None and not isinstance(cert_error, ssl.SSLError):
        return CertificateRejected(text, check="hostname", reason="TLS hostname mismatch")
    check, reason = _CERT_CHECKS.get(code or 0, ("other", "TLS certificate rejected"))
    return CertificateRejected(text, check=check, reason=reason)


# What an operator can do about each failed check.
# An answer's body in an error text or a log line: a short, redacted excerpt.
EXCERPT_CHARS = 160
# Redaction reads this far past the excerpt, so that a secret which starts inside the
# excerpt and runs past its end is found whole (replaced, not half shown).
REDACT_MARGIN = 1024


def excerpt(body: str | bytes, limit: int = EXCERPT_CHARS) -> str:
    """At most ``limit`` characters of an answer's ``body``, redacted: cut to a bounded
    window first (a body may be many MiB, and redaction scans all it is given), redacted,
    then cut to ``limit``."""
    window = limit + REDACT_MARGIN
    if isinstance(body, bytes):
        body = body[: window * 4].decode("utf-8", errors="replace")
    return redact_text(body[:window])[:limit]


def body_excerpt(response: Answer, limit: int = EXCERPT_CHARS) -> str:
    """``excerpt`` of an answer's body, decoded in the answer's own charset."""
    return excerpt(response.head(limit + REDACT_MARGIN), limit)


def status_error(code: ErrorCode, what: str, response: Answer) -> ArtemisError:
    """An error answer: 408/425/429 and 5xx may pass on retry; any other 4xx cannot.
    The text carries the status and a short, redacted excerpt of the body."""
    status = response.status_code
    return ArtemisError(
        code,
        f"{what} answered {status}: {body_excerpt(response)}",
        retryable=is_transient_status(status),
        details={"status": status, "reason": status_reason(status)},
        retry_after_s=retry_after_seconds(response),
    )


def retry_after_seconds(response: Answer) -> float | None:
    """``Retry-After`` in seconds (a number of seconds or an HTTP date); None: absent."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": a date in UTC with no zone said
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
