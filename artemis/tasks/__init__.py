"""Tasks: the TaskUnit contract (``base``), the built-in tasks and the registry of task
codes (``registry.TASKS``, imported from there: the task modules import ``base``)."""

from artemis.tasks.base import FetchControls, TaskContext, TaskUnit

__all__ = ["FetchControls", "TaskContext", "TaskUnit"]
