"""Accept benchmark: how fast the API takes runs, and how many small runs finish a second.

Starts the stack (dev server, samples, one worker, the API, each its own process), then
sends N async starts of `pull_stock_quotes` (one symbol, one page each) in waves of W
concurrent requests, timing each answer at the client, and waits until every run has
completed (polling the task listing, GET /tasks?status=…).

Then, on the same server, the same waves of raw `start_workflow` calls (one Temporal
client, a workflow type nothing polls: what Temporal alone takes to accept a start), and
the ratio of the two p99s.

Prints one JSON line: {"runs", "wave", "accept_p50_ms", "accept_p99_ms", "accept_max_ms",
"runs_per_s", "seconds", "raw_start_p50_ms", "raw_start_p99_ms", "p99_over_raw",
"accept_cpu_ms_per_run", "total_cpu_ms_per_run"} — the CPU ms a run of the API, the
worker(s) and the Temporal server, while the waves were accepted and over the whole run.
``--eager`` starts the dev server with eager activity execution and eager workflow start
enabled (dynamic config), to measure what they change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from temporalio.client import Client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_state import TERMINAL, RunStatus  # noqa: E402
from bench.accept_floor import raw_starts  # noqa: E402
from bench.stack import bench_stack  # noqa: E402

EAGER = {
    "system.enableActivityEagerExecution": "true",
    "system.enableEagerWorkflowStart": "true",
}


def percentile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[max(0, int(len(sorted_ms) * q) - 1)]


def per_run(before: dict[str, float], after: dict[str, float], runs: int) -> dict[str, float]:
    return {k: round((after[k] - before[k]) * 1000 / runs, 1) for k in before}


def body(samples: str, n: int) -> dict:
    return {
        "params": {
            "symbols": [f"AC{n}"],
            "start": "2025-01-01",
            "end": "2025-01-05",
            "base_url": samples,
        }
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--wave", type=int, default=50)
    ap.add_argument("--eager", action="store_true", help="eager activities and starts on")
    args = ap.parse_args()
    dynamic = EAGER if args.eager else None
    config = {
        "output_defaults": {
            "pull_stock_quotes": {"sinks": ["http"], "http_endpoint": "{samples}/sink/accept"}
        }
    }
    with bench_stack(config, dynamic_config=dynamic) as stack:
        limits = httpx.Limits(max_connections=args.wave, max_keepalive_connections=args.wave)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            url = f"{stack.api}/tasks/pull_stock_quotes/run?mode=async"
            # warm-up: connections, the worker's sandbox, caches
            for n in range(3):
                await http.post(url, json=body(stack.samples, 10_000 + n))

            async def start(n: int) -> tuple[float, str]:
                t0 = time.perf_counter()
                resp = await http.post(url, json=body(stack.samples, n))
                took = time.perf_counter() - t0
                if resp.status_code != 202:
                    raise SystemExit(f"start refused: {resp.status_code} {resp.text[:300]}")
                return took, resp.json()["data"]["task_id"]

            began = time.perf_counter()
            cpu0 = stack.cpu_s()
            accepted: list[tuple[float, str]] = []
            for first in range(0, args.runs, args.wave):
                wave = range(first, min(args.runs, first + args.wave))
                accepted += await asyncio.gather(*(start(n) for n in wave))
            cpu_accept = stack.cpu_s()
            # Completion as the task store records it (the run's own last write), read
            # from the listing: one request a poll, no Temporal query per run (polling
            # each run's GET /tasks/{id} made the worker answer ~100 progress queries a
            # poll, and the bench measured its own load).
            pending = {task_id for _, task_id in accepted}
            while pending:
                for status in sorted(TERMINAL):
                    cursor = None
                    while True:
                        page = (
                            await http.get(
                                f"{stack.api}/tasks",
                                params={"status": status, "limit": 500, "cursor": cursor},
                            )
                        ).json()["data"]
                        ended = {t["task_id"] for t in page["items"]} & pending
                        if ended and status != RunStatus.COMPLETED:
                            raise SystemExit(f"runs {sorted(ended)} ended {status}")
                        pending -= ended
                        cursor = page.get("next_cursor")
                        if not cursor:
                            break
                if pending:
                    await asyncio.sleep(0.05)
            seconds = time.perf_counter() - began
            cpu_end = stack.cpu_s()
        raw, _ = await raw_starts(await Client.connect(stack.temporal), args.runs, args.wave)
        ms = sorted(t * 1000 for t, _ in accepted)
        p99 = percentile(ms, 0.99)
        print(
            json.dumps(
                {
                    "runs": args.runs,
                    "wave": args.wave,
                    "accept_p50_ms": round(statistics.median(ms), 1),
                    "accept_p99_ms": round(p99, 1),
                    "accept_max_ms": round(ms[-1], 1),
                    "runs_per_s": round(args.runs / seconds, 1),
                    "seconds": round(seconds, 2),
                    "raw_start_p50_ms": round(statistics.median(raw), 1),
                    "raw_start_p99_ms": round(percentile(raw, 0.99), 1),
                    "p99_over_raw": round(p99 / percentile(raw, 0.99), 2),
                    "eager": args.eager,
                    # CPU ms a run, by process: while the waves were accepted, and over the
                    # whole bench (accept to the last completion; the listing polls count)
                    "accept_cpu_ms_per_run": per_run(cpu0, cpu_accept, args.runs),
                    "total_cpu_ms_per_run": per_run(cpu0, cpu_end, args.runs),
                }
            )
        )


if __name__ == "__main__":
    asyncio.run(main())
