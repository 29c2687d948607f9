"""crawl_notes end to end: the sample platform, the cookie pool, the execution lock,
tbl_source written once, the sinks, and no cookie value anywhere it must not be."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from datetime import timedelta
from functools import partial

from sqlalchemy import select

from artemis.crawler.cookies import add_cookie
from artemis.crawler.models import Candidate, CookieRow, CrawlExecution, SourceNote
from artemis.crawler.vault import vault_for
from artemis.db import get_engine
from tests.conftest import new_task_id
from tests.helpers import ending, eventually


async def crawl_stack(
    make_stack, cookies: dict[str, int], search_page_size: int | None = None, **overrides
):
    """A stack with its own platform name (so tests do not share a cookie pool) and
    ``cookies`` (session → priority) in that platform's pool."""
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
    stack = await make_stack(crawler=crawler)
    vault = vault_for(stack.settings)
    for n, (session, priority) in enumerate(cookies.items()):
        add_cookie(
            vault.engine, vault, platform, f"{platform}-c{n}", f"web_session={session}", priority
        )
    await stack.samples_http.post("/_control/platform", json={"reset": True})
    return stack, platform


def rows(stack, model, **where):
    engine = get_engine(stack.settings.database.url)
    q = select(model.__table__)
    for k, v in where.items():
        q = q.where(getattr(model, k) == v)
    with engine.connect() as conn:
        return conn.execute(q).all()


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
    assert (
        data["status"] == "completed"
        and data["workflow_id"] == f"artemis/lock/crawl_notes:{platform}"
    )
    stored = rows(stack, SourceNote, platform=platform)
    assert len(stored) == 24 and len({r.idempotency_key for r in stored}) == 24
    assert all(r.idempotency_key == f"{r.note_id}_v1" for r in stored)
    cands = rows(stack, Candidate, platform=platform)
    assert Counter(c.status for c in cands) == {"collected": 24}
    sent = Counter()
    for b in await stack.sink_batches(f"crawl_notes/{task_id}:"):
        if b["status"] == 200:
            for r in b["records"]:
                assert "_candidate_id" not in r
                sent[r["note_id"]] += 1
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
    from artemis.samples.platform import note_ids

    await stack.samples_http.post("/_control/platform", json={"slow_ids": note_ids(kw[0], 6)})
    first_id, second_id = new_task_id(), new_task_id()
    params = {"platform": platform, "keywords": kw}
    first = await stack.run(
        {"meta": {"task_id": first_id}, "params": params}, code="crawl_notes", mode="async"
    )
    assert first.status_code == 202, first.text
    second = await stack.run(
        {"meta": {"task_id": second_id}, "params": params}, code="crawl_notes", mode="async"
    )
    assert second.status_code == 409, second.text
    err = second.json()["error"]
    assert err["code"] == "EXECUTION_LOCKED" and first_id in err["message"]
    # The refused start left nothing behind in task storage.
    assert (await stack.http.get(f"/tasks/{second_id}")).status_code == 404
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
    from artemis.samples.platform import note_ids

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
    from temporalio.worker import Replayer

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
    import os
    import signal
    from pathlib import Path

    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker

    from activities.crawl import CrawlActivities
    from artemis.run_models import ReclaimInput, ReclaimResult
    from artemis.samples.platform import note_ids
    from tests.conftest import start_worker_process, write_config
    from workers.main import running_worker
    from workflows.reclaim import ReclaimWorkflow

    stack, platform = await crawl_stack(make_stack, {"sample-k": 1})
    # make_stack's own worker must not pick the run up: a stack without one, same queue.
    stack = await make_stack(worker=False, crawler=stack.settings.crawler.model_dump())
    kw = f"kill-{uuid.uuid4().hex[:6]}"
    ids = note_ids(kw, 12)
    await stack.samples_http.post(
        "/_control/platform",
        json={"notes_per_keyword": 12, "slow_ids": [ids[2]], "slow_ms": 60_000},
    )
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
            return any(c["note_id"] == ids[2] for c in calls)

        await eventually(inside_slow_note, "the worker to reach the slow note", interval=0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    held = rows(stack, Candidate, platform=platform, status="processing")
    assert len(held) == 10 and {c.processing_lock for c in held} == {task_id}
    assert rows(stack, SourceNote, platform=platform) == []

    await stack.samples_http.post("/_control/platform", json={"slow_ids": []})
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

            async def reclaim() -> ReclaimResult:
                return await env.client.execute_workflow(
                    ReclaimWorkflow.run,
                    ReclaimInput(lock_timeout_minutes=30),
                    id=f"reclaim-{uuid.uuid4().hex}",
                    task_queue="reclaim",
                    result_type=ReclaimResult,
                )

            assert (await reclaim()).records_pending == 0  # not stale yet
            await env.sleep(timedelta(minutes=31))
            late = await reclaim()
        await crawl.client.aclose()
    finally:
        await env.shutdown()
    assert late.records_pending == 10 and late.executions_timed_out >= 1
    assert {c.retry_count for c in rows(stack, Candidate, platform=platform)} <= {0, 1}

    # A worker again: the run resumes from its last heartbeat and collects everything.
    async with running_worker(stack.settings, stack.client):
        done = await stack.wait_status(task_id, timeout=90)
    assert done["status"] == "completed", done
    stored = rows(stack, SourceNote, platform=platform)
    assert sorted(r.note_id for r in stored) == sorted(ids)
    assert Counter(c.status for c in rows(stack, Candidate, platform=platform)) == {"collected": 12}
    sent = Counter()
    for b in await stack.sink_batches(f"crawl_notes/{task_id}:"):
        if b["status"] == 200:
            sent.update(r["note_id"] for r in b["records"])
    assert sorted(sent) == sorted(ids) and set(sent.values()) == {1}


async def test_reclaim_and_alert_schedules_are_created_once_and_their_runs_replay(stack):
    from temporalio.worker import Replayer

    from workers.main import (
        alerts_schedule_id,
        ensure_alerts_schedule,
        ensure_reclaim_schedule,
        reclaim_schedule_id,
    )
    from workflows.alerts import AlertsWorkflow
    from workflows.reclaim import ReclaimWorkflow

    queue = stack.settings.temporal.task_queue
    for schedule_id, ensure, every, wf_type, wf in (
        (
            reclaim_schedule_id,
            ensure_reclaim_schedule,
            timedelta(minutes=15),
            "ReclaimStaleLocks",
            ReclaimWorkflow,
        ),
        (
            alerts_schedule_id,
            ensure_alerts_schedule,
            timedelta(seconds=60),
            "EvaluateAlerts",
            AlertsWorkflow,
        ),
    ):
        handle = stack.client.get_schedule_handle(schedule_id(queue))
        desc = await handle.describe()  # created by the worker at start-up
        assert desc.schedule.spec.intervals[0].every == every
        await ensure(stack.client, stack.settings, queue)  # again: no error, no second one
        await handle.trigger()
        run = await eventually(
            partial(
                _newest_completed,
                stack.client,
                f"WorkflowType = '{wf_type}' AND TaskQueue = '{queue}'",
            ),
            f"a completed {wf_type} run",
            interval=0.1,
        )
        history = await stack.client.get_workflow_handle(run.id, run_id=run.run_id).fetch_history()
        assert ending(history) == "WORKFLOW_EXECUTION_COMPLETED", wf_type
        await Replayer(workflows=[wf]).replay_workflow(history)


async def _newest_completed(client, query: str):
    """The newest workflow that ``query`` lists, once it has completed (else None)."""
    runs = [w async for w in client.list_workflows(query)]
    return runs[0] if runs and runs[0].status and runs[0].status.name == "COMPLETED" else None


def _audit(config, histories: int = 40):
    import os
    import subprocess
    import sys
    from pathlib import Path

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

    from tests.conftest import write_config

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

    # PLATFORM_ERROR may be retried twice (SPEC §10): three attempts, then the run fails.
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
