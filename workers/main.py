"""Worker entry point: one process polling the task queue for workflows and activities."""

from __future__ import annotations

import asyncio
import compileall
import signal
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.crawl import CrawlActivities
from activities.housekeeping import HousekeepingActivities
from activities.locks import LockActivities
from activities.schedules import ScheduleActivities
from activities.task_run import TaskRunActivities
from artemis.calls import work
from artemis.config import Settings
from artemis.db import get_engine
from artemis.heap import settle_after_startup
from artemis.logsetup import configure_logging, get_logger
from artemis.metrics import serve as serve_metrics
from artemis.owners import DEFAULT_OWNER
from artemis.registry.resolve import provenance_rates
from artemis.run_models import (
    MADE_BY_CONFIG,
    AlertsInput,
    CleanupInput,
    ReclaimInput,
    provenance_queue,
)
from artemis.schedules import start_of, with_time_zone
from artemis.tasks.registry import get_task
from artemis.temporal.client import SearchAttributeCheck, connect
from artemis.temporal.schedules import ScheduleBook
from artemis.temporal.versioning import Build, make_current, worker_build
from artemis.tracing import exporting
from workers.boundary import RunActivityBoundary
from workflows.alerts import AlertsWorkflow
from workflows.cleanup import CleanupWorkflow
from workflows.execution_lock import ExecutionLockWorkflow
from workflows.note_details import NoteDetailsWorkflow
from workflows.quarantine_replay import QuarantineReplayWorkflow
from workflows.reclaim import ReclaimWorkflow
from workflows.scheduled_start import ScheduledStartWorkflow
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
        self,
        client: Client,
        settings: Settings,
        activities: TaskRunActivities,
        task_queue: str,
        build: Build,
    ) -> None:
        self.client = client
        self.build = build
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
        def read() -> dict[str, dict[str, Any]]:
            with get_engine(self.settings.database.url).connect() as conn:
                return provenance_rates(conn)

        try:
            rates = await work(read)
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
                activities=[self.activities.fetch.fetch_pages],
                interceptors=[
                    RunActivityBoundary(
                        self.activities.services.record,
                        exporting(self.activities.services.settings.telemetry),
                    )
                ],
                max_concurrent_activities=int(rate.get("max_concurrency") or 1),
                graceful_shutdown_timeout=timedelta(
                    seconds=self.settings.worker.graceful_shutdown_s
                ),
                max_heartbeat_throttle_interval=heartbeat_throttle(self.settings),
                # the queue is part of the worker's build: a pinned run's fetches stay on it
                deployment_config=self.build.config(),
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
WORKFLOWS = (
    TaskRunWorkflow,
    CleanupWorkflow,
    ReclaimWorkflow,
    NoteDetailsWorkflow,
    AlertsWorkflow,
    QuarantineReplayWorkflow,
    ScheduledStartWorkflow,
    ExecutionLockWorkflow,
)


def housekeeping_workflow_id(job: str, task_queue: str) -> str:
    """The fixed id of a housekeeping job's one execution per task queue."""
    return f"artemis/{job}/{task_queue}"


@dataclass
class HousekeepingJob:
    """One housekeeping job (workflows/housekeeping.py): its workflow, and the input its
    loop runs with under these settings (``enabled`` False: its loop is told to stop)."""

    name: str  # cleanup | reclaim | alerts
    workflow: Any  # the workflow's run method
    inp: Any  # CleanupInput | ReclaimInput | AlertsInput, every_s set
    enabled: bool = True

    def workflow_id(self, task_queue: str) -> str:
        return housekeeping_workflow_id(self.name, task_queue)


def housekeeping_jobs(settings: Settings) -> list[HousekeepingJob]:
    c = settings.crawler
    return [
        HousekeepingJob(
            "cleanup",
            CleanupWorkflow.run,
            CleanupInput(
                hours=float(settings.task_store.ttl_hours),
                every_s=settings.task_store.cleanup_interval_minutes * 60,
            ),
        ),
        HousekeepingJob(
            "reclaim",
            ReclaimWorkflow.run,
            ReclaimInput(
                lock_timeout_minutes=c.lock_timeout_minutes,
                every_s=c.recovery_interval_minutes * 60,
            ),
        ),
        HousekeepingJob(
            "alerts",
            AlertsWorkflow.run,
            AlertsInput(every_s=settings.alerts.interval_s),
            enabled=settings.alerts.enabled,
        ),
    ]


async def start_housekeeping_loop(client: Client, job: HousekeepingJob, task_queue: str) -> Any:
    """Start the job's loop, or signal the one already running with this input
    (signal-with-start: atomic, so workers starting together still leave one execution;
    the running loop takes the new settings). Returns the handle."""
    return await client.start_workflow(
        job.workflow,
        job.inp,
        id=job.workflow_id(task_queue),
        task_queue=task_queue,
        start_signal="configure",
        start_signal_args=[job.inp],
    )


async def stop_housekeeping_loop(client: Client, job: HousekeepingJob, task_queue: str) -> bool:
    """Tell the job's loop to end (its input with every_s None); False when none runs."""
    from temporalio.service import RPCError, RPCStatusCode

    handle = client.get_workflow_handle(job.workflow_id(task_queue))
    try:
        await handle.signal("configure", replace(job.inp, every_s=None))
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:  # not found: none runs
            raise
        return False
    return True


async def keep_housekeeping(client: Client, settings: Settings, task_queue: str) -> None:
    """Every ``worker.housekeeping_check_s``: each enabled job's loop runs — one that
    ended (terminated from the UI, say) is started again. A running loop is not signalled
    (its history stays short)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    while True:
        await asyncio.sleep(settings.worker.housekeeping_check_s)
        try:
            for job in housekeeping_jobs(settings):
                if not job.enabled:
                    continue
                handle = client.get_workflow_handle(job.workflow_id(task_queue))
                try:
                    status = (await handle.describe()).status
                except RPCError as e:
                    if e.status != RPCStatusCode.NOT_FOUND:
                        raise
                    status = None
                if status != WorkflowExecutionStatus.RUNNING:
                    await start_housekeeping_loop(client, job, task_queue)
                    log.info("housekeeping_loop_restarted", job=job.name, task_queue=task_queue)
        except Exception as e:  # Temporal away: the next check tries again
            log.warning("housekeeping_check_failed", error=f"{type(e).__name__}: {e}")


async def ensure_housekeeping(client: Client, settings: Settings, task_queue: str) -> None:
    """At every worker start: each housekeeping job has its one loop running with this
    worker's settings (a turned-off job's loop ends)."""
    for job in housekeeping_jobs(settings):
        if not job.enabled:
            if await stop_housekeeping_loop(client, job, task_queue):
                log.info("housekeeping_loop_stopped", job=job.name, task_queue=task_queue)
            continue
        await start_housekeeping_loop(client, job, task_queue)
        log.info(
            "housekeeping_loop_running",
            job=job.name,
            workflow_id=job.workflow_id(task_queue),
            every_s=job.inp.every_s,
        )


async def reconcile_schedules(client: Client, settings: Settings, task_queue: str) -> None:
    """At every worker start: the configuration's schedules (``schedules:``) made, updated
    or removed in Temporal as the file says (artemis/temporal/schedules.py). A task code
    the workers do not know stops the start, naming the schedule."""
    wanted = []
    for d in settings.schedules:
        get_task(d.task)  # TASK_NOT_FOUND naming the code
        d = await work(with_time_zone, d, settings.database.url)
        if d.timeout_s is None:  # the run's deadline, which the starter outlives
            d = d.model_copy(update={"timeout_s": settings.server.run_timeout_s})
        wanted.append((d, start_of(d, d.owner or DEFAULT_OWNER, "operator", MADE_BY_CONFIG)))
    counts = await ScheduleBook(client, task_queue).reconcile(wanted)
    log.info("schedules_reconciled", task_queue=task_queue, **counts)


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
    build: Build | None = None,
) -> Worker:
    crawl = crawl or CrawlActivities(settings, activities.services.client)
    queue = task_queue or settings.temporal.task_queue
    return Worker(
        client,
        task_queue=queue,
        workflows=list(WORKFLOWS),
        activities=[
            *activities.all(),
            *HousekeepingActivities(settings).all(),
            *crawl.all(),
            *ScheduleActivities(settings, client).all(),
            *LockActivities(client).all(),
        ],
        interceptors=[
            RunActivityBoundary(activities.services.record, exporting(settings.telemetry))
        ],
        # (worker.sandboxed_workflows: what the sandbox guards and why it is off)
        workflow_runner=SandboxedWorkflowRunner()
        if settings.worker.sandboxed_workflows
        else UnsandboxedWorkflowRunner(),
        max_concurrent_activities=100,
        graceful_shutdown_timeout=timedelta(seconds=settings.worker.graceful_shutdown_s),
        max_heartbeat_throttle_interval=heartbeat_throttle(settings),
        deployment_config=(build or settings_build(settings, queue)).config(),
    )


def settings_build(settings: Settings, task_queue: str | None = None) -> Build:
    """The build a worker with these settings polls as on ``task_queue``."""
    return worker_build(
        settings.temporal.deployment_name,
        task_queue or settings.temporal.task_queue,
        settings.worker.build_id,
    )


def heartbeat_throttle(settings: Settings) -> timedelta:
    """How often at most an activity's heartbeat is sent (the SDK's default is 80% of the
    heartbeat timeout: a fetch would learn of a pause up to 24 s late)."""
    return timedelta(seconds=settings.worker.heartbeat_throttle_s)


async def check_search_attributes(client: Client) -> dict[str, str] | None:
    """At start: the namespace's search attributes, a missing one logged as a warning
    naming it and its command. The worker starts all the same: the runs it already holds
    and the housekeeping loops need none, the API refuses new runs with CONFIG_ERROR
    until they are registered, and registering them heals without a restart
    (docs/operations.md). Returns the problems (None: Temporal would not list them)."""
    check = SearchAttributeCheck(client)
    problems = await check.refresh()
    error = check.error()
    if error is not None:
        log.warning("search_attributes_missing", error=error.message)
    elif problems is None:
        log.info("search_attributes_unchecked", error=check.unchecked)
    return problems


@asynccontextmanager
async def running_worker(
    settings: Settings,
    client: Client | None = None,
    task_queue: str | None = None,
    *,
    build: Build | None = None,
    promote: bool = False,
):
    """Run a worker for the duration of the ``async with`` block, polling as ``build``
    (default: the settings'). Its build becomes the deployment's current version when
    there is none yet, or, with ``promote``, in any case (the dev stack's own worker)."""
    client = client or await connect(settings)
    if settings.worker.sandboxed_workflows:
        await work(cache_workflow_bytecode)
    queue = task_queue or settings.temporal.task_queue
    build = build or settings_build(settings, queue)
    activities = TaskRunActivities(settings)
    activities.services.build_id = build.build_id
    worker = build_worker(client, settings, activities, queue, build=build)
    provenances = ProvenanceWorkers(client, settings, activities, queue, build)
    # A run prepared here polls its provenance's queue at once (a registry just imported).
    activities.services.on_rate_key = provenances.ensure
    await check_search_attributes(client)
    try:
        async with worker:
            await provenances.start()
            current = await make_current(client, build, replace=promote)
            log.info("worker_build", build=str(build), current=current)
            await ensure_housekeeping(client, settings, queue)
            await reconcile_schedules(client, settings, queue)
            keeper = asyncio.create_task(keep_housekeeping(client, settings, queue))
            log.info(
                "worker_started",
                task_queue=task_queue or settings.temporal.task_queue,
                address=settings.temporal.address,
            )
            try:
                yield worker
            finally:
                keeper.cancel()
                await provenances.stop()
    finally:
        await activities.aclose()


async def run_worker(settings: Settings) -> None:
    configure_logging(settings.logging)
    m = settings.metrics
    if m.enabled and m.worker_port is not None:
        serve_metrics(m.host, m.worker_port)
        log.info("metrics_served", host=m.host, port=m.worker_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_worker(settings):
        log.info("heap_settled", frozen_objects=settle_after_startup())
        await stop.wait()
        # Leaving the block shuts the workers down: no new tasks are polled, in-flight
        # activities get worker.graceful_shutdown_s to finish (a fetch stops at its next
        # page and returns its checkpoint), then the process exits 0.
        log.info("worker_stopping", graceful_shutdown_s=settings.worker.graceful_shutdown_s)
    log.info("worker_stopped")
