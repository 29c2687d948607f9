"""Built-in tasks and the registry of task codes."""

# Importing a task module registers its code.
from artemis.crawler import task as _crawl_notes  # noqa: E402,F401
from artemis.literature import harvest as _literature  # noqa: E402,F401
from artemis.tasks import stock_quotes as _stock_quotes  # noqa: E402,F401
from artemis.tasks.base import TaskContext, TaskUnit, get_task, register_task, task_codes

__all__ = ["TaskContext", "TaskUnit", "get_task", "register_task", "task_codes"]
