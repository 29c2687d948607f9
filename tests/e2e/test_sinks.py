"""Runs that land their records in a SQL table and in files, through the whole stack."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from tests.conftest import new_task_id, settings_with, start_worker_process
from tests.e2e.test_worker_crash import worker_config
from tests.helpers import eventually, stop_processes
from tests.sinks.test_sinks import quotes_table


def _count(url: str, sql: str) -> int:
    with sa.create_engine(url).connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


async def test_a_run_lands_in_a_sqlite_table_and_parquet_files_with_a_manifest(
    make_stack, tmp_path: Path
) -> None:
    lake_db = f"sqlite:///{tmp_path / 'lake.db'}"
    lake = tmp_path / "lake"
    stack = await make_stack(
        output_defaults={
            "pull_stock_quotes": {
                "sinks": ["sql", "files"],
                "sql": {"url": lake_db, "table": "quotes"},
                "files": {"url": str(lake), "format": "parquet"},
            }
        }
    )
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL", "MSFT", "IBM"]}}
    )
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "completed", data
    stats = data["stats"]
    fetched = stats["records_fetched"]
    assert fetched > 0
    assert stats["sinks"] == {"sql": fetched, "files": fetched}
    # the table: each (symbol, date) once, every record of the run
    assert _count(lake_db, "SELECT COUNT(*) FROM quotes") == fetched
    assert _count(lake_db, "SELECT COUNT(DISTINCT symbol || date) FROM quotes") == fetched
    # the files: one per page with records, whole, and the manifest lists them
    run_dir = lake / "pull_stock_quotes" / task_id
    files = sorted(run_dir.glob("files-*.parquet"))
    assert 3 <= len(files) <= stats["pages"]
    # one ledger row per page written to the table
    assert _count(lake_db, "SELECT COUNT(*) FROM _artemis_sink_ledger") == len(files)
    assert sum(pq.read_table(f).num_rows for f in files) == fetched
    manifest = json.loads((run_dir / "_manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["records"] == fetched
    assert sorted(f["path"] for f in manifest["files"]) == [str(f) for f in files]
    assert stats["sinks_finished"]["files"]["manifest"] == str(run_dir / "_manifest.json")
    # GET shows the same counts
    shown = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]["stats"]
    assert shown["sinks"] == stats["sinks"]
    # no temporary file was left behind
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


async def test_a_request_naming_a_sink_destination_is_refused(make_stack, tmp_path: Path) -> None:
    stack = await make_stack(
        output_defaults={
            "pull_stock_quotes": {
                "sinks": ["sql"],
                "sql": {"url": f"sqlite:///{tmp_path / 'lake.db'}", "table": "quotes"},
            }
        }
    )
    resp = await stack.run(
        {
            "params": {"symbols": ["AAPL"]},
            "output": {"sinks": ["sql"], "sql": {"url": f"sqlite:///{tmp_path / 'other.db'}"}},
        },
        mode="async",
    )
    assert resp.status_code == 422, resp.text
    assert "output.sql.url" in resp.json()["error"]["message"]
    assert not (tmp_path / "other.db").exists()
    # a task id names the run's folder of the files sink: never a path step
    for task_id in ("..", "."):
        resp = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}}, mode="async"
        )
        assert resp.status_code == 422 and "meta.task_id" in resp.text, resp.text


async def test_a_schema_mismatch_is_refused_at_start_naming_the_column(
    make_stack, tmp_path: Path
) -> None:
    lake_db = f"sqlite:///{tmp_path / 'lake.db'}"
    quotes_table(lake_db, "quotes", volume=None)
    stack = await make_stack(
        output_defaults={
            "pull_stock_quotes": {"sinks": ["sql"], "sql": {"url": lake_db, "table": "quotes"}}
        }
    )
    resp = await stack.run({"params": {"symbols": ["AAPL"]}})
    data = resp.json()
    # found when the run starts, before anything is fetched: the configuration's error
    assert resp.status_code == 500 and data["data"] is None, data
    error = data["error"]
    assert error["code"] == "CONFIG_ERROR" and not error["retryable"]
    assert "no column 'volume'" in error["message"]
    assert _count(lake_db, "SELECT COUNT(*) FROM quotes") == 0


@pytest.mark.parametrize("streaming", [True, False], ids=["emit-while-fetching", "per-batch"])
async def test_sigkill_mid_emit_leaves_every_key_once_in_postgresql(
    make_stack, pg_server, samples, tmp_path: Path, streaming: bool
) -> None:
    lake_db = fresh_database(pg_server.url, f"lake_{os.urandom(4).hex()}")
    stack = await make_stack(
        worker=False,
        runs={
            "pages_per_fetch": 20,
            "heartbeat_timeout_s": 2.0,
            "emit_while_fetching": streaming,
        },
        output_defaults={
            "pull_stock_quotes": {
                # the table first, then a slow HTTP sink: pages in the table whose emit
                # the worker never finished are written again on the retry
                "sinks": ["sql", "files", "http"],
                "sql": {"url": lake_db, "table": "quotes"},
                "files": {"url": str(tmp_path / "lake"), "format": "parquet"},
                "http_endpoint": f"{samples.url}/sink/crash",
            }
        },
    )
    # (heartbeats start after the throttle interval, activities/run_base.py Heartbeat:
    # a short one lets the test see an emit heartbeat before it ends)
    config = worker_config(stack, tmp_path, worker={"heartbeat_throttle_s": 0.2})
    await stack.fault("sink", delay_ms=150)
    first = start_worker_process(config, tmp_path / "worker1.out")
    second = None
    try:
        task_id = new_task_id()
        resp = await stack.run(
            {
                "meta": {"task_id": task_id},
                "params": {"symbols": ["AAPL", "MSFT"], "page_size": 1},
            },
            mode="async",
        )
        assert resp.status_code == 202, resp.text
        handle = stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"])
        await mid_emit(handle, streaming)
        first.send_signal(signal.SIGKILL)
        first.wait(10)  # gone: its activity in flight is lost, found by its heartbeat timeout
        second = start_worker_process(config, tmp_path / "worker2.out")
        final = await stack.wait_status(task_id, timeout=120)
    finally:
        await stack.fault("sink", delay_ms=0)
        stop_processes(first, second)
    assert final["status"] == "completed", final
    assert final["stats"]["records_fetched"] == 60
    table_took_every_key_once(lake_db, final)
    history = await handle.fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(attempts) >= 2
    # pages in the table whose HTTP delivery the killed worker never finished went again,
    # and the table's ledger took each of them once
    assert "sql_sink_page_already_loaded" in (tmp_path / "worker.log").read_text()
    files_whole_and_listed(tmp_path / "lake" / "pull_stock_quotes" / task_id, records=60)


def fresh_database(server_url: str, name: str) -> str:
    """A new, empty database on the PostgreSQL server at ``server_url``; its URL."""
    with sa.create_engine(server_url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return server_url.rsplit("/", 1)[0] + f"/{name}"


async def mid_emit(handle, streaming: bool) -> None:
    """Wait until an emit activity — or, ``streaming``, a fetch sending its pages on — has
    heartbeated delivered pages (the moment to kill its worker in the middle of the
    batch)."""

    def delivering(a) -> bool:
        if not a.heartbeat_details.payloads:
            return False
        if not streaming:
            return a.activity_type.name == "emit_batch"
        beat = json.loads(a.heartbeat_details.payloads[0].data)
        return a.activity_type.name == "fetch_pages" and beat["stream"]["next_seq"] >= 2

    async def check() -> bool:
        desc = await handle.describe()
        return any(delivering(a) for a in desc.raw_description.pending_activities)

    await eventually(check, "an emit to heartbeat a delivered page", interval=0.02)


def table_took_every_key_once(lake_db: str, final: dict) -> None:
    """The SQL sink's table holds each (symbol, date) of the run once, its ledger one row
    per page, and the run's stats count every record."""
    assert _count(lake_db, "SELECT COUNT(*) FROM quotes") == 60
    assert _count(lake_db, "SELECT COUNT(DISTINCT (symbol, date)) FROM quotes") == 60
    assert _count(lake_db, "SELECT COUNT(*) FROM _artemis_sink_ledger") == 60
    assert final["stats"]["sinks"]["sql"] == 60


def files_whole_and_listed(run_dir: Path, records: int) -> None:
    """Every page's file is whole (a rewritten page replaced its own file) with each key
    once; a write the kill cut short left only its temporary file, removed at finalize;
    the manifest lists the files."""
    files = sorted(run_dir.glob("files-*.parquet"))
    keys = [(r["symbol"], r["date"]) for f in files for r in pq.read_table(f).to_pylist()]
    assert len(keys) == records == len(set(keys))
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    manifest = json.loads((run_dir / "_manifest.json").read_text())
    assert manifest["records"] == records and manifest["file_count"] == len(files)


async def test_sinks_across_continue_as_new_count_in_stats_and_events(
    make_stack, tmp_path: Path
) -> None:
    from tests.e2e.test_events import read_sse

    lake_db = f"sqlite:///{tmp_path / 'lake.db'}"
    lake = tmp_path / "lake"
    stack = await make_stack(
        runs={"pages_per_fetch": 1, "max_batches_per_run": 2},
        output_defaults={
            "pull_stock_quotes": {
                "sinks": ["sql", "files"],
                "sql": {"url": lake_db, "table": "quotes"},
                "files": {"url": str(lake), "format": "jsonl"},
            }
        },
    )
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"symbols": ["NFLX"], "page_size": 5}}
    )
    data = resp.json()["data"]
    assert data["status"] == "completed" and data["stats"]["pages"] == 6, data
    runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{data['workflow_id']}'")]
    assert len(runs) >= 3, "expected the run to continue as new at least twice"
    # the counts of every execution of the run add up
    assert data["stats"]["sinks"] == {"sql": 30, "files": 30}
    assert _count(lake_db, "SELECT COUNT(*) FROM quotes") == 30
    run_dir = lake / "pull_stock_quotes" / task_id
    files = sorted(run_dir.glob("files-*.jsonl"))
    assert [f.name for f in files] == [f"files-{n:06d}.jsonl" for n in range(6)]
    manifest = json.loads((run_dir / "_manifest.json").read_text())
    assert manifest["records"] == 30 and manifest["file_count"] == 6
    events = await read_sse(stack.api_url, task_id)
    assert events[-1]["event"] == "complete"
    assert events[-1]["stats"]["sinks"] == {"sql": 30, "files": 30}
    progress = [e["sinks"] for e in events if e["event"] == "progress"]
    assert progress[-1] == {"sql": 30, "files": 30}, progress


async def test_a_sink_configuration_problem_is_a_config_error_naming_the_key(make_stack):
    from tests.conftest import new_task_id as _id

    stack = await make_stack(output_defaults={"pull_stock_quotes": {"sinks": ["files"]}})
    resp = await stack.run({"meta": {"task_id": _id()}, "params": {"symbols": ["CFG"]}})
    err = resp.json()["error"]
    assert err["code"] == "CONFIG_ERROR", err  # not the request's fault
    assert "output_defaults.pull_stock_quotes" in err["message"] and "<code>" not in err["message"]
    empty = await make_stack(output_defaults={"pull_stock_quotes": {"sinks": []}})
    resp = await empty.run({"meta": {"task_id": _id()}, "params": {"symbols": ["CFG"]}})
    err = resp.json()["error"]
    assert err["code"] == "CONFIG_ERROR" and "no sinks configured" in err["message"], err


async def test_a_run_keeps_the_sinks_it_started_with_whatever_the_workers_config(
    make_stack, tmp_path: Path
) -> None:
    """A run's output is resolved when it starts and carried by the run: a worker with
    another configuration (a restart with a new config file) sends it to the same places."""
    from workers.main import running_worker

    started_db = f"sqlite:///{tmp_path / 'started.db'}"
    stack = await make_stack(
        worker=False,
        output_defaults={
            "pull_stock_quotes": {
                "sinks": ["sql", "files"],
                "sql": {"url": started_db, "table": "quotes"},
                "files": {"url": str(tmp_path / "started"), "format": "jsonl"},
            }
        },
    )
    task_id = new_task_id()
    body = {"meta": {"task_id": task_id}, "params": {"symbols": ["KEEP"], "page_size": 5}}
    resp = await stack.run(body, mode="async")
    assert resp.status_code == 202, resp.text
    other = settings_with(
        stack.settings,
        output_defaults={
            "pull_stock_quotes": {
                "sinks": ["files"],
                "files": {"url": str(tmp_path / "other"), "format": "jsonl"},
            }
        },
    )
    async with running_worker(other, stack.client):
        data = await stack.wait_status(task_id)
    assert data["status"] == "completed", data
    assert data["stats"]["sinks"] == {"sql": 30, "files": 30}, data["stats"]
    assert _count(started_db, "SELECT COUNT(*) FROM quotes") == 30
    assert len(list((tmp_path / "started" / "pull_stock_quotes" / task_id).glob("*.jsonl"))) == 6
    assert not (tmp_path / "other").exists()
    # The resolved output in history names no secret and says it was resolved.
    history = await stack.client.get_workflow_handle(data["workflow_id"]).fetch_history()
    first = history.events[0].workflow_execution_started_event_attributes
    assert b'"resolved"' in first.input.payloads[0].data
