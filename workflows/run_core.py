"""What every part of the task-run workflow shares: the run's identity, its live state
(``RunState``: what it shows; ``RunCarry``: what continues-as-new and what a retry
starts from) and the small steps every part takes (a stop point, a plan step, the UI's
details line, a log line).

The workflow is one class assembled from parts, one module each: the batch loop
(``run_loop``), outages and the circuit breaker (``run_outages``), fan-out into child
runs (``run_fanout``), the ending (``run_ending``: finalize, retain, task-store mirror)
and the lifecycle (``task_run``: signals, queries, start, stop race).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from artemis.outage import waiting_line
    from artemis.run_models import RunCarry, RunRef, RunRequest
    from artemis.run_state import CircuitState, RunState, RunStatus


class Stop(Exception):
    """Raised inside the workflow when the run must stop early (cancel or deadline)."""

    def __init__(self, status: RunStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RunCore:
    """The state and the shared steps of a task run (see the module docstring)."""

    _req: RunRequest
    _run: RunRef
    # The run's carried state (continue-as-new, retry); what it shows is in _state.
    _live: RunCarry
    # Set once prepare ran (or the run was carried): params are the prepared ones.
    _prepared: bool
    _log_fields: dict[str, Any]

    def __init__(self) -> None:
        # The run's state, as the progress query, the mirror and the result give it.
        self._state = RunState(circuit=CircuitState.CLOSED.value)
        self._cancel_reason: str | None = None
        self._mirror_running: asyncio.Task[None] | None = None
        self._circuit_opens = 0
        self._resume_fetch = False
        # A parent run (backfill windows): its children emit and finish their own sinks.
        self._parent = False
        # Set once the run must stop. Cancelling an activity whose result is already on its
        # way can still return that result, so the loop also checks this flag itself.
        self._stopping = False
        # Outages being waited out, by dependency: {"since", "attempt", "waiting"}.
        self._outages: dict[str, dict[str, Any]] = {}
        # Every page below this sequence was delivered (of those above: live.delivered_above).
        self._delivered_below = 0
        # Bookkeeping started beside the run (awaited before it ends).
        self._beside: list[asyncio.Task[None]] = []

    @property
    def _params(self) -> dict[str, Any] | None:
        """The prepared params (None until prepare ran)."""
        return self._live.params if self._prepared else None

    def _carry(self, **more: Any) -> RunCarry:
        """The run's state for its next generation (continue-as-new) or, kept in the
        database, for POST /tasks/{id}/retry."""
        return dataclasses.replace(
            self._live,
            **self._state.carried(),
            generation=self._live.generation + 1,
            retry_start=False,
            **more,
        )

    def _stop_point(self) -> None:
        """A safe point: leave the batch loop if the run was asked to stop."""
        if self._stopping:
            raise asyncio.CancelledError("run is stopping")

    def _enter(self, step: str) -> None:
        self._state.enter(step)
        self._details()

    def _details(self) -> None:
        waiting = self._state.waiting
        workflow.set_current_details(
            self._state.details_line(waiting_line(waiting) if waiting else None)
        )

    def _log(self, event: str, **fields: Any) -> None:
        workflow.logger.info(event, extra={"artemis": {**self._log_fields, **fields}})


async def quietly(task: asyncio.Task[Any]) -> None:
    """Await a task for its side effects, whatever its ending."""
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
