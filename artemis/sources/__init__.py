"""Sources yield pages: records plus a JSON checkpoint from which fetching can resume."""

from artemis.paging import (
    CursorPaginator,
    PageNumberPaginator,
    Paginator,
    paginator_from_checkpoint,
)
from artemis.sources.base import Page, PageInfo, Source
from artemis.sources.rest import RestSource

__all__ = [
    "CursorPaginator",
    "Page",
    "PageInfo",
    "PageNumberPaginator",
    "Paginator",
    "RestSource",
    "Source",
    "paginator_from_checkpoint",
]
