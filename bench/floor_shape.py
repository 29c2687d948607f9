"""Workflows with a small run's Temporal shape and no work in them (bench/accept_floor.py).

``FloorShape`` is a small run of `pull_stock_quotes` as it runs today: two local
activities (the `running` record, prepare), fetch (which processes and emits its pages
beside it), three local activities (finalize, clean-up, the final record) — which is
also the lightest shape a run with I/O could take. ``FloorLight`` is lighter still, for
reference: the fetch and one local activity. ``FloorIO`` is ``FloorShape`` whose activity
does the I/O a bench run cannot do without: it GETs the run's one page of quotes from the
sample server and POSTs its records to the sample sink, with aiohttp as Artemis' HTTP
client and sink do — what the empty shape costs once the run's two requests are in it,
before any of Artemis' own work (staging, task store, events, secrets, logs, metrics).
(Before emit-while-fetching-v1 a small run's shape was "LAALAAAL": prepare, emit,
finalize and clean-up activities, process a local activity.)"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import aiohttp
from temporalio import activity, workflow

SHORT = timedelta(seconds=30)


@activity.defn(name="floor_step")
async def floor_step(n: int) -> int:
    return n + 1


_http: aiohttp.ClientSession | None = None


@activity.defn(name="floor_io_step")
async def floor_io_step(target: dict[str, Any]) -> int:
    """One page of quotes fetched and its records posted to the sink (the status checked)."""
    global _http
    if _http is None:
        _http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    async with _http.get(target["quotes"], params=target["params"]) as resp:
        resp.raise_for_status()
        records = (await resp.json())["items"]
    body = json.dumps(records).encode()
    headers = {"content-type": "application/json"}
    async with _http.post(target["sink"], data=body, headers=headers) as resp:
        resp.raise_for_status()
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
