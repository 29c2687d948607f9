"""TaskStorage benchmark: p50/p99 latency of save, load, update_status and delete, and the
time of delete_expired over 1,000 and 100,000 expired tasks, on SQL or Redis.

    python bench/task_store.py --backend sql|redis --ops N [--redis-url URL] [--database-url URL]

Prints one JSON line {"backend", "save": {"p50_ms", "p99_ms"}, "load": ..., "update_status":
..., "delete": ..., "delete_expired_1000_s", "delete_expired_100000_s", "contract_p99_ms"}.
Without --redis-url a throw-away redis-server is started; without --database-url a SQLite
file in a temporary folder is used.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_state import RunStatus  # noqa: E402
from artemis.taskstore import TaskData  # noqa: E402
from infra.redisserver import RedisServer  # noqa: E402

CONTRACT = {
    "sql": {"save": 20, "load": 10, "update_status": 15, "delete": 10},
    "redis": {"save": 5, "load": 2, "update_status": 3, "delete": 2},
}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return (time.perf_counter() - t0) * 1000


def old_terminal(n: int) -> list[TaskData]:
    when = datetime.now(UTC) - timedelta(days=3)
    return [
        TaskData(
            task_id=str(uuid.uuid4()),
            status=RunStatus.COMPLETED,
            result={"n": i},
            started_at=when,
            completed_at=when,
            updated_at=datetime.now(UTC),
        )
        for i in range(n)
    ]


def bulk_load(store, tasks: list[TaskData]) -> None:
    """Set-up only (not timed): many tasks at once."""
    if hasattr(store, "client"):
        for i in range(0, len(tasks), 5000):
            pipe = store.client.pipeline(transaction=False)
            for t in tasks[i : i + 5000]:
                store._write(pipe, t.task_id, t)
            pipe.execute()
    else:
        from artemis.taskstore.sql import _t

        rows = [store._row(t) for t in tasks]
        with store.engine.begin() as conn:
            for i in range(0, len(rows), 5000):
                conn.execute(_t.insert(), rows[i : i + 5000])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sql", "redis"], required=True)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--redis-url")
    ap.add_argument("--database-url")
    ap.add_argument("--skip-100k", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="artemis-bench-ts-"))
    redis_proc = None
    try:
        if args.backend == "redis":
            from artemis.taskstore.redis_store import RedisTaskStorage

            url = args.redis_url
            if url is None:
                redis_proc = RedisServer(tmp).start()
                url = redis_proc.url
            redis_store = RedisTaskStorage(url)
            redis_store.client.flushdb()
            store: Any = redis_store
        else:
            from artemis.migrate import upgrade
            from artemis.taskstore.sql import SqlTaskStorage

            url = args.database_url or f"sqlite:///{tmp / 'tasks.db'}"
            upgrade(url)
            store = SqlTaskStorage(url)
        ids = [str(uuid.uuid4()) for _ in range(args.ops)]
        lat: dict[str, list[float]] = {"save": [], "load": [], "update_status": [], "delete": []}
        for t in ids:
            lat["save"].append(timed(store.save, t, TaskData.pending(t, {"i": t})))
        for t in ids:
            lat["load"].append(timed(store.load, t))
        for t in ids:
            lat["update_status"].append(timed(store.update_status, t, RunStatus.RUNNING))
        for t in ids:
            lat["delete"].append(timed(store.delete, t))
        out = {"backend": args.backend, "ops": args.ops}
        for op, samples in lat.items():
            out[op] = {
                "p50_ms": round(statistics.median(samples), 3),
                "p99_ms": round(pct(samples, 0.99), 3),
            }
        for n in (1000, 100_000):
            if n == 100_000 and args.skip_100k:
                continue
            bulk_load(store, old_terminal(n))
            t0 = time.perf_counter()
            removed = store.delete_expired(datetime.now(UTC) - timedelta(hours=24))
            out[f"delete_expired_{n}_s"] = round(time.perf_counter() - t0, 3)
            if removed != n:
                raise SystemExit(f"delete_expired removed {removed}, expected {n}")
        out["contract_p99_ms"] = CONTRACT[args.backend]
        print(json.dumps(out))
    finally:
        if redis_proc is not None:
            redis_proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
