"""A REST source: GET a URL page after page through a paginator, pick the records out of
each JSON body, and classify failures into error codes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from artemis import jsonio
from artemis.completeness import check_loop, page_digest
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import (
    Answer,
    Headers,
    HttpClient,
    TransportError,
    body_excerpt,
    transport_error,
)
from artemis.http import status_error as status_error_default
from artemis.jsonpaths import contract_error, json_path_lookup
from artemis.logsetup import get_logger
from artemis.security import check_same_origin
from artemis.sources.base import Page, PageInfo, Source
from artemis.sources.paginators import Paginator, paginator_from_checkpoint

log = get_logger(__name__)


class RestSource(Source):
    def __init__(
        self,
        url: str,
        paginator: Paginator,
        *,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        records_path: str = "$.items",
        name: str = "rest",
        record_key: str | None = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        timeout: float | None = None,
        before_request: Callable[[], Awaitable[None]] | None = None,
        status_error: Callable[[str, Answer], ArtemisError] | None = None,
        send: Callable[[HttpClient, str, dict[str, Any]], Awaitable[Answer]] | None = None,
        parallel_pages: int = 1,
    ) -> None:
        self.url = url
        self.paginator = paginator
        self.params = params or {}
        self.headers = headers or {}
        self.records_path = records_path
        self.name = name
        # Where a record's key is (e.g. ``$.DOI``), for catching a repeated page; default:
        # the whole record.
        self.record_key = record_key
        self.transform = transform
        self.timeout = timeout
        # Awaited before every request: a rate limiter's acquire, for instance.
        self.before_request = before_request
        # Sends one GET (client, url, params): a contract client adds auth, rate limit and
        # key rotation; the default is a plain GET with this source's headers.
        self.send = send
        # Classifies error answers (default: 408/425/429/5xx retryable, other 4xx final).
        # Requests in flight at once for pages whose position is known in advance
        # (page-number or offset paging once the source stated its total).
        self.parallel_pages = max(1, parallel_pages)
        self.status_error = status_error or (
            lambda what, resp: status_error_default(ErrorCode.SOURCE_ERROR, what, resp)
        )

    def limit_rate(self, acquire: Callable[[], Awaitable[None]]) -> None:
        # A limit of the source's own (``before_request`` given at construction) wins.
        if self.before_request is None:
            self.before_request = acquire

    async def pages(
        self, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        paginator = paginator_from_checkpoint(checkpoint) if checkpoint else self.paginator
        if self.resumed and checkpoint and paginator.resume():
            log.warning("source_session_reopened", source=self.name, reason="resumed attempt")
        # Requests sent ahead, by request: each answer is still read in order below, and
        # one never asked for (a guess a short page made wrong) is dropped. On a retry the
        # checkpoint holds the last page handed over: at most these are requested again.
        ahead: dict[str, asyncio.Task[tuple[Any, Headers]]] = {}
        try:
            async for page in self._pages(client, paginator, ahead):
                yield page
        finally:
            for task in ahead.values():
                task.cancel()
            await asyncio.gather(*ahead.values(), return_exceptions=True)

    async def _pages(
        self,
        client: HttpClient,
        paginator: Paginator,
        ahead: dict[str, asyncio.Task[tuple[Any, Headers]]],
    ) -> AsyncIterator[Page]:
        guessing = self.parallel_pages > 1
        while paginator.has_more:
            params = paginator.update_request(self.params)
            url = paginator.request_url(self.url)
            if url != self.url:
                check_same_origin(url, self.url, f"{self.name}: {type(paginator).__name__}")
            request = describe_request(url, params)
            if guessing and ahead and request not in ahead:
                # The guesses missed (the source answers fewer records a page than asked,
                # say): every further guess would be a wasted request and rate-limit slot.
                guessing = False
                for task in ahead.values():
                    task.cancel()
                ahead.clear()
                log.info("source_pages_one_at_a_time", source=self.name, request=request)
            if guessing:
                self._send_ahead(client, paginator, ahead)
            sent = ahead.pop(request, None)
            try:
                if sent is not None:
                    data, headers = await sent
                else:
                    data, headers = await self._request(client, url, params)
            except ArtemisError as e:
                # An expired server session (a cursor): re-open it from the last committed
                # position instead of failing or starting over.
                if e.details.get("status") in (400, 404, 410) and paginator.reopen():
                    log.warning(
                        "source_session_reopened",
                        source=self.name,
                        error=e.message,
                        checkpoint=paginator.checkpoint(),
                    )
                    continue
                raise
            try:
                records = json_path_lookup(data, self.records_path)
                if not isinstance(records, list):
                    raise contract_error(
                        self.name, self.records_path, "the list of records", records
                    )
                new = paginator.take(records)
                digest = page_digest(new, self.record_key)
                check_loop(paginator.last_page_digest, digest, self.name, request)
                paginator.last_page_digest = digest or paginator.last_page_digest
                paginator.update_state(data, records, headers)
            except ArtemisError as e:
                if e.code in (ErrorCode.SOURCE_CONTRACT, ErrorCode.SOURCE_LOOP):
                    raise e.with_request(request) from None
                raise
            if self.transform:
                new = [self.transform(r) for r in new]
            yield Page(
                records=new,
                checkpoint=paginator.checkpoint() if paginator.has_more else None,
                info=PageInfo(
                    request=request,
                    expected_total=paginator.total,
                    taken=paginator.taken,
                    digest=digest,
                ),
            )

    def _send_ahead(
        self,
        client: HttpClient,
        paginator: Paginator,
        ahead: dict[str, asyncio.Task[tuple[Any, Headers]]],
    ) -> None:
        """Keep the current page and the ones after it in flight (``parallel_pages`` in
        all), once the paginator can tell them; the current page's request is popped by
        the caller."""
        guesses = paginator.ahead(self.parallel_pages - 1)
        if not guesses:
            return
        wanted: dict[str, tuple[str, dict[str, Any]]] = {}
        for guess in [paginator, *guesses]:
            params = guess.update_request(self.params)
            url = guess.request_url(self.url)
            if url != self.url:
                check_same_origin(url, self.url, f"{self.name}: {type(guess).__name__}")
            wanted[describe_request(url, params)] = (url, params)
        for request in [r for r in ahead if r not in wanted]:
            ahead.pop(request).cancel()
        for request, (url, params) in wanted.items():
            if request not in ahead:
                task = asyncio.create_task(self._request(client, url, params))
                # A guess dropped unused may have failed: its error is read here (the page
                # that is needed still raises it when awaited).
                task.add_done_callback(_read_error)
                ahead[request] = task

    async def _request(
        self, client: HttpClient, url: str, params: dict[str, Any]
    ) -> tuple[Any, Headers]:
        if self.before_request is not None:
            await self.before_request()
        return await self._get(client, url, params)

    async def _get(
        self, client: HttpClient, url: str, params: dict[str, Any]
    ) -> tuple[Any, Headers]:
        what = f"{self.name} GET {url}"
        try:
            if self.send is not None:
                resp = await self.send(client, url, params)
            else:
                resp = await client.get(
                    url,
                    # An empty mapping would wipe the query of a next-page URL: send None.
                    params=params or None,
                    headers=self.headers,
                    timeout=self.timeout,
                )
        except TransportError as e:
            raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
        if resp.status_code >= 400:
            raise self.status_error(what, resp)
        try:
            return jsonio.loads(resp.content), resp.headers
        except ValueError:
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"{what}: the answer is not JSON (HTTP {resp.status_code}, "
                f"{resp.headers.get('content-type', 'no content type')}): {body_excerpt(resp)!r}",
            ) from None


def _read_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def describe_request(url: str, params: dict[str, Any]) -> str:
    """``GET url?query`` for error messages (credentials are added later, by the sender,
    so they are never part of it)."""
    query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
    return f"GET {url}{'&' if '?' in url and query else '?' if query else ''}{query}"
