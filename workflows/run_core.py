"""What every part of the task-run workflow shares: the run's identity, its one state
(``RunState``: what it shows, what continues-as-new and what a retry starts from) and
the small steps every part takes (a stop point, a plan step, the UI's details line, a
log line).

The workflow class (``task_run``: signals, queries, start, stop race) holds one
``RunContext`` and hands it to its parts, one plain object and module each: the batch
loop (``run_loop``), outages and the circuit breaker (``run_outages``), fan-out into
child runs (``run_fanout``) and the ending (``run_ending``: finalize, retain, task-store
mirror).
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from artemis.outage import waiting_line
    from artemis.run_models import RunRef, RunRequest
    from artemis.run_state import CircuitState, RunState, RunStatus


class Stop(Exception):
    """Raised inside the workflow when the run must stop early (cancel or deadline)."""

    def __init__(self, status: RunStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RunContext:
    """One task run as its parts see it: its request and identity (set when it begins),
    its one state, and the small steps every part takes. The parts (the batch loop,
    outage waits, fan-out, the ending) are plain objects, each given this."""

    req: RunRequest
    ref: RunRef
    log_fields: dict[str, Any]

    def __init__(self) -> None:
        # The run's one state (artemis/run_state.py): what it shows and what goes on.
        self.state = RunState(circuit=CircuitState.CLOSED.value)
        # The `running` record, written concurrently with the run's start.
        self.mirror_running: asyncio.Task[None] | None = None
        # Bookkeeping started concurrently with the run (awaited before it ends).
        self.bookkeeping: list[asyncio.Task[None]] = []

    @property
    def params(self) -> dict[str, Any] | None:
        """The prepared params (None until prepare ran)."""
        return self.state.params

    def stop_point(self) -> None:
        """A safe point: leave the batch loop if the run was asked to stop."""
        if self.state.stopping:
            raise asyncio.CancelledError("run is stopping")

    def enter(self, step: str) -> None:
        self.state.enter(step)
        self.details()

    def details(self) -> None:
        """The run's line in the Temporal UI."""
        waiting = self.state.waiting
        workflow.set_current_details(
            self.state.details_line(waiting_line(waiting) if waiting else None)
        )

    def log(self, event: str, **fields: Any) -> None:
        workflow.logger.info(event, extra={"artemis": {**self.log_fields, **fields}})


async def quietly(task: asyncio.Task[Any]) -> None:
    """Await a task for its side effects, whatever its ending."""
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
