"""The one HTTP client factory, and the mapping of transport failures onto error codes."""

from __future__ import annotations

import asyncio
import codecs
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit
from urllib.request import getproxies, proxy_bypass_environment  # type: ignore[attr-defined]

import aiohttp
import httpx
import yarl

from artemis import jsonio
from artemis.config import HttpClientSettings
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import redact_text
from artemis.outage import status_reason

Params = Mapping[str, Any] | None


class Answer:
    """One HTTP answer, read whole: what the sources, sinks and the callback look at
    (``status_code``, ``headers`` with httpx's semantics, ``content``, ``text``, ``json()``)."""

    __slots__ = ("status_code", "headers", "content", "url", "_charset")

    def __init__(
        self,
        status_code: int,
        headers: httpx.Headers,
        content: bytes,
        url: str,
        charset: str | None,
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content
        self.url = url
        self._charset = charset

    @property
    def text(self) -> str:
        charset = self._charset or "utf-8"
        try:
            codecs.lookup(charset)
        except LookupError:  # a charset nobody knows (``utf8mb4``): UTF-8, as httpx reads it
            charset = "utf-8"
        return self.content.decode(charset, errors="replace")

    def json(self) -> Any:
        try:
            return jsonio.loads(self.content)
        except ValueError:
            # What orjson refuses and the stdlib reads (a BOM, UTF-16, NaN, huge integers).
            return json.loads(self.content)  # bytes: the stdlib detects BOM and UTF-16/32


class HttpClient:
    """The workers' HTTP client for sources, sinks and callbacks.

    aiohttp underneath: on this project's bench (loopback, 100-record JSON pages) a GET or
    POST cost 0.15-0.20 ms of CPU against httpx's 0.69-0.83 ms, and a harvest's worker is
    CPU-bound on its requests (two per page). The surface is the part of httpx's the
    callers use (``get``/``post`` with ``params``, ``headers``, ``content``/``data``/``json``,
    ``timeout``); URLs go out as httpx encodes them, the answer keeps httpx's header
    semantics, TLS trusts what httpx trusts, and transport failures are raised as httpx's
    exceptions with messages that never carry a query (an API key may be a parameter).
    Redirects are never followed (a 3xx could lead a request-supplied URL past
    ``security.allowed_hosts``) and no cookie is kept between requests (a crawler's cookie
    belongs to the one request that names it).

    Timeouts: a request's ``timeout=`` (a provenance's ``timeout_read_millis``), else
    ``timeout_seconds``, is T. A connection must be had within T and no single read may
    wait longer than T; besides, the answer's headers must arrive within 2T (connect plus
    read) of the start, the upload included (aiohttp has no write timeout: a hung upload
    is cut there), and its body must be read whole within T of the headers, so an answer
    that trickles in a byte at a time is a ``httpx.ReadTimeout`` too."""

    def __init__(self, settings: HttpClientSettings) -> None:
        self._settings = settings
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
            # Proxies from the environment as httpx reads them (HTTP(S)_PROXY, ALL_PROXY,
            # NO_PROXY), resolved here: aiohttp's own lookup would also read ~/.netrc on
            # every request and send its passwords.
            self._proxies = getproxies()
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=s.max_connections,
                    ssl=httpx.create_ssl_context(verify=True) if s.verify_ssl else False,
                ),
                headers=dict(s.headers),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                raise_for_status=False,
            )
        return self._session

    def _proxy_for(self, url: httpx.URL) -> str | None:
        if not self._proxies:
            return None
        proxy = self._proxies.get(url.scheme) or self._proxies.get("all")
        if not proxy or proxy_bypass_environment(url.host, self._proxies):
            return None
        return proxy

    async def get(
        self,
        url: str,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> Answer:
        return await self.request(
            "GET", url, params=params, headers=headers, timeout=timeout, max_bytes=max_bytes
        )

    async def post(
        self,
        url: str,
        *,
        content: bytes | str | None = None,
        data: Params = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> Answer:
        if json is not None:
            content = jsonio.dumps(json)
            headers = {"Content-Type": "application/json", **(headers or {})}
        return await self.request(
            "POST",
            url,
            content=content,
            data=data,
            headers=headers,
            timeout=timeout,
            max_bytes=max_bytes,
        )

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Params = None,
        content: bytes | str | None = None,
        data: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> Answer:
        try:
            full = with_params(url, params)
            # Encoded as httpx encodes it, then sent as is (yarl would re-quote a query).
            target = httpx.URL(full)
        except (ValueError, httpx.InvalidURL) as e:
            raise _as_httpx_error(e, method, url) from e
        body: bytes | str | None = content
        send_headers = dict(headers or {})
        if data:
            body = urlencode(_pairs(data))
            if not any(k.lower() == "content-type" for k in send_headers):
                send_headers["Content-Type"] = "application/x-www-form-urlencoded"
        session = self._open()
        wait = self._settings.timeout_seconds if timeout is None else timeout
        loop = asyncio.get_running_loop()
        # aiohttp's connect and sock_read bound a connection and every single read; these
        # deadlines bound the whole answer, so one that trickles in is a timeout too: its
        # headers within connect + read timeout of the request, its body within the read
        # timeout of the headers.
        deadline = asyncio.timeout(wait + wait)  # connect + read (the same value)
        headers_in = False
        try:
            async with deadline:
                async with session.request(
                    method,
                    yarl.URL(str(target), encoded=True),
                    data=body,
                    headers=send_headers,
                    allow_redirects=False,
                    proxy=self._proxy_for(target),
                    timeout=aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout)
                    if timeout is not None
                    else self._timeout,
                ) as resp:
                    headers_in = True
                    deadline.reschedule(loop.time() + wait)
                    payload = await _read_bounded(
                        resp, self._settings.max_body_bytes if max_bytes is None else max_bytes
                    )
                    return Answer(
                        resp.status,
                        httpx.Headers(list(resp.raw_headers)),
                        payload,
                        full,
                        resp.charset,
                    )
        except TimeoutError as e:
            if deadline.expired():
                what = "body not read whole" if headers_in else "no answer headers"
                raise httpx.ReadTimeout(
                    f"{what} within {wait:g} s (read timeout)",
                    request=_request_of(method, full),
                ) from e
            raise _as_httpx_error(e, method, full) from e
        except (aiohttp.ClientError, ValueError, OSError) as e:
            raise _as_httpx_error(e, method, full) from e

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AnswerTooLarge(httpx.DecodingError):
    """An answer larger than the reader's bound (after decompression): no retry helps."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer larger than {limit} bytes (http_client.max_body_bytes)")
        self.limit = limit


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


def _pairs(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """httpx's query encoding of a mapping: a list value repeats its key, True/False are
    ``true``/``false``, None is empty."""
    out: list[tuple[str, str]] = []
    for k, v in params.items():
        for item in v if isinstance(v, list | tuple) else (v,):
            if item is True:
                out.append((k, "true"))
            elif item is False:
                out.append((k, "false"))
            else:
                out.append((k, "" if item is None else str(item)))
    return out


def with_params(url: str, params: Params) -> str:
    """``url`` with ``params`` merged into its query: a key given in ``params`` replaces
    the URL's own values of that key, the URL's other parameters stay (httpx 0.28's client
    dropped them all — a next-page URL lost its page to a credential parameter); no params
    keeps the URL as is."""
    if not params:
        return url
    pairs = _pairs(params)
    parts = urlsplit(url)
    if parts.query:
        given = {k for k, _ in pairs}
        kept = parse_qsl(parts.query, keep_blank_values=True)
        if any(k in given for k, _ in kept):
            query = urlencode([(k, v) for k, v in kept if k not in given] + pairs)
        else:
            query = parts.query + "&" + urlencode(pairs)
    else:
        query = urlencode(pairs)
    return parts._replace(query=query).geturl()


_QUERY = re.compile(r"\?[^\s'\"]*")


def _request_of(method: str, url: str) -> httpx.Request | None:
    try:
        return httpx.Request(method, url)
    except httpx.InvalidURL:
        return None


def _as_httpx_error(e: BaseException, method: str, url: str) -> httpx.HTTPError:
    """aiohttp's transport failures as httpx's, under the same names callers report. The
    text never carries a query: aiohttp puts the whole URL into some of its messages."""
    request = _request_of(method, url)
    if isinstance(e, aiohttp.ClientResponseError):
        text = f"{type(e).__name__}: {e.status}, {e.message}"
    else:
        text = str(e) or type(e).__name__
    text = _QUERY.sub("?…", text)
    cls: type[httpx.TransportError]
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        cls = httpx.ConnectTimeout
    elif isinstance(e, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        cls = httpx.ReadTimeout
    elif isinstance(e, aiohttp.ClientConnectorError):
        cls = httpx.ConnectError
    elif isinstance(
        e,
        aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError,
    ):
        cls = httpx.RemoteProtocolError
    elif isinstance(e, aiohttp.InvalidURL | ValueError | httpx.InvalidURL):
        cls = httpx.UnsupportedProtocol
        text = f"invalid request to {url.split('?', 1)[0]!r}: {text}"
    else:
        cls = httpx.NetworkError
    return cls(text, request=request)


def make_client(settings: HttpClientSettings) -> HttpClient:
    return HttpClient(settings)


# What error classification reads: an answer of ours, or httpx's own (a source's custom
# sender may still use httpx).
Response = Answer | httpx.Response


def transport_error(code: ErrorCode, what: str, exc: httpx.HTTPError) -> ArtemisError:
    """Turn a transport failure into a retryable error naming what was being done; an
    answer past its size bound is final (a source's: SOURCE_CONTRACT)."""
    if isinstance(exc, AnswerTooLarge):
        return ArtemisError(
            ErrorCode.SOURCE_CONTRACT if code is ErrorCode.SOURCE_ERROR else code,
            f"{what}: {exc}",
            retryable=False,
            details={"reason": "answer too large", "limit": exc.limit},
        )
    if isinstance(exc, httpx.TimeoutException):
        reason = "connect timed out" if isinstance(exc, httpx.ConnectTimeout) else "read timed out"
        return ArtemisError(
            ErrorCode.TIMEOUT_ERROR if code is ErrorCode.TIMEOUT_ERROR else code,
            f"{what}: timed out ({type(exc).__name__})",
            retryable=True,
            details={"reason": reason},
        )
    return ArtemisError(
        code,
        f"{what}: {type(exc).__name__}: {exc}",
        retryable=True,
        details={"reason": _transport_reason(exc)},
    )


def _transport_reason(exc: httpx.HTTPError) -> str:
    """A few words for an operator: what the transport failure was."""
    text = str(exc).lower()
    if isinstance(exc, httpx.ConnectError):
        if "refused" in text:
            return "connection refused"
        if "name" in text or "resolve" in text or "dns" in text:
            return "name not resolved"
        return "cannot connect"
    if "reset" in text:
        return "connection reset"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "connection closed mid-answer"
    return type(exc).__name__


RETRYABLE_STATUSES = (408, 425, 429)


def status_error(code: ErrorCode, what: str, response: Response) -> ArtemisError:
    """An error answer: 408/425/429 and 5xx may pass on retry; any other 4xx cannot."""
    status = response.status_code
    return ArtemisError(
        code,
        # redacted before it is cut: a secret across the cut would leave its start
        f"{what} answered {status}: {redact_text(response.text)[:300]}",
        retryable=status in RETRYABLE_STATUSES or status >= 500,
        details={"status": status, "reason": status_reason(status)},
        retry_after_s=retry_after_seconds(response),
    )


def retry_after_seconds(response: Response) -> float | None:
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
