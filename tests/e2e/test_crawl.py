"""crawl_notes end to end: the sample platform, the cookie pool, the execution lock,
tbl_source written once, the sinks, and no cookie value anywhere it must not be."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections import Counter
from datetime import timedelta
from functools import partial
from pathlib import Path

from sqlalchemy import select
from temporalio.client import (
    WorkflowExecutionStatus,
)
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.crawl import CrawlActivities
from artemis.crawler.cookies import add_cookie
from artemis.crawler.models import Candidate, CookieRow, CrawlExecution, SourceNote
from artemis.crawler.vault import vault_for
from artemis.db import get_engine
from artemis.run_models import ReclaimResult
from artemis.temporal.client import connect
from artemis_samples.platform import note_ids
from starter.locks import KEY_TASK_ID
from tests.conftest import new_task_id, settings_with, start_worker_process, write_config
from tests.helpers import ending, eventually, secret_keys
from workers.main import (
    WORKFLOWS,
    housekeeping_jobs,
    housekeeping_workflow_id,
    running_worker,
    start_housekeeping_loop,
)
from workflows.reclaim import ReclaimWorkflow


async def crawl_stack(
    make_stack,
    cookies: dict[str, int],
    search_page_size: int | None = None,
    runs: dict | None = None,
    **overrides,
):
    """A stack with its own platform name (so tests do not share a cookie pool) and
    ``cookies`` (session → priority) in that platform's pool; ``runs``: its runs section."""
    platform = f"p{uuid.uuid4().hex[:8]}"
    probe = await make_stack(worker=False)
    base = f"{probe.samples_url}/platform"
    platform_cfg: dict = {"base_url": base}
    if search_page_size:
        platform_cfg["page_size"] = search_page_size
    crawler = {
        "platforms": {platform: platform_cfg},
        "backoff_s": [0.2, 0.4, 0.8],
        "detail_timeout_s": 1.0,
        **overrides,
    }
    stack = await make_stack(crawler=crawler, **({"runs": runs} if runs else {}))
    vault = vault_for(stack.settings)
    for n, (session, priority) in enumerate(cookies.items()):
        add_cookie(vault, platform, f"{platform}-c{n}", f"web_session={session}", priority)
    await stack.samples_http.post("/_control/platform", json={"reset": True})
    return stack, platform


def rows(stack, model, **where):
    engine = get_engine(stack.settings.database.url)
    q = select(model.__table__)
    for k, v in where.items():
        q = q.where(getattr(model, k) == v)
    with engine.connect() as conn:
        return conn.execute(q).all()


async def sent_notes(stack, task_id: str) -> Counter:
    """How many times each note of the crawl ``task_id`` reached the HTTP sink in an
    accepted POST (none carrying the crawl's own bookkeeping)."""
    sent: Counter = Counter()
    for b in await stack.sink_batches(f"crawl_notes/{task_id}:"):
        if b["status"] == 200:
            for r in b["records"]:
                assert "_candidate_id" not in r
                sent[r["note_id"]] += 1
    return sent


async def test_a_retried_crawl_takes_its_execution_lock_again(make_stack):
    """A crawl that gave up (its sink down past the outage tolerance) has released its
    lock; its retry takes it again: refused while another crawl of the name runs, run
    once that one ended, under the lock for as long as it runs."""
    stack, platform = await crawl_stack(
        make_stack, {"sample-r": 1}, runs={"retry_max_interval_s": 1.0, "outage_tolerance_s": 1}
    )
    await stack.samples_http.post("/_control/platform", json={"notes_per_keyword": 3})
    params = {"platform": platform, "keywords": [f"rho-{uuid.uuid4().hex[:6]}"]}
    lock = stack.client.get_workflow_handle(f"artemis/lock/crawl_notes:{platform}")
    failed_id, other_id = new_task_id(), new_task_id()
    await stack.fault("sink", status=503, for_s=3600)
    try:
        resp = await stack.run(
            {"meta": {"task_id": failed_id}, "params": params}, code="crawl_notes"
        )
    finally:
        await stack.fault("sink")
    data = resp.json()["data"]
    assert data["status"] == "failed" and data["error"]["code"] == "SINK_UNAVAILABLE", data
    await asyncio.wait_for(lock.result(), timeout=60)  # released with the run's end

    # another crawl of the name holds the lock: the retry is refused, naming it
    slow = {"slow_ms": 400, "slow_ids": note_ids(params["keywords"][0], 3)}
    await stack.samples_http.post("/_control/platform", json=slow)
    other = await stack.run(
        {"meta": {"task_id": other_id}, "params": params}, code="crawl_notes", mode="async"
    )
    assert other.status_code == 202, other.text
    refused = await stack.http.post(f"/tasks/{failed_id}/retry", json={})
    assert refused.status_code == 409, refused.text
    err = refused.json()["error"]
    assert err["code"] == "EXECUTION_LOCKED" and other_id in err["message"], err
    assert (await stack.wait_status(other_id, timeout=60))["status"] == "completed"

    async def retried() -> bool:
        resp = await stack.http.post(f"/tasks/{failed_id}/retry", json={})
        assert resp.status_code in (202, 409), resp.text
        return resp.status_code == 202

    await eventually(retried, "the retry to start once the other crawl's lock closed")
    desc = await lock.describe()
    assert desc.typed_search_attributes.get(KEY_TASK_ID) == failed_id
    assert (await stack.wait_status(failed_id, timeout=60))["status"] == "completed"
    assert "ended" in await asyncio.wait_for(lock.result(), timeout=60)


async def test_crawl_writes_each_note_once_and_sends_it_to_the_sinks(make_stack, app_log):
    stack, platform = await crawl_stack(make_stack, {"sample-a": 5, "sample-b": 1})
    await stack.samples_http.post(
        "/_control/platform", json={"notes_per_keyword": 12, "revoked": ["sample-a"]}
    )
    kw = [f"alpha-{uuid.uuid4().hex[:6]}", f"beta-{uuid.uuid4().hex[:6]}"]
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"platform": platform, "keywords": kw}},
        code="crawl_notes",
    )
    body = resp.json()
    assert resp.status_code == 200, body
    data = body["data"]
    # The run has a task run's id; its execution lock is a workflow of its own, named
    # apart, that says who held it and closes with the run.
    assert data["status"] == "completed"
    assert data["workflow_id"] == f"artemis/crawl_notes/{task_id}"
    lock = stack.client.get_workflow_handle(f"artemis/lock/crawl_notes:{platform}")
    assert "ended" in await asyncio.wait_for(lock.result(), timeout=60)
    desc = await lock.describe()
    assert desc.workflow_type == "ExecutionLock"
    assert desc.typed_search_attributes.get(KEY_TASK_ID) == task_id
    stored = rows(stack, SourceNote, platform=platform)
    assert len(stored) == 24 and len({r.idempotency_key for r in stored}) == 24
    assert all(r.idempotency_key == f"{r.note_id}_v1" for r in stored)
    cands = rows(stack, Candidate, platform=platform)
    assert Counter(c.status for c in cands) == {"collected": 24}
    sent = await sent_notes(stack, task_id)
    assert len(sent) == 24 and set(sent.values()) == {1}
    (execution,) = rows(stack, CrawlExecution, execution_id=task_id)
    assert execution.status == "completed" and execution.items_processed == 24
    assert execution.workflow_name == f"crawl_notes:{platform}"
    # The revoked cookie was blamed once per refusal and the pool moved on.
    a, b = sorted(rows(stack, CookieRow, platform=platform), key=lambda r: -r.priority)
    assert a.total_errors >= 1 and b.daily_used >= 24

    # No cookie value in the API's answers, the workflow's history or the logs.
    answers = json.dumps(body) + (await stack.http.get(f"/tasks/{task_id}")).text
    history = await stack.client.get_workflow_handle(data["workflow_id"]).fetch_history()
    events = (await stack.http.get(f"/tasks/{task_id}/events")).text
    for text in (answers, history.to_json(), events):
        assert "sample-a" not in text and "sample-b" not in text
    log_text = app_log.read_text()
    assert task_id in log_text  # the run did log here ...
    assert "web_session=sample-" not in log_text  # ... and never a cookie value


async def test_a_second_start_of_the_same_workflow_name_gets_409(make_stack):
    stack, platform = await crawl_stack(make_stack, {"sample-x": 1})
    await stack.samples_http.post(
        "/_control/platform", json={"notes_per_keyword": 6, "slow_ms": 300, "slow_ids": []}
    )
    kw = [f"gamma-{uuid.uuid4().hex[:6]}"]
    await stack.samples_http.post("/_control/platform", json={"slow_ids": note_ids(kw[0], 6)})
    first_id, second_id = new_task_id(), new_task_id()
    params = {"platform": platform, "keywords": kw}
    first = await stack.run(
        {"meta": {"task_id": first_id}, "params": params}, code="crawl_notes", mode="async"
    )
    assert first.status_code == 202, first.text
    # Read right after the 202: a lock's run is found through its record, which the API
    # reads before it reaches the task store.
    status = await stack.http.get(f"/tasks/{first_id}")
    assert status.status_code == 200, status.text
    assert status.json()["data"]["status"] in ("pending", "running"), status.text
    callback = {
        "run_id": f"cron-{second_id}",
        "callback": {
            "base_url": f"{stack.samples_url}/cronjob/runs",
            "auth_token": "refused-start-token-0123456789",
        },
    }
    second = await stack.run(
        {"meta": {"task_id": second_id, **callback}, "params": params},
        code="crawl_notes",
        mode="async",
    )
    assert second.status_code == 409, second.text
    err = second.json()["error"]
    assert err["code"] == "EXECUTION_LOCKED" and first_id in err["message"]
    # The refused start left nothing behind in task storage, nor a run secret.
    assert (await stack.http.get(f"/tasks/{second_id}")).status_code == 404
    assert secret_keys(stack, second_id) == []
    again = await stack.run(
        {"meta": {"task_id": first_id}, "params": params}, code="crawl_notes", mode="async"
    )
    assert again.status_code == 202  # the holder's own repeat attaches
    done = await stack.wait_status(first_id, timeout=60)
    assert done["status"] == "completed"

    async def third_start() -> bool:
        third = await stack.run(
            {"meta": {"task_id": second_id}, "params": params}, code="crawl_notes", mode="async"
        )
        return third.status_code == 202

    await eventually(third_start, "the lock to free once the workflow closed", interval=0.1)
    assert (await stack.wait_status(second_id))["status"] == "completed"
    repeat = await stack.run(
        {"meta": {"task_id": first_id}, "params": params}, code="crawl_notes", mode="sync"
    )
    assert repeat.json()["data"]["status"] == "completed"  # recorded, not run again
    assert len(rows(stack, CrawlExecution, workflow_name=f"crawl_notes:{platform}")) == 2


async def test_no_usable_cookie_fails_the_run_with_cookie_exhausted(make_stack):
    stack, platform = await crawl_stack(make_stack, {})
    resp = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"platform": platform, "keywords": ["k"]}},
        code="crawl_notes",
    )
    body = resp.json()
    assert body["data"]["status"] == "failed"
    assert body["error"]["code"] == "COOKIE_EXHAUSTED" and resp.status_code == 503
    bad = await stack.run(
        {"params": {"platform": "nowhere", "keywords": ["k"]}}, code="crawl_notes"
    )
    assert bad.status_code == 422 and "params.platform" in bad.json()["error"]["message"]


async def test_batch_details_one_slow_note_fails_alone(make_stack):
    stack, platform = await crawl_stack(make_stack, {"sample-d": 1})
    ids = note_ids("batch", 3)
    await stack.samples_http.post(
        "/_control/platform", json={"slow_ids": [ids[1]], "slow_ms": 3000}
    )
    resp = await stack.http.post("/notes/details", json={"platform": platform, "note_ids": ids})
    body = resp.json()
    assert resp.status_code == 207, body
    assert body["success"] is False
    assert body["summary"] == {"total": 3, "succeeded": 2, "failed": 1}
    assert body["error"]["code"] == "PARTIAL_FAIL" and body["error"]["retryable"] is True
    by_id = {i["id"]: i for i in body["items"]}
    assert by_id[ids[0]]["success"] and by_id[ids[0]]["data"]["note_id"] == ids[0]
    assert by_id[ids[2]]["success"] and by_id[ids[2]]["data"]["title"] == f"Note {ids[2]}"
    assert by_id[ids[1]]["error"]["code"] == "TIMEOUT_ERROR"
    assert by_id[ids[0]]["meta"]["cookie_used"] == f"{platform}-c0"
    assert "sample-d" not in resp.text and body["meta"]["request_id"]

    # The batch workflow's history replays (determinism).
    from workflows.note_details import NoteDetailsWorkflow

    batches = [
        w
        async for w in stack.client.list_workflows(
            f"WorkflowType = 'NoteDetails' AND TaskQueue = '{stack.settings.temporal.task_queue}'"
        )
    ]
    assert batches
    history = await stack.client.get_workflow_handle(batches[0].id).fetch_history()
    assert ending(history) == "WORKFLOW_EXECUTION_COMPLETED"  # partial results, not a failure
    await Replayer(workflows=[NoteDetailsWorkflow]).replay_workflow(history)

    await stack.samples_http.post("/_control/platform", json={"slow_ids": []})
    ok = await stack.http.post("/notes/details", json={"platform": platform, "note_ids": ids[:2]})
    assert ok.status_code == 200 and ok.json()["success"] and ok.json()["error"] is None
    for bad, where in (
        ({"platform": platform}, "body.note_ids"),
        ({"platform": platform, "note_ids": ["a", "a"]}, "unique"),
        ({"platform": "nowhere", "note_ids": ["a"]}, "body.platform"),
        ({"platform": platform, "note_ids": ["a"], "x": 1}, "body.x"),
    ):
        r = await stack.http.post("/notes/details", json=bad)
        assert r.status_code == 422 and where in r.json()["error"]["message"], r.text


async def test_killed_worker_and_reclaim_30_min_later_write_every_note_once(make_stack, tmp_path):
    """A worker dies mid-note; 30 minutes later (time-skipping) the reclaim frees the
    batch it held; the run goes on and every note is stored and sent exactly once."""
    stack, platform = await crawl_stack(make_stack, {"sample-k": 1})
    # make_stack's own worker must not pick the run up: a stack without one, same queue.
    stack = await make_stack(worker=False, crawler=stack.settings.crawler.model_dump())
    kw = f"kill-{uuid.uuid4().hex[:6]}"
    ids = note_ids(kw, 12)
    await stack.samples_http.post(
        "/_control/platform",
        json={"notes_per_keyword": 12, "slow_ids": [ids[2]], "slow_ms": 60_000},
    )
    task_id = await crawl_until_killed_in_a_note(stack, platform, kw, ids[2], tmp_path)
    held = rows(stack, Candidate, platform=platform, status="processing")
    assert len(held) == 10 and {c.processing_lock for c in held} == {task_id}
    assert rows(stack, SourceNote, platform=platform) == []

    await stack.samples_http.post("/_control/platform", json={"slow_ids": []})
    passes = await reclaim_passes_over_three_quarters_of_an_hour(stack)
    assert sum(r.records_pending for r in passes) == 10
    assert sum(r.executions_timed_out for r in passes) >= 1
    assert {c.retry_count for c in rows(stack, Candidate, platform=platform)} <= {0, 1}

    # A worker again: the run resumes from its last heartbeat and collects everything.
    async with running_worker(stack.settings, stack.client):
        done = await stack.wait_status(task_id, timeout=90)
    assert done["status"] == "completed", done
    stored = rows(stack, SourceNote, platform=platform)
    assert sorted(r.note_id for r in stored) == sorted(ids)
    assert Counter(c.status for c in rows(stack, Candidate, platform=platform)) == {"collected": 12}
    sent = await sent_notes(stack, task_id)
    assert sorted(sent) == sorted(ids) and set(sent.values()) == {1}


async def crawl_until_killed_in_a_note(stack, platform: str, kw: str, slow_id: str, tmp_path):
    """Start a crawl of ``kw`` on a worker process of its own and SIGKILL that worker
    once it is inside the slow note ``slow_id``; the run's task id."""
    config = write_config(tmp_path / "w.yaml", stack.settings)
    proc = start_worker_process(config, tmp_path / "w.log")
    task_id = new_task_id()
    try:
        resp = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"platform": platform, "keywords": [kw]}},
            code="crawl_notes",
            mode="async",
        )
        assert resp.status_code == 202, resp.text

        async def inside_slow_note() -> bool:
            calls = (await stack.samples_http.get("/_platform/calls")).json()
            return any(c["note_id"] == slow_id for c in calls)

        await eventually(inside_slow_note, "the worker to reach the slow note", interval=0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    return task_id


async def reclaim_passes_over_three_quarters_of_an_hour(stack) -> list:
    """The reclaim loop as a worker starts it (every 15 min, locks older than 30) on a
    time-skipping test server: a restart finds the same execution; no pass at the start,
    one at 15 minutes that finds nothing stale yet, then the passes at 30 and 45 minutes,
    all in one execution. The passes' results."""
    server = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "temporal-test-server"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(server) if server.exists() else None
    )
    try:
        crawl = CrawlActivities(stack.settings)
        async with Worker(
            env.client,
            task_queue="reclaim",
            workflows=[ReclaimWorkflow],
            activities=crawl.all(),
        ):
            (job,) = [j for j in housekeeping_jobs(stack.settings) if j.name == "reclaim"]
            assert job.inp.every_s == 15 * 60 and job.inp.lock_timeout_minutes == 30
            handle = await start_housekeeping_loop(env.client, job, "reclaim")
            again = await start_housekeeping_loop(env.client, job, "reclaim")  # a restart
            assert again.result_run_id == handle.result_run_id  # the same execution
            assert await _loop_results(env.client, handle.id) == []  # a tick away
            await env.sleep(timedelta(minutes=16))
            first = await eventually(
                partial(_loop_results, env.client, handle.id), "the pass at 15 minutes"
            )
            assert [r.records_pending for r in first] == [0]  # not stale yet
            await env.sleep(timedelta(minutes=30))  # passes at 30 and 45 minutes

            async def three() -> list | None:
                done = await _loop_results(env.client, handle.id)
                return done if len(done) >= 3 else None

            passes = await eventually(three, "the passes at 30 and 45 minutes")
            assert (await handle.describe()).run_id == handle.result_run_id  # one execution
        await crawl.client.aclose()
    finally:
        await env.shutdown()
    return passes


async def _loop_results(client, workflow_id: str, result_type=None) -> list:
    """The results of the passes a housekeeping loop's current run has completed."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    out = []
    for e in history.events:
        if e.HasField("activity_task_completed_event_attributes"):
            payloads = e.activity_task_completed_event_attributes.result.payloads
            out += await client.data_converter.decode(payloads, [result_type or ReclaimResult])
    return out


async def _pass_times(client, workflow_id: str) -> tuple[list, list]:
    """When (the workflow's time: its workflow task's start) a housekeeping loop's current
    run began each pass, and when it was signalled."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    by_id = {e.event_id: e for e in history.events}

    def workflow_time(scheduled):  # the start of the workflow task that scheduled it
        task = by_id[
            scheduled.activity_task_scheduled_event_attributes.workflow_task_completed_event_id
        ]
        started = task.workflow_task_completed_event_attributes.started_event_id
        return by_id[started].event_time.ToDatetime()

    passes = [
        workflow_time(e)
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    signals = [
        e.event_time.ToDatetime()
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    return passes, signals


async def test_housekeeping_runs_one_loop_per_job(make_stack):
    """Housekeeping adds no row per tick to the UI's list: each job (clean-up, reclaim,
    alerts) has one execution per task queue that loops on a timer; a second worker, a
    restart, many intervals do not add another; the interval follows the config of the
    worker last started; alerts turned off end their loop; the loops' histories replay."""
    # reclaim every 1.2 s and alerts every second: many intervals within the test
    stack = await make_stack(
        worker=False, alerts={"interval_s": 1}, crawler={"recovery_interval_minutes": 0.02}
    )
    client, queue = stack.client, stack.settings.temporal.task_queue
    ids = {
        job.name: housekeeping_workflow_id(job.name, queue)
        for job in housekeeping_jobs(stack.settings)
    }
    alerts = client.get_workflow_handle(ids["alerts"])

    # two workers on the queue (two processes in production: a client each)
    other = await connect(stack.settings)
    async with running_worker(stack.settings, client), running_worker(stack.settings, other):
        await eventually(partial(passes_at_least, client, ids["alerts"], 4), "4 alert passes")
        await eventually(partial(passes_at_least, client, ids["reclaim"], 3), "3 reclaim passes")
        first_run = (await alerts.describe()).run_id

    await one_running_loop_per_job(client, queue, ids)
    await a_restart_replans_the_same_loop(stack, ids["alerts"], first_run)
    await alerts_turned_off_end_their_loop_alone(stack, ids)


async def passes_at_least(client, workflow_id: str, n: int) -> bool:
    return len((await _pass_times(client, workflow_id))[0]) >= n


async def one_running_loop_per_job(client, queue: str, ids: dict[str, str]) -> None:
    """Over many intervals and two worker starts: one execution per job in the list, still
    running (the workers are gone: each loop waits on its timer for the next worker)."""

    async def listed() -> list:
        rows = [w async for w in client.list_workflows(f"TaskQueue = '{queue}'")]
        return rows if len(rows) >= 3 else []

    rows = await eventually(listed, "the three loops in the list", interval=0.2)
    assert sorted(w.workflow_type for w in rows) == [
        "CleanupOldTasks",
        "EvaluateAlerts",
        "ReclaimStaleLocks",
    ], [(w.id, w.workflow_type) for w in rows]
    assert {w.id for w in rows} == set(ids.values())
    assert {w.status for w in rows} == {WorkflowExecutionStatus.RUNNING}


async def a_restart_replans_the_same_loop(stack, alerts_id: str, first_run: str) -> None:
    """A restart with another interval: the same execution, re-planned from every second
    to every 2 s at the signal the new worker's start sent it. The plan is read from the
    loop's own timers (their length and summary), not from how soon a loaded machine
    ran each pass."""
    client = stack.client
    slower = settings_with(stack.settings, alerts={"interval_s": 2})
    async with running_worker(slower, client):

        async def three_slow_passes() -> list | None:
            times, signals = await _pass_times(client, alerts_id)
            after = [t for t in times if t > signals[-1]]
            return times if len(after) >= 3 else None

        times = await eventually(three_slow_passes, "three passes after the signal", timeout=90)
        assert (await client.get_workflow_handle(alerts_id).describe()).run_id == first_run
    signalled = (await _pass_times(client, alerts_id))[1][-1]
    timers = await _timers(client, alerts_id)
    before = [(length, summary) for at, length, summary in timers if at < signalled]
    after = [(length, summary) for at, length, summary in timers if at > signalled]
    assert before and all(
        s == "Next alerts evaluation (every 1 s)" and n <= 1.0 for n, s in before
    ), before
    assert len(after) >= 2 and all(
        s == "Next alerts evaluation (every 2 s)" and n <= 2.0 for n, s in after
    ), after
    # a timer of 2 s is a lower bound: the passes after the signal are at least 2 s apart
    later = [t for t in times if t > signalled]
    gaps = [(b - a).total_seconds() for a, b in zip(later, later[1:], strict=False)]
    assert len(gaps) >= 2 and min(gaps) >= 2.0, gaps


async def _timers(client, workflow_id: str) -> list[tuple]:
    """Each timer a loop's current run started: when, its length in seconds, its summary."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    out = []
    for e in history.events:
        if e.HasField("timer_started_event_attributes"):
            length = e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            summary = await client.data_converter.decode([e.user_metadata.summary], [str])
            out.append((e.event_time.ToDatetime(), length.total_seconds(), summary[0]))
    return out


async def alerts_turned_off_end_their_loop_alone(stack, ids: dict[str, str]) -> None:
    """Alerts turned off: the next worker start ends their loop; the others keep theirs.
    The ended loop's history and a running one's replay."""
    client = stack.client
    alerts = client.get_workflow_handle(ids["alerts"])
    off = settings_with(stack.settings, alerts={"enabled": False})
    async with running_worker(off, client):
        await asyncio.wait_for(alerts.result(), 90)
        assert (await client.get_workflow_handle(ids["reclaim"]).describe()).status == (
            WorkflowExecutionStatus.RUNNING
        )
    history = await alerts.fetch_history()
    assert ending(history) == "WORKFLOW_EXECUTION_COMPLETED"
    replayer = Replayer(workflows=list(WORKFLOWS))
    await replayer.replay_workflow(history)
    await replayer.replay_workflow(await client.get_workflow_handle(ids["reclaim"]).fetch_history())


def _audit(config, histories: int = 40):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "starter.cli", "audit", "--config", str(config)]
        + ["--histories", str(histories)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "200"},
        cwd=Path(__file__).resolve().parents[2],
    )
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else out.stderr


async def test_audit_passes_after_a_crawl_and_fails_on_a_planted_cookie(
    make_stack, tmp_path, app_log
):
    from sqlalchemy import update

    stack, platform = await crawl_stack(make_stack, {"sample-audit-1": 1})
    await stack.samples_http.post("/_control/platform", json={"notes_per_keyword": 3})
    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "params": {"platform": platform, "keywords": [f"au-{uuid.uuid4().hex[:6]}"]},
        },
        code="crawl_notes",
    )
    assert resp.json()["data"]["status"] == "completed"
    assert task_id in app_log.read_text()  # the log the audit reads holds this crawl's lines
    config = write_config(tmp_path / "a.yaml", stack.settings)
    code, report = await asyncio.to_thread(_audit, config)
    assert code == 0, report
    assert report["passed"] is True and report["findings"] == []
    assert report["checked"]["cookies"] >= 1 and report["checked"]["histories"] >= 1
    assert report["checked"]["log_lines"] > 0 and report["checked"]["db_values"] > 0

    engine = get_engine(stack.settings.database.url)
    (cookie,) = rows(stack, CookieRow, platform=platform)
    with engine.begin() as conn:
        conn.execute(
            update(CookieRow.__table__)
            .where(CookieRow.id == cookie.id)
            .values(cookie_encrypted="web_session=planted-in-clear")
        )
    try:
        code, report = await asyncio.to_thread(_audit, config, 0)
    finally:
        with engine.begin() as conn:
            conn.execute(
                update(CookieRow.__table__)
                .where(CookieRow.id == cookie.id)
                .values(cookie_encrypted=cookie.cookie_encrypted)
            )
    assert code == 1 and report["passed"] is False
    wheres = {f["where"] for f in report["findings"]}
    assert f"db:tbl_cookie.cookie_encrypted id={cookie.id}" in wheres
    assert "planted-in-clear" not in json.dumps(report)

    # A secret value in a log file: found by value, never printed.
    log = tmp_path / "planted.log"
    log.write_text('{"event": "oops", "header": "Cookie: sample-audit-1"}\n')
    planted = stack.settings.model_copy(
        update={
            "logging": stack.settings.logging.model_copy(
                update={"file": stack.settings.logging.file.model_copy(update={"path": str(log)})}
            )
        }
    )
    code, report = await asyncio.to_thread(_audit, write_config(tmp_path / "b.yaml", planted), 0)
    assert code == 1 and any(f["where"].startswith(f"log:{log}") for f in report["findings"])
    assert "sample-audit-1" not in json.dumps(report)


async def test_rate_limits_wait_for_retry_after_and_error_budgets_end_retries(make_stack):
    stack, platform = await crawl_stack(make_stack, {"sample-r": 1})
    await stack.samples_http.post(
        "/_control/platform", json={"notes_per_keyword": 4, "rate_per_s": 2}
    )
    resp = await stack.run(
        {"params": {"platform": platform, "keywords": [f"rl-{uuid.uuid4().hex[:6]}"]}},
        code="crawl_notes",
    )
    assert resp.json()["data"]["status"] == "completed", resp.text
    calls = (await stack.samples_http.get("/_platform/calls")).json()
    assert any(c["status"] == 429 for c in calls)  # the platform pushed back ...
    assert sum(1 for c in calls if c["status"] == 200) == 4  # ... and every note came
    (cookie,) = rows(stack, CookieRow, platform=platform)
    assert cookie.total_errors == 0 and cookie.status == "active"  # not the cookie's fault

    # PLATFORM_ERROR may be retried twice (docs/api.md): three attempts, then the run fails.
    await stack.samples_http.post(
        "/_control/platform",
        json={"reset": True, "search_fail": {"status": 502, "times": 10}},
    )
    failed = await stack.run(
        {"params": {"platform": platform, "keywords": [f"pe-{uuid.uuid4().hex[:6]}"]}},
        code="crawl_notes",
    )
    body = failed.json()
    assert body["data"]["status"] == "failed" and body["error"]["code"] == "PLATFORM_ERROR"
    stats = (await stack.samples_http.get("/_platform/stats")).json()
    assert stats["search_calls"] == 3


async def test_a_housekeeping_loop_ended_meanwhile_is_started_again(make_stack):
    """A loop that ended (terminated from the UI, say) runs again: each worker checks
    every worker.housekeeping_check_s."""
    stack = await make_stack(worker=False)
    checking = settings_with(stack.settings, worker={"housekeeping_check_s": 0.5})
    client, queue = stack.client, stack.settings.temporal.task_queue
    handle = client.get_workflow_handle(housekeeping_workflow_id("reclaim", queue))
    async with running_worker(checking, client):
        first = (await handle.describe()).run_id
        await handle.terminate("ended from outside")

        async def restarted() -> bool:
            desc = await client.get_workflow_handle(handle.id).describe()
            return desc.run_id != first and desc.status == WorkflowExecutionStatus.RUNNING

        await eventually(restarted, "the loop to run again", timeout=30)
