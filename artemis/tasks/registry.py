"""The task codes a run can start: an explicit list (no registration by import side
effect). A new task is a TaskUnit subclass added here."""

from __future__ import annotations

from artemis.crawler.task import CrawlNotes
from artemis.errors import ArtemisError, ErrorCode
from artemis.literature.harvest import LiteratureHarvest
from artemis.tasks.base import TaskUnit
from artemis.tasks.source_harvest import SourceHarvest
from artemis.tasks.stock_quotes import PullStockQuotes

TASKS: tuple[type[TaskUnit], ...] = (PullStockQuotes, SourceHarvest, LiteratureHarvest, CrawlNotes)
_BY_CODE = {task.code: task for task in TASKS}


def get_task(code: str) -> TaskUnit:
    """The task of ``code``; TASK_NOT_FOUND naming the known codes."""
    cls = _BY_CODE.get(code)
    if cls is None:
        raise ArtemisError(
            ErrorCode.TASK_NOT_FOUND,
            f"unknown task code {code!r} (known: {', '.join(sorted(_BY_CODE))})",
        )
    return cls()


def task_codes() -> list[str]:
    return sorted(_BY_CODE)
