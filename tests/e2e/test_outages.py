"""Outages of sources and sinks are waited out, and a run that gave up can be finished
(POST /tasks/{id}/retry; docs/architecture.md, docs/api.md). Real Temporal, real sample
servers on loopback; the clock is scaled down (outages of seconds, waits capped at 1 s),
the defaults (1800 s, 60 s) ride out the same shapes for longer."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from functools import partial
from typing import Any

import httpx
from sqlalchemy import text

from artemis.db import get_engine
from artemis.run_state import TERMINAL
from artemis.temporal.client import connect
from infra.devserver import DevServer, free_port
from tests.conftest import new_task_id, serve_api, settings_with, start_worker_process, write_config
from tests.e2e.test_events import read_sse
from tests.helpers import eventually, patch_traces, stop_processes

# Waits between attempts capped at 1 s: an outage of a few seconds is many attempts.
SCALED = {"retry_max_interval_s": 1.0, "pages_per_fetch": 2}
NOV_DAYS = 30


def delivered(batches: list[dict[str, Any]]) -> Counter:
    """How many times each (symbol, date) reached the sink in an accepted POST."""
    out: Counter = Counter()
    for b in batches:
        if b["status"] == 200:
            for r in b["records"]:
                out[(r["symbol"], r["date"])] += 1
    return out


def by_key(batches: list[dict[str, Any]]) -> dict[str, set[int]]:
    """Statuses each Idempotency-Key was answered with."""
    out: dict[str, set[int]] = {}
    for b in batches:
        out.setdefault(b["idempotency_key"], set()).add(b["status"])
    return out


async def _status(stack, task_id: str) -> dict[str, Any]:
    return (await stack.http.get(f"/tasks/{task_id}")).json()["data"] or {}


async def _start(stack, symbols: list[str], page_size: int = 5, **meta: Any) -> tuple[str, str]:
    task_id, run_id = new_task_id(), f"cron-{new_task_id()}"
    body = {
        "meta": {
            "task_id": task_id,
            "run_id": run_id,
            "callback": {"base_url": f"{stack.samples_url}/cronjob/runs"},
            **meta,
        },
        "params": {"symbols": symbols, "page_size": page_size},
    }
    resp = await stack.run(body, mode="async")
    assert resp.status_code == 202, resp.text
    return task_id, run_id


async def _waiting_on(stack, task_id: str, dependency: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        data = await _status(stack, task_id)
        w = data.get("waiting")
        return data if w and w.get("dependency") == dependency else None

    return await eventually(check, f"the run to say it waits on the {dependency}", timeout=60)


async def _emitted_some(stack, task_id: str) -> None:
    async def check() -> bool:
        data = await _status(stack, task_id)
        return (data.get("stats") or {}).get("records_emitted", 0) > 0

    await eventually(check, "the run to deliver its first records", timeout=60)


async def _clear(stack) -> None:
    for target in ("sink", "quotes", "cronjob"):
        await stack.fault(target)
    await stack.fault("latency", latency_ms=0)


async def test_sink_down_mid_run_is_waited_out_and_every_record_arrives_once(make_stack):
    stack = await make_stack(runs=SCALED)
    await stack.fault("latency", latency_ms=40)
    try:
        task_id, run_id = await _start(stack, ["AAPL", "MSFT"])
        await _emitted_some(stack, task_id)
        outage_began = time.monotonic()
        await stack.fault("sink", status=503, for_s=8)
        data = await _waiting_on(stack, task_id, "sink")
        w = data["waiting"]
        assert data["status"] == "running" and w["name"] == "http"
        assert w["reason"] == "503 Service Unavailable" and w["attempt"] >= 1
        assert data["waiting_line"].startswith("waiting: sink http unavailable since ")
        assert "(503 Service Unavailable), attempt" in data["waiting_line"]
        # the Temporal UI's current details say the same, and the gauge counts the run
        handle = stack.client.get_workflow_handle(data["workflow_id"])
        meta = await handle.query("__temporal_workflow_metadata")
        assert "waiting: sink http unavailable since" in meta.current_details
        metrics = (await stack.http.get("/metrics")).text
        assert 'artemis_runs_waiting{dependency="sink"} 0.0' not in metrics
        assert 'artemis_runs_waiting{dependency="sink"}' in metrics
        final = await stack.wait_status(task_id, timeout=120)
    finally:
        await _clear(stack)
    assert final["status"] == "completed", final
    assert time.monotonic() - outage_began >= 8  # it did wait the outage out
    batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    counts = delivered(batches)
    assert len(counts) == 2 * NOV_DAYS and set(counts.values()) == {1}
    keys = by_key(batches)
    # pages that met the outage went again, under the same key, until one was taken
    assert any(503 in statuses for statuses in keys.values())
    assert all(200 in statuses for statuses in keys.values())
    assert final["stats"]["records_emitted"] == 2 * NOV_DAYS
    assert len(await stack.finals(run_id)) == 1
    events = await read_sse(stack.api_url, task_id)
    waits = [e for e in events if e["event"] == "waiting"]
    assert waits and waits[0]["dependency"] == "sink" and waits[0]["name"] == "http"
    assert waits[0]["line"].startswith("waiting: sink http unavailable since ")
    assert [e for e in events if e["event"] == "recovered"][-1]["dependency"] == "sink"
    assert events[-1]["event"] == "complete"


async def test_source_down_mid_run_is_waited_out(make_stack):
    stack = await make_stack(runs=SCALED)
    await stack.fault("latency", latency_ms=40)
    try:
        task_id, run_id = await _start(stack, ["AAPL", "MSFT"])
        await _emitted_some(stack, task_id)
        await stack.fault("quotes", status=503, for_s=6)
        data = await _waiting_on(stack, task_id, "source")
        assert data["waiting"]["name"] == "quotes"
        assert data["waiting"]["reason"] == "503 Service Unavailable"
        final = await stack.wait_status(task_id, timeout=120)
    finally:
        await _clear(stack)
    assert final["status"] == "completed", final
    counts = delivered(await stack.sink_batches(f"pull_stock_quotes/{task_id}:"))
    assert len(counts) == 2 * NOV_DAYS and set(counts.values()) == {1}
    assert len(await stack.finals(run_id)) == 1


async def test_source_that_answers_nothing_is_cut_and_retried(make_stack):
    stack = await make_stack(runs=SCALED, http_client={"timeout_seconds": 1.0})
    await stack.fault("latency", latency_ms=40)
    try:
        task_id, run_id = await _start(stack, ["AAPL"])
        await _emitted_some(stack, task_id)
        await stack.fault("quotes", hang=True, for_s=6)
        data = await _waiting_on(stack, task_id, "source")
        assert data["waiting"]["reason"] == "read timed out"
        final = await stack.wait_status(task_id, timeout=120)
    finally:
        await _clear(stack)
    assert final["status"] == "completed", final
    counts = delivered(await stack.sink_batches(f"pull_stock_quotes/{task_id}:"))
    assert len(counts) == NOV_DAYS and set(counts.values()) == {1}


async def test_past_the_tolerance_the_run_fails_and_a_retry_finishes_it(make_stack):
    stack = await make_stack(runs={**SCALED, "outage_tolerance_s": 10})
    # symbols of this test alone: the sample server's request log is shared
    symbols = [f"R{new_task_id()[-5:]}".upper(), f"S{new_task_id()[-5:]}".upper()]
    await stack.fault("latency", latency_ms=30)
    try:
        task_id, run_id = await _start(stack, symbols)
        await _emitted_some(stack, task_id)
        down = time.monotonic()
        await stack.fault("sink", status=503, for_s=3600)
        final = await stack.wait_status(task_id, timeout=120)
        failed_after = time.monotonic() - down
        calls_at_failure = await stack.samples_http.get("/_quotes/calls")
    finally:
        await stack.fault("latency", latency_ms=0)
    assert final["status"] == "failed", final
    assert final["error"]["code"] == "SINK_UNAVAILABLE", final
    assert "sink http unavailable" in final["error"]["message"]
    assert "503 Service Unavailable" in final["error"]["message"]
    assert 10 <= failed_after < 70, failed_after
    # its undelivered pages stay staged
    engine = get_engine(stack.settings.database.url)
    assert _staged_raw_pages(engine, f"pull_stock_quotes/{task_id}") > 0
    assert [c["body"]["result"] for c in await stack.finals(run_id)] == ["failed"]
    delivered_before = {
        k
        for k, statuses in by_key(await stack.sink_batches(f"pull_stock_quotes/{task_id}:")).items()
        if 200 in statuses
    }

    await stack.fault("sink")  # the sink is back
    resp = await stack.http.post(f"/tasks/{task_id}/retry")
    assert resp.status_code == 202, resp.text
    answer = resp.json()["data"]
    assert answer["retry_attempt"] == 1 and answer["retried_error"] == "SINK_UNAVAILABLE"
    done = await stack.wait_status(task_id, {"completed", "failed"}, timeout=120)
    assert done["status"] == "completed", done
    # the retry's row in the UI says what it harvests, like the first attempt's
    desc = await stack.client.get_workflow_handle(done["workflow_id"]).describe()
    summary = await desc.static_summary()
    assert summary is not None and summary.startswith("pull_stock_quotes · ")
    assert ", ".join(symbols) in summary and summary.endswith(f"task {task_id} · retry 1")
    batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    counts = delivered(batches)
    assert len(counts) == 2 * NOV_DAYS and set(counts.values()) == {1}
    # the stats went on from the failed attempt's, nothing counted twice
    for key in ("records_fetched", "records_processed", "records_emitted"):
        assert done["stats"][key] == 2 * NOV_DAYS, (key, done["stats"])
    _delivered_pages_not_sent_again(batches, delivered_before)
    calls = (await stack.samples_http.get("/_quotes/calls")).json()
    _fetched_pages_not_fetched_again(calls_at_failure.json(), calls, symbols)
    results = [c["body"]["result"] for c in await stack.finals(run_id)]
    assert results == ["failed", "success"], results
    # the retry started on the current code's flow (its kept request notwithstanding)
    assert await patch_traces(stack.client, done["workflow_id"]) == []


def _staged_raw_pages(engine, run_key: str) -> int:
    """The fetched pages of ``run_key`` staged and not yet delivered."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM staged_page WHERE run_key = :k AND kind = 'raw' "
                "AND payload != ''"
            ),
            {"k": run_key},
        ).scalar_one()


def _delivered_pages_not_sent_again(batches: list[dict[str, Any]], before: set[str]) -> None:
    """Pages the sink took before the failure (``before``: their keys) were not sent again."""
    after = [b for b in batches if b["idempotency_key"] in before]
    assert Counter(b["idempotency_key"] for b in after if b["status"] == 200) == Counter(
        dict.fromkeys(before, 1)
    )


def _fetched_pages_not_fetched_again(
    calls_before: list[dict[str, Any]], calls: list[dict[str, Any]], symbols: list[str]
) -> None:
    """Nothing fetched before the failure was fetched again, and every page of
    ``symbols`` was fetched (the source's request log before the failure and now)."""
    mine_before = [(c["symbol"], c["page"]) for c in calls_before if c["symbol"] in symbols]
    mine_after = [(c["symbol"], c["page"]) for c in calls if c["symbol"] in symbols]
    assert len(mine_before) == len(set(mine_before))  # each page asked for once before
    refetched = Counter(mine_after) - Counter(mine_before)
    assert not set(refetched) & set(mine_before), refetched
    assert sorted(set(mine_after)) == sorted((sym, page) for sym in symbols for page in range(1, 7))


async def test_fetch_side_stays_bounded_while_the_sink_is_down(make_stack):
    stack = await make_stack(runs={**SCALED, "max_batches_ahead": 2, "outage_tolerance_s": 3600})
    key = None
    engine = get_engine(stack.settings.database.url)
    try:
        await stack.fault("sink", status=503, for_s=3600)
        task_id, _ = await _start(stack, ["AAPL", "MSFT"], page_size=1)
        key = f"pull_stock_quotes/{task_id}"
        await _waiting_on(stack, task_id, "sink")
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # a window watched, not a wait
            seen.append(_staged_raw_pages(engine, key))
            await asyncio.sleep(0.2)
        # two batches of two pages at most: the one waiting for the sink, the next one
        assert max(seen) <= 2 * 2, seen
        assert seen[-1] > 0
        before = (await stack.samples_http.get("/_stats")).json()["quote_requests"]
        attempt = int((await _status(stack, task_id))["waiting"]["attempt"])
        # two more attempts at the sink go by: the source is asked nothing meanwhile
        await eventually(
            lambda: _attempts_at_least(stack, task_id, attempt + 2), "two more attempts", 60
        )
        assert (await stack.samples_http.get("/_stats")).json()["quote_requests"] == before
        await stack.fault("sink")
        final = await stack.wait_status(task_id, timeout=180)
    finally:
        await _clear(stack)
    assert final["status"] == "completed", final
    counts = delivered(await stack.sink_batches(f"{key}:"))
    assert len(counts) == 2 * NOV_DAYS and set(counts.values()) == {1}


async def test_retry_refusals_name_why(make_stack):
    stack = await make_stack(runs={**SCALED, "retain_failed_s": 1})
    assert (await stack.http.post("/tasks/t-unknown-0000/retry")).status_code == 404

    ok = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["AAPL"]}})
    done_id = ok.json()["data"]["task_id"]
    resp = await stack.http.post(f"/tasks/{done_id}/retry")
    assert resp.status_code == 409 and "completed" in resp.json()["error"]["message"]

    await stack.fault("sink", status=400, times=1)
    bad = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["X"]}})
    assert bad.json()["data"]["status"] == "failed"
    resp = await stack.http.post(f"/tasks/{bad.json()['data']['task_id']}/retry")
    assert resp.status_code == 409 and "SINK_ERROR" in resp.json()["error"]["message"]

    await stack.fault("latency", latency_ms=100)
    try:
        task_id, _ = await _start(stack, ["AAPL"], page_size=1)
        resp = await stack.http.post(f"/tasks/{task_id}/retry")
        assert resp.status_code == 409 and "running" in resp.json()["error"]["message"]
        await stack.http.post(f"/tasks/{task_id}/cancel")
        await stack.wait_status(task_id)
    finally:
        await stack.fault("latency", latency_ms=0)

    # a run that gave up, whose kept state expired (retain_failed_s: 1)
    stack2 = await make_stack(runs={**SCALED, "outage_tolerance_s": 1, "retain_failed_s": 1})
    try:
        await stack2.fault("sink", status=503, for_s=3600)
        gone = await stack2.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["Z"]}})
    finally:
        await stack2.fault("sink")
    data = gone.json()["data"]
    assert data["status"] == "failed" and data["error"]["code"] == "SINK_UNAVAILABLE", data
    from artemis.retained import KEPT_FORMAT, Retained

    kept = Retained(stack2.settings.database.url)
    key = f"pull_stock_quotes/{data['task_id']}"
    state = kept.load(key)
    if state is not None:  # (it may have expired already on a slow machine)
        assert state["state"]["format"] == KEPT_FORMAT and state["state"]["build"]
    await eventually(lambda: kept.load(key) is None, "the kept state to expire", timeout=30)
    resp = await stack2.http.post(f"/tasks/{data['task_id']}/retry")
    assert resp.status_code == 410, resp.text
    assert resp.json()["error"]["code"] == "GONE"
    assert "cleaned up" in resp.json()["error"]["message"]


async def test_sql_sink_database_down_is_waited_out(make_stack, tmp_path):
    import sqlalchemy as sa

    from infra.pgserver import PgServer, available
    from tests.conftest import require

    require(available(), "PostgreSQL", "postgresql")
    # durable: a crash loses no committed transaction (as in production)
    lake = PgServer(dbname="lake", durable=True).start()
    try:
        stack = await make_stack(
            runs=SCALED,
            output_defaults={
                "pull_stock_quotes": {
                    "sinks": ["sql"],
                    "sql": {"url": lake.url, "table": "quotes"},
                }
            },
        )
        await stack.fault("latency", latency_ms=40)
        try:
            task_id, run_id = await _start(stack, ["PGX", "PGY"])
            await _emitted_some(stack, task_id)
            lake.crash()
            try:
                data = await _waiting_on(stack, task_id, "sink")
                assert data["waiting"]["name"] == "sql"
                assert data["waiting"]["reason"] == "database unreachable"
                await eventually(
                    lambda: _attempts_at_least(stack, task_id, 3), "three attempts", timeout=60
                )
            finally:
                lake.restart()
            final = await stack.wait_status(task_id, timeout=120)
        finally:
            await _clear(stack)
        assert final["status"] == "completed", final
        assert final["stats"]["sinks"]["sql"] == 2 * NOV_DAYS
        with sa.create_engine(lake.url).connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT symbol, date, count(*) FROM quotes WHERE _artemis_task_id = :t "
                    "GROUP BY symbol, date"
                ),
                {"t": task_id},
            ).all()
        assert len(rows) == 2 * NOV_DAYS and {r[2] for r in rows} == {1}
        assert len(await stack.finals(run_id)) == 1
    finally:
        lake.stop()


async def _attempts_at_least(stack, task_id: str, n: int) -> bool:
    w = (await _status(stack, task_id)).get("waiting") or {}
    return int(w.get("attempt") or 0) >= n


async def test_a_waiting_run_survives_its_worker_killed_and_temporal_restarted(
    make_stack, tmp_path
):
    """The wait is a Temporal timer: no worker holds it, the server keeps it."""
    temporal = DevServer(
        port=free_port(),
        ui_port=None,
        db_file=tmp_path / "temporal.db",
        log_file=tmp_path / "temporal.log",
    ).start()
    base = await make_stack(worker=False)
    settings = settings_with(
        base.settings,
        temporal={**base.settings.temporal.model_dump(), "address": temporal.address},
        runs=SCALED,
        logging={"output": "file", "file": {"path": str(tmp_path / "worker.log")}},
    )
    config = write_config(tmp_path / "worker.yaml", settings)
    client = await connect(settings)
    server, serving, api_url = await serve_api(settings, client)
    workers = [start_worker_process(config, tmp_path / "worker1.out")]
    api = httpx.AsyncClient(base_url=api_url, timeout=60)
    try:
        await base.fault("sink", status=503, for_s=3600)
        task_id, run_id, body = base.callback_run(["KILLW"], page_size=5)
        resp = await api.post("/tasks/pull_stock_quotes/run", params={"mode": "async"}, json=body)
        assert resp.status_code == 202, resp.text
        attempt = partial(_sink_wait_attempt, api, task_id)
        await eventually(attempt, "the run to wait on the sink", timeout=90)
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(10)
        workers.append(start_worker_process(config, tmp_path / "worker2.out"))
        seen = await eventually(attempt, "the wait to go on", timeout=60)
        await _temporal_away_then_back(temporal)
        await eventually(lambda: _grew(attempt, seen), "attempts after the restart", timeout=90)
        await base.fault("sink")  # the sink is back
        data = await eventually(
            partial(_ended, api, task_id), "the run to end", timeout=120, interval=0.2
        )
    finally:
        await base.fault("sink")
        await api.aclose()
        stop_processes(*workers)
        server.should_exit = True
        await serving
        temporal.stop()
    assert data["status"] == "completed", data
    counts = delivered(await base.sink_batches(f"pull_stock_quotes/{task_id}:"))
    assert len(counts) == NOV_DAYS and set(counts.values()) == {1}
    finals = await base.finals(run_id)
    assert [f["body"]["result"] for f in finals] == ["success"]


async def _sink_wait_attempt(api: httpx.AsyncClient, task_id: str) -> int:
    """The attempt at the sink the run says it waits on (0: not waiting on the sink)."""
    data = (await api.get(f"/tasks/{task_id}")).json()["data"] or {}
    w = data.get("waiting") or {}
    return int(w.get("attempt") or 0) if w.get("dependency") == "sink" else 0


async def _temporal_away_then_back(temporal: DevServer) -> None:
    """The server goes away for a while, then comes back with its database."""
    temporal.stop()
    await asyncio.sleep(3)  # deliberate: the server stays away this long (the outage)
    temporal.start()


async def _ended(api: httpx.AsyncClient, task_id: str) -> dict[str, Any] | None:
    """The run's answer once it has ended."""
    data = (await api.get(f"/tasks/{task_id}")).json()["data"] or {}
    return data if data.get("status") in TERMINAL else None


async def _grew(probe, before: int) -> bool:
    return await probe() > before


async def test_a_provenances_own_tolerance_and_a_per_task_one(make_stack):
    from tests.e2e.test_literature import _literature, harvest, import_doc, variant

    stack = await make_stack(runs=SCALED)
    code = f"crossref_short_{new_task_id()[-6:]}"
    doc = variant(stack, "crossref", code)
    doc["retry_cfg"][0].update(
        initial_delay_millis=100, circuit_break_threshold=None, outage_tolerance_millis=1500
    )
    import_doc(stack, doc)
    await _literature(stack, fault={"api": "works", "status": 503, "times": 100000})
    try:
        began = time.monotonic()
        resp = await harvest(
            stack, new_task_id(), provenance=code, query="x", start="2025-01-01", end="2025-01-02"
        )
        took = time.monotonic() - began
    finally:
        await _literature(stack, fault={})
    data = resp.json()["data"]
    assert data["status"] == "failed", data
    assert data["error"]["code"] == "SOURCE_UNAVAILABLE", data
    assert f"source {code} unavailable" in data["error"]["message"]
    assert took < 30, took

    # a task's own: task_defaults / params outage_tolerance_s (0: fail fast)
    await stack.fault("quotes", status=503, times=100000)
    try:
        resp = await stack.run(
            {
                "meta": {"task_id": new_task_id()},
                "params": {"symbols": ["FF"], "outage_tolerance_s": 0},
            }
        )
    finally:
        await stack.fault("quotes")
    data = resp.json()["data"]
    assert data["status"] == "failed" and data["error"]["code"] == "SOURCE_ERROR", data


async def test_a_state_kept_by_a_build_of_another_format_is_gone_naming_the_build(make_stack):
    """A retry runs on the current build: a state kept in a format it does not read is
    refused (410) before it is taken, naming the build that kept it."""
    from sqlalchemy import text

    from artemis.db import get_engine
    from artemis.retained import KEPT_FORMAT, Retained

    stack = await make_stack(runs={**SCALED, "outage_tolerance_s": 1, "retain_failed_s": 3600})
    try:
        await stack.fault("sink", status=503, for_s=3600)
        failed = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["Z"]}})
    finally:
        await stack.fault("sink")
    data = failed.json()["data"]
    assert data["error"]["code"] == "SINK_UNAVAILABLE", data
    key = f"pull_stock_quotes/{data['task_id']}"
    kept = Retained(stack.settings.database.url)
    state = kept.load(key)["state"]
    assert state["format"] == KEPT_FORMAT
    other = {**state, "format": KEPT_FORMAT + 1, "build": "otherbuild01"}
    with get_engine(stack.settings.database.url).begin() as conn:
        conn.execute(
            text("UPDATE retained_run SET state = :s WHERE run_key = :k"),
            {"s": json.dumps(other), "k": key},
        )
    resp = await stack.http.post(f"/tasks/{data['task_id']}/retry")
    assert resp.status_code == 410, resp.text
    error = resp.json()["error"]
    assert error["code"] == "GONE" and "otherbuild01" in error["message"], error
    assert f"format {KEPT_FORMAT + 1}" in error["message"]
    assert kept.load(key)["taken_at"] is None  # refused before it was taken
