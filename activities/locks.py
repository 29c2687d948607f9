"""The execution lock's activity (workflows/execution_lock.py): wait, heartbeating, for
the run a lock was taken for to end, following its continue-as-new chain; then the lock
workflow ends and the name is free again. Also the wait a scheduled start uses
(activities/schedules.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle

from artemis.run_models import LockedRun

# How often a wait for a run's end says it is alive.
HEARTBEAT_S = 20.0


async def until_closed(handle: WorkflowHandle[Any, Any]) -> None:
    """Heartbeat until ``handle``'s run (and the runs it continued as) closed, whatever
    its ending; one that does not exist counts as closed."""
    ended = asyncio.ensure_future(_quietly(handle.result()))
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
        """Return once the run ``run`` names has ended (its lock is then released)."""
        await until_closed(self.client.get_workflow_handle(run.workflow_id, run_id=run.run_id))
        return f"released: {run.workflow_id} ended"

    def all(self) -> list[Any]:
        return [self.hold]


async def _quietly(waiting: Any) -> None:
    try:
        await waiting
    except Exception:  # the run failed, was cancelled or terminated, or never existed
        pass
