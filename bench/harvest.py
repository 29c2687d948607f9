"""Harvest benchmark: Artemis end to end vs a plain async httpx loop doing the same work.

Starts a Temporal dev server, the sample servers (quote API with L ms per page and a
sink), an `artemis worker` and an `artemis api`, each in its own process. Then:

- artemis: POST /tasks/pull_stock_quotes/run?mode=sync for N pages of M records and time
  it until the answer (every record fetched, processed, emitted and the run finalized);
- baseline: fetch the same N pages one after another with httpx while a second coroutine
  posts each page to the sink — the same concurrency as Artemis (sequential pages, emit
  overlapping fetch) and the same JSON library (orjson), with none of the durability.

Multi-source mode (``--symbols S``): S symbols of N pages each. Artemis fetches them as
parallel units (``runs.fetch_concurrency``); the baseline runs S such loops at once.

Sink mode (``--sink sql|files``): the same Artemis run lands its records in a table
(PostgreSQL, started by the bench; ``--sql-url`` for another) or in Parquet files
(``--file-format``) instead of the HTTP sink; each repeat also times the HTTP-sink run, and
``sink_ratio`` is the one over the other. The records landed are counted in the table /
files (every key once).

Prints one JSON line: {"symbols", "pages", "records", "artemis_s", "baseline_s", "ratio", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import date, timedelta
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_models import RunTuning  # noqa: E402
from artemis.run_state import RunStatus  # noqa: E402
from bench.accept import EAGER  # noqa: E402
from bench.stack import bench_stack  # noqa: E402

START = date(1960, 1, 1)


async def baseline(samples: str, pages: int, page_size: int, symbols: int = 1) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=30) as http:
        t0 = time.perf_counter()
        sent = await asyncio.gather(
            *(_one_symbol(http, samples, f"BASE{n}", pages, page_size) for n in range(symbols))
        )
        return time.perf_counter() - t0, sum(sent)


async def _one_symbol(
    http: httpx.AsyncClient, samples: str, symbol: str, pages: int, page_size: int
) -> int:
    """The raw loop for one symbol: fetch its pages in order while a second coroutine
    posts each page to the sink."""
    end = START + timedelta(days=pages * page_size - 1)
    queue: asyncio.Queue = asyncio.Queue()
    sent = 0

    async def produce() -> None:
        page = 1
        while page is not None:
            resp = await http.get(
                f"{samples}/quotes",
                params={
                    "symbol": symbol,
                    "start": START.isoformat(),
                    "end": end.isoformat(),
                    "page": page,
                    "page_size": page_size,
                },
            )
            resp.raise_for_status()
            data = orjson.loads(resp.content)
            await queue.put(data["items"])
            page = data["next_page"]
        await queue.put(None)

    async def consume() -> None:
        nonlocal sent
        seq = 0
        while (items := await queue.get()) is not None:
            resp = await http.post(
                f"{samples}/sink/baseline",
                content=orjson.dumps(items),
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": f"baseline:{symbol}:{seq}",
                },
            )
            resp.raise_for_status()
            sent += len(items)
            seq += 1

    await asyncio.gather(produce(), consume())
    return sent


async def artemis_run(
    api: str,
    samples: str,
    pages: int,
    page_size: int,
    symbols: int = 1,
    sink: str = "http",
    task_id: str | None = None,
) -> tuple[float, dict]:
    end = START + timedelta(days=pages * page_size - 1)
    body: dict = {
        "output": {"sinks": [sink]},
        "params": {
            "symbols": [f"ARTM{n}" for n in range(symbols)],
            "start": START.isoformat(),
            "end": end.isoformat(),
            "page_size": page_size,
            "base_url": samples,
        },
    }
    if task_id:
        body["meta"] = {"task_id": task_id}
    async with httpx.AsyncClient(timeout=600) as http:
        t0 = time.perf_counter()
        resp = await http.post(f"{api}/tasks/pull_stock_quotes/run?mode=sync", json=body)
        elapsed = time.perf_counter() - t0
    data = resp.json()
    if resp.status_code != 200 or data["data"]["status"] != RunStatus.COMPLETED:
        raise SystemExit(f"artemis run failed: {resp.status_code} {resp.text[:500]}")
    return elapsed, data["data"]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=200, help="pages per symbol")
    ap.add_argument("--symbols", type=int, default=1, help="symbols (parallel units)")
    ap.add_argument("--page-size", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; medians reported")
    ap.add_argument("--pages-per-fetch", type=int, default=RunTuning().pages_per_fetch)
    ap.add_argument("--fetch-concurrency", type=int, default=4)
    ap.add_argument("--emit-concurrency", type=int, default=4)
    ap.add_argument(
        "--per-batch",
        action="store_true",
        help="runs.emit_while_fetching false: each batch processed and emitted after its fetch",
    )
    ap.add_argument("--sink", choices=["http", "sql", "files"], default="http")
    ap.add_argument("--sql-url", help="the sql sink's database (default: a PostgreSQL of its own)")
    ap.add_argument("--file-format", choices=["parquet", "jsonl"], default="parquet")
    ap.add_argument(
        "--eager",
        action="store_true",
        help="the dev server with eager activity execution and eager workflow start on",
    )
    ap.add_argument(
        "--memory-only",
        action="store_true",
        help="one Artemis run, no baseline: report the worker's idle and peak RSS",
    )
    args = ap.parse_args()
    with contextlib.ExitStack() as resources:
        await _main(args, resources)


async def _main(args: argparse.Namespace, resources: contextlib.ExitStack) -> None:
    sql_url = args.sql_url
    if args.sink == "sql" and not sql_url:
        from infra.pgserver import PgServer

        pg = PgServer().start()
        resources.callback(pg.stop)
        sql_url = pg.url
    lake = Path(tempfile.mkdtemp(prefix="artemis-lake-"))
    resources.callback(shutil.rmtree, lake, True)
    config = {
        "runs": {
            "pages_per_fetch": args.pages_per_fetch,
            "fetch_concurrency": args.fetch_concurrency,
            "emit_concurrency": args.emit_concurrency,
            "emit_while_fetching": not args.per_batch,
        },
        "output_defaults": {
            "pull_stock_quotes": {
                "sinks": ["http"],
                "http_endpoint": "{samples}/sink/artemis",
                **({"sql": {"url": sql_url, "table": "bench_quotes"}} if sql_url else {}),
                "files": {"url": str(lake), "format": args.file_format},
            }
        },
    }
    dynamic = EAGER if args.eager else None
    with bench_stack(config, latency_ms=args.latency_ms, dynamic_config=dynamic) as stack:
        samples, api = stack.samples, stack.api
        await artemis_run(api, samples, 3, 10)  # warm-up: connections, sandbox, caches
        if args.memory_only:
            pid = stack.worker_pids[0]
            idle = stack.rss_mb(pid)
            t, one = await artemis_run(api, samples, args.pages, args.page_size, args.symbols)
            print(
                json.dumps(
                    {
                        "symbols": args.symbols,
                        "records": one["stats"]["records_emitted"],
                        "seconds": round(t, 1),
                        "worker_idle_rss_mb": round(idle, 1),
                        "worker_peak_rss_mb": round(stack.rss_mb(pid, peak=True), 1),
                    }
                )
            )
            return
        await baseline(samples, 3, 10)
        artemis_times, base_times, http_times = [], [], []
        stats: dict = {}
        want = args.symbols * args.pages * args.page_size
        for _ in range(args.repeat):
            async with httpx.AsyncClient() as http:
                await http.post(f"{samples}/_control/reset", json={})
            task_id = f"bench-{uuid.uuid4().hex[:12]}"
            t, stats = await artemis_run(
                api, samples, args.pages, args.page_size, args.symbols, args.sink, task_id
            )
            artemis_times.append(t)
            if args.sink == "http":
                async with httpx.AsyncClient(timeout=60) as http:
                    got = sum(
                        len(b["records"])
                        for b in (await http.get(f"{samples}/_sink/batches")).json()
                        if b["status"] == 200
                    )
            else:
                got = _landed(args.sink, sql_url, lake / "pull_stock_quotes" / task_id)
                async with httpx.AsyncClient() as http:
                    await http.post(f"{samples}/_control/reset", json={})
                t, _ = await artemis_run(api, samples, args.pages, args.page_size, args.symbols)
                http_times.append(t)
            if got != want:
                raise SystemExit(f"{args.sink} sink holds {got} records, expected {want}")
            t, sent = await baseline(samples, args.pages, args.page_size, args.symbols)
            base_times.append(t)
        a, b = statistics.median(artemis_times), statistics.median(base_times)
        sink_fields: dict = {"sink": args.sink}
        if http_times:
            h = statistics.median(http_times)
            sink_fields.update(
                {
                    "http_sink_s": round(h, 3),
                    "sink_ratio": round(a / h, 3),
                    "http_sink_runs_s": [round(x, 3) for x in http_times],
                    **({"file_format": args.file_format} if args.sink == "files" else {}),
                    **({"database": sql_url.split(":", 1)[0]} if args.sink == "sql" else {}),
                }
            )
        print(
            json.dumps(
                {
                    "symbols": args.symbols,
                    "pages": args.pages,
                    "records": args.symbols * args.pages * args.page_size,
                    "artemis_s": round(a, 3),
                    "baseline_s": round(b, 3),
                    "ratio": round(a / b, 3),
                    "latency_ms": args.latency_ms,
                    "repeat": args.repeat,
                    "pages_per_fetch": args.pages_per_fetch,
                    "eager": args.eager,
                    "batches": stats.get("stats", {}).get("batches"),
                    "artemis_runs_s": [round(x, 3) for x in artemis_times],
                    "baseline_runs_s": [round(x, 3) for x in base_times],
                    **sink_fields,
                }
            )
        )


def _landed(sink: str, sql_url: str | None, run_dir: Path) -> int:
    """Records the run left in the table (distinct keys) or in its files."""
    if sink == "sql":
        import sqlalchemy as sa

        assert sql_url
        with sa.create_engine(sql_url).connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT COUNT(DISTINCT (symbol, date)) FROM bench_quotes")
                    if sql_url.startswith("postgresql")
                    else sa.text("SELECT COUNT(DISTINCT symbol || date) FROM bench_quotes")
                ).scalar_one()
            )
    files = sorted(run_dir.glob("files-*"))
    if not files:
        return 0
    if files[0].suffix == ".parquet":
        import pyarrow.parquet as pq

        return sum(pq.read_metadata(f).num_rows for f in files)
    return sum(len(f.read_bytes().splitlines()) for f in files)


if __name__ == "__main__":
    asyncio.run(main())
