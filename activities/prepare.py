"""Step 1 of a run: its params validated and prepared by its task (a registry lookup,
say), its size, its source's retry, circuit-breaker and rate settings; or the child runs
it fans out into (a backfill's windows, a window split over the source's result cap)."""

from __future__ import annotations

from typing import Any

from temporalio import activity

from activities.run_base import RunStep, log
from artemis.calls import hook, hooks, work
from artemis.run_models import (
    ChildSliceInput,
    PrepareInput,
    SplitInput,
    SplitResult,
)
from artemis.run_state import CircuitBreaker, FetchRetry, PrepareResult
from artemis.tasks import TaskContext, TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import current_trace


class PrepareActivities(RunStep):
    @activity.defn(name="prepare_params")
    async def prepare_params(self, inp: PrepareInput) -> PrepareResult:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        params = await hook(task.prepare_params, inp.params, self.settings, trusted=True)
        ctx = await self.task_context(task, inp.run, params.model_dump(mode="json"), trace)
        # The task's hooks may read its registry (a database): one call into all of them.
        prepared = await hooks(
            task, PREPARE_HOOKS, _prepared, task, ctx, params.model_dump(mode="json")
        )
        if prepared.rate_key and self.on_rate_key is not None:
            try:
                await self.on_rate_key(prepared.rate_key)
            except Exception as e:  # the periodic refresh still comes
                log.warning("provenance_queue_not_ensured", error=f"{type(e).__name__}: {e}")
        return prepared

    @activity.defn(name="split_run")
    async def split_run(self, inp: SplitInput) -> SplitResult:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = await self.task_context(task, inp.run, inp.params, trace)
        children = await work(task.split, ctx, inp.details)
        parallelism = await work(task.split_parallelism, ctx)
        log.info(
            "run_split", pieces=len(children or []), parallelism=parallelism, details=inp.details
        )
        return SplitResult(children=children, parallelism=parallelism)

    @activity.defn(name="plan_child_slice")
    async def plan_child_slice(self, inp: ChildSliceInput) -> SplitResult:
        """The params of a fan-out's child runs ``offset`` .. ``offset + limit - 1``."""
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = await self.task_context(task, inp.run, inp.params, trace)
        children = await work(task.child_slice, ctx, inp.offset, inp.limit)
        return SplitResult(children=children)


# The hooks ``_prepared`` calls (``build_sources``, in the default ``total_hint``, does
# no I/O by its contract; tests/unit/test_store_calls.py checks the list).
PREPARE_HOOKS = (
    "plan_children",
    "search_attributes",
    "completeness_tolerance",
    "total_hint",
    "fetch_retry",
    "circuit_breaker",
    "rate_key",
    "outage_tolerance",
)


def _prepared(task: TaskUnit, ctx: TaskContext, params: dict[str, Any]) -> PrepareResult:
    """What the task's hooks say of the run (synchronous: they may query the registry)."""
    plan = task.plan_children(ctx)
    search = {k: str(v) for k, v in task.search_attributes(ctx).items() if v}
    if plan is not None:
        log.info("params_prepared", children=plan.count, parallelism=plan.parallelism)
        return PrepareResult(
            params=params,
            total=plan.count,
            fan_out=plan.count,
            parallelism=plan.parallelism,
            search=search,
            tolerance_pct=task.completeness_tolerance(ctx),
        )
    total = task.total_hint(ctx)
    retry = task.fetch_retry(ctx)
    circuit = task.circuit_breaker(ctx)
    rate_key = task.rate_key(ctx)
    log.info("params_prepared", total=total, fetch_retry=retry, circuit=circuit, rate_key=rate_key)
    return PrepareResult(
        params=params,
        total=total,
        fetch_retry=FetchRetry(**retry) if retry else None,
        circuit=CircuitBreaker(**circuit) if circuit else None,
        rate_key=rate_key,
        search=search,
        tolerance_pct=task.completeness_tolerance(ctx),
        outage_tolerance_s=task.outage_tolerance(ctx),
    )
