"""The Sink contract: what every sink implements and what it is told about a batch and
the run's end. Building sinks from a run's output is ``artemis/sinks/factory.py``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from artemis.http import HttpClient
from artemis.tracing import TraceContext


@dataclass
class EmitContext:
    """What a sink needs to know about the batch it is sending."""

    run_key: str
    seq: int
    trace: TraceContext
    request_id: str | None
    task_code: str
    task_id: str = ""
    # Records each sink took from this page (for the run's stats).
    counts: dict[str, int] = field(default_factory=dict)
    # A quarantined record replayed (its quarantine row's id): it goes under a key of its
    # own, fixed per row, never under its page's (whose body it would change).
    replay_row: int | None = None

    def delivered(self, sink_name: str, records: int) -> None:
        self.counts[sink_name] = self.counts.get(sink_name, 0) + records

    def idempotency_key(self, sink_name: str) -> str:
        # Derived from the run and the batch only: every retry of this batch sends the same key.
        if self.replay_row is not None:
            return f"{self.run_key}:{sink_name}:quarantine:{self.replay_row}"
        return f"{self.run_key}:{sink_name}:{self.seq}"


class Sink(ABC):
    name: str

    @abstractmethod
    async def emit(
        self, client: HttpClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        """Deliver ``records``; raise ArtemisError(SINK_ERROR) when not delivered."""

    async def finish(self, end: RunEnd) -> dict[str, Any] | None:
        """Called once at the run's finalize (e.g. to write a manifest); what it returns
        goes into the run's stats under ``sinks_finished.<name>``."""
        return None


@dataclass
class RunEnd:
    run_key: str
    task_code: str
    task_id: str
    status: str


def shown_url(url: str) -> str:
    """A URL as errors and logs show it: no user, password or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
