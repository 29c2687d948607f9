"""A retry of a run that failed with a retryable code (``POST /tasks/{id}/retry``,
docs/api.md): a new execution under the same workflow id, from the run's kept state,
started through the run service (``starter/service.py``) that starts every run."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError
from temporalio.client import WorkflowHandle
from temporalio.converter import value_to_type
from temporalio.exceptions import WorkflowAlreadyStartedError

from artemis.calls import work
from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.owners import owned_lock, owner_of
from artemis.retained import KEPT_FORMAT, Retained
from artemis.run_models import WORKFLOW_NAME, RunRequest, lock_workflow_id, workflow_id_for
from artemis.run_record import RunSnapshot, Write, write_runs
from artemis.run_state import RETRYABLE_ENDINGS, TERMINAL, RunState, RunStatus
from artemis.sinks.sealing import SECRET_REF
from artemis.tasks.base import TaskUnit
from artemis.tasks.registry import get_task
from artemis.taskstore import TaskData
from artemis.temporal.runs import OPEN_STATUSES, closed_run_end
from artemis.tracing import TraceContext
from starter.service import RunService, Started
from starter.ssrf import check_request_urls

log = get_logger(__name__)


class RunRetries:
    """The retry of one run, through ``runs``: its reads, its locks, its start."""

    def __init__(self, runs: RunService) -> None:
        self.runs = runs

    async def retry(
        self, task_id: str, trace: TraceContext, request_id: str | None
    ) -> dict[str, Any]:
        """Finish a run that failed with a retryable code from its kept state
        (docs/api.md): a new execution under the same workflow id that first delivers what
        was staged and not delivered, then fetches on from the checkpoint. 404 unknown;
        409 running, completed, cancelled or failed for good (naming why); 410 its state
        was cleaned up, or was kept by a build whose format this one does not read."""
        record = await self.runs.record(task_id)
        retained = Retained(self.runs.settings.database.url)
        kept_key = await work(retained.key_of, task_id)
        workflow_id = record.workflow_id if record is not None else None
        handle = await self.runs.find(task_id, workflow_id)
        if record is None and handle is None and kept_key is None:
            raise ArtemisError(ErrorCode.TASK_NOT_FOUND, f"no task with id {task_id!r}")
        _check_retryable(task_id, await self._run_end(task_id, record, handle))
        kept_key, kept = await self._claim_kept(retained, kept_key, task_id)
        req, carry = self._retry_request(kept["state"], trace, request_id)
        wf_id = workflow_id or workflow_id_for(req.task_code, task_id)
        try:
            # Its URLs again, against today's allow-list and DNS: a saved request may be
            # up to runs.retain_failed_s old.
            await self._check_saved_urls(req)
        except BaseException:
            await work(retained.release, kept_key)
            raise
        new = await self._start_retry(req, wf_id, kept, retained, kept_key)
        log.info(
            "run_retry_started",
            task_id=task_id,
            workflow_id=wf_id,
            attempt=carry.retry_attempt,
            next_seq=carry.next_seq,
            undelivered=carry.undelivered,
        )
        return {
            "task_code": req.task_code,
            "task_id": task_id,
            "workflow_id": wf_id,
            "run_id": new.result_run_id,
            "retry_attempt": carry.retry_attempt,
            "retried_error": kept["error_code"],
            "resume_from_seq": carry.next_seq,
            "undelivered": carry.undelivered,
            "links": {"self": f"/tasks/{task_id}", "events": f"/tasks/{task_id}/events"},
        }

    async def _run_end(
        self, task_id: str, record: Any, handle: WorkflowHandle | None
    ) -> dict[str, Any] | None:
        """How the run to retry ended, from Temporal or else from its task-store record
        (None: neither knows); 409 while it runs."""
        end: dict[str, Any] | None = None
        if handle is not None:
            desc = await handle.describe()
            if desc.status in OPEN_STATUSES:
                raise ArtemisError(
                    ErrorCode.CONFLICT, f"task {task_id} is running: nothing to retry"
                )
            end = await closed_run_end(handle, desc.status)
        elif record is not None and record.status in TERMINAL:
            end = {"status": record.status, "error": record.error}
        return end

    async def _claim_kept(
        self, retained: Retained, kept_key: str | None, task_id: str
    ) -> tuple[str, dict[str, Any]]:
        """The failed run's kept state and its key, taken for this retry: 410 when it was
        cleaned up or kept in a format this code does not read, 409 when another retry
        took it first."""
        kept = await work(retained.load, kept_key) if kept_key else None
        if kept is None:
            raise ArtemisError(
                ErrorCode.GONE,
                f"task {task_id}: its kept state (checkpoint, staged pages, delivery "
                f"ledger) was cleaned up after runs.retain_failed_s "
                f"({self.runs.settings.runs.retain_failed_s:g} s) or never kept",
            )
        assert kept_key is not None
        kept_format = kept["state"].get("format", 1)
        if kept_format != KEPT_FORMAT:
            raise ArtemisError(
                ErrorCode.GONE,
                f"task {task_id}: its kept state was written by worker build "
                f"{kept['state'].get('build') or 'unknown'} in format {kept_format}, which "
                f"this build (format {KEPT_FORMAT}) does not read: start the task again "
                f"(POST /tasks/{kept_key.split('/')[0]}/run)",
                details={"kept_by_build": kept["state"].get("build"), "format": kept_format},
            )
        if not await work(retained.take, kept_key):
            raise ArtemisError(ErrorCode.CONFLICT, f"task {task_id}: a retry is already starting")
        return kept_key, kept

    def _owner_role(self, owner: str) -> str:
        """The role of the token named ``owner`` (an API without tokens: admin)."""
        tokens = self.runs.settings.server.tokens()
        if not tokens:
            return "admin"
        return next((t.role for t in tokens if t.name == owner), "client")

    def _retry_request(
        self, state: dict[str, Any], trace: TraceContext, request_id: str | None
    ) -> tuple[RunRequest, RunState]:
        """The saved run's request and carried state, for the retry's new execution."""
        req: RunRequest = value_to_type(RunRequest, state["request"], [])
        if "role" not in state["request"]:
            # A kept request that names no role: its owner's role now.
            req.role = self._owner_role(owner_of(req.task_id))
        carry: RunState = value_to_type(RunState, state["carry"], [])
        carry = dataclasses.replace(carry, retry_start=True, retry_attempt=carry.retry_attempt + 1)
        req = dataclasses.replace(
            req,
            carry=carry,
            trace_id=trace.trace_id,
            parent_span_id=trace.span_id,
            request_id=request_id or req.request_id,
            # The operator's current outage settings (a longer tolerance, say).
            tuning=self.runs.settings.runs.run_tuning(),
        )
        return req, carry

    async def _start_retry(
        self, req: RunRequest, wf_id: str, kept: dict[str, Any], retained: Retained, kept_key: str
    ) -> WorkflowHandle:
        """Start the retry's execution (``req``, carrying the failed run's state); when it
        does not start, the task-store record as it was and the kept state released (409
        when a run of the id is open)."""
        carry, task_id = req.carry, req.task_id
        assert carry is not None  # (a retry's request carries the run's state)
        what = await work(_what, req.task_code, req.params, self.runs.settings)
        # Open again before the run starts (it records `running` itself once it does).
        before = await self._reopen(task_id, req.task_code, wf_id, carry.stats)
        held: WorkflowHandle | Started | None = None
        try:
            held = await self._retry_lock(req, wf_id)
            handle = await self.runs.start_workflow(
                req,
                wf_id,
                exclusive=True,  # never concurrently with a run of the same id
                summary=(req.task_code, what, f"task {task_id}", f"retry {carry.retry_attempt}"),
                details=f"Retry {carry.retry_attempt} of task `{task_id}` (failed "
                f"`{kept['error_code']}`), from page #{carry.next_seq}.",
                owner=owner_of(task_id),  # the retried run stays its owner's
            )
        except WorkflowAlreadyStartedError:
            await self.runs.unlock(held, "the task id's run is open")
            await self._restore(task_id, before)
            await work(retained.release, kept_key)
            raise ArtemisError(
                ErrorCode.CONFLICT, f"task {task_id} is running: nothing to retry"
            ) from None
        except Exception as e:
            await self.runs.unlock(held, f"the retry did not start ({type(e).__name__})", e)
            await self._restore(task_id, before)
            await work(retained.release, kept_key)
            raise
        if isinstance(held, WorkflowHandle):
            await self.runs.bind_lock(held, handle)
        return handle

    async def _retry_lock(self, req: RunRequest, wf_id: str) -> WorkflowHandle | None:
        """The task's execution lock taken for a retry of ``req``'s run (None: the task has
        none, or the run's own workflow id is its lock: a run started so keeps it)."""
        task = get_task(req.task_code)
        if type(task).lock_name is TaskUnit.lock_name:
            return None  # a task without one
        lock = task.lock_name(await work(task.prepare_params, req.params, self.runs.settings))
        if not lock or wf_id.startswith(lock_workflow_id("")):
            return None
        owner = owner_of(req.task_id)
        held = await self.runs.take_lock(lock, req, owner, req.role, "none")
        if isinstance(held, Started):  # the failed run's own lock, closing a moment after it
            await self.runs.locks.closing(owned_lock(owner, lock))
            held = await self.runs.take_lock(lock, req, owner, req.role, "none")
        if isinstance(held, Started):  # still this task id's: its run is open
            raise WorkflowAlreadyStartedError(wf_id, WORKFLOW_NAME)
        return held

    async def _check_saved_urls(self, req: RunRequest) -> None:
        """A saved run's request URLs (source params, sink endpoint, callback) checked as
        a new start's are: INVALID_INPUT naming the field when one may no longer be
        reached."""
        endpoint = req.output.get("http_endpoint")
        if endpoint == SECRET_REF:
            key = req.secrets_key or f"{req.task_code}/{req.task_id}"
            endpoint = await work(self.runs.secrets.get, key, "output.http_endpoint")
        await check_request_urls(
            self.runs.settings,
            req.task_code,
            get_task(req.task_code),
            req.params,
            {"http_endpoint": endpoint} if isinstance(endpoint, str) else None,
            req.callback,
        )

    async def _reopen(self, task_id: str, code: str, workflow_id: str, stats: dict) -> Any:
        """The task store's record of a retried run: open again, its old error gone.
        Returns the record as it was (None: none, or the store is unreachable)."""
        opened = RunSnapshot(task_id, code, workflow_id, RunStatus.PENDING.value, stats=stats)
        try:
            (before,) = await work(write_runs, self.runs.store, [opened], Write.EXACT)
            return before
        except Exception as e:  # the run records itself when it starts
            log.warning("task_store_unavailable", task_id=task_id, error=f"{type(e).__name__}: {e}")
            return None

    async def _restore(self, task_id: str, before: TaskData | None) -> None:
        """A retry that did not start: the record as it was."""
        if before is None:
            return
        try:
            await work(write_runs, self.runs.store, [RunSnapshot.of(before)], Write.EXACT)
        except Exception as e:
            log.warning("task_store_unavailable", task_id=task_id, error=f"{type(e).__name__}: {e}")


def _check_retryable(task_id: str, end: dict[str, Any] | None) -> None:
    """409 for a run no retry may finish: completed, cancelled, or failed with a code no
    retry can fix (a run whose end is unknown counts as failed)."""
    status = (end or {}).get("status") or RunStatus.FAILED
    code = ((end or {}).get("error") or {}).get("code")
    if status == RunStatus.COMPLETED:
        raise ArtemisError(ErrorCode.CONFLICT, f"task {task_id} completed: nothing to retry")
    if status == RunStatus.CANCELLED:
        raise ArtemisError(
            ErrorCode.CONFLICT, f"task {task_id} was cancelled (CANCELLED is not retryable)"
        )
    if end is not None and (code or ErrorCode.INTERNAL) not in RETRYABLE_ENDINGS:
        raise ArtemisError(
            ErrorCode.CONFLICT,
            f"task {task_id} failed with {code}, which no retry can fix (retryable: "
            f"{', '.join(RETRYABLE_ENDINGS)})",
            details={"error_code": code},
        )


def _what(code: str, params: dict[str, Any], settings: Settings) -> str:
    """What a run of ``params`` harvests (its UI summary), or "" when they do not read."""
    task = get_task(code)
    try:
        return task.describe(task.prepare_params(params, settings))
    except (ValidationError, ArtemisError, TypeError, ValueError):
        return ""
