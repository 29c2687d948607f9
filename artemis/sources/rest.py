"""A REST source: request a URL page after page through a paginator, pick the records out
of each JSON (or XML) answer, and classify failures into error codes.

A search is a GET with its parameters in the query string, or a POST with a body
(``method``, ``body``, ``content_type``); the paginator's parameters go in the query
string or in that body (``paging_in``), where a dot in a parameter name nests it
(``page.size`` → ``{"page": {"size": 50}}``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, Headers, HttpClient, body_excerpt, timed
from artemis.http import status_error as status_error_default
from artemis.logsetup import get_logger
from artemis.paging import (
    Paginator,
    check_loop,
    contract_error,
    json_path_lookup,
    page_digest,
    paginator_from_checkpoint,
)
from artemis.security import check_same_origin
from artemis.sources.base import Page, PageInfo, Source
from artemis.sources.responses import Asked, ResponseRule, act_on, once
from artemis.sources.xmldoc import XmlDocument, parse_xml
from artemis.transport_errors import TransportError, transport_error

log = get_logger(__name__)

JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"
# How long a session's release (a scroll's DELETE) is waited for when the fetch stops on
# an error: it is a courtesy to the server, never a reason to hold the stop up.
RELEASE_TIMEOUT_S = 10.0
# The data of an answer a response rule ignored: the resource's paging ends with it.
IGNORED: Any = object()


@dataclass
class Request:
    """One request of a source: method, URL, query parameters and body (a mapping, sent
    as ``content_type``; None: no body)."""

    method: str
    url: str
    params: dict[str, Any]
    body: dict[str, Any] | None = None
    content_type: str = JSON_TYPE

    def describe(self) -> str:
        """``GET url?query`` (``POST url?query {body}``) for error messages and for telling
        requests apart (credentials are added later, by the sender, so they are never
        part of it)."""
        line = describe_request(self.url, self.params).replace("GET ", f"{self.method} ", 1)
        if self.body is not None:
            line += " " + json.dumps(self.body, sort_keys=True, default=str)
        return line


def encode_body(body: dict[str, Any], content_type: str) -> bytes:
    """A request body as ``content_type`` says: JSON, or a form of scalar values (a list
    repeats its key)."""
    if content_type == FORM_TYPE:
        pairs: list[tuple[str, Any]] = []
        for key, value in body.items():
            for one in value if isinstance(value, list) else [value]:
                if isinstance(one, dict | list):
                    raise ArtemisError(
                        ErrorCode.CONFIG_ERROR,
                        f"a form body holds scalar values: {key!r} is {type(one).__name__}",
                    )
                pairs.append((key, "true" if one is True else "false" if one is False else one))
        return urlencode(pairs).encode()
    return jsonio.dumps(body)


def place(body: dict[str, Any] | None, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` merged into a copy of ``body``: a dot in a name nests it, a value
    overrides the one there, a None removes it."""
    out = json.loads(json.dumps(body or {}, default=str))
    for name, value in values.items():
        *parents, leaf = name.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                if value is None:
                    break
                node[part] = {}
            node = node[part]
        else:
            if value is None:
                node.pop(leaf, None)
            else:
                node[leaf] = value
    return out


@dataclass
class Search:
    """What a source asks and how its answers read (defaults: a JSON GET whose records
    are at ``$.items``). ``record_key``: where a record's key is (e.g. ``$.DOI``), for
    catching a repeated page (default: the whole record); ``response_format`` JSON, or
    XML read by XML paths (``artemis.sources.xmldoc``), an XML record's text typed by
    ``record_types``; ``paging_in``: where the paging parameters go; ``parallel_pages``:
    requests in flight at once for pages whose position is known in advance (page-number
    or offset paging once the source stated its total)."""

    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    method: str = "GET"
    body: dict[str, Any] | None = None
    content_type: str = JSON_TYPE
    paging_in: str = "QUERY"
    records_path: str = "$.items"
    response_format: str = "JSON"
    record_types: dict[str, str] | None = None
    record_key: str | None = None
    timeout: float | None = None
    parallel_pages: int = 1


@dataclass
class SourceHooks:
    """What a source's owner plugs in: ``transform`` each record; ``before_request``,
    awaited before every request (a rate limiter's acquire); ``send``, which sends one
    request (a contract client adds auth, rate limit and key rotation; default: a plain
    request with the source's headers); ``status_error``, which classifies error answers
    (default: 408/425/429/5xx retryable, other 4xx final); ``actions``, the answers that
    are not errors, or errors inside a 200 (``responses.py``), applied to every answer
    before its status is looked at."""

    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    before_request: Callable[[], Awaitable[None]] | None = None
    send: Callable[[HttpClient, Request], Awaitable[Answer]] | None = None
    status_error: Callable[[str, Answer], ArtemisError] | None = None
    actions: list[ResponseRule] | None = None


class RestSource(Source):
    def __init__(
        self,
        url: str,
        paginator: Paginator,
        search: Search | None = None,
        hooks: SourceHooks | None = None,
        *,
        name: str = "rest",
    ) -> None:
        search, hooks = search or Search(), hooks or SourceHooks()
        self._configure(search, hooks)
        self.url = url
        self.paginator = paginator
        self.name = name

    def _configure(self, search: Search, hooks: SourceHooks) -> None:
        self.params = search.params or {}
        self.headers = search.headers or {}
        self.records_path = search.records_path
        self.record_key = search.record_key
        self.timeout = search.timeout
        self.method, self.body = search.method, search.body
        self.content_type, self.paging_in = search.content_type, search.paging_in
        self.response_format = search.response_format
        self.record_types = search.record_types
        self.parallel_pages = max(1, search.parallel_pages)
        self.transform = hooks.transform
        self.before_request = hooks.before_request
        self.send = hooks.send
        self.status_error = hooks.status_error or (
            lambda what, resp: status_error_default(ErrorCode.SOURCE_ERROR, what, resp)
        )
        self.actions = hooks.actions or []

    def limit_rate(self, acquire: Callable[[], Awaitable[None]]) -> None:
        # A limit of the source's own (``before_request`` given at construction) wins.
        if self.before_request is None:
            self.before_request = acquire

    async def pages(
        self, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        paginator = paginator_from_checkpoint(checkpoint) if checkpoint else self.paginator
        if self.resumed and checkpoint:
            stale = paginator.release_request()
            if paginator.resume():
                log.warning("source_session_reopened", source=self.name, reason="resumed attempt")
                if stale is not None:
                    await self._release(client, stale)
        # Requests sent ahead, by request: each answer is still read in order below, and
        # one never asked for (a guess a short page made wrong) is dropped. On a retry the
        # checkpoint holds the last page handed over: at most these are requested again.
        ahead: dict[str, asyncio.Task[tuple[Any, Headers]]] = {}
        try:
            async for page in self._pages(client, paginator, ahead):
                yield page
        except (Exception, asyncio.CancelledError):
            # A fetch that fails or is cancelled resumes (if at all) as a retried attempt,
            # which opens a new session: the one held now is released. A fetch closed
            # between pages keeps it: the next batch continues it from the checkpoint.
            held = paginator.release_request()
            if held is not None:
                try:
                    async with asyncio.timeout(RELEASE_TIMEOUT_S):
                        await self._release(client, held)
                except TimeoutError:
                    log.warning("source_session_not_released", source=self.name)
            raise
        finally:
            for task in ahead.values():
                task.cancel()
            await asyncio.gather(*ahead.values(), return_exceptions=True)

    def build_request(self, paginator: Paginator) -> Request:
        """The request for the paginator's current page."""
        url = paginator.request_url(self.url)
        own = paginator.own_request()
        method = self.method
        if self.paging_in != "BODY":
            params = paginator.update_request({} if own else self.params)
            body = None if own or method == "GET" else (self.body or {})
            return Request(method, url, params, body, self.content_type)
        paging = paginator.update_request({})
        pinned = paginator.query_keys()
        params = {} if own else dict(self.params)
        params.update({k: v for k, v in paging.items() if k in pinned})
        rest = {k: v for k, v in paging.items() if k not in pinned}
        body = place(None if own else self.body, rest)
        return Request(method, url, params, body, self.content_type)

    async def _release(self, client: HttpClient, held: tuple[str, dict[str, Any]]) -> None:
        """Release a server session (a scroll): DELETE with its id where the paging
        parameters go. Best effort: a failure is logged, never raised (the server lets
        the session expire)."""
        url, values = held
        if self.paging_in == "BODY":
            request = Request("DELETE", url, {}, place(None, values), self.content_type)
        else:
            request = Request("DELETE", url, dict(values))
        try:
            check_same_origin(url, self.url, f"{self.name}: release")
            resp = await self._send(client, request)
            # 404: the session had expired already.
            if resp.status_code >= 400 and resp.status_code != 404:
                log.warning(
                    "source_session_not_released", source=self.name, status=resp.status_code
                )
        except (ArtemisError, TransportError) as e:
            log.warning("source_session_not_released", source=self.name, error=str(e))

    async def _pages(
        self,
        client: HttpClient,
        paginator: Paginator,
        ahead: dict[str, asyncio.Task[tuple[Any, Headers]]],
    ) -> AsyncIterator[Page]:
        guessing = self.parallel_pages > 1
        while paginator.has_more:
            req = self.build_request(paginator)
            if req.url != self.url:
                check_same_origin(req.url, self.url, f"{self.name}: {type(paginator).__name__}")
            request = req.describe()
            if guessing and ahead and request not in ahead:
                # The guesses missed (the source answers fewer records a page than asked,
                # say): every further guess would be a wasted request and rate-limit slot.
                guessing = False
                self._drop_guesses(ahead, request)
            if guessing:
                self._send_ahead(client, paginator, ahead)
            sent = ahead.pop(request, None)
            try:
                if sent is not None:
                    data, headers = await sent
                else:
                    data, headers = await self._request(client, req)
            except ArtemisError as e:
                if self._reopened(e, paginator):
                    continue
                raise
            if data is IGNORED:
                await self._end_session(client, paginator)
                yield self._page([], paginator, request, None, ignored=1)
                return
            try:
                records = self.records_of(data)
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
            if not paginator.has_more:
                await self._end_session(client, paginator)
            yield self._page(new, paginator, request, digest)

    async def _end_session(self, client: HttpClient, paginator: Paginator) -> None:
        """The session (a scroll) ends with the last page: released before the page is
        handed over (a retry from the checkpoint before it opens a new one anyway)."""
        held = paginator.release_request()
        if held is not None:
            await self._release(client, held)
            paginator.released()

    def _drop_guesses(
        self, ahead: dict[str, asyncio.Task[tuple[Any, Headers]]], request: str
    ) -> None:
        """Cancel the requests sent ahead on a guess: pages go one at a time from here."""
        for task in ahead.values():
            task.cancel()
        ahead.clear()
        log.info("source_pages_one_at_a_time", source=self.name, request=request)

    def _reopened(self, e: ArtemisError, paginator: Paginator) -> bool:
        """An expired server session (a cursor, a scroll): re-open it instead of failing
        (a cursor from the last committed position, a scroll from the start). True when
        it was re-opened, and the page is asked again."""
        if e.details.get("status") in (400, 404, 410) and paginator.reopen():
            log.warning(
                "source_session_reopened",
                source=self.name,
                error=e.message,
                checkpoint=paginator.checkpoint(),
            )
            return True
        return False

    def _page(
        self,
        new: list[Any],
        paginator: Paginator,
        request: str,
        digest: str | None,
        ignored: int = 0,
    ) -> Page:
        """The page of the records ``new`` (transformed), with the checkpoint after it;
        ``ignored``: the page of an answer a response rule ignored, the last one."""
        if self.transform:
            new = [self.transform(r) for r in new]
        more = paginator.has_more and not ignored
        return Page(
            records=new,
            checkpoint=paginator.checkpoint() if more else None,
            info=PageInfo(
                request=request,
                expected_total=paginator.total,
                taken=paginator.taken,
                digest=digest,
                ignored=ignored,
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
        wanted: dict[str, Request] = {}
        for guess in [paginator, *guesses]:
            req = self.build_request(guess)
            if req.url != self.url:
                check_same_origin(req.url, self.url, f"{self.name}: {type(guess).__name__}")
            wanted[req.describe()] = req
        for request in [r for r in ahead if r not in wanted]:
            ahead.pop(request).cancel()
        for request, req in wanted.items():
            if request not in ahead:
                task = asyncio.create_task(self._request(client, req))
                # A guess dropped unused may have failed: its error is read here (the page
                # that is needed still raises it when awaited).
                task.add_done_callback(_read_error)
                ahead[request] = task

    def records_of(self, data: Any) -> Any:
        """The records of an answer at ``records_path`` (an XML answer's elements made
        records)."""
        if isinstance(data, XmlDocument):
            return data.records(self.records_path, self.record_types)
        return json_path_lookup(data, self.records_path)

    async def _request(self, client: HttpClient, req: Request) -> tuple[Any, Headers]:
        if self.before_request is not None:
            await self.before_request()
        return await self._get(client, req)

    async def _send(self, client: HttpClient, req: Request) -> Answer:
        if self.send is not None:
            return await self.send(client, req)
        headers = dict(self.headers)
        content = None
        if req.body is not None:
            content = encode_body(req.body, req.content_type)
            headers["Content-Type"] = req.content_type
        return await client.request(
            req.method,
            req.url,
            # An empty mapping would wipe the query of a next-page URL: send None.
            params=req.params or None,
            body=content,
            headers=headers,
            transport=timed(None, self.timeout),
        )

    async def _get(self, client: HttpClient, req: Request) -> tuple[Any, Headers]:
        """One answer's data (``IGNORED``: a response rule ignored it) and headers."""
        what = f"{self.name} {req.method} {req.url}"
        try:
            resp = await self._send(client, req)
        except TransportError as e:
            raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
        # Parsed once, whether a rule's jsonpath reads it first or the records are.
        parse = once(lambda: self._parse(resp, what))
        if self.actions and act_on(
            self.actions, resp, parse, Asked(self.name, what, req.describe()), self.status_error
        ):
            return IGNORED, resp.headers
        if resp.status_code >= 400:
            raise self.status_error(what, resp)
        return parse(), resp.headers

    def _parse(self, resp: Answer, what: str) -> Any:
        """An answer's body: XML read as a document, else JSON (SOURCE_CONTRACT when it is
        not JSON)."""
        if self.response_format == "XML":
            return parse_xml(resp.content, what)
        try:
            return jsonio.loads(resp.content)
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
