"""Execution locks as the start path takes them (workflows/execution_lock.py): a task
with a lock (``TaskUnit.lock_name``: a crawl's workflow name) has one run at a time per
name. The lock is a workflow of its own, ``artemis/lock/{name}``; the run keeps its own
id, ``artemis/{code}/{task_id}``.

A start takes the lock, starts the run, then tells the lock the run's run id. A lock held
by another task refuses the start (EXECUTION_LOCKED, naming the holder to whom may see
it); held by the same task id, the start attaches to that task's run. A run that does
not start releases the lock at once; a starter that stops between the two starts leaves
it to end by itself (``BIND_WITHIN``), and ``tbl_crawl_execution``'s one-running-row
index is the database's guard behind it."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.owners import owner_of
from artemis.run_models import (
    LOCK_BIND_SIGNAL,
    LOCK_WORKFLOW,
    SA_OWNER,
    SA_TASK_ID,
    LockHold,
    lock_workflow_id,
)

log = get_logger("artemis.locks")

# A lock closes a moment after its run ended (its activity sees the end, the workflow
# completes): a start meeting a lock in that moment waits for it this long, at most.
CLOSING_S = 10.0

KEY_TASK_ID = SearchAttributeKey.for_keyword(SA_TASK_ID)
KEY_OWNER = SearchAttributeKey.for_keyword(SA_OWNER)


class ExecutionLocks:
    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue

    async def take(self, lock_id: str, hold: LockHold, owner: str) -> WorkflowHandle[Any, Any]:
        """The lock ``lock_id`` taken for ``hold``'s run; raises
        WorkflowAlreadyStartedError while another run holds it."""
        return await self.client.start_workflow(
            LOCK_WORKFLOW,
            hold,
            id=lock_workflow_id(lock_id),
            task_queue=self.task_queue,
            # one open at a time (the lock), a new one once the last one closed
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            # the holder, as a competing start and the UI read it
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(KEY_TASK_ID, hold.task_id),
                    SearchAttributePair(KEY_OWNER, owner),
                ]
            ),
            static_summary=f"lock {hold.lock} · held by task {hold.task_id}",
            execution_timeout=timedelta(seconds=hold.timeout_s + 2 * 3600),
        )

    async def holder(self, lock_id: str) -> str | None:
        """The task id holding ``lock_id`` (None: it is free, or no task id is told)."""
        handle = self.client.get_workflow_handle(lock_workflow_id(lock_id))
        desc = await handle.describe()
        return desc.typed_search_attributes.get(KEY_TASK_ID)

    async def is_open(self, workflow_id: str) -> bool:
        """Whether the workflow ``workflow_id`` runs (one that does not exist: no)."""
        try:
            desc = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            return False
        return desc.status == WorkflowExecutionStatus.RUNNING

    async def closing(self, lock_id: str) -> None:
        """Wait, at most ``CLOSING_S``, for a lock whose run has ended to close."""
        handle = self.client.get_workflow_handle(lock_workflow_id(lock_id))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(handle.result(), timeout=CLOSING_S)

    @staticmethod
    async def bind(lock: WorkflowHandle[Any, Any], run_id: str) -> None:
        """Tell the lock that its run started (it holds until that run ends)."""
        await lock.signal(LOCK_BIND_SIGNAL, run_id)

    @staticmethod
    async def release(lock: WorkflowHandle[Any, Any], why: str) -> None:
        """A lock whose run did not start, released now (best effort: unreleased, it
        ends by itself)."""
        try:
            await lock.terminate(reason=why)
        except Exception as e:  # (raised in a failure's handling: never hide that failure)
            log.warning("lock_not_released", lock=lock.id, error=f"{type(e).__name__}: {e}")


def locked(lock: str, task_id: str, holder: str | None, owner: str, sees_all: bool) -> ArtemisError:
    """EXECUTION_LOCKED for a start of ``task_id`` that met ``lock`` held by ``holder``:
    the holder named to its owner, an operator or an admin only."""
    details: dict[str, Any] = {"workflow_name": lock}
    running = "another task"
    if holder is not None and (sees_all or owner_of(holder) == owner):
        details["running_task_id"] = holder
        running = f"task {holder}"
    return ArtemisError(
        ErrorCode.EXECUTION_LOCKED,
        f"{lock} is already running ({running}); one execution at a time",
        details=details,
    )
