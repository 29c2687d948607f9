"""The Source contract: an async iterator of pages, resumable from a checkpoint."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from artemis.http import HttpClient


@dataclass
class Page:
    """One page of records and the checkpoint that resumes *after* it.

    ``checkpoint`` is plain JSON (None when this was the last page), so a heartbeat can
    carry it and a retry can start from it.
    """

    records: list[dict[str, Any]]
    checkpoint: dict[str, Any] | None
    info: dict[str, Any] = field(default_factory=dict)


class Source(ABC):
    name: str = "source"
    # Set on the source a retried fetch attempt resumes: its first request may repeat one
    # whose answer was lost (a stateful server session must then be re-opened).
    resumed: bool = False

    @abstractmethod
    def pages(self, client: HttpClient, checkpoint: dict[str, Any] | None) -> AsyncIterator[Page]:
        """Yield pages starting at ``checkpoint`` (None = from the beginning)."""
