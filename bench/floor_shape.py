"""Workflows with a small run's Temporal shape and no work in them (bench/accept_floor.py).

``FloorShape`` is a small run of `pull_stock_quotes` as it runs today: two local
activities (the `running` record, prepare), fetch (which processes and emits its pages
concurrently with it), three local activities (finalize, clean-up, the final record) — which is
also the lightest shape a run with I/O could take. ``FloorLight`` is lighter still, for
reference: the fetch and one local activity. ``FloorIO`` is ``FloorShape`` whose activity
does the I/O a bench run cannot do without: it GETs the run's one page of quotes from the
sample server and POSTs its records to the sample sink, with aiohttp as Artemis' HTTP
client and sink do — what the empty shape costs once the run's two requests are in it,
before any of Artemis' own work (staging, task store, events, secrets, logs, metrics).
``FloorContract`` (below) adds that work's writes, with plain sqlite3.
(Before emit-while-fetching-v1 a small run's shape was "LAALAAAL": prepare, emit,
finalize and clean-up activities, process a local activity.)"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import timedelta
from typing import Any

import aiohttp
from temporalio import activity, workflow

from artemis.run_state import RunStatus

SHORT = timedelta(seconds=30)


@activity.defn(name="floor_step")
async def floor_step(n: int) -> int:
    return n + 1


_http: aiohttp.ClientSession | None = None


def _session() -> aiohttp.ClientSession:
    global _http
    if _http is None:
        _http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    return _http


async def _get_page(target: dict[str, Any]) -> bytes:
    """The run's page of quotes (the status checked)."""
    async with _session().get(target["quotes"], params=target["params"]) as resp:
        resp.raise_for_status()
        return await resp.read()


async def _post_records(target: dict[str, Any], records: list[Any]) -> None:
    """The page's records posted to the sample sink (the status checked)."""
    body = json.dumps(records).encode()
    headers = {"content-type": "application/json"}
    async with _session().post(target["sink"], data=body, headers=headers) as resp:
        resp.raise_for_status()


@activity.defn(name="floor_io_step")
async def floor_io_step(target: dict[str, Any]) -> int:
    """One page of quotes fetched and its records posted to the sink."""
    records = json.loads(await _get_page(target))["items"]
    await _post_records(target, records)
    return len(records)


async def close_http() -> None:
    global _http
    if _http is not None:
        await _http.close()
        _http = None


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


@workflow.defn(name="FloorIO")
class FloorIO:
    @workflow.run
    async def run(self, target: dict[str, Any]) -> int:
        n = 0
        for step in "LLALLL":
            if step == "L":
                n = await workflow.execute_local_activity(
                    floor_step, n, start_to_close_timeout=SHORT
                )
            else:
                n += await workflow.execute_activity(
                    floor_io_step, target, start_to_close_timeout=SHORT
                )
        return n


# -- the contract floor ---------------------------------------------------------------------
# ``FloorContract``: ``FloorIO`` started with the run's two keyword search attributes and
# doing, with plain sqlite3 on the event loop (as Artemis' run statements do on SQLite),
# the writes a small run must make: the task record set `running` and then
# `completed`, the page staged before it is sent and dropped at the end, and the stream's
# eight events (two each for prepare, the fetch and finalize, a progress event, the
# run's status) — what a run costs with no Artemis code in it.

_CONTRACT_SCHEMA = """
CREATE TABLE IF NOT EXISTS task (id TEXT PRIMARY KEY, status TEXT, stats TEXT, at INTEGER);
CREATE TABLE IF NOT EXISTS event (seq INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT,
    kind TEXT, step TEXT, data TEXT, ts_ms INTEGER);
CREATE TABLE IF NOT EXISTS page (run TEXT, seq INTEGER, body BLOB, PRIMARY KEY (run, seq));
"""
_dbs: dict[str, sqlite3.Connection] = {}


def _db(path: str) -> sqlite3.Connection:
    db = _dbs.get(path)
    if db is None:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_CONTRACT_SCHEMA)
        _dbs[path] = db
    return db


def _write(path: str, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    """One transaction."""
    db = _db(path)
    db.execute("BEGIN IMMEDIATE")
    try:
        for sql, args in statements:
            db.execute(sql, args)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _event(task_id: str, kind: str, step: str, data: dict[str, Any]) -> tuple[str, tuple]:
    return (
        "INSERT INTO event (task_id, kind, step, data, ts_ms) VALUES (?, ?, ?, ?, ?)",
        (task_id, kind, step, json.dumps(data), int(time.time() * 1000)),
    )


def _pair(task_id: str, step: str, activity_name: str) -> list[tuple[str, tuple]]:
    info = {"activity": activity_name, "attempt": 1}
    return [
        _event(task_id, "activity_start", step, info),
        _event(task_id, "activity_result", step, {**info, "ok": True}),
    ]


@activity.defn(name="floor_contract_step")
async def floor_contract_step(inp: dict[str, Any]) -> int:
    db, task_id, step = inp["db"], inp["task_id"], inp["step"]
    if step == "start":
        row = (task_id, str(RunStatus.RUNNING), 0)
        _write(db, [("INSERT OR REPLACE INTO task VALUES (?, ?, '{}', ?)", row)])
    elif step == "prepare":
        _write(db, _pair(task_id, "step_prepare", "prepare_params"))
    elif step == "fetch":
        start = _event(task_id, "activity_start", "step_fetch", {"activity": "fetch_pages"})
        _write(db, [start])
        body = await _get_page(inp)
        _write(db, [("INSERT INTO page VALUES (?, 0, ?)", (task_id, body))])
        records = json.loads(body)["items"]
        await _post_records(inp, records)
        progress = {"pages": 1, "records": len(records)}
        result = {"activity": "fetch_pages", "ok": True, "result": progress}
        _write(
            db,
            [
                _event(task_id, "progress", "step_fetch", progress),
                _event(task_id, "activity_result", "step_fetch", result),
            ],
        )
        return len(records)
    elif step == "finalize":
        _write(db, _pair(task_id, "step_finalize", "finalize_run"))
    elif step == "cleanup":
        _write(db, [("DELETE FROM page WHERE run = ?", (task_id,))])
    else:
        _write(
            db,
            [
                (
                    "UPDATE task SET status = ?, at = ? WHERE id = ?",
                    (str(RunStatus.COMPLETED), 1, task_id),
                ),
                _event(task_id, "run_status", "", {"status": str(RunStatus.COMPLETED)}),
            ],
        )
    return 0


@workflow.defn(name="FloorContract")
class FloorContract:
    @workflow.run
    async def run(self, target: dict[str, Any]) -> int:
        n = 0
        task_id = workflow.info().workflow_id
        for step in ("start", "prepare", "fetch", "finalize", "cleanup", "end"):
            inp = {**target, "task_id": task_id, "step": step}
            if step == "fetch":
                n += await workflow.execute_activity(
                    floor_contract_step, inp, start_to_close_timeout=SHORT
                )
            else:
                n += await workflow.execute_local_activity(
                    floor_contract_step, inp, start_to_close_timeout=SHORT
                )
        return n
