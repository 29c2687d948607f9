"""The Source contract: an async iterator of pages, resumable from a checkpoint."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from artemis.http import HttpClient


@dataclass
class PageInfo:
    """What a page says about itself and the fetch so far, besides its records.

    A source sets what it knows of its own request (``request``, ``taken``,
    ``expected_total``, ``digest``); the units fetch (``artemis/tasks/base.py``)
    overwrites ``expected_total`` with the run's sum and adds ``units_done``, ``source``
    and, on a unit's short last page, ``incomplete``.
    """

    # Who served the page, as an operator calls it (the progress line's prefix).
    source: str | None = None
    # The request that served it (``describe_request``): named in SOURCE_LOOP and
    # INCOMPLETE errors.
    request: str | None = None
    # The total the source stated (None: it states none); records taken so far.
    expected_total: int | None = None
    taken: int = 0
    # The fingerprint of the page's record keys (``page_digest``): a page staged twice
    # with one digest is a loop.
    digest: str | None = None
    # The run's units (sources) finished so far, for progress.
    units_done: int | None = None
    # ``completeness.shortfall``'s description when a unit ended short of its total.
    incomplete: dict[str, Any] | None = None
    # Answers a response rule ignored (``artemis/sources/responses.py``) to make this
    # page: 1 on the empty page that ends a resource's paging that way; counted in the
    # run's stats (``responses_ignored``).
    ignored: int = 0
    # A source of several resources (artemis/sources/tree.py): each resource's counts so
    # far (records, ignored answers, stated totals).
    resources: dict[str, dict[str, Any]] | None = None


@dataclass
class Page:
    """One page of records and the checkpoint that resumes *after* it.

    ``checkpoint`` is plain JSON (None when this was the last page), so a heartbeat can
    carry it and a retry can start from it.
    """

    records: list[dict[str, Any]]
    checkpoint: dict[str, Any] | None
    info: PageInfo = field(default_factory=PageInfo)


class Source(ABC):
    name: str = "source"
    # Set on the source a retried fetch attempt resumes: its first request may repeat one
    # whose answer was lost (a stateful server session must then be re-opened).
    resumed: bool = False

    @abstractmethod
    def pages(self, client: HttpClient, checkpoint: dict[str, Any] | None) -> AsyncIterator[Page]:
        """Yield pages starting at ``checkpoint`` (None = from the beginning)."""

    def limit_rate(self, acquire: Callable[[], Awaitable[None]]) -> None:
        """An operator's rate for this run (a set_rate_limit signal): ``acquire`` is to be
        awaited before each request. Default: not applied — a source that paces its
        requests itself (its own limiter, a contract's) ignores it."""
        return None
