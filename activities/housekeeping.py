"""The clean-up loop's activity (workflows/cleanup.py): record the ending of runs that
could not record it themselves (terminated in Temporal, say), then drop what has aged
out — terminal tasks, staged pages, events, kept runs, files-sink records. Not a run's
activity: it works across runs, with the same stores."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode

from activities.run_base import RunData, log
from artemis.calls import work
from artemis.config import Settings
from artemis.errors import ErrorCode
from artemis.events import EventLog
from artemis.quarantine import store as quarantine
from artemis.registry.frozen import forget_old_contracts
from artemis.run_models import SA_TASK_ID, CleanupInput, CleanupResult, workflow_id_for
from artemis.run_record import RunSnapshot, Write, write_runs
from artemis.run_state import OPEN, RunStatus, end_error
from artemis.sinks.files import drop_file_records_older_than
from artemis.taskstore import ConcurrentModification, TaskNotFound, TaskStorage, make_task_storage
from artemis.temporal.runs import OPEN_STATUSES, closed_run_end
from artemis.vault import START_SEP

# A start writes its secrets just before its run starts: younger ones are never orphans.
ORPHAN_SECRET_AGE = timedelta(hours=1)


class HousekeepingActivities:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.data = RunData(settings)
        self.staging = self.data.staging
        self.retained = self.data.retained
        self.events = EventLog(settings.database.url)
        self._task_store: TaskStorage | None = None

    @property
    def task_store(self) -> TaskStorage:
        if self._task_store is None:
            self._task_store = make_task_storage(self.settings)
        return self._task_store

    @activity.defn(name="cleanup_old_tasks")
    async def cleanup_old_tasks(self, inp: CleanupInput) -> CleanupResult:
        """The clean-up job (docs/operations.md): record the
        ending of runs that could not record it themselves, then drop terminal tasks,
        stale staged pages and old events."""
        now = datetime.now(UTC)
        reconciled = await self._reconcile_open_runs(now - timedelta(seconds=inp.reconcile_after_s))
        before = now - timedelta(hours=inp.hours)
        tasks = await work(self.task_store.delete_expired, before)
        # Runs kept for a retry keep their pages until their state expires, then go whole.
        expired = await work(self.retained.expired, now)
        for key in expired:
            await work(self.data.drop, key)
        keep = await work(self.retained.live_keys, now)
        secrets = await self._drop_orphan_secrets(now - ORPHAN_SECRET_AGE, keep)
        pages = await work(self.staging.drop_older_than, before, keep)
        events = await work(self.events.drop_older_than, before)
        # A run may write files for up to 30 days (meta.timeout_s); its records go once it
        # has been quiet longer than that and the clean-up's own age.
        quiet = min(before, now - timedelta(days=30, hours=1))
        files = await work(drop_file_records_older_than, self.settings.database.url, quiet)
        # Quarantined records (and what a replay needs of their runs) past their keeping.
        held = await work(
            quarantine.drop_older_than,
            self.settings.database.url,
            self.settings.quarantine.retain_days,
        )
        contracts = await work(
            forget_old_contracts,
            self.settings.database.url,
            self.settings.runs.frozen_contract_days,
        )
        log.info(
            "cleanup_done",
            frozen_contracts_removed=contracts,
            hours=inp.hours,
            runs_reconciled=reconciled,
            tasks_removed=tasks,
            staged_pages_removed=pages,
            events_removed=events,
            sink_files_forgotten=files,
            retained_expired=len(expired),
            run_secrets_dropped=secrets,
            quarantined_records_removed=held,
        )
        return CleanupResult(
            tasks_removed=tasks,
            staged_pages_removed=pages,
            events_removed=events,
            runs_reconciled=reconciled,
            sink_files_forgotten=files,
        )

    async def _drop_orphan_secrets(self, before: datetime, kept: set[str]) -> int:
        """Secrets written before ``before`` whose run is not open and not kept for a
        retry: a start that never became a run, a run terminated in Temporal (it never
        reached its own clean-up), a start whose refusal could not drop them. A key whose
        run cannot be told (a storage or Temporal error) is kept for the next pass, and
        the rest of the clean-up goes on. Returns how many keys were dropped."""
        try:
            keys = await work(self.data.secrets.keys_older_than, before)
        except Exception as e:
            log.warning("run_secrets_not_swept", error=f"{type(e).__name__}: {e}")
            return 0
        dropped = 0
        for key in keys:
            run = key.split(START_SEP, 1)[0]
            if run in kept:
                continue
            code, _, task_id = run.partition("/")
            try:
                if await self._run_open(code, task_id):
                    continue
                await work(self.data.secrets.drop_key, key)
            except Exception as e:
                log.warning("run_secret_not_swept", run_key=run, error=f"{type(e).__name__}: {e}")
                continue
            dropped += 1
        return dropped

    async def _run_open(self, code: str, task_id: str) -> bool:
        """Whether the run of these secrets may still read them: its task-store record
        says it is open, or — without a record (a run quiet for longer than the store's
        ttl, a start whose answer was lost) — Temporal has its workflow open."""
        if not task_id:
            return False
        record = await work(self.task_store.load, task_id)
        if record is not None:
            return record.status in OPEN
        client = activity.client()
        try:
            desc = await client.get_workflow_handle(workflow_id_for(code, task_id)).describe()
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
        else:
            if desc.status in OPEN_STATUSES:
                return True
        if "'" in task_id or "\\" in task_id:
            return False  # no task id holds them: nothing to look up
        # A run started under its lock's workflow id (as runs with a lock once were), or
        # the lock a run holds: found by its task id.
        query = f"{SA_TASK_ID} = '{task_id}' AND ExecutionStatus = 'Running'"
        async for _ in client.list_workflows(query, limit=1):
            return True
        return False

    async def _reconcile_open_runs(self, quiet_since: Any) -> int:
        """Runs the task store holds open (pending/running), untouched since
        ``quiet_since``, whose workflow has closed — terminated in Temporal, or its last
        task-store write failed — get their ending from Temporal, recorded once. This
        schedule is that repair's one owner: an API read never writes."""
        client = activity.client()
        done = 0
        for status in sorted(OPEN):
            cursor = None
            while True:
                items, cursor = await work(
                    self.task_store.list, status=status, limit=200, cursor=cursor
                )
                for rec in items:
                    if (rec.updated_at or rec.created_at) > quiet_since:
                        continue
                    handle = client.get_workflow_handle(
                        rec.workflow_id or workflow_id_for(rec.task_code, rec.task_id)
                    )
                    try:
                        desc = await handle.describe()
                    except RPCError as e:
                        if e.status != RPCStatusCode.NOT_FOUND:
                            raise
                        end: dict[str, Any] = {
                            "status": RunStatus.FAILED,
                            "error": end_error(
                                RunStatus.FAILED,
                                ErrorCode.INTERNAL.value,
                                "the run's workflow is not in Temporal "
                                "(never started, or past its retention)",
                            ),
                        }
                    else:
                        if desc.status in OPEN_STATUSES:
                            continue
                        end = await closed_run_end(handle, desc.status)
                        # the workflow's own start and close: the run's one duration
                        end["started_at"], end["at"] = desc.start_time, desc.close_time
                    try:
                        ending = RunSnapshot(
                            rec.task_id,
                            rec.task_code,
                            rec.workflow_id,
                            end["status"],
                            stats=end.get("stats") or {},
                            error=end.get("error"),
                            started_at=end.get("started_at"),
                            at=end.get("at"),
                            version=rec.version,
                        )
                        await work(write_runs, self.task_store, [ending], Write.REPAIR)
                    except (ConcurrentModification, TaskNotFound):
                        continue  # the run (or another clean-up) wrote first
                    log.info("task_store_reconciled", task_id=rec.task_id, status=end["status"])
                    done += 1
                if not cursor:
                    break
        return done

    def all(self) -> list[Callable[..., Any]]:
        return [self.cleanup_old_tasks]
