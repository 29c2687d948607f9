"""Outages at the default settings (docs/performance.md): a 4-symbol quotes run (480
records) whose sink answers 503 for 90 s mid-run, then one whose quote source does, then
one whose source accepts connections and answers nothing for 90 s — the shapes that
`runs.outage_tolerance_s` (1800 s) and `retry_max_interval_s` (60 s) are there to ride
out. Separate processes (dev server, sample servers, worker, API), nothing scaled down.

    python bench/outage.py [--outage-s 90] [--kinds sink,source,hang]

Prints one JSON line per case: status, seconds the run waited, the attempts the waiting
events counted, records delivered (each once?), finalize calls, and the run's length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_state import TERMINAL  # noqa: E402
from bench.stack import bench_stack  # noqa: E402

SYMBOLS = ["OA", "OB", "OC", "OD"]


async def case(stack: Any, kind: str, outage_s: float) -> dict[str, Any]:
    n = f"{kind}-{int(time.time())}"
    task_id, run_id = f"outage-{n}", f"cron-{n}"
    symbols = [f"{s}{kind[:2].upper()}" for s in SYMBOLS]
    async with httpx.AsyncClient(timeout=60) as http:
        # 300 ms a page, 4 pages a batch: the run is mid-way when the outage begins
        await http.post(f"{stack.samples}/_control/latency", json={"latency_ms": 300})
        resp = await http.post(
            f"{stack.api}/tasks/pull_stock_quotes/run?mode=async",
            json={
                "meta": {
                    "task_id": task_id,
                    "run_id": run_id,
                    "callback": {"base_url": f"{stack.samples}/cronjob/runs"},
                },
                "params": {
                    "symbols": symbols,
                    "start": "2025-01-01",
                    "end": "2025-04-30",
                    "page_size": 10,
                    "base_url": stack.samples,
                },
            },
        )
        resp.raise_for_status()
        began = time.monotonic()
        while True:  # mid-run: a few records delivered
            data = (await http.get(f"{stack.api}/tasks/{task_id}")).json()["data"] or {}
            if (data.get("stats") or {}).get("records_emitted", 0) >= 40:
                break
            await asyncio.sleep(0.2)
        target, spec = {
            "sink": ("sink", {"status": 503, "for_s": outage_s}),
            "source": ("quotes", {"status": 503, "for_s": outage_s}),
            "hang": ("quotes", {"hang": True, "for_s": outage_s}),
        }[kind]
        await http.post(f"{stack.samples}/_control/{target}", json=spec)
        waited_seen = False
        while True:
            data = (await http.get(f"{stack.api}/tasks/{task_id}")).json()["data"] or {}
            waited_seen = waited_seen or bool(data.get("waiting"))
            if data.get("status") in TERMINAL:
                break
            await asyncio.sleep(0.5)
        took = time.monotonic() - began
        await http.post(f"{stack.samples}/_control/{target}", json={})
        await http.post(f"{stack.samples}/_control/latency", json={"latency_ms": 0})
        batches = (await http.get(f"{stack.samples}/_sink/batches")).json()
        mine = [
            b
            for b in batches
            if (b["idempotency_key"] or "").startswith(f"pull_stock_quotes/{task_id}:")
        ]
        records = Counter(
            (r["symbol"], r["date"]) for b in mine if b["status"] == 200 for r in b["records"]
        )
        calls = (await http.get(f"{stack.samples}/_cronjob/calls")).json()
        finals = [c for c in calls if c["run_id"] == run_id and c["kind"] == "callback"]
        events: list[dict[str, Any]] = []
        async with http.stream("GET", f"{stack.api}/tasks/{task_id}/events") as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
    waits = [e for e in events if e.get("event") == "waiting"]
    recovered = [e for e in events if e.get("event") == "recovered"]
    return {
        "case": kind,
        "outage_s": outage_s,
        "status": data.get("status"),
        "error": (data.get("error") or {}).get("code"),
        "records": sum(records.values()),
        "distinct_records": len(records),
        "each_once": set(records.values()) == {1},
        "rejected_posts": sum(1 for b in mine if b["status"] != 200),
        "finalize_calls": len(finals),
        "waiting_seen_in_get": waited_seen,
        "waiting_events": len(waits),
        "last_attempt": waits[-1].get("attempt") if waits else None,
        "waited_s": recovered[-1].get("waited_s") if recovered else None,
        "run_s": round(took, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--outage-s", type=float, default=90.0)
    ap.add_argument("--kinds", default="sink,source,hang")
    args = ap.parse_args()
    config = {
        "runs": {"pages_per_fetch": 4},
        "output_defaults": {
            "pull_stock_quotes": {"sinks": ["http"], "http_endpoint": "{samples}/sink/quotes"}
        },
        "security": {"allowed_hosts": ["127.0.0.1"]},
    }
    with bench_stack(config) as stack:
        for kind in args.kinds.split(","):
            print(json.dumps(asyncio.run(case(stack, kind, args.outage_s))), flush=True)


if __name__ == "__main__":
    main()
