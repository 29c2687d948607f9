"""Worker entry point: one process polling the task queue for workflows and activities."""

from __future__ import annotations

import asyncio
import compileall
import signal
import sys
import time
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.crawl import CrawlActivities
from activities.task_run import TaskRunActivities
from artemis.config import Settings
from artemis.logsetup import configure_logging, get_logger
from artemis.run_models import AlertsInput, CleanupInput, ReclaimInput, provenance_queue
from workers.boundary import RunActivityBoundary
from workers.client import connect
from workflows.alerts import AlertsWorkflow
from workflows.cleanup import CleanupWorkflow
from workflows.note_details import NoteDetailsWorkflow
from workflows.reclaim import ReclaimWorkflow
from workflows.task_run import TaskRunWorkflow

log = get_logger("artemis.worker")


class ProvenanceWorkers:
    """One extra worker per rate-limited provenance, polling that provenance's queue for
    fetch activities only, at most ``max_concurrency`` of them at a time in this process.
    The rate itself is held by the provenance's gate in the database, across every worker
    process (``artemis/ratelimit.py``). The registry is re-read every
    ``runs.provenance_refresh_s``: a new provenance gets a worker, a changed rate a new one;
    and at once, on this worker, when a run about to fetch from a provenance is prepared
    here (``ensure``): a harvest started right after ``registry import`` does not wait for
    the next refresh."""

    def __init__(
        self, client: Client, settings: Settings, activities: TaskRunActivities, task_queue: str
    ) -> None:
        self.client = client
        self.settings = settings
        self.activities = activities
        self.task_queue = task_queue
        self.running: dict[str, tuple[dict[str, Any], Worker, asyncio.Task[None]]] = {}
        self._loop: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._refreshed = 0.0

    async def ensure(self, code: str) -> None:
        """A run is about to fetch from ``code``'s queue: make sure this worker polls it
        at the registry's current rate (re-read unless read within the last second)."""
        if code in self.running and time.monotonic() - self._refreshed < 1.0:
            return
        await self.refresh()

    async def refresh(self) -> None:
        async with self._lock:  # one re-read at a time (the loop, and runs being prepared)
            await self._refresh()

    async def _refresh(self) -> None:
        from artemis.db import get_engine
        from artemis.registry.resolve import provenance_rates

        def read() -> dict[str, dict[str, Any]]:
            with get_engine(self.settings.database.url).connect() as conn:
                return provenance_rates(conn)

        try:
            rates = await asyncio.to_thread(read)
            self._refreshed = time.monotonic()
        except Exception as e:  # no registry tables yet, a DB hiccup: try again later
            log.warning("provenance_queues_unavailable", error=f"{type(e).__name__}: {e}")
            return
        for code, rate in rates.items():
            current = self.running.get(code)
            if current is not None and current[0] == rate:
                continue
            if current is not None:
                await current[1].shutdown()
            queue = provenance_queue(self.task_queue, code)
            worker = Worker(
                self.client,
                task_queue=queue,
                activities=[self.activities.fetch_pages],
                interceptors=[RunActivityBoundary(self.activities.record)],
                max_concurrent_activities=int(rate.get("max_concurrency") or 1),
                graceful_shutdown_timeout=timedelta(
                    seconds=self.settings.worker.graceful_shutdown_s
                ),
            )
            self.running[code] = (rate, worker, asyncio.create_task(worker.run()))
            log.info("provenance_queue_polled", provenance=code, task_queue=queue, **rate)

    async def start(self) -> None:
        await self.refresh()

        async def loop() -> None:
            while True:
                await asyncio.sleep(self.settings.runs.provenance_refresh_s)
                await self.refresh()

        self._loop = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
        # All at once: each gets worker.graceful_shutdown_s, not one after another.
        await asyncio.gather(
            *(worker.shutdown() for _, worker, _ in self.running.values()), return_exceptions=True
        )
        for _, _, task in self.running.values():
            try:
                await task
            except Exception:  # a worker that failed to start has already been logged
                pass


# Every workflow type a worker serves (the replay corpus covers each of them).
WORKFLOWS = (TaskRunWorkflow, CleanupWorkflow, ReclaimWorkflow, NoteDetailsWorkflow, AlertsWorkflow)


def cleanup_schedule_id(task_queue: str) -> str:
    return f"artemis/cleanup-old-tasks/{task_queue}"


async def _ensure_schedule(
    client: Client, schedule_id: str, workflow: Any, arg: Any, wf_id: str, tq: str, every: Any
) -> bool:
    """Create the schedule unless it exists (idempotent at every worker start-up)."""
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleAlreadyRunningError,
        ScheduleIntervalSpec,
        ScheduleSpec,
    )

    try:
        await client.create_schedule(
            schedule_id,
            Schedule(
                action=ScheduleActionStartWorkflow(workflow, arg, id=wf_id, task_queue=tq),
                spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
            ),
        )
        return True
    except ScheduleAlreadyRunningError:
        return False


async def ensure_cleanup_schedule(client: Client, settings: Settings, task_queue: str) -> None:
    """Create, once, the schedule that runs cleanup_old_tasks(hours) every hour."""
    hours = float(settings.task_store.ttl_hours)
    if await _ensure_schedule(
        client,
        cleanup_schedule_id(task_queue),
        CleanupWorkflow.run,
        CleanupInput(hours=hours),
        f"artemis/cleanup/{task_queue}",
        task_queue,
        timedelta(hours=1),
    ):
        log.info("cleanup_schedule_created", task_queue=task_queue, hours=hours)


def reclaim_schedule_id(task_queue: str) -> str:
    return f"artemis/reclaim-stale-locks/{task_queue}"


async def ensure_reclaim_schedule(client: Client, settings: Settings, task_queue: str) -> None:
    """Create, once, the schedule of seed 004 §4.4: every recovery_interval_minutes,
    release record locks and executions older than lock_timeout_minutes."""
    c = settings.crawler
    if await _ensure_schedule(
        client,
        reclaim_schedule_id(task_queue),
        ReclaimWorkflow.run,
        ReclaimInput(lock_timeout_minutes=c.lock_timeout_minutes),
        f"artemis/reclaim/{task_queue}",
        task_queue,
        timedelta(minutes=c.recovery_interval_minutes),
    ):
        log.info("reclaim_schedule_created", task_queue=task_queue)


def alerts_schedule_id(task_queue: str) -> str:
    return f"artemis/evaluate-alerts/{task_queue}"


async def ensure_alerts_schedule(client: Client, settings: Settings, task_queue: str) -> None:
    """Create, once, the schedule that evaluates the crawler alerts every interval_s."""
    if not settings.alerts.enabled:
        return
    if await _ensure_schedule(
        client,
        alerts_schedule_id(task_queue),
        AlertsWorkflow.run,
        AlertsInput(),
        f"artemis/alerts/{task_queue}",
        task_queue,
        timedelta(seconds=settings.alerts.interval_s),
    ):
        log.info("alerts_schedule_created", task_queue=task_queue)


def cache_workflow_bytecode() -> bool:
    """Compile the workflow modules' bytecode once, at start-up (best effort).

    The sandbox imports each workflow's module afresh for every run (that is its
    isolation). Without cached bytecode — PYTHONDONTWRITEBYTECODE, set in many container
    images and on this project's machine — every run compiled workflows/task_run.py from
    source: with it cached, 12.3-12.6 -> 14.0-14.1 small runs/s on bench/accept.py.
    Returns False when the directory cannot be written (nothing else changes then)."""
    folder = Path(sys.modules[TaskRunWorkflow.__module__].__file__ or ".")
    ok = bool(compileall.compile_dir(folder.parent, quiet=2, force=False))
    if not ok:
        log.info("workflow_bytecode_not_cached", folder=str(folder.parent))
    return ok


def build_worker(
    client: Client,
    settings: Settings,
    activities: TaskRunActivities,
    task_queue: str | None = None,
    crawl: CrawlActivities | None = None,
) -> Worker:
    crawl = crawl or CrawlActivities(settings, activities.client)
    return Worker(
        client,
        task_queue=task_queue or settings.temporal.task_queue,
        workflows=list(WORKFLOWS),
        activities=[*activities.all(), *crawl.all()],
        interceptors=[RunActivityBoundary(activities.record)],
        max_concurrent_activities=100,
        graceful_shutdown_timeout=timedelta(seconds=settings.worker.graceful_shutdown_s),
    )


@asynccontextmanager
async def running_worker(
    settings: Settings, client: Client | None = None, task_queue: str | None = None
):
    """Run a worker for the duration of the ``async with`` block."""
    client = client or await connect(settings)
    await asyncio.to_thread(cache_workflow_bytecode)
    activities = TaskRunActivities(settings)
    worker = build_worker(client, settings, activities, task_queue)
    provenances = ProvenanceWorkers(
        client, settings, activities, task_queue or settings.temporal.task_queue
    )
    # A run prepared here polls its provenance's queue at once (a registry just imported).
    activities.on_rate_key = provenances.ensure
    try:
        async with worker:
            await provenances.start()
            await ensure_cleanup_schedule(
                client, settings, task_queue or settings.temporal.task_queue
            )
            await ensure_reclaim_schedule(
                client, settings, task_queue or settings.temporal.task_queue
            )
            await ensure_alerts_schedule(
                client, settings, task_queue or settings.temporal.task_queue
            )
            log.info(
                "worker_started",
                task_queue=task_queue or settings.temporal.task_queue,
                address=settings.temporal.address,
            )
            try:
                yield worker
            finally:
                await provenances.stop()
    finally:
        await activities.aclose()


async def run_worker(settings: Settings) -> None:
    configure_logging(settings.logging)
    m = settings.metrics
    if m.enabled and m.worker_port is not None:
        from artemis.metrics import serve

        serve(m.host, m.worker_port)
        log.info("metrics_served", host=m.host, port=m.worker_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_worker(settings):
        await stop.wait()
        # Leaving the block shuts the workers down: no new tasks are polled, in-flight
        # activities get worker.graceful_shutdown_s to finish (a fetch stops at its next
        # page and returns its checkpoint), then the process exits 0.
        log.info("worker_stopping", graceful_shutdown_s=settings.worker.graceful_shutdown_s)
    log.info("worker_stopped")
