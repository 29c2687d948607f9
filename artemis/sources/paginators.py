"""Paginators: one small class per strategy.

Each answers two questions: ``update_request`` — how do I ask for the current page? — and
``update_state`` — what does this response tell me about the next one? Their whole state
is a plain JSON checkpoint (``checkpoint()`` / ``paginator_from_checkpoint``) so that a
heartbeat can carry it and a retried activity resumes exactly where the last one stopped.

To add a strategy: subclass ``Paginator``, give it a unique ``kind``, keep every field
JSON-serialisable, and register it in ``_KINDS``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from artemis.errors import ArtemisError, ErrorCode


def json_path_get(data: Any, path: str) -> Any:
    """Resolve a simple JSONPath (``$.message.next-cursor``, ``items[0].id``); None if absent."""
    path = path.strip()
    if path.startswith("$"):
        path = path[1:]
    cur = data
    for part in [p for p in path.replace("[", ".[").split(".") if p]:
        if part.startswith("["):
            if not isinstance(cur, list):
                return None
            idx = int(part.strip("[]"))
            if idx >= len(cur):
                return None
            cur = cur[idx]
        else:
            if not isinstance(cur, dict):
                return None
            cur = cur.get(part)
        if cur is None:
            return None
    return cur


@dataclass
class Paginator:
    kind: ClassVar[str] = "base"
    has_more: bool = True

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        """The query parameters for the current page."""
        return params

    def request_url(self, url: str) -> str:
        """The URL for the current page (a Link header paginator replaces it)."""
        return url

    def take(self, records: list[Any]) -> list[Any]:
        """The records of this answer that are new (all, unless the session re-opened)."""
        return records

    def reopen(self) -> bool:
        """Start a fresh server session after the old one expired, skipping what was
        already delivered; False when this strategy has no session to re-open."""
        return False

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        """Learn from one answer where the next page is, or that there is none."""
        raise NotImplementedError(f"{type(self).__name__} must implement update_state")

    def checkpoint(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass
class PageNumberPaginator(Paginator):
    """Page-number paging, for APIs shaped like::

        GET /quotes?page=2&page_size=50
        {"items": [...], "page": 2, "next_page": 3}     # next_page null on the last page

    ``next_page_path`` names the field holding the next page number; without it the
    paginator stops on an empty page or one shorter than ``page_size``.
    """

    kind: ClassVar[str] = "page_number"
    page: int = 1
    page_param: str = "page"
    page_size: int | None = None
    page_size_param: str | None = "page_size"
    next_page_path: str | None = "next_page"
    max_pages: int | None = None
    pages_seen: int = 0
    total_path: str | None = None

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
        if self.next_page_path is not None:
            if not isinstance(data, dict):
                raise ArtemisError(
                    ErrorCode.SOURCE_ERROR,
                    "expected a JSON object with a next-page field for "
                    f"PageNumberPaginator, got {type(data).__name__}",
                )
            nxt = json_path_get(data, self.next_page_path)
            if nxt is None:
                self.has_more = False
            else:
                try:
                    self.page = int(nxt)
                except (TypeError, ValueError):
                    raise ArtemisError(
                        ErrorCode.SOURCE_ERROR,
                        f"next page at {self.next_page_path!r} is not a number: {nxt!r}",
                    ) from None
        else:
            self.page += 1
            if not records or (self.page_size and len(records) < self.page_size):
                self.has_more = False
        if self.total_path and self.page_size:
            total = _int_at(data, self.total_path, "PageNumberPaginator")
            if (self.page - 1) * self.page_size >= total:
                self.has_more = False
        if self.max_pages is not None and self.pages_seen >= self.max_pages:
            self.has_more = False


@dataclass
class CursorPaginator(Paginator):
    """Cursor paging, for APIs shaped like Crossref's::

        GET /works?rows=100&cursor=*
        {"message": {"items": [...], "next-cursor": "AoJ..."}}

    ``cursor_path`` finds the next cursor in the body, ``cursor_param`` sends it;
    ``initial_cursor`` is what the first request sends (``*`` for Crossref, or none).
    Paging ends when no cursor comes back, the cursor repeats, or a page is empty or
    shorter than ``page_size``.
    """

    kind: ClassVar[str] = "cursor"
    cursor: str | None = None
    cursor_param: str = "cursor"
    cursor_path: str = "$.next_cursor"
    initial_cursor: str | None = None
    page_size: int | None = None
    page_size_param: str | None = None
    started: bool = False
    # Records delivered so far, and the index of the next record the server sends in the
    # current session: after a re-open the first `position` records are skipped.
    position: int = 0
    seen: int = 0
    reopened: int = 0
    max_reopen: int = 3

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
        nxt = json_path_get(data, self.cursor_path)
        previous = self.cursor
        self.started = True
        self.cursor = nxt if isinstance(nxt, str) and nxt else None
        if (
            self.cursor is None
            or self.cursor == previous
            or not records
            or (self.page_size is not None and len(records) < self.page_size)
        ):
            self.has_more = False

    def take(self, records: list[Any]) -> list[Any]:
        start = self.seen
        self.seen += len(records)
        new = records[max(0, self.position - start) :]
        self.position += len(new)
        return new

    def reopen(self) -> bool:
        if self.cursor is None or self.reopened >= self.max_reopen:
            return False
        self.reopened += 1
        self.cursor, self.started, self.seen, self.has_more = None, False, 0, True
        return True


def _int_at(data: Any, path: str, who: str) -> int:
    value = json_path_get(data, path)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ArtemisError(
            ErrorCode.SOURCE_ERROR,
            f"total count not found at {path!r} in the response for {who} (got {value!r})",
        ) from None


@dataclass
class OffsetPaginator(Paginator):
    """Offset/limit paging, for APIs shaped like::

        GET /items?offset=200&limit=100
        {"items": [...], "total": 1234}

    Stops at ``total`` (from ``total_path``) when given, else on a short or empty page, and
    never asks past ``max_offset`` (an API's result window, e.g. Crossref's 10,000).
    """

    kind: ClassVar[str] = "offset"
    offset: int = 0
    limit: int = 100
    offset_param: str = "offset"
    limit_param: str = "limit"
    total_path: str | None = None
    max_offset: int | None = None

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, self.offset_param: self.offset, self.limit_param: self.limit}

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.offset += len(records)
        if not records or len(records) < self.limit:
            self.has_more = False
        if self.total_path is not None and self.offset >= _int_at(
            data, self.total_path, "OffsetPaginator"
        ):
            self.has_more = False
        if self.max_offset is not None and self.offset >= self.max_offset:
            self.has_more = False


@dataclass
class TokenPaginator(Paginator):
    """Continuation-token paging, for APIs shaped like::

        GET /items?pageToken=abc
        {"items": [...], "nextPageToken": "def"}     # absent on the last page

    The first request sends no token.
    """

    kind: ClassVar[str] = "token"
    token: str | None = None
    token_param: str = "page_token"
    token_path: str = "$.next_page_token"

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, self.token_param: self.token} if self.token else dict(params)

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        nxt = json_path_get(data, self.token_path)
        if not isinstance(nxt, str) or not nxt or nxt == self.token:
            self.has_more = False
        self.token = nxt if isinstance(nxt, str) and nxt else None


_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?', re.I)


@dataclass
class LinkHeaderPaginator(Paginator):
    """RFC 8288 ``Link`` header paging (GitHub style)::

        Link: <https://api.example/items?page=3>; rel="next", <...>; rel="last"

    The next request goes to the ``rel="next"`` URL as given; paging ends without one.
    """

    kind: ClassVar[str] = "link_header"
    next_url: str | None = None

    def request_url(self, url: str) -> str:
        return self.next_url or url

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        # The next URL already carries its query; only the first request sends params.
        return {} if self.next_url else dict(params)

    def update_state(
        self, data: Any, records: list[Any], headers: Mapping[str, str] | None = None
    ) -> None:
        m = _LINK.search((headers or {}).get("link", "") or (headers or {}).get("Link", ""))
        self.next_url = m.group(1) if m else None
        if self.next_url is None:
            self.has_more = False


_KINDS: dict[str, type[Paginator]] = {
    cls.kind: cls
    for cls in (
        PageNumberPaginator,
        CursorPaginator,
        OffsetPaginator,
        TokenPaginator,
        LinkHeaderPaginator,
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
    try:
        return cls(**data)
    except TypeError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"bad {kind} checkpoint: {e}") from None
