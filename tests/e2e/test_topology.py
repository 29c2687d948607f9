"""The stack as it runs on a cluster (docs/operations.md): PostgreSQL for the Artemis
database, the Redis task store, two `artemis worker` and two `artemis api` processes.
A run started on one API is read, listed and streamed from the other; a worker is
SIGKILLed mid-run; the database and the task store each go away for 6 s mid-run. Every
time the run completes with every record once per idempotency key and one finalize."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections import Counter
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import PendingActivityState

from artemis.run_state import TERMINAL
from infra.devserver import free_port, port_open
from tests.conftest import (
    RedisServer,
    new_task_id,
    require,
    settings_with,
    start_api_process,
    start_worker_process,
    write_config,
)
from tests.helpers import eventually


class Cluster:
    def __init__(self, stack, pg, redis, apis: list[str], workers: list[subprocess.Popen]):
        self.stack, self.pg, self.redis = stack, pg, redis
        self.apis, self.workers = apis, workers

    def api(self, n: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.apis[n], timeout=60)


@pytest.fixture(scope="module")
def cluster_pg():
    from infra.pgserver import PgServer, available

    require(available(), "PostgreSQL", "postgresql")
    from artemis.migrate import upgrade

    # durable: a crash of a production PostgreSQL loses no committed transaction
    server = PgServer(dbname="cluster", durable=True).start()
    upgrade(server.url)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster_redis(tmp_path_factory):
    from infra.redisserver import available

    require(available(), "redis-server", "redis-server")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture
async def cluster(make_stack, cluster_pg, cluster_redis, tmp_path):
    # The in-process stack only lends its settings and sample servers: the cluster is the
    # processes below.
    stack = await make_stack(
        worker=False,
        runs={"pages_per_fetch": 10, "heartbeat_timeout_s": 2.0},
        database={"url": cluster_pg.url},
        task_store={"backend": "redis", "redis_url": cluster_redis.url},
    )
    settings = settings_with(
        stack.settings, logging={"output": "file", "file": {"path": str(tmp_path / "c.log")}}
    )
    config = write_config(tmp_path / "cluster.yaml", settings)
    workers = [start_worker_process(config, tmp_path / f"worker{n}.out") for n in (1, 2)]
    ports = [free_port(), free_port()]
    apis = [start_api_process(config, p, tmp_path / f"api{n}.out") for n, p in enumerate(ports)]

    def listening() -> bool:
        assert all(a.poll() is None for a in apis), "an API process exited"
        return all(port_open("127.0.0.1", p) for p in ports)

    await eventually(listening, "the API processes to start", interval=0.1)
    yield Cluster(
        stack, cluster_pg, cluster_redis, [f"http://127.0.0.1:{p}" for p in ports], workers
    )
    for proc in workers + apis:
        if proc.poll() is None:
            proc.terminate()
    for proc in workers + apis:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _start(c: Cluster, symbols: list[str]) -> tuple[str, str, dict[str, Any]]:
    task_id, run_id = new_task_id(), f"cron-{new_task_id()}"
    body = {
        "meta": {
            "task_id": task_id,
            "run_id": run_id,
            "callback": {"base_url": f"{c.stack.samples_url}/cronjob/runs"},
        },
        "params": {"symbols": symbols, "page_size": 1},
    }
    async with c.api(0) as a:
        resp = await a.post("/tasks/pull_stock_quotes/run", params={"mode": "async"}, json=body)
    assert resp.status_code == 202, resp.text
    return task_id, run_id, resp.json()["data"]


async def _fetched(c: Cluster, task_id: str, at_least: int) -> None:
    async def check() -> bool:
        async with c.api(1) as b:
            resp = await b.get(f"/tasks/{task_id}")
        data = resp.json().get("data") or {}
        return (
            resp.status_code == 200 and data.get("stats", {}).get("records_fetched", 0) >= at_least
        )

    await eventually(check, f"{at_least} records fetched", timeout=90)


async def _completed_once_each(c: Cluster, task_id: str, run_id: str, records: int) -> dict:
    async def done() -> bool:
        async with c.api(1) as b:
            data = (await b.get(f"/tasks/{task_id}")).json().get("data") or {}
        return data.get("status") in TERMINAL

    await eventually(done, "the run to end", timeout=180)
    async with c.api(1) as b:
        final = (await b.get(f"/tasks/{task_id}")).json()["data"]
    assert final["status"] == "completed", (final.get("error"), final.get("stats"))
    by_key: dict[str, list] = {}
    for batch in await c.stack.sink_batches(f"pull_stock_quotes/{task_id}:"):
        if batch["status"] == 200:
            if batch["idempotency_key"] in by_key:  # a re-delivery: same key, same records
                assert by_key[batch["idempotency_key"]] == batch["records"]
            by_key[batch["idempotency_key"]] = batch["records"]
    seen = Counter((r["symbol"], r["date"]) for rs in by_key.values() for r in rs)
    assert len(seen) == records and set(seen.values()) == {1}
    finals = await c.stack.finals(run_id)
    assert [f["status"] for f in finals] == [200] and finals[0]["body"]["result"] == "success"
    return final


async def test_run_on_one_api_is_read_listed_and_streamed_from_the_other_and_survives_a_sigkill(
    cluster,
):
    c = cluster
    cleanup: list[asyncio.Task] = []
    await c.stack.fault("latency", latency_ms=40)
    try:
        task_id, run_id, started = await _start(c, ["PGA", "PGB"])
        events: list[dict[str, Any]] = []

        async def stream() -> None:
            async with c.api(1) as b, b.stream("GET", f"/tasks/{task_id}/events") as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        events.append(json.loads(line[5:]))

        streaming = asyncio.create_task(stream())
        cleanup.append(streaming)
        await _fetched(c, task_id, 10)
        async with c.api(1) as b:
            listed = (await b.get("/tasks", params={"code": "pull_stock_quotes"})).json()["data"]
        assert task_id in [t["task_id"] for t in listed["items"]]
        # SIGKILL the worker running the fetch (its identity is pid@host). Between two
        # batches, or before a worker has picked the next one up, no activity is running:
        # wait for one that a worker has started.
        handle = c.stack.client.get_workflow_handle(started["workflow_id"])
        victims: list = []

        async def running_on_a_worker() -> bool:
            pending = (await handle.describe()).raw_description.pending_activities
            pids = {
                int(a.last_worker_identity.split("@")[0])
                for a in pending
                if a.activity_type.name == "fetch_pages"
                and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                and a.last_worker_identity
            }
            victims[:] = [w for w in c.workers if w.pid in pids]
            return bool(victims)

        await eventually(running_on_a_worker, "a fetch running on a worker", interval=0.02)
        assert len(victims) == 1 and all(w.poll() is None for w in c.workers), victims
        victim = victims[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        await _completed_once_each(c, task_id, run_id, 60)
        await asyncio.wait_for(streaming, 30)
    finally:
        await c.stack.fault("latency", latency_ms=0)
        for task in cleanup:
            task.cancel()
    assert events[0]["event"] == "plan_update" and events[-1]["event"] == "complete"
    assert [e["event"] for e in events].count("complete") == 1


@pytest.mark.parametrize("outage", ["database", "task_store"])
async def test_a_6s_outage_of_the_database_or_the_task_store_mid_run_loses_nothing(cluster, outage):
    c = cluster
    await c.stack.fault("latency", latency_ms=40)
    try:
        task_id, run_id, _ = await _start(c, ["OUTA", "OUTB"])
        await _fetched(c, task_id, 6)
        if outage == "database":
            c.pg.crash()
            await asyncio.sleep(6)
            c.pg.restart()
        else:
            c.redis.kill()
            await asyncio.sleep(6)
            c.redis.start()
        final = await _completed_once_each(c, task_id, run_id, 60)
    finally:
        await c.stack.fault("latency", latency_ms=0)
    assert final["stats"]["records_emitted"] == 60
