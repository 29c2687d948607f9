"""The execution lock's activity (workflows/execution_lock.py): wait, heartbeating, for
the run a lock was taken for to end, following its continue-as-new chain; then the lock
workflow ends and the name is free again. Also the wait a scheduled start uses
(activities/schedules.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from artemis.run_models import LockedRun

# How often a wait for a run's end says it is alive.
HEARTBEAT_S = 20.0


async def until_closed(handle: WorkflowHandle[Any, Any]) -> None:
    """Heartbeat until ``handle``'s run (and the runs it continued as) closed, whatever
    its ending; one that does not exist counts as closed. Temporal out of reach is not an
    ending: the error is raised (the activity is retried, the wait goes on)."""
    ended = asyncio.ensure_future(_closed(handle.result()))
    try:
        while not ended.done():
            activity.heartbeat()
            await asyncio.wait({ended}, timeout=HEARTBEAT_S)
    finally:
        ended.cancel()


class LockActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name="hold_execution_lock")
    async def hold(self, run: LockedRun) -> str:
        """Return once the run ``run`` names has ended (its lock is then released). No run
        id (the lock was never told one): the workflow id's latest run, if any."""
        handle = self.client.get_workflow_handle(run.workflow_id, run_id=run.run_id or None)
        await until_closed(handle)
        return f"released: {run.workflow_id} ended"

    def all(self) -> list[Any]:
        return [self.hold]


async def _closed(waiting: Any) -> None:
    """``waiting`` (a run's result) awaited to its end, whatever that is."""
    try:
        await waiting
    except WorkflowFailureError:  # it failed, was cancelled, terminated or timed out
        pass
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:  # (it never existed: nothing to wait for)
            raise
