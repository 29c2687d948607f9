"""literature_harvest runs through the registry contract against the sample PubMed and
Crossref servers."""

from __future__ import annotations

import time
from collections import Counter
from functools import partial

import httpx

from artemis.run_models import provenance_queue
from tests.conftest import new_task_id, start_worker_process, write_config
from tests.helpers import assert_rate_at_most, ending, eventually, patch_traces

KEYS = {"provenance", "id", "doi", "title", "journal", "published", "authors", "abstract"}


def variant(stack, name: str, code: str) -> dict:
    """A bundled registry file under another provenance code, pointed at the samples."""
    import yaml

    from tests.conftest import ROOT

    doc = yaml.safe_load((ROOT / "infra" / "registry" / f"{name}.yaml").read_text())
    doc["provenance"]["provenance_code"] = code
    doc["provenance"]["base_url_default"] = (
        f"{stack.samples_url}/entrez" if name == "pubmed" else stack.samples_url
    )
    return doc


def import_doc(stack, doc: dict) -> None:
    import yaml

    from artemis.db import get_engine
    from artemis.registry.yaml_io import import_yaml

    import_yaml(
        get_engine(stack.settings.database.url),
        yaml.safe_dump(doc),
        stack.settings.vault.master_key_file,
    )


async def harvest(stack, task_id: str, mode: str = "sync", **params):
    """Start literature_harvest with ``params`` under ``task_id``; the API's answer."""
    return await stack.run(
        {"meta": {"task_id": task_id}, "params": params}, code="literature_harvest", mode=mode
    )


async def harvest_source(stack, task_id: str, mode: str = "sync", **params):
    """Start source_harvest (a registry source of no paper family) with ``params``."""
    return await stack.run(
        {"meta": {"task_id": task_id}, "params": params}, code="source_harvest", mode=mode
    )


async def _delivered(stack, task_id: str) -> Counter:
    batches = await stack.sink_batches(f"literature_harvest/{task_id}:")
    by_key = {b["idempotency_key"]: b["records"] for b in batches if b["status"] == 200}
    counts: Counter = Counter()
    for records in by_key.values():
        for r in records:
            assert set(r) == KEYS
            counts[(r["provenance"], r["id"])] += 1
    return counts


async def test_pubmed_harvest_delivers_every_record_once(stack):
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        await http.post("/_control/literature", json={"reset": True})
    task_id = new_task_id()
    resp = await harvest(
        stack,
        task_id,
        provenance="pubmed",
        task_type="harvest",
        query="cancer",
        start="2025-01-01",
        end="2025-01-10",
    )
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "completed", data
    counts = await _delivered(stack, task_id)
    assert len(counts) == 300 and set(counts.values()) == {1}  # 10 days x 30 per day
    assert data["stats"]["records_emitted"] == 300
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        calls = (await http.get("/_literature/calls")).json()
    searches = [c for c in calls if c["api"] == "esearch"]
    fetches = [c for c in calls if c["api"] == "efetch"]
    assert searches[0]["params"]["usehistory"] == "y"
    assert searches[0]["params"]["mindate"] == "2025/01/01"
    assert searches[0]["params"]["maxdate"] == "2025/01/10"
    assert searches[0]["params"]["datetype"] == "edat"
    assert all(c["params"].get("tool") and c["params"].get("email") for c in calls)
    # two efetch batches, in flight together (max_parallel_requests 3): either may land first
    assert sorted(len(c["params"]["id"].split(",")) for c in fetches) == [100, 200]


async def test_crossref_harvest_with_cursor_delivers_every_record_once(stack):
    task_id = new_task_id()
    resp = await harvest(
        stack,
        task_id,
        provenance="crossref",
        task_type="harvest",
        query="ecology",
        start="2025-01-01",
        end="2025-01-10",
        page_size=100,
    )
    assert resp.status_code == 200, resp.text
    counts = await _delivered(stack, task_id)
    assert len(counts) == 300 and set(counts.values()) == {1}
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        calls = [
            c
            for c in (await http.get("/_literature/calls")).json()
            if c["api"] == "works" and c["params"].get("query") == "ecology"
        ]
    assert calls[0]["params"]["cursor"] == "*" and calls[0]["params"]["rows"] == "100"
    assert calls[1]["params"]["cursor"] != "*"
    assert "offset" not in calls[0]["params"]
    assert calls[0]["params"]["filter"] == "from-index-date:2025-01-01,until-index-date:2025-01-10"
    assert calls[0]["params"]["mailto"]


async def test_unknown_provenance_and_bad_task_type_are_422(stack):
    resp = await stack.run({"params": {"provenance": "arxiv"}}, code="literature_harvest")
    assert (
        resp.status_code == 422 and "unknown provenance 'arxiv'" in resp.json()["error"]["message"]
    )
    resp = await stack.run(
        {"params": {"provenance": "pubmed", "task_type": "weekly"}}, code="literature_harvest"
    )
    assert resp.status_code == 422 and "params.task_type" in resp.json()["error"]["message"]
    resp = await stack.run(
        {"params": {"provenance": "pubmed", "contract": {}}}, code="literature_harvest"
    )
    assert resp.status_code == 422 and "params.contract" in resp.json()["error"]["message"]


async def test_update_runs_advance_the_watermark_only_on_success(stack):
    from datetime import UTC, datetime, timedelta

    from artemis.db import get_engine
    from artemis.registry.resolve import find_provenance
    from artemis.registry.watermark import read_watermark

    query = f"update-{new_task_id()}"
    engine = get_engine(stack.settings.database.url)

    def mark():
        with engine.connect() as conn:
            pid = find_provenance(conn, "crossref").id
            return read_watermark(conn, pid, "update", query)

    async def run(**params):
        task_id = new_task_id()
        resp = await stack.run(
            {
                "meta": {"task_id": task_id},
                "params": {
                    "provenance": "crossref",
                    "task_type": "update",
                    "query": query,
                    **params,
                },
            },
            code="literature_harvest",
        )
        return task_id, resp

    # the first run of a query needs a start
    _, resp = await run(end="2025-01-05")
    assert resp.status_code == 422 and "params.start" in resp.json()["error"]["message"]
    t1, resp = await run(start="2025-01-01", end="2025-01-05")
    assert resp.json()["data"]["status"] == "completed", resp.text
    assert len(await _delivered(stack, t1)) == 150  # Jan 1..5, 30 a day
    assert mark() == datetime(2025, 1, 5, tzinfo=UTC)
    # next run: from the watermark minus the 1 h overlap (so Jan 4 again) up to its end
    t2, resp = await run(end="2025-01-08")
    ids = {i for _, i in await _delivered(stack, t2)}
    assert len(ids) == 150 and "10.5555/crossref.90" in ids  # Jan 4 is index 90..119
    assert mark() == datetime(2025, 1, 8, tzinfo=UTC)
    # a failed run leaves the watermark where it was
    await stack.fault("sink", status=400, times=1)
    _, resp = await run(end="2025-01-12")
    assert resp.json()["data"]["status"] == "failed"
    assert mark() == datetime(2025, 1, 8, tzinfo=UTC)
    # without an end: up to now minus the contract's 20 min lag
    _, resp = await run()
    assert resp.json()["data"]["status"] == "completed"
    lagged = datetime.now(UTC) - timedelta(seconds=1200)
    assert abs((mark() - lagged).total_seconds()) < 60


async def _literature(stack, **spec):
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        await http.post("/_control/literature", json=spec)


async def _works_calls(stack, query):
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        return [
            c
            for c in (await http.get("/_literature/calls")).json()
            if c["api"] == "works" and c["params"].get("query") == query
        ]


async def test_retry_cfg_is_the_fetch_retry_policy_and_retry_after_is_honoured(stack):
    query = f"retry-{new_task_id()}"
    await _literature(stack, fault={"api": "works", "status": 429, "times": 1, "retry_after": "3"})
    task_id = new_task_id()
    resp = await harvest(
        stack, task_id, provenance="crossref", query=query, start="2025-01-01", end="2025-01-02"
    )
    assert resp.json()["data"]["status"] == "completed", resp.text
    calls = await _works_calls(stack, query)
    assert calls[0]["status"] == 429 and calls[1]["status"] == 200
    # crossref.yaml retries after 1 s; the answer's Retry-After: 3 wins
    assert calls[1]["at"] - calls[0]["at"] >= 2.8
    assert len(await _delivered(stack, task_id)) == 60
    history = await stack.client.get_workflow_handle(
        resp.json()["data"]["workflow_id"]
    ).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "fetch_pages"
    ]
    policy = scheduled[0].retry_policy
    # max_retries 5 + the first try would be 6; the circuit breaker's threshold (5) wins
    assert policy.maximum_attempts == 5
    assert policy.initial_interval.ToTimedelta().total_seconds() == 1.0
    assert policy.maximum_interval.ToTimedelta().total_seconds() == 60.0


async def test_giveup_status_fails_at_once_with_source_error(stack):
    query = f"giveup-{new_task_id()}"
    await _literature(stack, fault={"api": "works", "status": 403, "times": 1})
    resp = await stack.run(
        {
            "params": {
                "provenance": "crossref",
                "query": query,
                "start": "2025-01-01",
                "end": "2025-01-02",
            }
        },
        code="literature_harvest",
    )
    assert resp.status_code == 502
    assert (
        resp.json()["error"]["code"] == "SOURCE_ERROR" and "403" in resp.json()["error"]["message"]
    )
    assert [c["status"] for c in await _works_calls(stack, query)] == [403]


async def test_registry_change_mid_run_does_not_touch_that_run(stack):
    import yaml

    from artemis.db import get_engine
    from artemis.registry.yaml_io import export_yaml, import_yaml

    engine = get_engine(stack.settings.database.url)
    original = export_yaml(engine, "crossref")
    query = f"frozen-{new_task_id()}"
    await _literature(stack, latency_ms=150)
    try:
        task_id = new_task_id()
        await harvest(
            stack,
            task_id,
            provenance="crossref",
            query=query,
            start="2025-01-01",
            end="2025-01-10",
            page_size=50,
            mode="async",
        )
        await eventually(partial(_works_calls, stack, query), "the harvest to reach the source")
        # mid-run: page size and base URL change in the registry
        doc = yaml.safe_load(original)
        doc["pagination_cfg"][0]["max_page_size_value"] = 10
        doc["provenance"]["base_url_default"] = "http://127.0.0.1:1"
        import_yaml(engine, yaml.safe_dump(doc), stack.settings.vault.master_key_file)
        final = await stack.wait_status(task_id, timeout=60)
    finally:
        import_yaml(engine, original, stack.settings.vault.master_key_file)
        await _literature(stack, latency_ms=0)
    assert final["status"] == "completed", final
    assert len(await _delivered(stack, task_id)) == 300
    assert {c["params"]["rows"] for c in await _works_calls(stack, query)} == {"50"}


async def _delivered_tree(stack, task_id: str) -> Counter:
    """Records delivered by a run and all its child runs (their task ids extend its own)."""
    batches = await stack.sink_batches(f"literature_harvest/{task_id}")
    by_key = {b["idempotency_key"]: b["records"] for b in batches if b["status"] == 200}
    counts: Counter = Counter()
    for records in by_key.values():
        for r in records:
            counts[(r["provenance"], r["id"])] += 1
    return counts


async def test_backfill_runs_calendar_windows_as_child_workflows_two_at_a_time(stack):
    from artemis.run_models import workflow_id_for

    task_id = new_task_id()
    resp = await harvest(
        stack,
        task_id,
        provenance="crossref",
        task_type="backfill",
        query=f"bf-{task_id}",
        start="2025-01-01",
        end="2025-03-31",
        parallelism=2,
    )
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "completed"
    assert data["stats"]["records_emitted"] == 2700  # Jan 930 + Feb 840 + Mar 930
    counts = await _delivered_tree(stack, task_id)
    assert len(counts) == 2700 and set(counts.values()) == {1}
    spans = []
    for n, (first, last) in enumerate(
        [("2025-01-01", "2025-01-31"), ("2025-02-01", "2025-02-28"), ("2025-03-01", "2025-03-31")]
    ):
        child = stack.client.get_workflow_handle(
            workflow_id_for("literature_harvest", f"{task_id}.w{n}")
        )
        desc = await child.describe()
        assert desc.parent_id == data["workflow_id"]
        assert desc.status.name == "COMPLETED"
        spans.append((desc.start_time, desc.close_time))
        calls = await _works_calls(stack, f"bf-{task_id}")
        assert any(
            c["params"]["filter"] == f"from-index-date:{first},until-index-date:{last}"
            for c in calls
        )
    # never more than two windows at once
    for t, _ in spans:
        assert sum(1 for a, b in spans if a <= t < b) <= 2
    # The backfill's event stream shows its windows' batches and one end: its own.
    from tests.e2e.test_events import read_sse

    events = await read_sse(stack.api_url, task_id)
    fetched = [
        e for e in events if e["event"] == "activity_result" and e["activity"] == "fetch_pages"
    ]
    assert len(fetched) >= 3
    assert sum(e["data"]["records"] for e in fetched if not e["error"]) == 2700
    progress = [e for e in events if e["event"] == "progress"]
    assert progress[-1]["records_emitted"] == 2700 and progress[-1]["current"] == 3
    assert [e["event"] for e in events].count("complete") == 1
    assert events[-1]["event"] == "complete"


async def _capped_pubmed(stack, code: str, **rate) -> None:
    """A PubMed variant whose result cap is 400 (a month splits twice), with the sample
    server's own rate limit off (the run's rate is ``rate``)."""
    doc = variant(stack, "pubmed", code)
    doc["pagination_cfg"][0]["max_result_window"] = 400
    doc["rate_limit_cfg"][0].update(**rate)
    import_doc(stack, doc)
    await _literature(stack, enforce_rate=False)


async def test_window_over_the_result_cap_is_split_until_it_fits(stack):

    await _capped_pubmed(stack, "pubmed_small_cap", qps_limit=50, burst_capacity=10)
    try:
        task_id = new_task_id()
        resp = await harvest(
            stack,
            task_id,
            provenance="pubmed_small_cap",
            query=f"cap-{task_id}",
            start="2025-01-01",
            end="2025-01-30",
        )
    finally:
        await _literature(stack, enforce_rate=True)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "completed" and data["stats"]["records_emitted"] == 900
    counts = await _delivered_tree(stack, task_id)
    assert len(counts) == 900 and set(counts.values()) == {1}  # nothing truncated
    assert all(p == "pubmed_small_cap" for p, _ in counts)
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        searches = [
            c["params"]
            for c in (await http.get("/_literature/calls")).json()
            if c["api"] == "esearch" and c["params"].get("term") == f"cap-{task_id}"
        ]
    # the split run and its pieces (child runs) on the current code's flow: no patch markers
    traces = await patch_traces(stack.client, data["workflow_id"])
    async for wf in stack.client.list_workflows(
        f"WorkflowId STARTS_WITH 'artemis/literature_harvest/{task_id}.'"
    ):
        traces += await patch_traces(stack.client, wf.id)
    assert traces == []
    windows = {(s["mindate"], s["maxdate"]) for s in searches}
    # 30 days (900 hits) -> 15 + 15 (450 each, still over) -> four windows of 210-240 hits
    assert ("2025/01/01", "2025/01/30") in windows
    assert {
        ("2025/01/01", "2025/01/08"),
        ("2025/01/09", "2025/01/15"),
        ("2025/01/16", "2025/01/23"),
        ("2025/01/24", "2025/01/30"),
    } <= windows


async def test_parallelism_bounds_the_windows_fetching_however_deep_they_split(stack):
    """A backfill at parallelism 2 whose months split twice over the result cap: every
    window that fetches (a leaf) holds one of the 2 slots; never 3 at once."""
    await _capped_pubmed(
        stack, "pubmed_split_cap", qps_limit=200, burst_capacity=50, max_concurrency=8
    )
    try:
        task_id = new_task_id()
        resp = await harvest(
            stack,
            task_id,
            provenance="pubmed_split_cap",
            task_type="backfill",
            query=f"deep-{task_id}",
            start="2025-01-01",
            end="2025-02-28",
            parallelism=2,
        )
    finally:
        await _literature(stack, enforce_rate=True)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "completed" and data["stats"]["records_emitted"] == 1770
    counts = await _delivered_tree(stack, task_id)
    assert len(counts) == 1770 and set(counts.values()) == {1}
    runs = [
        w
        async for w in stack.client.list_workflows(
            f"WorkflowId STARTS_WITH 'artemis/literature_harvest/{task_id}.'"
        )
    ]
    parents = {w.parent_id for w in runs}
    leaves = [(w.start_time, w.close_time) for w in runs if w.id not in parents]
    # 2 months -> halves (still over 400) -> quarters: 8 windows that fetch
    assert len(leaves) == 8 and all(b is not None for _, b in leaves)
    busiest = max(sum(1 for a, b in leaves if a <= t < b) for t, _ in leaves)
    assert busiest <= 2, f"{busiest} windows fetched at once with parallelism 2"


async def test_a_provenance_imported_into_a_running_cluster_fetches_at_once(make_stack):
    """Workers re-read the registry every 30 s here; a harvest of a provenance imported a
    moment ago still reaches its source within 2 s of its start."""
    stack = await make_stack(runs={"provenance_refresh_s": 30.0, "pages_per_fetch": 5})
    code = f"fresh_{new_task_id()[:8]}"
    import_doc(stack, variant(stack, "crossref", code))
    task_id = new_task_id()
    started = time.time()
    resp = await harvest(
        stack,
        task_id,
        mode="async",
        provenance=code,
        query=f"fresh-{task_id}",
        start="2025-01-01",
        end="2025-01-02",
    )
    assert resp.status_code == 202, resp.text
    calls = await eventually(
        lambda: _works_calls(stack, f"fresh-{task_id}"), "the harvest's first request", 30
    )
    first = min(c["at"] for c in calls)
    assert first - started <= 2.0, f"first request {first - started:.2f} s after the start"
    final = await stack.wait_status(task_id, timeout=60)
    assert final["status"] == "completed", final


async def test_parent_and_child_histories_replay(stack):
    from temporalio.worker import Replayer

    from workflows.task_run import TaskRunWorkflow

    task_id = new_task_id()
    resp = await harvest(
        stack,
        task_id,
        provenance="crossref",
        task_type="backfill",
        query=f"rp-{task_id}",
        start="2025-01-01",
        end="2025-02-28",
    )
    assert resp.json()["data"]["status"] == "completed"
    histories = []
    async for wf in stack.client.list_workflows(
        f"WorkflowId STARTS_WITH 'artemis/literature_harvest/{task_id}'"
    ):
        histories.append(
            await stack.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        )
    assert len(histories) == 3  # the parent and its two month windows
    assert [ending(h) for h in histories] == ["WORKFLOW_EXECUTION_COMPLETED"] * 3
    replayed = 0
    async with Replayer(workflows=[TaskRunWorkflow]).workflow_replay_iterator(
        _aiter(histories)
    ) as results:
        async for result in results:
            assert result.replay_failure is None, result.replay_failure
            replayed += 1
    assert replayed == 3


async def _aiter(items):
    for item in items:
        yield item


async def test_expired_crossref_cursor_is_reopened_from_the_checkpoint(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 2})
    query = f"expire-{new_task_id()}"
    await _literature(stack, latency_ms=100)
    try:
        task_id = new_task_id()
        await harvest(
            stack,
            task_id,
            provenance="crossref",
            query=query,
            start="2025-01-01",
            end="2025-01-10",
            page_size=50,
            mode="async",
        )

        async def three_pages() -> bool:
            return len([c for c in await _works_calls(stack, query) if c["status"] == 200]) >= 3

        await eventually(three_pages, "the harvest to fetch 3 pages")
        await _literature(stack, expire_cursors=True)
        final = await stack.wait_status(task_id, timeout=60)
    finally:
        await _literature(stack, latency_ms=0)
    assert final["status"] == "completed", final
    counts = await _delivered(stack, task_id)
    assert len(counts) == 300 and set(counts.values()) == {1}
    calls = await _works_calls(stack, query)
    assert [c["params"]["cursor"] for c in calls].count("*") == 2  # opened, then re-opened
    assert any(c["status"] == 400 for c in calls)


async def test_expired_pubmed_webenv_is_reopened_at_the_same_retstart(make_stack):
    stack = await make_stack(runs={"pages_per_fetch": 1})
    query = f"webenv-{new_task_id()}"
    await _literature(stack, enforce_rate=False)
    try:
        task_id = new_task_id()
        await harvest(
            stack,
            task_id,
            provenance="pubmed",
            query=query,
            start="2025-01-01",
            end="2025-01-10",
            page_size=100,
            mode="async",
        )
        async with httpx.AsyncClient(base_url=stack.samples_url) as http:

            async def searched() -> bool:
                calls = (await http.get("/_literature/calls")).json()
                return any(
                    c["api"] == "esearch" and c["params"].get("term") == query for c in calls
                )

            await eventually(searched, "the harvest to search", interval=0.02)
        await _literature(stack, expire_sessions=True)
        final = await stack.wait_status(task_id, timeout=60)
    finally:
        await _literature(stack, enforce_rate=True)
    assert final["status"] == "completed", final
    counts = await _delivered(stack, task_id)
    assert len(counts) == 300 and set(counts.values()) == {1}
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        searches = [
            c["params"]
            for c in (await http.get("/_literature/calls")).json()
            if c["api"] == "esearch" and c["params"].get("term") == query
        ]
    assert [s["retstart"] for s in searches][:1] == ["0"]
    reopened = [s for s in searches if "WebEnv" not in s and s["retstart"] != "0"]
    assert reopened, searches  # a fresh session, at the retstart it had reached


async def test_pause_resume_and_set_rate_limit_act_on_a_running_harvest(make_stack):
    from artemis.run_models import PauseRequest, RateLimitRequest

    stack = await make_stack(runs={"pages_per_fetch": 1})
    query = f"live-{new_task_id()}"
    await _literature(stack, latency_ms=50)
    try:
        task_id = new_task_id()
        resp = await harvest(
            stack,
            task_id,
            provenance="crossref",
            query=query,
            start="2025-01-01",
            end="2025-01-10",
            page_size=20,
            mode="async",
        )
        handle = stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"])

        async def two_pages() -> bool:
            return len(await _works_calls(stack, query)) >= 2

        await eventually(two_pages, "the harvest to fetch 2 pages", interval=0.02)
        await handle.signal("pause", PauseRequest(reason="maintenance"))

        async def paused() -> dict | None:
            progress = await handle.query("progress")
            return progress if progress["stage"] == "paused" else None

        progress = await eventually(paused, "the harvest to pause")
        assert progress["paused"] is True
        # paused: no fetch is running, so nothing can ask the source while paused
        pending = (await handle.describe()).raw_description.pending_activities
        assert "fetch_pages" not in [a.activity_type.name for a in pending]
        during = len(await _works_calls(stack, query))
        await handle.signal("set_rate_limit", RateLimitRequest(qps=4))
        await handle.signal("resume")
        final = await stack.wait_status(task_id, timeout=60)
    finally:
        await _literature(stack, latency_ms=0)
    assert final["status"] == "completed"
    assert len(await _delivered(stack, task_id)) == 300
    after = [c["at"] for c in await _works_calls(stack, query)][during:]
    # 4 requests/s, held evenly (burst 1), from the resume on (crossref.yaml: 10, burst 10),
    # by the source's own clock
    assert len(after) >= 5, after
    assert_rate_at_most(after, qps=4, burst=1)


async def test_circuit_breaker_rests_on_a_durable_timer_then_goes_on(stack):

    doc = variant(stack, "crossref", "crossref_breaker")
    doc["retry_cfg"][0].update(
        initial_delay_millis=100, circuit_break_threshold=2, circuit_cool_down_millis=2500
    )
    import_doc(stack, doc)
    query = f"breaker-{new_task_id()}"
    await _literature(stack, fault={"api": "works", "status": 503, "times": 2})
    task_id = new_task_id()
    resp = await harvest(
        stack,
        task_id,
        provenance="crossref_breaker",
        query=query,
        start="2025-01-01",
        end="2025-01-02",
    )
    assert resp.json()["data"]["status"] == "completed", resp.text
    calls = await _works_calls(stack, query)
    assert [c["status"] for c in calls[:3]] == [503, 503, 200]
    assert calls[1]["at"] - calls[0]["at"] < 1.5  # the retry policy's own backoff
    assert calls[2]["at"] - calls[1]["at"] >= 2.4  # the cool-down
    history = await stack.client.get_workflow_handle(
        resp.json()["data"]["workflow_id"]
    ).fetch_history()
    timers = [e for e in history.events if e.HasField("timer_started_event_attributes")]
    assert any(
        t.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds() == 2.5
        for t in timers
    )
    assert len(await _delivered(stack, task_id)) == 60


async def test_keys_rotate_on_401_and_429_with_per_key_health(stack, monkeypatch):
    suffix = new_task_id()[-8:]
    code = f"pubmed_keys_{suffix}"
    keys = import_three_keys(stack, monkeypatch, code, suffix)
    query = f"keys-{suffix}"
    await a_revoked_key_gives_way_to_the_newest(stack, code, query, keys)
    await a_429_benches_the_key_in_use(stack, code, f"{query}-2", keys)


def import_three_keys(stack, monkeypatch, code: str, suffix: str) -> tuple[str, ...]:
    """A PubMed variant ``code`` with three source-wide API keys from the environment:
    a (preferred), b (the newest) and c; their values."""
    keys = (f"key-a-{suffix}", f"key-b-{suffix}", f"key-c-{suffix}")
    for name, key in zip(("ROT_KEY_A", "ROT_KEY_B", "ROT_KEY_C"), keys, strict=True):
        monkeypatch.setenv(name, key)
    doc = variant(stack, "pubmed", code)
    doc["rate_limit_cfg"][0].update(qps_limit=20, burst_capacity=5)
    cred = {
        "scope_code": "SOURCE",
        "auth_type_code": "API_KEY_QUERY",
        "param_or_header_name": "api_key",
        "effective_from": "2025-01-01T00:00:00Z",
    }
    doc["credential"] = [
        {**cred, "credential_name": "a", "secret_env": "ROT_KEY_A", "is_default_preferred": True},
        {
            **cred,
            "credential_name": "b",
            "secret_env": "ROT_KEY_B",
            "effective_from": "2025-02-01T00:00:00Z",
        },
        {**cred, "credential_name": "c", "secret_env": "ROT_KEY_C"},
    ]
    import_doc(stack, doc)
    return keys


async def a_revoked_key_gives_way_to_the_newest(stack, code: str, query: str, keys) -> None:
    """Key a is revoked (401) and b's first answer is a 429: a (preferred) is refused
    once, then b (newest) serves everything and c is never needed; the rotation happens
    inside one attempt (no activity failed)."""
    key_a, key_b, key_c = keys
    await _literature(stack, bad_keys=[key_a], fault={"api": "esearch", "status": 429, "times": 0})
    task_id = new_task_id()
    resp = await harvest(
        stack, task_id, provenance=code, query=query, start="2025-01-01", end="2025-01-05"
    )
    await _literature(stack, bad_keys=[])
    assert resp.json()["data"]["status"] == "completed", resp.text
    assert len(await _delivered(stack, task_id)) == 150
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        calls = [
            c
            for c in (await http.get("/_literature/calls")).json()
            if c["params"].get("api_key") in (key_a, key_b, key_c)
        ]
    used = [(c["params"]["api_key"], c["status"]) for c in calls]
    assert used[0] == (key_a, 401)
    assert all(k == key_b and s == 200 for k, s in used[1:])
    history = await stack.client.get_workflow_handle(
        resp.json()["data"]["workflow_id"]
    ).fetch_history()
    assert not [e for e in history.events if e.HasField("activity_task_failed_event_attributes")]


async def a_429_benches_the_key_in_use(stack, code: str, query: str, keys) -> None:
    """A 429 (Retry-After: 30) benches the key in use (b) and c takes over."""
    _, key_b, key_c = keys
    await _literature(
        stack, fault={"api": "esearch", "status": 429, "times": 1, "retry_after": "30"}
    )
    resp = await harvest(
        stack, new_task_id(), provenance=code, query=query, start="2025-01-01", end="2025-01-02"
    )
    assert resp.json()["data"]["status"] == "completed", resp.text
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        searches = [
            (c["params"].get("api_key"), c["status"])
            for c in (await http.get("/_literature/calls")).json()
            if c["api"] == "esearch" and c["params"].get("term") == query
        ]
    assert searches[:2] == [(key_b, 429), (key_c, 200)]


async def test_qps_holds_across_two_worker_processes_and_fetches_use_the_provenance_queue(
    make_stack, tmp_path
):
    suffix = new_task_id()[-8:]
    stack = await make_stack()
    code = f"crossref_qps_{suffix}"
    doc = variant(stack, "crossref", code)
    doc["rate_limit_cfg"][0].update(qps_limit=4, burst_capacity=1, max_concurrency=2)
    import_doc(stack, doc)
    queue = provenance_queue(stack.settings.temporal.task_queue, code)
    # A second worker in a process of its own (nothing shared in memory with the first).
    config = write_config(tmp_path / "worker.yaml", stack.settings)
    second = start_worker_process(config, tmp_path / "worker2.out")
    try:
        await both_workers_poll(stack, queue)
        runs = []
        for n in range(2):
            task_id = new_task_id()
            await harvest(
                stack,
                task_id,
                provenance=code,
                query=f"qps-{suffix}-{n}",
                start="2025-01-01",
                end="2025-01-05",
                page_size=15,
                mode="async",
            )
            runs.append(task_id)
        finals = [await stack.wait_status(t, timeout=90) for t in runs]
        workers = set()
        for f in finals:
            workers |= await activity_workers(stack, f["workflow_id"])
    finally:
        second.terminate()
        second.wait(30)
    assert [f["status"] for f in finals] == ["completed", "completed"]
    for t in runs:
        assert len(await _delivered(stack, t)) == 150
    await one_gate_for_both_processes(stack, f"qps-{suffix}-")
    history = await stack.client.get_workflow_handle(finals[0]["workflow_id"]).fetch_history()
    queues = {
        e.activity_task_scheduled_event_attributes.task_queue.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "fetch_pages"
    }
    assert queues == {queue}
    assert len(workers) >= 2, f"activities ran on one worker only: {workers}"


async def both_workers_poll(stack, queue: str) -> None:
    """Wait until two worker processes poll the provenance's activity queue (a process
    starts in seconds)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    async def two_pollers() -> bool:
        desc = await stack.client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=stack.client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        return len({p.identity for p in desc.pollers}) >= 2

    await eventually(two_pollers, "both workers to poll the provenance queue", timeout=60)


async def activity_workers(stack, workflow_id: str) -> set[str]:
    """The identities of the workers that ran the workflow's activities."""
    history = await stack.client.get_workflow_handle(workflow_id).fetch_history()
    return {
        e.activity_task_started_event_attributes.identity
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    }


async def one_gate_for_both_processes(stack, query_prefix: str) -> None:
    """qps_limit 4 held by one gate for both processes (burst 1), measured at the server:
    no stretch of requests holds more than the gate lets through in it (a limit per
    process would let about twice as many through)."""
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        times = sorted(
            c["at"]
            for c in (await http.get("/_literature/calls")).json()
            if c["api"] == "works" and str(c["params"].get("query", "")).startswith(query_prefix)
        )
    assert len(times) >= 20
    busiest = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    average = (len(times) - 1) / (times[-1] - times[0])
    print(f"QPS_MEASURED busiest_1s={busiest} average={average:.2f} requests={len(times)}")
    assert_rate_at_most(times, qps=4, burst=1)


async def test_efetch_id_lists_over_the_threshold_go_by_post(stack):

    suffix = new_task_id()[-8:]
    doc = variant(stack, "pubmed", f"pubmed_post_{suffix}")
    doc["batching_cfg"][0].update(detail_batch_size=300, post_threshold_ids=200)
    import_doc(stack, doc)
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        before = len((await http.get("/_literature/calls")).json())
    task_id = new_task_id()
    resp = await harvest(
        stack,
        task_id,
        provenance=f"pubmed_post_{suffix}",
        query=f"post-{suffix}",
        start="2025-01-01",
        end="2025-01-15",
    )
    assert resp.json()["data"]["status"] == "completed", resp.text
    assert len(await _delivered(stack, task_id)) == 450
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        calls = (await http.get("/_literature/calls")).json()[before:]
    sizes = [
        (c["method"], len(c["params"]["id"].split(","))) for c in calls if c["api"] == "efetch"
    ]
    # both batches in flight together (either may land first): the long list by POST
    assert sorted(sizes) == [("GET", 150), ("POST", 300)]
