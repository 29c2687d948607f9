"""The TaskStorage contract (docs/architecture.md): save (upsert), load (None when absent
or expired), update_status (optimistic lock; started_at on running, completed_at on a
terminal status), delete (idempotent), delete_expired (terminal tasks only, in batches).
Times are UTC."""

from __future__ import annotations

import base64
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, model_validator

from artemis.run_state import STORED, TERMINAL, RunStatus

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

STATUSES = tuple(s.value for s in STORED)


class StorageUnavailable(Exception):
    """The database or Redis cannot be reached."""


class TaskValidationError(Exception):
    """The task data breaks the contract (e.g. completed without a result)."""


class ConcurrentModification(Exception):
    """Another writer changed the task since it was read (optimistic lock)."""


class TaskNotFound(KeyError):
    """No task with that id."""


def utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def check_status(status: str, result: Any, error: Any) -> None:
    """A status the store keeps, with the result or error it needs."""
    if status not in STATUSES:
        raise TaskValidationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if status == RunStatus.COMPLETED and result is None:
        raise TaskValidationError("a completed task needs a result")
    if status in (RunStatus.FAILED, RunStatus.TIMEOUT) and error is None:
        raise TaskValidationError(f"a {status} task needs an error")


class TaskData(BaseModel):
    task_id: str = Field(min_length=1, max_length=200)
    task_code: str = ""
    workflow_id: str | None = None
    status: str = RunStatus.PENDING.value
    payload: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    feedback: dict[str, Any] | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    started_at: datetime | None = None
    completed_at: datetime | None = None
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    version: int = 0

    @model_validator(mode="after")
    def _check(self) -> TaskData:
        check_status(self.status, self.result, self.error)
        for name in ("created_at", "started_at", "completed_at", "updated_at"):
            setattr(self, name, utc(getattr(self, name)))
        return self

    @classmethod
    def pending(
        cls,
        task_id: str,
        payload: dict[str, Any],
        task_code: str = "",
        workflow_id: str | None = None,
    ) -> TaskData:
        return cls(task_id=task_id, payload=payload, task_code=task_code, workflow_id=workflow_id)


@dataclass(frozen=True)
class StatusChange:
    """A change of a task record's status: the new status, what the run left (its stats
    as ``result``, or its ``error``), and ``started_at`` / ``at``, the run's start and the
    change's time on the workflow's clock (one duration for the run; the store's own clock
    when absent)."""

    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    started_at: datetime | None = None
    at: datetime | None = None

    @classmethod
    def of(cls, change: StatusChange | str) -> StatusChange:
        return change if isinstance(change, StatusChange) else cls(change)


class TaskStorage(ABC):
    # Artemis' own database when the store keeps its tasks there: its calls are
    # statements on it (``artemis.calls``). None: a store of its own (Redis).
    engine: Engine | None = None

    @abstractmethod
    def save(self, task_id: str, data: TaskData) -> None:
        """Insert or replace the task (upsert)."""

    @abstractmethod
    def create(self, task_id: str, data: TaskData) -> bool:
        """Insert the task unless the id has one (atomic); True if it was inserted."""

    def create_many(self, tasks: list[TaskData]) -> None:
        """``create`` for each task, as one write where the store can (the API's
        `pending` records of a burst of starts: one transaction, not one each)."""
        for data in tasks:
            self.create(data.task_id, data)

    @abstractmethod
    def load(self, task_id: str) -> TaskData | None:
        """The task, or None when absent or expired."""

    @abstractmethod
    def update_status(
        self, task_id: str, change: StatusChange | str, *, expected_version: int | None = None
    ) -> TaskData:
        """Change the status (``change``, or a bare status) under an optimistic lock;
        stamps started_at / completed_at.

        Raises ConcurrentModification when the version moved (``expected_version``, or the
        one read just before writing), TaskNotFound when there is no such task."""

    def set_status(
        self,
        task_id: str,
        change: StatusChange | str,
        *,
        absent: Callable[[], TaskData] | None = None,
    ) -> None:
        """``update_status`` for a writer that holds the state and needs no answer (a run's
        mirror of itself): the same fields written, in one step where the store can (SQL:
        no read first, so no ConcurrentModification). ``absent``: builds the record to
        create first when there is none (insert-if-absent, as ``create``; SQL: in the same
        transaction); called only then. TaskNotFound when there is no such task (and no ``absent``);
        TaskValidationError for a completed status without ``result`` or a failed one
        without ``error`` (the stored one is not read to make up for it)."""
        change = StatusChange.of(change)
        check_status(change.status, change.result, change.error)

        def update() -> None:
            self.update_status(task_id, change)

        try:
            update()
        except TaskNotFound:
            if absent is None:
                raise
            self.create(task_id, absent())
            update()

    @abstractmethod
    def delete(self, task_id: str) -> None:
        """Remove the task; no error when it is not there."""

    @abstractmethod
    def delete_expired(self, before: datetime, batch_size: int = 1000) -> int:
        """Remove terminal tasks completed before ``before``; returns how many."""

    @abstractmethod
    def list(
        self,
        *,
        status: str | None = None,
        code: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        owner: str | None = None,
    ) -> tuple[list[TaskData], str | None]:
        """Tasks newest first, filtered by status, task code and owner (``artemis.owners``);
        returns the page and the cursor of the next one (None at the end)."""

    @abstractmethod
    def record_feedback(self, task_id: str, status: str, comment: str | None = None) -> TaskData:
        """Store a user's verdict on the run (``success`` | ``failed``)."""

    @staticmethod
    def same_id(task_id: str, data: TaskData) -> None:
        """A write under ``task_id`` carries that task (else TaskValidationError)."""
        if data.task_id != task_id:
            raise TaskValidationError(
                f"task id {task_id!r} does not match the data's {data.task_id!r}"
            )

    @classmethod
    def transition(
        cls, current: TaskData, change: StatusChange, version: int
    ) -> tuple[dict[str, Any], TaskData]:
        """The changed fields of a status change and the task after it (validated)."""
        changes = cls.stamped(current, change.status, utc(change.at) or datetime.now(UTC))
        if change.started_at is not None:
            changes["started_at"] = utc(change.started_at)
        if change.result is not None:
            changes["result"] = change.result
        if change.error is not None:
            changes["error"] = change.error
        updated = TaskData.model_validate(
            {**current.model_dump(), **changes, "version": version + 1}
        )
        return changes, updated

    @staticmethod
    def stamped(data: TaskData, status: str, now: datetime) -> dict[str, Any]:
        """The fields a status change sets."""
        changes: dict[str, Any] = {"status": status, "updated_at": now}
        if status == RunStatus.RUNNING and data.started_at is None:
            changes["started_at"] = now
        if status in TERMINAL:
            changes["completed_at"] = now
            if data.started_at is None:
                changes["started_at"] = now
        return changes


def encode_cursor(created_at: datetime, task_id: str) -> str:
    raw = json.dumps([utc(created_at).isoformat(), task_id])  # type: ignore[union-attr]
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, task_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return datetime.fromisoformat(created), str(task_id)
    except (ValueError, TypeError):
        raise TaskValidationError(f"cursor {cursor!r} is not one this API gave out") from None
