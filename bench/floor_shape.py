"""Workflows with a small run's Temporal shape and no work in them (bench/accept_floor.py).

``FloorShape`` is a small run of `pull_stock_quotes` as it runs today: two local
activities (the `running` record, prepare), fetch (which processes and emits its pages
beside it), three local activities (finalize, clean-up, the final record) — which is
also the lightest shape a run with I/O could take. ``FloorLight`` is lighter still, for
reference: the fetch and one local activity. (Before emit-while-fetching-v1 a small run's
shape was "LAALAAAL": prepare, emit, finalize and clean-up activities, process a local
activity.)"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

SHORT = timedelta(seconds=30)


@activity.defn(name="floor_step")
async def floor_step(n: int) -> int:
    return n + 1


async def _steps(n: int, shape: str) -> int:
    for step in shape:
        if step == "L":
            n = await workflow.execute_local_activity(floor_step, n, start_to_close_timeout=SHORT)
        else:
            n = await workflow.execute_activity(floor_step, n, start_to_close_timeout=SHORT)
    return n


@workflow.defn(name="FloorShape")
class FloorShape:
    @workflow.run
    async def run(self, n: int) -> int:
        return await _steps(n, "LLALLL")


@workflow.defn(name="FloorLight")
class FloorLight:
    @workflow.run
    async def run(self, n: int) -> int:
        return await _steps(n, "AL")
