"""Step 5 of a run and its bookkeeping: finalize (the task's hook, the sinks' finish, the
CronJob's callback), keep a run that failed with a retryable code for a retry, drop its
data, note the outages it waits out, and mirror its state into task storage."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.run_base import (
    RunStep,
    log,
    run_key,
    run_sinks,
)
from artemis.callback import finalize_body
from artemis.calls import hook, statement, work
from artemis.errors import ArtemisError, ErrorCode
from artemis.metrics import CALLBACKS, RUNS_FINISHED, RUNS_STARTED, WAITING
from artemis.retained import KEPT_FORMAT
from artemis.run_models import (
    FINALIZE_MAX_ATTEMPTS,
    CleanupRunInput,
    FinalizeInput,
    FinalizeOutcome,
    FinalizeResult,
    MirrorInput,
    OutageNote,
    RetainInput,
    RunRef,
)
from artemis.run_record import RunSnapshot, Write, write_runs
from artemis.run_state import WAITING_STEP, RunStatus, is_terminal
from artemis.sinks import RunEnd
from artemis.tasks.registry import get_task
from artemis.taskstore import ConcurrentModification, StorageUnavailable, TaskNotFound
from artemis.tracing import TraceContext, current_trace

# A run that staged at most this many pages has its data dropped on the event loop.
SMALL_DROP_PAGES = 8


class EndingActivities(RunStep):
    @activity.defn(name="note_outage")
    async def note_outage(self, inp: OutageNote) -> None:
        """A run started waiting on a dependency (each attempt), or it recovered: the
        run's event stream and the waiting gauge (the workflow logs the line)."""
        key = run_key(inp.run)
        w = inp.waiting
        if inp.kind == "waiting":
            WAITING.wait(key, str(w.get("dependency")), float(w.get("next_in_s") or 60))
        else:
            WAITING.done(key, str(w.get("dependency")))
        await self.record(inp.run, inp.kind, w, WAITING_STEP.get(str(w.get("dependency"))))

    @activity.defn(name="finalize_run")
    async def finalize_run(self, inp: FinalizeInput) -> FinalizeResult:
        trace = current_trace()
        stats = await self._task_ending(inp, trace)
        if inp.params is not None and inp.finish_sinks:
            finished = await self._finish_sinks(inp, trace)
            if finished:
                stats["sinks_finished"] = finished
        outcome, detail = FinalizeOutcome.SKIPPED, ""
        callback = None
        try:
            callback = await self.cronjob_client(inp.run, inp.callback, trace)
        except ArtemisError as e:
            if e.code != ErrorCode.INVALID_INPUT:
                # e.g. a run secret that this master key cannot read (a rotation half done):
                # retried, and if it never reads, a visible finalize failure, never dropped.
                e.retryable = True
                raise
            # A refused callback target (not allowed host) is reported, never retried.
            log.warning(
                "callback_finalize_failure",
                error=str(e),
                caller_run_id=(inp.callback or {}).get("caller_run_id"),
            )
            outcome, detail = FinalizeOutcome.REJECTED, str(e)
        if callback is not None:
            attempt = activity.info().attempt
            body = finalize_body(inp.status, stats, inp.error_message)
            suffix = f":retry{inp.retry_attempt}" if inp.retry_attempt else ""
            outcome, detail = await callback.finalize(body, attempt, suffix)
            if outcome == FinalizeOutcome.RETRY:
                if attempt < FINALIZE_MAX_ATTEMPTS:
                    CALLBACKS.labels("finalize", FinalizeOutcome.RETRY.value).inc()
                    raise ApplicationError(
                        f"finalize callback failed: {detail}", type=ErrorCode.CALLBACK_ERROR.value
                    )
                log.error(
                    "callback_finalize_gave_up",
                    caller_run_id=callback.target.caller_run_id,
                    attempts=attempt,
                    error=detail,
                )
                outcome = FinalizeOutcome.GAVE_UP
        CALLBACKS.labels("finalize", outcome.value).inc()
        log.info(
            "run_finalized",
            status=inp.status,
            callback=outcome,
            **{k: v for k, v in stats.items() if isinstance(v, int)},
        )
        return FinalizeResult(callback=outcome, detail=detail, stats=stats)

    async def _task_ending(self, inp: FinalizeInput, trace: TraceContext) -> dict[str, Any]:
        """The task's own hooks at the end: ``finalize`` (a completed run: its stats, as
        the hook leaves them) and ``run_ended``. Neither fails the run."""
        stats = dict(inp.stats)
        if inp.params is None:
            return stats
        task = get_task(inp.run.task_code)
        if inp.status == RunStatus.COMPLETED:
            try:
                ctx = await self.task_context(task, inp.run, inp.params, trace)
                stats = await hook(task.finalize, ctx, stats)
            except Exception as e:  # finalize must not fail the run
                log.warning("task_finalize_hook_failed", error=f"{type(e).__name__}: {e}")
        try:
            ended = await self.task_context(task, inp.run, inp.params, trace)
            await hook(task.run_ended, ended, inp.status, inp.error_code)
        except Exception as e:  # an execution record is bookkeeping: never fail here
            log.warning("task_run_ended_hook_failed", error=f"{type(e).__name__}: {e}")
        return stats

    async def _finish_sinks(self, inp: FinalizeInput, trace: TraceContext) -> dict[str, Any]:
        """Each sink's last word on the run (the files sink's manifest), before the
        callback says the run is done. A failure is retried with the finalize; after the
        last attempt it is reported in the stats, never dropped in silence."""
        assert inp.params is not None
        task = get_task(inp.run.task_code)
        ctx = await self.task_context(task, inp.run, inp.params, trace, inp.output)
        end = RunEnd(run_key(inp.run), inp.run.task_code, inp.run.task_id, inp.status)
        finished: dict[str, Any] = {}
        try:
            sinks = await run_sinks(task, ctx)
        except ArtemisError as e:
            log.error("sinks_unavailable_at_finalize", error=str(e))
            return {"error": str(e)}
        for sink in sinks:
            try:
                result = await sink.finish(end)
            except Exception as e:
                retryable = not isinstance(e, ArtemisError) or e.retryable
                if retryable and activity.info().attempt < FINALIZE_MAX_ATTEMPTS:
                    raise
                # The callback still goes; the failure is in the run's stats and the log.
                log.error("sink_finish_failed", sink=sink.name, error=f"{type(e).__name__}: {e}")
                result = {"error": f"{type(e).__name__}: {e}"}
            if result is not None:
                finished[sink.name] = result
        return finished

    @activity.defn(name="retain_run")
    async def retain_run(self, inp: RetainInput) -> None:
        """A run failed with a retryable code: keep its request and carry (references and
        counts only) next to its staged pages and secret, for POST /tasks/{id}/retry."""
        await statement(
            self.db,
            self.retained.keep,
            inp.run,
            inp.error_code,
            inp.error_message,
            {
                "format": KEPT_FORMAT,
                "build": self.build_id,
                "request": asdict(inp.request),
                "carry": asdict(inp.carry),
            },
            inp.retain_s,
        )
        log.info(
            "run_retained",
            error_code=inp.error_code,
            next_seq=inp.carry.next_seq,
            undelivered=inp.carry.undelivered,
            retain_s=inp.retain_s,
        )

    @activity.defn(name="cleanup_run")
    async def cleanup_run(self, inp: CleanupRunInput) -> None:
        """After a finalize was sent: drop the run's staged pages and its secret."""
        small = inp.pages is not None and inp.pages <= SMALL_DROP_PAGES
        await self._drop_run_data(inp.run, small)

    async def _drop_run_data(self, run: RunRef, small: bool = False) -> None:
        """``small``: a few rows, a statement; else batch-sized work (a run's staged pages
        may be many)."""
        key = run_key(run)
        if small:
            await statement(self.db, self.data.drop, key)
        else:
            await work(self.data.drop, key)
        log.info("run_data_dropped")

    @activity.defn(name="mirror_state")
    async def mirror_state(self, inp: MirrorInput) -> str:
        """Record the run's state in task storage (``set_status``: one UPDATE on SQL): the
        status, the snapshot of its stats and error the workflow holds, and its start and
        end on the workflow's clock."""

        def write() -> str:
            run = inp.run
            # The API writes `pending` concurrently with its answer; whichever comes first creates
            # the record, the other finds it (insert-if-absent).
            snapshot = RunSnapshot(
                run.task_id,
                run.task_code,
                run.workflow_id,
                inp.status,
                params=inp.params,
                stats=inp.stats or None,
                error=inp.error,
                started_at=_at(inp.started_ms),
                at=_at(inp.ended_ms),
            )
            try:
                write_runs(self.task_store, [snapshot], Write.STATUS)
            except (StorageUnavailable, TaskNotFound, ConcurrentModification) as e:
                raise ArtemisError(
                    ErrorCode.INTERNAL, f"task store: {type(e).__name__}: {e}", retryable=True
                ) from None
            return inp.status

        if is_terminal(inp.status):
            # The stream's end goes first: it must not wait on a task-store outage.
            await self.record(
                inp.run,
                "run_status",
                {"status": inp.status, "stats": inp.stats, "error": inp.error, "steps": inp.steps},
            )
        # (the store is built on first use, in a thread: a Redis client's import is slow)
        status = await statement(self.services.built_task_store, write)
        if inp.status == RunStatus.RUNNING:
            RUNS_STARTED.labels(inp.run.task_code).inc()
        elif is_terminal(inp.status):
            RUNS_FINISHED.labels(inp.run.task_code, inp.status).inc()
        log.info("task_state_recorded", status=status)
        return status


def _at(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)
