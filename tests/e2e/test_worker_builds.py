"""Two worker builds on one Temporal server: a run is pinned to the build it started on.

Build B changes a run's sequence of commands (a timer first) with no patch. A's run
does not replay on B's code, so it is pinning that lets it finish: it stays on A after B
becomes current, while new runs start on B.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from contextlib import AsyncExitStack
from typing import Any

import pytest
from temporalio.common import VersioningBehavior
from temporalio.worker import Replayer

from artemis.temporal import versioning
from artemis.temporal.client import data_converter
from artemis.temporal.versioning import (
    Build,
    current_build,
    describe,
    drainage,
    make_current,
)
from starter.cli.audit import _audit
from tests.builds.task_run_b import TaskRunB
from tests.conftest import ROOT, new_task_id
from tests.helpers import eventually
from workers import main as worker_main
from workers.main import running_worker
from workflows.task_run import TaskRunWorkflow


def b_workflows() -> tuple[Any, ...]:
    return tuple(TaskRunB if w is TaskRunWorkflow else w for w in worker_main.WORKFLOWS)


async def two_builds(make_stack) -> tuple[Any, str, Build, Build]:
    """A stack with no worker and a deployment of its own (the suite's stacks share one),
    and two builds of it, A and B."""
    stack = await make_stack(
        worker=False, runs={"pages_per_fetch": 1}, temporal={"deployment_name": None}
    )
    deployment = stack.settings.temporal.task_queue
    a = Build(deployment, f"a{uuid.uuid4().hex[:8]}")
    b = Build(deployment, f"b{uuid.uuid4().hex[:8]}")
    return stack, deployment, a, b


async def pinned_to(stack, workflow_id: str) -> tuple[str, str]:
    """(behaviour, build id) of a run as Temporal describes it."""
    d = await stack.client.get_workflow_handle(workflow_id).describe()
    info = d.raw_description.workflow_execution_info.versioning_info
    return VersioningBehavior(info.behavior).name, info.deployment_version.build_id


async def start(stack, symbol: str) -> tuple[str, str]:
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": [symbol], "page_size": 2}},
        mode="async",
    )
    assert resp.status_code == 202, resp.text
    return task_id, resp.json()["data"]["workflow_id"]


async def pages(stack, task_id: str) -> int:
    data = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
    return int((data or {}).get("stats", {}).get("pages", 0))


async def records_once(stack, task_id: str) -> None:
    """30 days of quotes, two per page: each date delivered under exactly one idempotency
    key (a batch sent again after an attempt whose answer was lost carries the same key,
    which the receiver dedups by)."""
    keys: dict[str, set[str]] = {}
    for b in await stack.sink_batches(f"pull_stock_quotes/{task_id}:"):
        if b["status"] == 200:
            for r in b["records"]:
                keys.setdefault(r["date"], set()).add(b["idempotency_key"])
    assert len(keys) == 30 and all(len(k) == 1 for k in keys.values()), keys


async def b_timer(stack, workflow_id: str) -> bool:
    """Whether the run's history has build B's own timer (10 ms, before anything else)."""
    events = (await stack.client.get_workflow_handle(workflow_id).fetch_history()).events
    return any(
        e.HasField("timer_started_event_attributes")
        and e.timer_started_event_attributes.start_to_fire_timeout.ToMilliseconds() == 10
        for e in events
    )


@pytest.mark.parametrize("api_first", [False, True], ids=["workers-then-switch", "api-first"])
async def test_a_run_finishes_on_its_build_while_new_runs_start_on_the_next(
    make_stack, monkeypatch, api_first
):
    stack, deployment, a, b = await two_builds(make_stack)
    await stack.fault("latency", latency_ms=60)
    try:
        async with AsyncExitStack() as worker_a:
            await worker_a.enter_async_context(
                running_worker(stack.settings, stack.client, build=a)
            )
            assert current_build(await describe(stack.client, deployment)) == a.build_id
            task_a, wf_a = await start(stack, "OLD")
            await eventually(lambda: _at_least(stack, task_a, 3), "build A to fetch 3 pages")
            assert await pinned_to(stack, wf_a) == ("PINNED", a.build_id)

            with monkeypatch.context() as m:
                m.setattr(worker_main, "WORKFLOWS", b_workflows())
                async with running_worker(stack.settings, stack.client, build=b):
                    if api_first:
                        # B's API and workers are up, A is still current: a run started
                        # now starts on A, and stays there
                        task_a2, wf_a2 = await start(stack, "MID")
                        await eventually(
                            lambda: _on(stack, wf_a2, a), "the run to start on build A"
                        )
                    await make_current(stack.client, b, replace=True)
                    assert current_build(await describe(stack.client, deployment)) == b.build_id

                    # A's history so far does not replay on B's code: without the pin,
                    # B's worker would fail this run's next workflow task
                    history = await stack.client.get_workflow_handle(wf_a).fetch_history()
                    replayed = await Replayer(
                        workflows=[TaskRunB], data_converter=data_converter()
                    ).replay_workflow(history, raise_on_replay_failure=False)
                    assert replayed.replay_failure is not None
                    assert "nondetermin" in str(replayed.replay_failure).lower()

                    task_b, wf_b = await start(stack, "NEW")
                    await stack.fault("latency", latency_ms=0)
                    final_a = await stack.wait_status(task_a, timeout=120)
                    final_b = await stack.wait_status(task_b, timeout=120)
                    assert final_a["status"] == "completed", final_a
                    assert final_b["status"] == "completed", final_b
                    assert await pinned_to(stack, wf_a) == ("PINNED", a.build_id)
                    assert await pinned_to(stack, wf_b) == ("PINNED", b.build_id)
                    assert not await b_timer(stack, wf_a)
                    assert await b_timer(stack, wf_b)
                    if api_first:
                        final = await stack.wait_status(task_a2, timeout=120)
                        assert final["status"] == "completed", final
                        assert not await b_timer(stack, wf_a2)
                        await records_once(stack, task_a2)

                    # A has nothing left to run: Temporal reports its version drained
                    # (the test server checks every second), and its worker can stop
                    await eventually(
                        lambda: _drained(stack, a), "build A to be drained", timeout=60
                    )
                    await worker_a.aclose()
                    task_c, wf_c = await start(stack, "LATER")
                    final_c = await stack.wait_status(task_c, timeout=120)
                    assert final_c["status"] == "completed", final_c
                    assert await pinned_to(stack, wf_c) == ("PINNED", b.build_id)
    finally:
        await stack.fault("latency", latency_ms=0)
    await records_once(stack, task_a)
    await records_once(stack, task_b)


async def _at_least(stack, task_id: str, n: int) -> bool:
    return await pages(stack, task_id) >= n


async def _drained(stack, build: Build) -> bool:
    return await drainage(stack.client, build) == "DRAINED"


async def _on(stack, workflow_id: str, build: Build) -> bool:
    """Whether the run is pinned to ``build`` (once its first workflow task is done)."""
    return await pinned_to(stack, workflow_id) == ("PINNED", build.build_id)


async def test_a_run_pinned_to_a_build_no_worker_polls_is_shown_as_waiting_for_it(
    make_stack, monkeypatch
):
    # A worker long-polls for up to a minute; here a build counts as polled only if it
    # polled in the last two seconds, so that the stopped build is seen within the test.
    monkeypatch.setattr(versioning, "POLLED_WITHIN_S", 2.0)
    stack, deployment, a, b = await two_builds(make_stack)
    await stack.fault("latency", latency_ms=60)
    try:
        async with running_worker(stack.settings, stack.client, build=a):
            task_a, wf_a = await start(stack, "OLD")
            await eventually(lambda: _at_least(stack, task_a, 2), "build A to fetch 2 pages")
        # A's worker is gone mid-run; B is deployed and made current by the operator
        async with running_worker(stack.settings, stack.client, build=b):
            promoted = await builds_cli(stack, "promote", b.build_id)
            assert promoted.returncode == 0, promoted.stderr
            assert promoted.stdout.strip() == f"current build: {b.build_id}"

            async def told() -> dict | None:
                data = (await stack.http.get(f"/tasks/{task_a}")).json()["data"]
                note = (data.get("progress") or {}).get("note") or ""
                return data if "which no worker polls" in note else None

            data = await eventually(told, "the status to say no worker polls build A")
            assert data["build"] == a.build_id and data["status"] == "running", data
            assert a.build_id in data["progress"]["note"]

            async def stranded() -> list[str]:
                return [
                    s.build_id
                    for s in await versioning.builds(stack.client, deployment, deployment)
                    if s.stranded
                ]

            assert await eventually(stranded, "build A to be listed stranded") == [a.build_id]
            listed = await builds_cli(stack, "list", "-o", "json")
            # (its own process counts a build polled within the last 90 s: A still is)
            assert listed.returncode == 0, listed.stderr
            rows = {r["build_id"]: r for r in json.loads(listed.stdout)}
            assert rows[a.build_id]["status"] == "DRAINING", rows
            assert rows[b.build_id]["status"] == "CURRENT" and rows[b.build_id]["polled"]
            report = await asyncio.to_thread(_audit, stack.settings, 1)
            assert any(a.build_id in f.what for f in report.findings), report.findings
            # a worker of A's build comes back: the run finishes there
            await stack.fault("latency", latency_ms=0)
            async with running_worker(stack.settings, stack.client, build=a):
                final = await stack.wait_status(task_a, timeout=120)
        assert final["status"] == "completed", final
        assert await pinned_to(stack, wf_a) == ("PINNED", a.build_id)
    finally:
        await stack.fault("latency", latency_ms=0)
    await records_once(stack, task_a)


async def builds_cli(stack, *args: str) -> subprocess.CompletedProcess:
    """`artemis builds …` in its own process, against the stack's Temporal."""
    env = {
        **os.environ,
        "ARTEMIS__TEMPORAL__ADDRESS": stack.settings.temporal.address,
        "ARTEMIS__TEMPORAL__TASK_QUEUE": stack.settings.temporal.task_queue,
    }
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "starter.cli", "builds", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
