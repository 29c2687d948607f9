"""Task storage (docs/architecture.md): what operators and front ends read about runs,
kept beyond Temporal's retention, on SQL or Redis."""

from artemis.taskstore.base import (
    TERMINAL,
    ConcurrentModification,
    StatusChange,
    StorageUnavailable,
    TaskData,
    TaskNotFound,
    TaskStorage,
    TaskValidationError,
)
from artemis.taskstore.sql import SqlTaskStorage

__all__ = [
    "StatusChange",
    "TERMINAL",
    "ConcurrentModification",
    "StorageUnavailable",
    "TaskData",
    "TaskNotFound",
    "TaskStorage",
    "TaskValidationError",
    "make_task_storage",
]


def make_task_storage(settings) -> TaskStorage:  # noqa: ANN001
    """The backend chosen by ``task_store.backend``."""
    if settings.task_store.backend == "redis":
        # Lazy: importing the redis client costs ~0.3 s, paid only by deployments that
        # store tasks on Redis (the default is SQL).
        from artemis.taskstore.redis_store import RedisTaskStorage

        return RedisTaskStorage(settings.task_store.redis_url, settings.task_store.ttl_hours)
    return SqlTaskStorage(settings.database.url, settings.task_store.ttl_hours)
