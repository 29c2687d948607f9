"""One model of a run's state, used by everything that writes or reads it: the workflow
(its ``progress`` query and its result), the task-store mirror, the event stream's
terminal events and the API.

- ``TERMINAL``: the statuses a run ends in.
- ``new_stats`` / ``stats_view`` / ``add_stats``: the counters of a run (one list of
  keys), with the total the sources stated beside them.
- ``end_code`` / ``end_error`` / ``error_code_of``: how a status maps to its error code,
  and through ``ErrorCode`` to its HTTP status — the one mapping of the codebase.
- ``RunState``: status, stage, steps, stats, error and the operator's controls, as the
  progress query answers them.

Stdlib and ``artemis.errors`` only: the workflow sandbox imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from artemis.errors import ErrorCode

TERMINAL = frozenset({"completed", "failed", "cancelled", "timeout"})
# The failures POST /tasks/{id}/retry finishes from the run's kept state (SPEC §4
# "Outages"): a dependency down past its tolerance, an internal failure, a timeout.
RETRYABLE_ENDINGS = ("SOURCE_UNAVAILABLE", "SINK_UNAVAILABLE", "INTERNAL", "TIMEOUT_ERROR")
OPEN = frozenset({"pending", "running"})
STAT_KEYS = ("pages", "records_fetched", "records_processed", "records_emitted", "batches")
STEPS = ("step_prepare", "step_fetch", "step_process", "step_emit", "step_finalize")

# A status that is its own reason carries its own code; "failed" carries the failure's.
_STATUS_CODES = {"cancelled": ErrorCode.CANCELLED, "timeout": ErrorCode.TIMEOUT_ERROR}


def new_stats() -> dict[str, int]:
    return dict.fromkeys(STAT_KEYS, 0)


def stats_view(source: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's stats as every answer shows them: the counters, and the records the
    sources stated they hold (None when no source states a total)."""
    source = source or {}
    stated = source.get("expected_total")
    view: dict[str, Any] = {
        **{k: int(source.get(k) or 0) for k in STAT_KEYS},
        "expected_total": stated if isinstance(stated, int) else None,
    }
    # Records each sink took (http, sql, files, ...), and what sinks reported at the end
    # (the files sink's manifest).
    for extra in ("sinks", "sinks_finished"):
        if isinstance(source.get(extra), Mapping):
            view[extra] = dict(source[extra])
    return view


def add_sink_counts(into: dict[str, Any], counts: Mapping[str, int]) -> None:
    """Add records per sink (an emitted batch's, a child run's) to a run's stats."""
    if not counts:
        return
    per = dict(into.get("sinks") or {})
    for name, n in counts.items():
        per[name] = int(per.get(name) or 0) + int(n)
    into["sinks"] = per


def add_stats(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Add a part's stats (a child run's, say) to the whole's."""
    for key in STAT_KEYS:
        into[key] = int(into.get(key) or 0) + int(other.get(key) or 0)
    if isinstance(other.get("sinks"), Mapping):
        add_sink_counts(into, other["sinks"])
    stated = other.get("expected_total")
    if isinstance(stated, int):
        into["expected_total"] = int(into.get("expected_total") or 0) + stated


def error_code_of(code: str | None) -> ErrorCode:
    """An error code as the enum (INTERNAL for a code this build does not know)."""
    try:
        return ErrorCode(code or ErrorCode.INTERNAL.value)
    except ValueError:
        return ErrorCode.INTERNAL


def end_code(status: str, code: str | None = None) -> ErrorCode | None:
    """The code a run's ending carries: none when it completed, CANCELLED / TIMEOUT_ERROR
    for those endings, otherwise the failure's own code (INTERNAL when unknown)."""
    if status == "completed":
        return None
    return _STATUS_CODES.get(status) or error_code_of(code)


def end_error(status: str, code: str | None, message: str | None) -> dict[str, Any] | None:
    """The ``error`` of a run that ended with ``status`` ({code, message}, or None)."""
    ended = end_code(status, code)
    if ended is None:
        return None
    return {"code": ended.value, "message": message or status}


@dataclass
class RunState:
    """What a run is doing, as its ``progress`` query answers (and GET /tasks/{id}
    shows while it runs)."""

    status: str = "pending"
    stage: str = "pending"
    steps: dict[str, str] = field(default_factory=lambda: dict.fromkeys(STEPS, "PENDING"))
    stats: dict[str, Any] = field(default_factory=new_stats)
    current: int = 0
    total: int = 0
    error: dict[str, Any] | None = None
    paused: bool = False
    qps: float | None = None
    circuit: str | None = None
    task_store: str = "pending"
    # Waiting out an outage (SPEC §4): {dependency, name, since, reason, error, attempt,
    # next_attempt_at, next_in_s, tolerance_s}; None while nothing is down.
    waiting: dict[str, Any] | None = None

    def shown_status(self) -> str:
        """The status as a person reads it: a running run the operator paused is
        ``pausing`` until its fetch in flight has stopped, then ``paused``."""
        if self.status == "running" and self.paused:
            return "paused" if self.stage == "paused" else "pausing"
        return self.status

    def progress(self) -> dict[str, Any]:
        return {
            "status": self.shown_status(),
            "stage": self.stage,
            "current": self.current,
            "total": self.total,
            **stats_view(self.stats),
            "steps": [{"id": s, "status": self.steps[s]} for s in STEPS],
            "error": self.error,
            "paused": self.paused,
            "qps": self.qps,
            "circuit": self.circuit,
            "task_store": self.task_store,
            "waiting": self.waiting,
        }
