"""The workflow's payloads stay bounded however large the run: the real TaskRunWorkflow on
a real Temporal dev server, its activities replaced by stand-ins that answer at once with
results of the real types and sizes (a frozen contract of several KB in the params; one
record a page). So a backfill of hundreds of windows and a 10,000-page run take seconds,
and the largest payload one workflow task sends is measured in their histories against the bound
docs/performance.md states. (The same runs on the whole stack, with real activities, are
bench/backfill.py's and tests/e2e/test_bounded_payloads.py's.)"""

from __future__ import annotations

import os
import uuid
from typing import Any

from temporalio import activity
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from artemis.ledger import Ledger
from artemis.run_models import (
    WORKFLOW_NAME,
    ChildSliceInput,
    CleanupRunInput,
    FetchInput,
    FetchResult,
    FinalizeInput,
    FinalizeResult,
    MirrorInput,
    PrepareInput,
    RunRequest,
    RunResult,
    RunTuning,
    SplitResult,
    workflow_id_for,
)
from artemis.run_state import PrepareResult
from artemis.temporal.runs import largest_workflow_task
from artemis.temporal.versioning import make_current, worker_build
from tests.e2e.test_bounded_payloads import WORKFLOW_TASK_BOUND, histories
from workflows.task_run import TaskRunWorkflow

# What a frozen contract weighs in a run's params (a registry provenance's, as JSON).
CONTRACT = {"endpoint": {"path_template": "/x" * 1500}, "record_model": {"f": "int" * 400}}


class StandIns:
    """The run's activities, answering at once: a backfill of ``windows`` windows whose
    children fetch one page each, or a run of ``pages`` pages of one record."""

    def __init__(self) -> None:
        self.slices: list[int] = []

    @activity.defn(name="prepare_params")
    async def prepare_params(self, inp: PrepareInput) -> PrepareResult:
        params = {**inp.params, "contract": CONTRACT} if "window" not in inp.params else inp.params
        windows = inp.params.get("windows")
        if windows:
            return PrepareResult(params=params, total=windows, fan_out=windows, parallelism=32)
        return PrepareResult(params=params, total=0)

    @activity.defn(name="plan_child_slice")
    async def plan_child_slice(self, inp: ChildSliceInput) -> SplitResult:
        self.slices.append(inp.limit)
        ref = "sha256:" + "0" * 64
        return SplitResult(
            children=[
                {"window": n, "start": "2015-01-01", "end": "2015-01-01", "contract_ref": ref}
                for n in range(inp.offset, inp.offset + inp.limit)
            ]
        )

    @activity.defn(name="fetch_pages")
    async def fetch_pages(self, inp: FetchInput) -> FetchResult:
        pages = int(inp.params.get("pages") or 1)
        n = min(inp.max_pages, pages - inp.first_seq)
        return FetchResult(
            first_seq=inp.first_seq,
            next_seq=inp.first_seq + n,
            pages=n,
            records=n,
            checkpoint={"page": inp.first_seq + n + 1},
            done=inp.first_seq + n >= pages,
            units_done=0,
            streamed=Ledger(
                first_seq=inp.first_seq,
                next_seq=inp.first_seq + n,
                records_in=n,
                records_out=n,
                records_emitted=n,
                batches=1,
                sinks={"http": n},
            ),
        )

    @activity.defn(name="finalize_run")
    async def finalize_run(self, inp: FinalizeInput) -> FinalizeResult:
        return FinalizeResult(callback="skipped", stats=inp.stats)

    @activity.defn(name="cleanup_run")
    async def cleanup_run(self, inp: CleanupRunInput) -> None:
        return None

    @activity.defn(name="mirror_state")
    async def mirror_state(self, inp: MirrorInput) -> str:
        return "ok"

    def all(self) -> list[Any]:
        return [
            self.prepare_params,
            self.plan_child_slice,
            self.fetch_pages,
            self.finalize_run,
            self.cleanup_run,
            self.mirror_state,
        ]


async def _run(
    client, params: dict[str, Any], tuning: RunTuning, generations: int
) -> tuple[RunResult, list]:
    queue = f"payloads-{uuid.uuid4().hex[:8]}"
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    stand_ins = StandIns()
    build = worker_build(None, queue, None)  # a deployment of its own
    async with Worker(
        client,
        task_queue=queue,
        workflows=[TaskRunWorkflow],
        activities=stand_ins.all(),
        workflow_runner=UnsandboxedWorkflowRunner(),
        max_concurrent_activities=100,
        deployment_config=build.config(),
    ):
        await make_current(client, build)
        handle = await client.start_workflow(
            WORKFLOW_NAME,
            RunRequest(
                task_code="source_harvest",
                task_id=task_id,
                params=params,
                trace_id="0" * 32,
                tuning=tuning,
                timeout_s=3600,
            ),
            id=workflow_id_for("source_harvest", task_id),
            task_queue=queue,
            result_type=RunResult,
        )
        result = await handle.result()
    return result, await histories(client, handle.id, generations)


# A backfill's windows here: 200 at 50 a generation by default (about 15 s on two cores);
# ARTEMIS_TEST_WINDOWS=3650 ARTEMIS_TEST_CHILDREN_PER_RUN=500 is ten years of daily windows
# at the default generation (about 4 minutes: each child is a whole run, ~60 ms of
# Temporal's and the SDK's work even with these stand-ins).
WINDOWS = int(os.environ.get("ARTEMIS_TEST_WINDOWS", "200"))
CHILDREN_PER_RUN = int(os.environ.get("ARTEMIS_TEST_CHILDREN_PER_RUN", "50"))


async def test_a_backfill_of_daily_windows_keeps_its_payloads_bounded(client):
    tuning = RunTuning(children_per_run=CHILDREN_PER_RUN)
    generations = -(-WINDOWS // CHILDREN_PER_RUN)  # a generation per share
    result, runs = await _run(client, {"windows": WINDOWS}, tuning, generations)
    assert result.status == "completed", result
    assert result.stats["records_fetched"] == WINDOWS  # each child's one record, added up
    biggest = max(largest_workflow_task(h.events) for h in runs)
    assert 0 < biggest < WORKFLOW_TASK_BOUND, biggest


async def test_a_run_of_ten_thousand_pages_keeps_its_payloads_bounded(client):
    pages = 10_000
    # 200 pages a batch, 20 batches a generation: three generations
    result, runs = await _run(client, {"pages": pages}, RunTuning(max_batches_per_run=20), 3)
    assert result.status == "completed", result
    assert result.stats["pages"] == pages and result.stats["records_emitted"] == pages
    biggest = max(largest_workflow_task(h.events) for h in runs)
    assert 0 < biggest < WORKFLOW_TASK_BOUND, biggest
