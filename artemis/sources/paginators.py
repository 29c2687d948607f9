"""Paginators: one small class per strategy.

Each answers two questions: ``update_request`` — how do I ask for the current page? — and
``update_state`` — what does this response tell me about the next one? Their whole state
is a plain JSON checkpoint (``checkpoint()`` / ``paginator_from_checkpoint``) so that a
heartbeat can carry it and a retried activity resumes exactly where the last one stopped.

To add a strategy: subclass ``Paginator``, give it a unique ``kind``, keep every field
JSON-serialisable, and register it in ``_KINDS``.
"""

from __future__ import annotations

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
        raise NotImplementedError

    def update_state(self, data: Any, records: list[Any]) -> None:
        raise NotImplementedError

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

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        params = dict(params)
        params[self.page_param] = self.page
        if self.page_size is not None and self.page_size_param:
            params[self.page_size_param] = self.page_size
        return params

    def update_state(self, data: Any, records: list[Any]) -> None:
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
    started: bool = False

    def update_request(self, params: dict[str, Any]) -> dict[str, Any]:
        params = dict(params)
        value = self.cursor if self.started else (self.cursor or self.initial_cursor)
        if value is not None:
            params[self.cursor_param] = value
        return params

    def update_state(self, data: Any, records: list[Any]) -> None:
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


_KINDS: dict[str, type[Paginator]] = {
    PageNumberPaginator.kind: PageNumberPaginator,
    CursorPaginator.kind: CursorPaginator,
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
