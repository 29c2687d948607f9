"""Fan-out: a run whose window is cut into child runs (a backfill's windows; a window
over the source's result cap split into pieces). The children fetch, emit and finish
their own sinks; their counts add up in the parent, and a split's pieces must add up to
the count the source gave for the whole window."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import retry_policies
from workflows.run_core import RunContext

with workflow.unsafe.imports_passed_through():
    from activities.task_run import TaskRunActivities
    from artemis.completeness import is_short
    from artemis.errors import ErrorCode
    from artemis.run_models import (
        WORKFLOW_NAME,
        ChildSliceInput,
        RunRequest,
        RunResult,
        SplitInput,
        SplitResult,
        workflow_id_for,
    )
    from artemis.run_state import LOOP_STEPS
    from artemis.temporal.failures import details_of


class FanOut:
    """Child runs: a backfill's windows, or the pieces of a window split over a cap."""

    def __init__(self, run: RunContext) -> None:
        self.run = run

    async def split(self, e: ActivityError) -> None:
        details = details_of(e)
        split: SplitResult = await workflow.execute_local_activity_method(
            TaskRunActivities.split_run,
            SplitInput(run=self.run.ref, params=self.run.params or {}, details=details),
            start_to_close_timeout=timedelta(seconds=30),
            summary="Split the window over the result cap",
        )
        if not split.children:
            raise e
        self.run.log("run_split", pieces=len(split.children), count=details.get("count"))
        self.run.state.split_into(len(split.children))
        await self.run_children(split.children, split.parallelism, prefix="s")
        count = details.get("count")
        if isinstance(count, int):
            # The pieces must add up to the window the source counted: a gap between
            # them would lose records while every piece looks complete.
            self.run.state.expect(count)
            got = self.run.state.stats["records_fetched"]
            tolerance_pct = self.run.state.tolerance_pct
            if is_short(count, got, tolerance_pct):
                raise ApplicationError(
                    f"the split window: expected {count} records (the source's count of the "
                    f"whole window), got {got} from its {len(split.children)} pieces, beyond "
                    f"the tolerance of {tolerance_pct:g} %",
                    {"expected_total": count, "records_fetched": got},
                    type=ErrorCode.INCOMPLETE,
                    non_retryable=True,
                )

    async def run_children(
        self, children: list[dict[str, Any]], parallelism: int, prefix: str = "w"
    ) -> None:
        """Run child task runs (a split's pieces), ``parallelism`` at a time; their records
        go to the sinks from the children, their counts add up here."""
        self.run.enter("step_fetch")
        gate = asyncio.Semaphore(max(1, parallelism))

        async def one(n: int, params: dict[str, Any]) -> None:
            async with gate:
                self.run.stop_point()
                await self._child(f"{prefix}{n}", params)

        await asyncio.gather(*(one(n, p) for n, p in enumerate(children)))
        self.run.state.complete(*LOOP_STEPS)

    async def run_planned(self) -> bool:
        """The run's planned child runs (a backfill's windows), from the next one not
        started, ``parallelism`` at a time: their params asked a slice at a time, at most
        ``tuning.children_per_run`` started in this generation. True when every child ran;
        False when this generation's share is done (every child it started has ended) and
        the run goes on as new."""
        state, tuning = self.run.state, self.run.req.tuning
        total = state.fan_out or 0
        self.run.enter("step_fetch")
        gate = asyncio.Semaphore(max(1, state.parallelism))
        running: list[asyncio.Task[None]] = []

        async def one(n: int, params: dict[str, Any]) -> None:
            try:
                await self._child(f"w{n}", params)
            finally:
                gate.release()

        started = 0
        while state.children_next < total and started < tuning.children_per_run:
            if started and workflow.info().is_continue_as_new_suggested():
                break
            limit = min(CHILD_SLICE, total - state.children_next, tuning.children_per_run - started)
            planned = await self._slice(state.children_next, limit)
            if not planned:
                raise ApplicationError(
                    f"the plan of {total} child runs gave none at {state.children_next}",
                    type=ErrorCode.INTERNAL,
                    non_retryable=True,
                )
            for params in planned:
                await gate.acquire()
                _raise_failed(running)
                self.run.stop_point()
                running.append(asyncio.create_task(one(state.children_next, params)))
                state.children_next += 1
                started += 1
            _raise_failed(running)
            running = [t for t in running if not t.done()]
        await asyncio.gather(*running)
        if state.children_next < total:
            return False
        state.complete(*LOOP_STEPS)
        return True

    async def _slice(self, offset: int, limit: int) -> list[dict[str, Any]]:
        sliced: SplitResult = await workflow.execute_local_activity_method(
            TaskRunActivities.plan_child_slice,
            ChildSliceInput(
                run=self.run.ref, params=self.run.params or {}, offset=offset, limit=limit
            ),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=retry_policies.PREPARE,
            summary=f"Plan child runs {offset}-{offset + limit - 1}",
        )
        return sliced.children or []

    async def _child(self, suffix: str, params: dict[str, Any]) -> None:
        """One child run (task id ``{task id}.{suffix}``), its counts added here."""
        req = self.run.req
        child_id = f"{req.task_id}.{suffix}"
        result: RunResult = await workflow.execute_child_workflow(
            WORKFLOW_NAME,
            RunRequest(
                task_code=req.task_code,
                task_id=child_id,
                params=params,
                trace_id=req.trace_id,
                parent_span_id=req.parent_span_id,
                request_id=req.request_id,
                output=req.output,
                callback=None,
                timeout_s=req.timeout_s,
                tuning=req.tuning,
                root_task_id=self.run.ref.root_task_id,
                secrets_key=req.secrets_key,
                role=req.role,
            ),
            id=workflow_id_for(req.task_code, child_id),
            result_type=RunResult,
            # what the window harvests, and its own task id
            static_summary=" · ".join(
                str(x)
                for x in (
                    req.task_code,
                    params.get("provenance"),
                    f"{params.get('start')}..{params.get('end')}",
                    f"task {child_id}",
                )
                if x
            ),
        )
        self.run.state.child_ended(result.stats)
        self.run.details()


# Child runs' params asked per local activity (the task bounds the result's bytes too).
CHILD_SLICE = 100


def _raise_failed(tasks: list[asyncio.Task[None]]) -> None:
    """A child run that failed fails the parent now: no further child starts."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            task.result()
