"""The boundary every activity of a run passes through, as a Temporal activity
interceptor: it binds the run's log fields and trace span, records the attempt in the
run's event stream and the metrics, and turns domain errors into typed Temporal failures
(with the error table's retry budget, docs/api.md).

It applies to the activities whose input carries the run (``inp.run`` is a ``RunRef``);
the housekeeping activities (clean-up, reclaim, alerts) pass straight through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any, Protocol

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from artemis.errors import ArtemisError, ErrorCode
from artemis.events import ACTIVITY_STEP
from artemis.ledger import Ledger
from artemis.logsetup import get_logger
from artemis.metrics import ACTIVITY_SECONDS
from artemis.redact import redact_text
from artemis.run_models import (
    BatchInput,
    EmitResult,
    FetchInput,
    FetchResult,
    FinalizeInput,
    FinalizeResult,
    RunRef,
    SplitResult,
)
from artemis.run_state import PrepareResult
from artemis.tasks.registry import get_task
from artemis.tracing import TraceContext, new_span_id, use_trace

log = get_logger("artemis.activities")


class Recorder(Protocol):
    """Records one event of a run (``soon``: queued, committed with the next awaited one)."""

    def __call__(
        self,
        run: RunRef,
        kind: str,
        data: dict[str, Any],
        step: str | None = None,
        soon: bool = False,
    ) -> Awaitable[None]: ...


def trace_for(run: RunRef, spans: bool = True) -> TraceContext:
    """The activity's span: the OpenTelemetry span of Temporal's interceptor when it
    belongs to the run's trace, else a fresh span id in that trace. ``spans``: whether
    the worker's client has that interceptor (only when spans are exported); without it
    there is no span to look for."""
    if not spans:
        return TraceContext(run.trace_id, new_span_id(), run.parent_span_id)
    from opentelemetry import trace

    sc = trace.get_current_span().get_span_context()
    if sc.is_valid and format(sc.trace_id, "032x") == run.trace_id:
        return TraceContext(run.trace_id, format(sc.span_id, "016x"), run.parent_span_id)
    return TraceContext(run.trace_id, new_span_id(), run.parent_span_id)


class RunActivityBoundary(Interceptor):
    """Worker interceptor: ``Worker(..., interceptors=[RunActivityBoundary(record)])``.
    ``spans``: whether Temporal's tracing interceptor runs (``artemis.tracing.exporting``)."""

    def __init__(self, record: Recorder, spans: bool = True) -> None:
        self.record = record
        self.spans = spans

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Boundary(next, self.record, self.spans)


class _Boundary(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, record: Recorder, spans: bool) -> None:
        super().__init__(next)
        self.record = record
        self.spans = spans

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        inp = input.args[0] if input.args else None
        run = getattr(inp, "run", None)
        if not isinstance(run, RunRef):
            return await self.next.execute_activity(input)
        trace = trace_for(run, self.spans)
        token = use_trace(trace)
        info = activity.info()
        name = info.activity_type
        _bind_log_fields(run, trace, info)
        step = ACTIVITY_STEP.get(name)
        ident = _ident(info, inp)
        began = time.perf_counter()
        outcome, error = "ok", None
        try:
            if step is not None:
                await self._record_start(run, ident, inp, step)
            result = await self.next.execute_activity(input)
            if step is not None:
                await self._record_result(run, ident, inp, result, step, began)
            return result
        except ArtemisError as e:
            error = _domain_failure(e, run, info.attempt)
            outcome = "error"
            raise as_application_error(e) from None
        except asyncio.CancelledError:
            log.info("activity_cancelled")
            outcome = "cancelled"
            error = {"code": ErrorCode.CANCELLED.value, "message": "activity cancelled"}
            raise
        except ApplicationError as e:
            outcome = "error"
            error = _application_failure(e)
            if error["message"] != e.message:
                raise _redacted(e, str(error["message"])) from None
            raise
        except Exception as e:
            log.exception("activity_crashed")
            outcome = "error"
            text = redact_text(f"{type(e).__name__}: {e}")
            error = {"code": ErrorCode.INTERNAL.value, "message": text}
            raise ApplicationError(text, type=ErrorCode.INTERNAL.value) from None
        finally:
            ACTIVITY_SECONDS.labels(name, outcome).observe(time.perf_counter() - began)
            if error is not None and step is not None:
                await asyncio.shield(
                    self.record(
                        run,
                        "activity_result",
                        {**ident, "ok": False, "error": error, "duration_ms": _ms_since(began)},
                        step,
                    )
                )
            structlog.contextvars.clear_contextvars()
            token.var.reset(token)

    async def _record_start(self, run: RunRef, ident: dict[str, Any], inp: Any, step: str) -> None:
        """The attempt's `activity_start` event (a finalize's names the run's status)."""
        start = dict(ident)
        if isinstance(inp, FinalizeInput):
            start["status"] = inp.status
        # Committed with the activity's result (or its next event): one transaction
        # for a short activity's events, never a wait before its work.
        await self.record(run, "activity_start", start, step, soon=True)

    async def _record_result(
        self, run: RunRef, ident: dict[str, Any], inp: Any, result: Any, step: str, began: float
    ) -> None:
        """The attempt's `activity_result` event when it succeeded (counts only)."""
        data = {"ok": True, "result": _result_data(inp, result)}
        await self.record(
            run,
            "activity_result",
            {**ident, **data, "duration_ms": _ms_since(began)},
            step,
        )


def _bind_log_fields(run: RunRef, trace: TraceContext, info: activity.Info) -> None:
    """The run's and the attempt's fields on every log line of the activity."""
    structlog.contextvars.bind_contextvars(
        trace_id=run.trace_id,
        span_id=trace.span_id,
        request_id=run.request_id,
        task_code=run.task_code,
        task_id=run.task_id,
        workflow_id=run.workflow_id,
        activity=info.activity_type,
        attempt=info.attempt,
    )


def _ident(info: activity.Info, inp: Any) -> dict[str, Any]:
    """What names the attempt in its events."""
    return {
        "activity": info.activity_type,
        "activity_id": info.activity_id,
        "run_id": info.workflow_run_id,
        "attempt": info.attempt,
        "summary": _summary(info.activity_type, inp),
    }


def _domain_failure(e: ArtemisError, run: RunRef, attempt: int) -> dict[str, Any]:
    """A domain error, redacted in place and made final once its retry budget is spent;
    logged, and returned as the attempt's error for its event."""
    # Redacted before it leaves the activity: failures are plain text in history
    # (even with payload encryption), and reach events and the task store.
    e.message = redact_text(e.message)
    if e.retryable and attempt > e.code.info.max_retries and _budgeted(run):
        # The error table's max retries (docs/api.md), enforced by Temporal: this
        # failure is final, so the retry policy stops here.
        e.retryable = False
        log.warning("error_budget_spent", code=e.code.value, attempt=attempt)
    log.warning("activity_failed", error=str(e), code=e.code.value, retryable=e.retryable)
    return {"code": e.code.value, "message": e.message, "retryable": e.retryable}


def _application_failure(e: ApplicationError) -> dict[str, Any]:
    """An activity's own ApplicationError as the attempt's error for its event (its
    message redacted)."""
    return {
        "code": e.type or ErrorCode.INTERNAL,
        "message": redact_text(e.message),
        "retryable": not e.non_retryable,
    }


def _redacted(e: ApplicationError, message: str) -> ApplicationError:
    """The same failure as ``e`` with its message redacted."""
    return ApplicationError(
        message,
        *e.details,
        type=e.type,
        non_retryable=e.non_retryable,
        next_retry_delay=e.next_retry_delay,
    )


def as_application_error(e: ArtemisError) -> ApplicationError:
    return ApplicationError(
        e.message,
        {"code": e.code.value, **e.details},
        type=e.code.value,
        non_retryable=not e.retryable,
        next_retry_delay=timedelta(seconds=e.retry_after_s) if e.retry_after_s else None,
    )


def _summary(name: str, inp: Any) -> str:
    """A short line for the event stream: what this attempt works on."""
    if isinstance(inp, FetchInput):
        return f"pages from #{inp.first_seq}"
    if isinstance(inp, BatchInput):
        return f"pages #{inp.first_seq}-#{inp.last_seq}"
    if isinstance(inp, FinalizeInput):
        return f"status {inp.status}"
    return name


def _result_data(inp: Any, result: Any) -> dict[str, Any]:
    """Counts only (never records or secrets) for the event stream."""
    if isinstance(result, PrepareResult):
        return {"total": result.total, "children": result.fan_out or 0}
    if isinstance(result, FetchResult):
        return {
            "pages": result.pages,
            "records": result.records,
            "next_seq": result.next_seq,
            "done": result.done,
            "units_done": result.units_done,
            "expected_total": result.expected_total,
            "streamed": None if result.streamed is None else result.streamed.to_json(),
        }
    if isinstance(result, Ledger):  # process_batch's
        return {**result.to_json(), "last_seq": inp.last_seq}
    if isinstance(result, EmitResult):
        return {**result.ledger.to_json(), "last_seq": inp.last_seq}
    if isinstance(result, FinalizeResult):
        return {"callback": result.callback}
    if isinstance(result, SplitResult):
        return {"pieces": len(result.children or [])}
    return {}


def _budgeted(run: RunRef) -> bool:
    try:
        return bool(get_task(run.task_code).error_budgets)
    except ArtemisError:
        return False


def _ms_since(began: float) -> int:
    return int((time.perf_counter() - began) * 1000)
