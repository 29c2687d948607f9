"""How a source's answers are read: JSON paths into the answer, against the source's
contract; the paginators that walk its pages; the fingerprint of a page that catches a
source serving one page again. One module, as a page's records take these steps together
(docs/architecture.md, "The record's path").

**JSON paths.** "Absent" and "null" are kept apart (``MISSING``), counts and flags are
read strictly, and the SOURCE_CONTRACT error names the path that was expected and what
was found.

**Paginators**, one small class per strategy. Each answers two questions:
``update_request`` — how do I ask for the current page? — and ``update_state`` — what
does this response tell me about the next one? Their whole state is a plain JSON
checkpoint (``checkpoint()`` / ``paginator_from_checkpoint``) so that a heartbeat can
carry it and a retried activity resumes exactly where the last one stopped.

**Paging ends only on the source's own word**: an empty page, a next marker that is
present and null/false, a stated total reached, or a page shorter than the page size where
the source documents that rule (``short_page_ends``). A missing key (unless the source
documents leaving its marker out on the last page: a token's ``absent_ends``, OData's
``@odata.nextLink``), an unexpected shape or a value of the wrong type is never an end: it
is a ``SOURCE_CONTRACT`` error naming the path that was expected and what was found.
Where the source states a total (``total_path``) the paginator keeps it in ``total``
next to ``taken`` (the records delivered) so the run can reconcile the two.

To add a strategy: subclass ``Paginator``, give it a unique ``kind``, keep every field
JSON-serialisable, end paging only on positive evidence, and register it in ``_KINDS``.
"""

from __future__ import annotations

import hashlib
import reprlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from typing import Any, ClassVar
from urllib.parse import parse_qs, urljoin, urlsplit

import jsonpath
import orjson

from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Headers
from artemis.redact import redact_text
from artemis.urls import header_links


class _Missing:
    """The marker of a key that is absent (as opposed to present and null)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


class Document(ABC):
    """An answer read by paths of its own language (an XML answer): the lookups below
    hand it its path instead of reading it as JSON."""

    @abstractmethod
    def lookup(self, path: str) -> Any:
        """The value at ``path``, in the document's own path language."""

    def as_flag(self, value: Any) -> Any:
        """A value found in it read as true/false (unchanged when it is neither)."""
        return value


@cache
def _compiled(path: str) -> Any:
    return jsonpath.compile(path.strip())


def json_path_lookup(data: Any, path: str) -> Any:
    """The value at a JSONPath (``$.message.next-cursor``, ``$.items[0].id``, RFC 9535 via
    python-jsonpath); ``MISSING`` when nothing is there, so that "absent" and "null" stay
    different answers. A path that selects several values (``$.data[*].attributes``)
    gives the list of them."""
    if isinstance(data, Document):
        return data.lookup(path)
    query = _compiled(path)
    if query.singular_query():
        match = query.match(data)
        return MISSING if match is None else match.obj
    found = query.findall(data)
    return found if found else MISSING


def json_path_get(data: Any, path: str) -> Any:
    """Like ``json_path_lookup``, with None for an absent value."""
    value = json_path_lookup(data, path)
    return None if value is MISSING else value


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 400, 400, 400


def describe(value: Any) -> str:
    """What was found, for an error message: the type and a short repr."""
    if value is MISSING:
        return "no such key"
    # A bounded repr (a value found may be most of a large answer), redacted before the
    # cut below so that a secret across it is still found whole.
    text = redact_text(_SHORT.repr(value))
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def contract_error(who: str, path: str, expected: str, found: Any) -> ArtemisError:
    """The source broke its contract: ``expected`` at ``path``, ``found`` instead. The
    source adds the request it made (``RestSource`` appends it)."""
    return ArtemisError(
        ErrorCode.SOURCE_CONTRACT,
        f"{who}: expected {expected} at {path!r}, found {describe(found)}",
        details={"path": path},
    )


def as_count(value: Any) -> int | None:
    """A non-negative integer, also from a digit string (E-utilities sends ``"404"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def required_count(data: Any, path: str, who: str) -> int:
    value = json_path_lookup(data, path)
    count = as_count(value)
    if count is None:
        raise contract_error(who, path, "the total count (a non-negative integer)", value)
    return count


def required_flag(data: Any, path: str, who: str) -> bool:
    """A "has more" flag: present on every page, true or false (nothing else ends)."""
    value = json_path_lookup(data, path)
    if isinstance(data, Document):
        value = data.as_flag(value)
    if not isinstance(value, bool):
        raise contract_error(who, path, "true or false (are there more pages)", value)
    return value


# -- a page's fingerprint ---------------------------------------------------------------


def record_keys(records: Iterable[Any], key_path: str | None = None) -> list[bytes]:
    """Each record's key: the value at ``key_path`` when given (a record without one
    breaks the contract), else the whole record."""
    if key_path:
        keys = []
        for r in records:
            value = json_path_lookup(r, key_path)
            if value is MISSING or value is None or isinstance(value, (dict, list)) or value == "":
                raise contract_error("record key", key_path, "the record's key", value)
            keys.append(orjson.dumps(value, default=str))
        return keys
    return [orjson.dumps(r, default=str, option=orjson.OPT_SORT_KEYS) for r in records]


def page_digest(records: list[Any], key_path: str | None = None) -> str | None:
    """A fingerprint of a page's record keys (None for an empty page)."""
    if not records:
        return None
    h = hashlib.sha1(usedforsecurity=False)
    for key in record_keys(records, key_path):
        h.update(key)
        h.update(b"\x00")
    return h.hexdigest()


def check_loop(previous: str | None, digest: str | None, who: str, where: str) -> None:
    """A source serving the previous page's records again is looping (SOURCE_LOOP); a
    repeated cursor alone is not (Crossref keeps one cursor for a whole session)."""
    if digest is not None and digest == previous:
        raise ArtemisError(
            ErrorCode.SOURCE_LOOP,
            f"{who}: the page of {where} holds the same records as the page before it; "
            "the source is serving one page again",
        )


# -- paginators --------------------------------------------------------------------------


@dataclass
class Paginator:
    kind: ClassVar[str] = "base"
    has_more: bool = True
    # Records delivered so far, and the total the source states (None: it states none).
    taken: int = 0
    total: int | None = None
    total_path: str | None = None
    # Pages answered so far, and the fingerprint of the last page's record keys: a source
    # serving the previous page again is caught by content (SOURCE_LOOP), not by cursor.
    pages_seen: int = 0
    last_page_digest: str | None = None

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        """The query parameters for the current page."""
        return params

    def request_url(self, url: str) -> str:
        """The URL for the current page (a Link header paginator replaces it)."""
        return url

    def own_request(self) -> bool:
        """True when the current request is the paginator's alone (a scroll's continue
        request): the search's own parameters and body are not sent with it."""
        return False

    def query_keys(self) -> frozenset[str]:
        """Paging parameters that go in the query string wherever the others go (the
        keep-alive of a scroll's opening request)."""
        return frozenset()

    def release_request(self) -> tuple[str, dict[str, Any]] | None:
        """The URL and parameters that release the server session this paginator holds
        (sent by DELETE), or None when it holds none to release."""
        return None

    def released(self) -> None:
        """The session named by ``release_request`` was released (or given up)."""

    def take(self, records: list[Any]) -> list[Any]:
        """The records of this answer that are new (all, unless the session re-opened)."""
        self.taken += len(records)
        return records

    def reopen(self) -> bool:
        """Start a fresh server session after the old one expired, skipping what was
        already delivered; False when this strategy has no session to re-open."""
        return False

    def resume(self) -> bool:
        """A retried attempt resumes here: True when the strategy re-opened its session
        (the last request of a stateful session may have been served, its answer lost)."""
        return False

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        """Learn from one answer (``records``: all the records it holds) where the next
        page is, or that there is none. Called after ``take``."""
        raise NotImplementedError(f"{type(self).__name__} must implement update_state")

    def read_total(self, data: Any) -> None:
        """The stated total, when the contract names where it is (required there)."""
        if self.total_path is not None:
            self.total = required_count(data, self.total_path, type(self).__name__)

    def total_reached(self) -> bool:
        return self.total is not None and self.taken >= self.total

    def ahead(self, n: int) -> list[Paginator]:
        """Up to ``n`` pages after the current one, when this strategy can tell them
        before the current one is answered (its position is arithmetic and the source
        stated a total): their requests may go out together. None otherwise. A guess is
        only ever a request: each answer is still read in order by the paginator."""
        return []

    def checkpoint(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


def _next_url_params(
    next_url: str | None, params: dict[str, Any], size_param: str | None, size: int | None
) -> dict[str, Any]:
    """The parameters sent with a URL the source handed back: the first request sends
    the search's params and the page size; a next URL already carries its query, and
    gets the page size only when it lacks it (never twice)."""
    sized = {size_param: size} if size is not None and size_param else {}
    if next_url:
        given = parse_qs(urlsplit(next_url).query, keep_blank_values=True)
        return {} if not sized or size_param in given else sized
    return {**params, **sized}


@dataclass
class PageNumberPaginator(Paginator):
    """Page-number paging, for APIs shaped like::

        GET /quotes?page=2&page_size=50
        {"items": [...], "page": 2, "next_page": 3}     # next_page null on the last page

    With ``next_page_path`` the field must be present on every page: a number goes on, null
    or false ends. With ``has_more_path`` (``{"items": [...], "has_more": false}``) a flag
    must be: true goes on to the next page, false ends. Without either, paging ends on an
    empty page, on the stated total (``total_path``), or on a short page when
    ``short_page_ends`` (the source documents that a page shorter than ``page_size`` is
    the last).
    """

    kind: ClassVar[str] = "page_number"
    page: int = 1
    page_param: str = "page"
    page_size: int | None = None
    page_size_param: str | None = "page_size"
    next_page_path: str | None = "next_page"
    has_more_path: str | None = None
    max_pages: int | None = None
    short_page_ends: bool = False

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        params = dict(params)
        params[self.page_param] = self.page
        if self.page_size is not None and self.page_size_param:
            params[self.page_size_param] = self.page_size
        return params

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        if self.next_page_path is not None:
            nxt = json_path_lookup(data, self.next_page_path)
            if nxt is None or nxt is False:
                self.has_more = False
            else:
                number = as_count(nxt)
                if number is None or number < 1:
                    raise contract_error(
                        "PageNumberPaginator",
                        self.next_page_path,
                        "the next page number, or null on the last page",
                        nxt,
                    )
                self.page = number
        elif self.has_more_path is not None:
            self.page += 1
            if not required_flag(data, self.has_more_path, "PageNumberPaginator"):
                self.has_more = False
        else:
            self.page += 1
            if not records or (
                self.short_page_ends and self.page_size and len(records) < self.page_size
            ):
                self.has_more = False
        if self.total_reached():
            self.has_more = False
        if self.max_pages is not None and self.pages_seen >= self.max_pages:
            self.has_more = False

    def ahead(self, n: int) -> list[Paginator]:
        if (
            self.next_page_path is not None
            or self.has_more_path is not None
            or self.total is None
            or not self.page_size
        ):
            return []
        # Full pages from here on: what is left after the current page, in pages.
        left = max(0, self.total - self.taken - self.page_size)
        count = min(n, -(-left // self.page_size))
        if self.max_pages is not None:
            count = min(count, self.max_pages - self.pages_seen - 1)
        return [replace(self, page=self.page + k) for k in range(1, count + 1)]


@dataclass
class CursorPaginator(Paginator):
    """Cursor paging, for APIs shaped like Crossref's::

        GET /works?rows=100&cursor=*
        {"message": {"items": [...], "next-cursor": "AoJ...", "total-results": 454}}

    ``cursor_path`` finds the next cursor in the body (it must be there; null ends),
    ``cursor_param`` sends it; ``initial_cursor`` is what the first request sends (``*``
    for Crossref, or none). A cursor that repeats is normal: Crossref returns one value
    for the whole session. Paging ends on an empty page, a null cursor, the stated total,
    or a short page when ``short_page_ends`` (Crossref documents it).
    """

    kind: ClassVar[str] = "cursor"
    cursor: str | None = None
    cursor_param: str = "cursor"
    cursor_path: str = "$.next_cursor"
    initial_cursor: str | None = None
    page_size: int | None = None
    page_size_param: str | None = None
    short_page_ends: bool = False
    started: bool = False
    # The index of the next record the server sends in the current session (after a
    # re-open the first `position` records are skipped), and how many it has sent.
    position: int = 0
    seen: int = 0
    reopened: int = 0
    max_reopen: int = 3
    # The server keeps the session's position (the cursor came back unchanged): sending
    # the same cursor twice gets two different pages.
    stateful: bool = False

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        params = dict(params)
        value = self.cursor if self.started else (self.cursor or self.initial_cursor)
        if value is not None:
            params[self.cursor_param] = value
        if self.page_size is not None and self.page_size_param:
            params[self.page_size_param] = self.page_size
        return params

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        nxt = json_path_lookup(data, self.cursor_path)
        self.started = True
        if nxt is None or nxt is False or nxt == "":
            self.cursor = None
            self.has_more = False
        elif isinstance(nxt, str):
            if nxt == self.cursor:
                self.stateful = True
            self.cursor = nxt
        else:
            raise contract_error(
                "CursorPaginator", self.cursor_path, "the next cursor (a string) or null", nxt
            )
        if (
            not records
            or (self.short_page_ends and self.page_size and len(records) < self.page_size)
            or self.total_reached()
        ):
            self.has_more = False

    def take(self, records: list[Any]) -> list[Any]:
        start = self.seen
        self.seen += len(records)
        new = records[max(0, self.position - start) :]
        self.position += len(new)
        self.taken += len(new)
        return new

    def reopen(self) -> bool:
        if self.cursor is None or self.reopened >= self.max_reopen:
            return False
        self.reopened += 1
        self._restart()
        return True

    def resume(self) -> bool:
        # A stateful session cannot replay the page whose answer a crash lost: start a new
        # session and skip the records already delivered (``position``).
        if not (self.stateful and self.started and self.has_more):
            return False
        self._restart()
        return True

    def _restart(self) -> None:
        self.cursor, self.started, self.seen, self.has_more = None, False, 0, True
        self.last_page_digest = None


@dataclass
class OffsetPaginator(Paginator):
    """Offset/limit paging, for APIs shaped like::

        GET /items?offset=200&limit=100
        {"items": [...], "total": 1234}

    Ends on an empty page, at the stated total (``total_path``), or on a short page when
    ``short_page_ends``. A source with its own end marker names it, and the marker must be
    on every page: ``next_offset_path`` (``{"items": [...], "next_offset": 200}``, null or
    false on the last page; the next request starts there) or ``has_more_path`` (true or
    false). A source that lists only the first ``max_offset`` records of a query
    (Crossref's 10,000) holding more is ``RESULT_CAP_EXCEEDED`` (the run splits its
    window), never a silent stop at the cap.
    """

    kind: ClassVar[str] = "offset"
    offset: int = 0
    limit: int = 100
    offset_param: str = "offset"
    limit_param: str = "limit"
    max_offset: int | None = None
    short_page_ends: bool = False
    next_offset_path: str | None = None
    has_more_path: str | None = None

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, self.offset_param: self.offset, self.limit_param: self.limit}

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        self.offset += len(records)
        if self.next_offset_path is not None or self.has_more_path is not None:
            self._follow_marker(data)
            if not self.has_more or self.total_reached():
                self.has_more = False
                return
        elif (
            not records
            or (self.short_page_ends and len(records) < self.limit)
            or self.total_reached()
        ):
            self.has_more = False
            return
        if self.max_offset is not None and (
            (self.total is not None and self.total > self.max_offset)
            or self.offset >= self.max_offset
        ):
            raise ArtemisError(
                ErrorCode.RESULT_CAP_EXCEEDED,
                f"OffsetPaginator: the source lists at most {self.max_offset} records of a "
                f"query and states {self.total if self.total is not None else 'more'}",
                retryable=False,
                details={"count": self.total, "cap": self.max_offset},
            )

    def _follow_marker(self, data: Any) -> None:
        """The source's own word on the next page (its marker decides, not the count)."""
        if self.has_more_path is not None:
            self.has_more = required_flag(data, self.has_more_path, "OffsetPaginator")
            return
        assert self.next_offset_path is not None
        nxt = json_path_lookup(data, self.next_offset_path)
        if nxt is None or nxt is False:
            self.has_more = False
            return
        offset = as_count(nxt)
        if offset is None:
            raise contract_error(
                "OffsetPaginator",
                self.next_offset_path,
                "the next offset, or null on the last page",
                nxt,
            )
        self.offset = offset

    def ahead(self, n: int) -> list[Paginator]:
        if self.total is None or self.next_offset_path or self.has_more_path:
            return []
        out: list[Paginator] = []
        for k in range(1, n + 1):
            offset = self.offset + k * self.limit
            if offset >= self.total or (self.max_offset is not None and offset >= self.max_offset):
                break
            out.append(replace(self, offset=offset))
        return out


@dataclass
class TokenPaginator(Paginator):
    """Continuation-token paging, for APIs shaped like::

        GET /items?pageToken=abc
        {"items": [...], "nextPageToken": "def"}     # null on the last page

    The first request sends no token. The token field must be present (null or empty
    ends); set ``absent_ends`` only for an API that documents leaving it out on the last
    page (Google's APIs do).
    """

    kind: ClassVar[str] = "token"
    token: str | None = None
    token_param: str = "page_token"
    token_path: str = "$.next_page_token"
    absent_ends: bool = False
    page_size: int | None = None
    page_size_param: str | None = None

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        params = {**params, self.token_param: self.token} if self.token else dict(params)
        if self.page_size is not None and self.page_size_param:
            params[self.page_size_param] = self.page_size
        return params

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        nxt = json_path_lookup(data, self.token_path)
        if nxt is MISSING and self.absent_ends:
            nxt = None
        if nxt is None or nxt is False or nxt == "":
            self.token = None
            self.has_more = False
        elif isinstance(nxt, str):
            self.token = nxt
        else:
            raise contract_error(
                "TokenPaginator", self.token_path, "the next page token (a string) or null", nxt
            )
        if self.total_reached():
            self.has_more = False


@dataclass
class LinkHeaderPaginator(Paginator):
    """RFC 8288 ``Link`` header paging (GitHub style)::

        Link: <https://api.example/items?page=3>; rel="next", <...>; rel="last"

    The next request goes to the ``rel="next"`` URL as given; a ``Link`` header without
    one ends paging. An answer without any ``Link`` header is a single page when it is
    the first; on a later page (the previous one promised more) it breaks the contract.
    The page size (``page_size_param``) goes with the first request; a next URL carries
    it as the server wrote it, and gets it only when it lacks it.
    """

    kind: ClassVar[str] = "link_header"
    next_url: str | None = None
    page_size: int | None = None
    page_size_param: str | None = None

    def request_url(self, url: str) -> str:
        return self.next_url or url

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        return _next_url_params(self.next_url, params, self.page_size_param, self.page_size)

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        raw = Headers(headers or {}).get("link")
        if raw is None:
            if self.pages_seen > 1:
                raise contract_error(
                    "LinkHeaderPaginator",
                    "Link header",
                    'a Link header (with rel="next", or without it on the last page)',
                    MISSING,
                )
            self.next_url, self.has_more = None, False
            return
        links = header_links(raw)
        if not links:
            raise contract_error(
                "LinkHeaderPaginator", "Link header", "RFC 8288 links (<url>; rel=...)", raw
            )
        nxt = (links.get("next") or {}).get("url")
        self.next_url = nxt or None
        if self.next_url is None or self.total_reached():
            self.has_more = False


@dataclass
class NextUrlPaginator(Paginator):
    """Next-URL-in-the-body paging, for APIs shaped like Django REST framework's, OData's
    or JSON:API's::

        GET /items?page_size=50
        {"results": [...], "next": "https://api.example/items?page=2&page_size=50"}
        {"value": [...], "@odata.nextLink": "/items?$skiptoken=abc"}    # OData
        {"data": [...], "links": {"next": null}}                         # JSON:API

    ``next_url_path`` finds the next page's URL; null or absent ends paging (OData leaves
    ``@odata.nextLink`` out on the last page). Any other value that is not a non-empty
    string breaks the contract. A relative URL is resolved against the URL of the page
    that gave it; the source refuses one on another origin. The first request sends the
    search's params and the page size; a next URL is sent as given, with the page size
    added only when it lacks it (as ``LinkHeaderPaginator``).
    """

    kind: ClassVar[str] = "next_url"
    next_url: str | None = None
    next_url_path: str = "$.next"
    # The URL of the page asked for last: a relative next URL is resolved against it.
    page_url: str | None = None
    page_size: int | None = None
    page_size_param: str | None = None

    def request_url(self, url: str) -> str:
        self.page_url = self.next_url or url
        return self.page_url

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        return _next_url_params(self.next_url, params, self.page_size_param, self.page_size)

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        found = json_path_lookup(data, self.next_url_path)
        if found is MISSING or found is None:
            self.next_url, self.has_more = None, False
            return
        if not isinstance(found, str) or not found.strip():
            raise contract_error(
                "NextUrlPaginator",
                self.next_url_path,
                "the next page's URL (a string), or null or nothing on the last page",
                found,
            )
        here = self.next_url or self.page_url or ""
        nxt = urljoin(here, found.strip())
        if not records and nxt == here:
            # An empty page naming itself as the next one: no content digest catches it.
            raise ArtemisError(
                ErrorCode.SOURCE_LOOP,
                f"NextUrlPaginator: an empty page names itself as the next page "
                f"({self.next_url_path!r}); the source is serving one page again",
            )
        self.next_url = nxt
        if self.total_reached():
            self.has_more = False


@dataclass
class SinglePaginator(Paginator):
    """No paging: one request, whose records (``records_jsonpath``) are the whole
    resource. It sends no paging parameter; a stated total (``total_path``) is still
    read, for the run to reconcile."""

    kind: ClassVar[str] = "single"

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        self.has_more = False


@dataclass
class ScrollPaginator(Paginator):
    """Scroll paging, for APIs shaped like Elasticsearch's and OpenSearch's::

        POST /index/_search?scroll=1m      {"size": 100, "query": {...}}
        {"_scroll_id": "DXF1...", "hits": {"total": {"value": 230}, "hits": [...]}}
        POST /_search/scroll               {"scroll": "1m", "scroll_id": "DXF1..."}
        ...                                (an empty hits list: the end)
        DELETE /_search/scroll             {"scroll_id": "DXF1..."}

    The opening request is the search itself, with the keep-alive (``keep_alive_param``,
    always in the query string) and the page size; each later request goes to
    ``scroll_url`` with the keep-alive and the latest scroll id (``scroll_id_path`` in
    every answer that has records) and nothing else. Paging ends on an empty page or
    the stated total; the scroll is then released (``release_url``, by DELETE).

    A scroll cannot be rewound: a resumed attempt (whose last request may have been
    served, its answer lost) and a scroll that expired (the server answers 404) open a
    new scroll from the start, releasing the old one, and deliver its records again
    (sinks write by key, so a record delivered twice is stored once); the count of
    records delivered starts over with it, against the new scroll's total.
    """

    kind: ClassVar[str] = "scroll"
    scroll_id: str | None = None
    scroll_url: str = ""
    release_url: str | None = None
    keep_alive: str | None = "1m"
    keep_alive_param: str = "scroll"
    scroll_id_param: str = "scroll_id"
    scroll_id_path: str = "$._scroll_id"
    page_size: int | None = None
    page_size_param: str | None = "size"
    reopened: int = 0
    max_reopen: int = 3

    def request_url(self, url: str) -> str:
        return self.scroll_url if self.scroll_id is not None else url

    def own_request(self) -> bool:
        return self.scroll_id is not None

    def query_keys(self) -> frozenset[str]:
        return frozenset({self.keep_alive_param}) if self.scroll_id is None else frozenset()

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        alive = {self.keep_alive_param: self.keep_alive} if self.keep_alive else {}
        if self.scroll_id is not None:
            return {**alive, self.scroll_id_param: self.scroll_id}
        params = {**params, **alive}
        if self.page_size is not None and self.page_size_param:
            params[self.page_size_param] = self.page_size
        return params

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.pages_seen += 1
        self.read_total(data)
        found = json_path_lookup(data, self.scroll_id_path)
        if isinstance(found, str) and found:
            self.scroll_id = found
        elif records:
            raise contract_error(
                "ScrollPaginator", self.scroll_id_path, "the scroll id (a string)", found
            )
        if not records or self.total_reached():
            self.has_more = False

    def release_request(self) -> tuple[str, dict[str, Any]] | None:
        if self.scroll_id is None or not self.release_url:
            return None
        return self.release_url, {self.scroll_id_param: self.scroll_id}

    def released(self) -> None:
        self.scroll_id = None

    def reopen(self) -> bool:
        if self.scroll_id is None or self.reopened >= self.max_reopen:
            return False
        self.reopened += 1
        self._restart()
        return True

    def resume(self) -> bool:
        if self.scroll_id is None or not self.has_more:
            return False
        self._restart()
        return True

    def _restart(self) -> None:
        self.scroll_id, self.has_more, self.taken = None, True, 0
        self.total, self.last_page_digest = None, None


_KINDS: dict[str, type[Paginator]] = {
    cls.kind: cls
    for cls in (
        PageNumberPaginator,
        CursorPaginator,
        OffsetPaginator,
        TokenPaginator,
        ScrollPaginator,
        LinkHeaderPaginator,
        NextUrlPaginator,
        SinglePaginator,
    )
}


def paginator_from_checkpoint(checkpoint: dict[str, Any]) -> Paginator:
    data = dict(checkpoint)
    kind = data.pop("kind", None)
    cls = _KINDS.get(kind or "")
    if cls is None:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"unknown paginator kind in checkpoint: {kind!r} (known: {', '.join(sorted(_KINDS))})",
        )
    # A checkpoint may carry fields the paginator does not have (ignored), and lack the
    # count of records delivered: derive it where the state holds it, else the run cannot
    # be reconciled (no stated total is kept for it).
    known = {f.name for f in fields(cls)}
    counted = "taken" in data
    try:
        paginator = cls(**{k: v for k, v in data.items() if k in known})
    except TypeError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"bad {kind} checkpoint: {e}") from None
    if not counted:
        if isinstance(paginator, CursorPaginator):
            paginator.taken = paginator.position
        elif isinstance(paginator, OffsetPaginator):
            paginator.taken = paginator.offset
        else:
            paginator.total_path, paginator.total = None, None
    return paginator
