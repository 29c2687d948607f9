"""crawl_notes end to end: the sample platform, the cookie pool, the execution lock,
tbl_source written once, the sinks, and no cookie value anywhere it must not be."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter

from sqlalchemy import select

from artemis.crawler.cookies import add_cookie
from artemis.crawler.models import Candidate, CookieRow, CrawlExecution, SourceNote
from artemis.crawler.vault import vault_for
from artemis.db import get_engine
from tests.conftest import new_task_id


async def crawl_stack(make_stack, cookies: dict[str, int], **overrides):
    """A stack with its own platform name (so tests do not share a cookie pool) and
    ``cookies`` (session → priority) in that platform's pool."""
    platform = f"p{uuid.uuid4().hex[:8]}"
    probe = await make_stack(worker=False)
    base = f"{probe.samples_url}/platform"
    crawler = {
        "platforms": {platform: {"base_url": base}},
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


async def test_crawl_writes_each_note_once_and_sends_it_to_the_sinks(make_stack):
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
    with open(stack.settings.logging.file.path) as fh:
        log_text = fh.read()
    assert "web_session=sample-" not in log_text


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
    again = await stack.run(
        {"meta": {"task_id": first_id}, "params": params}, code="crawl_notes", mode="async"
    )
    assert again.status_code == 202  # the holder's own repeat attaches
    done = await stack.wait_status(first_id, timeout=60)
    assert done["status"] == "completed"
    for _ in range(100):  # the lock frees once the workflow closes
        third = await stack.run(
            {"meta": {"task_id": second_id}, "params": params}, code="crawl_notes", mode="async"
        )
        if third.status_code == 202:
            break
        await asyncio.sleep(0.1)
    assert third.status_code == 202
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
