"""Backfill benchmark: a registry source backfilled over N days of daily windows (one child
run per window), on the whole stack in processes (bench/stack.py).

The source is a plain JSON API on loopback holding one record per day (``GET
/events?from=…&to=…&page=…&size=…``); the records land in a SQLite table. The bench
checks every record landed once, then reads the parent's histories (one per generation:
it continues as new every ``runs.children_per_run`` children) from Temporal and reports
the largest payload one workflow task sent, against the bound docs/performance.md
states (256 KiB; Temporal refuses 2 MiB).

Prints one JSON line: {"days", "children", "generations", "wall_s", "children_per_s",
"largest_workflow_task_bytes", "bound_bytes", "within_bound", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml
from fastapi import FastAPI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_state import TERMINAL, RunStatus  # noqa: E402
from artemis.temporal.runs import largest_workflow_task  # noqa: E402
from artemis_samples.server import ThreadedServer  # noqa: E402
from bench.stack import BenchStack, bench_stack  # noqa: E402

BOUND = 256 * 1024
FIRST = date(2015, 1, 1)


def events_app(days: int) -> FastAPI:
    """One record a day at noon UTC from FIRST, filtered by the window ``[from, to)``."""
    app = FastAPI()
    noon = datetime.combine(FIRST, datetime.min.time(), UTC) + timedelta(hours=12)
    records: list[tuple[int, datetime]] = [(n + 1, noon + timedelta(days=n)) for n in range(days)]

    @app.get("/events")
    async def events(
        start: str = "", end: str = "", page: int = 1, size: int = 50
    ) -> dict[str, Any]:
        lo = datetime.fromisoformat(start) if start else None
        hi = datetime.fromisoformat(end) if end else None
        found = [
            {"id": ident, "at": at.isoformat()}
            for ident, at in records
            if (lo is None or at >= lo) and (hi is None or at < hi)
        ]
        return {"items": found[(page - 1) * size : page * size], "total": len(found)}

    return app


def provenance(code: str, base: str, concurrency: int) -> dict[str, Any]:
    since = "2025-01-01T00:00:00Z"
    return {
        "provenance": {
            "provenance_code": code,
            "base_url_default": base,
            "record_model": {"key": ["id"], "fields": {"id": "int", "at": "datetime"}},
        },
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": since,
                "endpoint_name": "events",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/events",
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": since,
                "pagination_mode_code": "PAGE_NUMBER",
                "page_size_value": 50,
                "page_number_param_name": "page",
                "page_size_param_name": "size",
                "records_jsonpath": "$.items",
                "total_count_jsonpath": "$.total",
            }
        ],
        "window_offset_cfg": [
            {
                "scope_code": "TASK",
                "task_type": "backfill",
                "effective_from": since,
                "window_mode_code": "SLIDING",
                "window_size_value": 1,
                "window_size_unit_code": "DAY",
                "window_start_param_name": "start",
                "window_end_param_name": "end",
            }
        ],
        "rate_limit_cfg": [
            {"scope_code": "SOURCE", "effective_from": since, "max_concurrency": concurrency}
        ],
    }


def importer(doc: dict[str, Any]) -> Any:
    def run(stack: BenchStack) -> None:
        from artemis.config import load_settings
        from artemis.db import get_engine
        from artemis.registry.yaml_io import import_yaml

        os.environ["COOKIE_MASTER_KEY"] = stack.env["COOKIE_MASTER_KEY"]
        settings = load_settings(stack.env["ARTEMIS_CONFIG"])
        import_yaml(
            get_engine(settings.database.url), yaml.safe_dump(doc), settings.vault.master_key_file
        )

    return run


async def measure(stack: BenchStack, code: str, days: int, lake: str) -> dict[str, Any]:
    from temporalio.client import Client

    task_id = f"bench-{uuid.uuid4().hex[:12]}"
    last = FIRST + timedelta(days=days - 1)
    body = {
        "meta": {"task_id": task_id, "timeout_s": 6 * 3600},
        "params": {
            "provenance": code,
            "task_type": "backfill",
            "start": str(FIRST),
            "end": str(last),
        },
    }
    async with httpx.AsyncClient(timeout=60) as http:
        t0 = time.perf_counter()
        resp = await http.post(f"{stack.api}/tasks/source_harvest/run?mode=async", json=body)
        if resp.status_code != 202:
            raise SystemExit(f"backfill refused: {resp.status_code} {resp.text[:800]}")
        workflow_id = resp.json()["data"]["workflow_id"]
        while True:
            data = (await http.get(f"{stack.api}/tasks/{task_id}")).json()["data"]
            if data and data["status"] in TERMINAL:
                break
            await asyncio.sleep(0.5)
        wall = time.perf_counter() - t0
    if data["status"] != RunStatus.COMPLETED:
        raise SystemExit(f"backfill ended {data['status']}: {json.dumps(data)[:800]}")
    with sa.create_engine(lake).connect() as conn:
        landed = conn.execute(sa.text(f'SELECT COUNT(DISTINCT id) FROM "{code}"')).scalar_one()
        rows = conn.execute(sa.text(f'SELECT COUNT(*) FROM "{code}"')).scalar_one()
    if landed != days or rows != days:
        raise SystemExit(f"{landed} distinct records in {rows} rows, expected {days}")
    client = await Client.connect(stack.temporal)
    sizes, events = [], []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        sizes.append(largest_workflow_task(history.events))
        events.append(len(history.events))
    return {
        "wall_s": round(wall, 1),
        "children_per_s": round(days / wall, 2),
        "generations": len(sizes),
        "largest_history_events": max(events),
        "largest_workflow_task_bytes": max(sizes),
        "records_landed": landed,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--days", type=int, default=730, help="daily windows (child runs)")
    ap.add_argument("--concurrency", type=int, default=8, help="children at once")
    args = ap.parse_args()
    with contextlib.ExitStack() as resources:
        lake_dir = Path(tempfile.mkdtemp(prefix="artemis-lake-"))
        resources.callback(shutil.rmtree, lake_dir, True)
        lake = f"sqlite:///{lake_dir / 'lake.db'}"
        source = ThreadedServer(events_app(args.days)).start()
        resources.callback(source.stop)
        code = f"daily{uuid.uuid4().hex[:6]}"
        config = {
            "output_defaults": {"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}},
        }
        doc = provenance(code, source.url, args.concurrency)
        stack = resources.enter_context(bench_stack(config, before_start=importer(doc)))
        result = await measure(stack, code, args.days, lake)
    result = {
        "days": args.days,
        "children": args.days,
        "concurrency": args.concurrency,
        **result,
        "bound_bytes": BOUND,
        "within_bound": result["largest_workflow_task_bytes"] < BOUND,
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
