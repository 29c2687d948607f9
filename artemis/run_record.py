"""A run's task-store record, built and written in one place.

Four parties write a run's record: the API (the `pending` record concurrently with its answer, a
retry opening a failed run again or putting it back when the retry did not start), the
run itself (``mirror_state``: its status, stats and error as the workflow holds them) and
the housekeeping reconciler (the ending of a run whose workflow closed without recording
it). Each hands a :class:`RunSnapshot` to :func:`write_runs` and says how it writes
(:class:`Write`); the record itself (``TaskData``) is built only here, so the fields a new
record carries and the rules of a status change are the same for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from artemis.run_state import RunStatus
from artemis.taskstore.base import StatusChange, TaskData, TaskStorage


@dataclass(frozen=True)
class RunSnapshot:
    """What a writer knows of a run: its identity, its status and what goes with it."""

    task_id: str
    task_code: str
    workflow_id: str | None
    status: str
    # The request's params: the payload of a record this write creates (the task list
    # names a run's source from them). None: a record created without them.
    params: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    # The run's start and the change's time (its end, for a terminal status), on the
    # workflow's clock where the writer has it: one duration for the run.
    started_at: datetime | None = None
    at: datetime | None = None
    # The record's version this write expects (``Write.REPAIR``).
    version: int | None = None

    @classmethod
    def of(cls, data: TaskData) -> RunSnapshot:
        """The snapshot a stored record holds (to put it back as it was)."""
        return cls(
            task_id=data.task_id,
            task_code=data.task_code,
            workflow_id=data.workflow_id,
            status=data.status,
            stats=data.result,
            error=data.error,
            started_at=data.started_at,
            at=data.completed_at,
        )

    def change(self) -> StatusChange:
        """The status change this snapshot writes."""
        return StatusChange(self.status, self.stats, self.error, self.started_at, self.at)

    def record(self) -> TaskData:
        """The record a run starts with when the store has none for it: `pending`, its
        params as payload (its status is then written as the writer says)."""
        return TaskData(
            task_id=self.task_id,
            task_code=self.task_code,
            workflow_id=self.workflow_id,
            status=RunStatus.PENDING.value,
            payload={"params": self.params} if self.params is not None else {},
        )


class Write(Enum):
    """How a writer changes the record."""

    # The record a run starts with, unless the task id has one (the API's `pending`
    # record: the run may have recorded itself first). Many at once: one transaction.
    NEW = "new"
    # The run's status and what it carries (a None leaves the stored value), the record
    # created first when there is none: the run's mirror of itself, one statement on SQL.
    STATUS = "status"
    # STATUS under the optimistic lock of ``RunSnapshot.version``: ConcurrentModification
    # when someone wrote since (the run, or another repair), TaskNotFound when it is gone.
    REPAIR = "repair"
    # Status, stats, error and end exactly as the snapshot holds them (a None clears
    # them): a retry opens a failed run again, and puts it back when it did not start.
    # Answers the record as it was.
    EXACT = "exact"


def write_runs(
    store: TaskStorage, snapshots: Sequence[RunSnapshot], how: Write
) -> list[TaskData | None]:
    """Write the runs' records as ``how`` says. Answers, for ``Write.EXACT``, each record
    as it was before (None: there was none), else an empty list. The store's errors
    (StorageUnavailable, ConcurrentModification, TaskNotFound) go to the caller."""
    if how is Write.NEW:
        store.create_many([s.record() for s in snapshots])
        return []
    before: list[TaskData | None] = []
    for s in snapshots:
        if how is Write.STATUS:
            store.set_status(s.task_id, s.change(), absent=s.record)
        elif how is Write.REPAIR:
            store.update_status(s.task_id, s.change(), expected_version=s.version)
        else:
            before.append(_write_exact(store, s))
    return before


def _write_exact(store: TaskStorage, s: RunSnapshot) -> TaskData | None:
    was = store.load(s.task_id)
    changes: dict[str, Any] = {
        "status": s.status,
        "result": s.stats,
        "error": s.error,
        "completed_at": s.at,
    }
    if s.started_at is not None:
        changes["started_at"] = s.started_at
    current = was or s.record()
    store.save(s.task_id, TaskData.model_validate({**current.model_dump(), **changes}))
    return was
