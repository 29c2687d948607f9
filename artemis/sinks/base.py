"""The Sink contract and the factory that turns ``output_defaults`` into sinks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import httpx

from artemis.errors import ArtemisError, ErrorCode
from artemis.tracing import TraceContext


@dataclass
class EmitContext:
    """What a sink needs to know about the batch it is sending."""

    run_key: str
    seq: int
    trace: TraceContext
    request_id: str | None
    task_code: str

    def idempotency_key(self, sink_name: str) -> str:
        # Derived from the run and the batch only: every retry of this batch sends the same key.
        return f"{self.run_key}:{sink_name}:{self.seq}"


class Sink(ABC):
    name: str

    @abstractmethod
    async def emit(
        self, client: httpx.AsyncClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        """Deliver ``records``; raise ArtemisError(SINK_ERROR) when not delivered."""


def build_sinks(spec: dict[str, Any]) -> list[Sink]:
    """Build sinks from an ``output_defaults.<code>`` mapping (request overrides merged in)."""
    from artemis.sinks.http import HttpSink, LogSink

    names = spec.get("sinks") or []
    if isinstance(names, str):
        names = [names]
    sinks: list[Sink] = []
    for name in names:
        if name == "http":
            endpoint = spec.get("http_endpoint")
            if not endpoint:
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT, "output: sink 'http' needs 'http_endpoint'"
                )
            sinks.append(HttpSink(endpoint, headers=spec.get("http_headers") or {}))
        elif name == "log":
            sinks.append(LogSink())
        else:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT, f"output: unknown sink {name!r} (known: http, log)"
            )
    if not sinks:
        raise ArtemisError(ErrorCode.INVALID_INPUT, "output: no sinks configured")
    return sinks
