"""Worker entry point: one process polling the task queue for workflows and activities."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from temporalio.client import Client
from temporalio.worker import Worker

from activities.task_run import TaskRunActivities
from artemis.config import Settings
from artemis.logsetup import configure_logging, get_logger
from workers.client import connect
from workflows.task_run import TaskRunWorkflow

log = get_logger("artemis.worker")


def build_worker(
    client: Client, settings: Settings, activities: TaskRunActivities, task_queue: str | None = None
) -> Worker:
    return Worker(
        client,
        task_queue=task_queue or settings.temporal.task_queue,
        workflows=[TaskRunWorkflow],
        activities=activities.all(),
        max_concurrent_activities=100,
    )


@asynccontextmanager
async def running_worker(
    settings: Settings, client: Client | None = None, task_queue: str | None = None
):
    """Run a worker for the duration of the ``async with`` block."""
    client = client or await connect(settings)
    activities = TaskRunActivities(settings)
    worker = build_worker(client, settings, activities, task_queue)
    try:
        async with worker:
            log.info(
                "worker_started",
                task_queue=task_queue or settings.temporal.task_queue,
                address=settings.temporal.address,
            )
            yield worker
    finally:
        await activities.aclose()


async def run_worker(settings: Settings) -> None:
    configure_logging(settings.logging)
    async with running_worker(settings):
        await asyncio.Event().wait()
