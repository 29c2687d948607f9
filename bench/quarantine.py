"""Quarantine overhead benchmark: a harvest with 1 % bad records against a clean one.

Starts a Temporal dev server, an `artemis worker` and an `artemis api` (bench/stack.py),
plus a source of its own in this process: GitHub's "list repository issues" as its REST
documentation describes it (``per_page`` up to 100, ``page``, a ``Link`` header with
rel next/last/first/prev on every page of a multi-page answer, no rel="next" on the last).

Each pair runs ``source_harvest`` twice, sync over the API, into a SQLite table:

- clean: R issues, every one fitting the provenance's record model;
- poisoned: R issues of which 1 % are spoilt (a float written as a string, the key field
  ``id`` missing, a bare string instead of an object), ``on_bad_record: quarantine``.

Both runs set ``max_bad_records`` explicitly. Every run has a provenance (and so a
table) of its own. The order alternates within pairs (clean first in even pairs, poisoned
first in odd ones) so that a drift over the bench (a growing database, a warming cache)
falls on both sides alike. One warm-up pair runs first and is not counted. Every run is
checked (R emitted clean; R - 1 % emitted and 1 % quarantined poisoned; the table holds
what was emitted) and the bench fails if one is not as expected.

Prints one JSON line: {"records", "pairs", "clean_s", "poisoned_s", "median_clean_s",
"median_poisoned_s", "ratio_of_medians", "median_pair_ratio", the same from the
workflows' own durations, "cpu_count", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_state import RunStatus  # noqa: E402
from artemis_samples.server import ThreadedServer  # noqa: E402
from bench.stack import BenchStack, bench_stack  # noqa: E402

PAGE_SIZE = 100
BOUND = 1.05

MODEL = {
    "key": ["id"],
    "fields": {
        "id": "int",
        "number": "int",
        "title": "str",
        "state": "str",
        "updated_at": "datetime",
        "score": "float | None",
    },
}


class Issues:
    """Records per namespace (one per run), served in the order stored."""

    def __init__(self, latency_s: float = 0.0) -> None:
        self.records: dict[str, list[Any]] = {}
        self.latency_s = latency_s


def issues_app(state: Issues) -> FastAPI:
    app = FastAPI()

    @app.get("/{ns}/repos/{owner}/{repo}/issues")
    async def list_issues(
        ns: str, owner: str, repo: str, request: Request, per_page: int = 30, page: int = 1
    ) -> JSONResponse:
        per_page = min(per_page, 100)
        if state.latency_s:
            await asyncio.sleep(state.latency_s)
        items = state.records.get(ns, [])
        last = max(1, math.ceil(len(items) / per_page))
        links: dict[str, int] = {}
        if page < last:
            links |= {"next": page + 1, "last": last}
        if page > 1:
            links |= {"first": 1, "prev": page - 1}
        headers = {}
        if links:
            headers["Link"] = ", ".join(
                f'<{request.url.include_query_params(page=n)}>; rel="{rel}"'
                for rel, n in links.items()
            )
        return JSONResponse(items[(page - 1) * per_page : page * per_page], headers=headers)

    return app


def issue(ident: int) -> dict[str, Any]:
    """An issue as GitHub's REST API answers it (the fields the model names, and some it
    does not, which the run drops — as a real one would)."""
    return {
        "id": ident,
        "node_id": f"I_{ident}",
        "number": ident,
        "title": f"issue {ident}",
        "state": "open",
        "user": {"login": "octocat", "id": 1},
        "updated_at": f"2025-03-01T{ident // 3600 % 24:02d}:{ident // 60 % 60:02d}:"
        f"{ident % 60:02d}Z",
        "score": ident / 10,
    }


def issues(n: int) -> list[Any]:
    return [issue(i) for i in range(1, n + 1)]


def poison(records: list[Any], bad: int) -> None:
    """Spoil ``bad`` records in place, spread over the pages: 40 % get a score written as
    a string, 30 % lose their id, the rest become a bare string."""
    wrong, no_key = bad * 40 // 100, bad * 30 // 100
    picked = random.Random(37).sample(range(len(records)), bad)
    for i in picked[:wrong]:
        records[i]["score"] = str(records[i]["score"])
    for i in picked[wrong : wrong + no_key]:
        del records[i]["id"]
    for i in picked[wrong + no_key :]:
        records[i] = f"broken record {i}"


def doc(code: str, base: str) -> dict[str, Any]:
    """The issues endpoint as a provenance, a hundred a page, in a record model of its own."""
    return {
        "provenance": {"provenance_code": code, "base_url_default": base},
        "record_model": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "key_json": MODEL["key"],
                "fields_json": MODEL["fields"],
            }
        ],
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_name": "issues",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/repos/octo/hello/issues",
                "default_query_params": {"state": "all", "sort": "updated", "direction": "asc"},
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "pagination_mode_code": "LINK_HEADER",
                "page_size_value": PAGE_SIZE,
                "page_size_param_name": "per_page",
                "records_jsonpath": "$",
            }
        ],
    }


class Plan:
    """Every run's provenance, made before the stack starts: the registry is complete
    before the worker reads any of it, and no run's table is another's."""

    def __init__(self, pairs: int, records: int, bad: int, state: Issues, source: str) -> None:
        self.bad = bad
        tag = uuid.uuid4().hex[:8]
        # pair -1 is the warm-up
        self.codes = {
            (pair, kind): f"qb_{tag}_{kind}_{pair + 1}"
            for pair in range(-1, pairs)
            for kind in ("clean", "poisoned")
        }
        self.docs = []
        for code in self.codes.values():
            served = issues(records)
            if "_poisoned_" in code:
                poison(served, bad)
            state.records[code] = served
            self.docs.append(doc(code, f"{source}/{code}"))

    def import_all(self, stack: BenchStack) -> None:
        from artemis.config import load_settings
        from artemis.db import get_engine
        from artemis.registry.yaml_io import import_yaml

        # The stack's processes share one master key, given in their environment; the
        # import here seals with the same one.
        os.environ["COOKIE_MASTER_KEY"] = stack.env["COOKIE_MASTER_KEY"]
        settings = load_settings(stack.env["ARTEMIS_CONFIG"])
        engine = get_engine(settings.database.url)
        for d in self.docs:
            import_yaml(engine, yaml.safe_dump(d), settings.vault.master_key_file)


async def run(
    http: httpx.AsyncClient, api: str, code: str, max_bad: int
) -> tuple[float, float | None, dict[str, Any]]:
    """One sync harvest of ``code``: (seconds from request to answer on the client, the
    workflow's own duration in seconds, the run's stats)."""
    body = {
        "meta": {"task_id": f"bench-{uuid.uuid4().hex[:12]}"},
        "params": {"provenance": code, "on_bad_record": "quarantine", "max_bad_records": max_bad},
    }
    t0 = time.perf_counter()
    resp = await http.post(f"{api}/tasks/source_harvest/run?mode=sync", json=body)
    elapsed = time.perf_counter() - t0
    data = resp.json().get("data") or {}
    if resp.status_code != 200 or data.get("status") != RunStatus.COMPLETED:
        raise SystemExit(f"run of {code} failed: {resp.status_code} {resp.text[:800]}")
    ms = data.get("duration_ms")
    return elapsed, (ms / 1000 if ms is not None else None), data["stats"]


def check(code: str, stats: dict[str, Any], records: int, bad: int, lake: str) -> None:
    """A run that did not do what it should is not a measurement: stop the bench."""
    want = {
        "records_fetched": records,
        "records_emitted": records - bad,
        "records_quarantined": bad,
        "sinks": {"sql": records - bad},
    }
    got = {k: stats.get(k, 0 if k == "records_quarantined" else None) for k in want}
    with sa.create_engine(lake).connect() as conn:
        landed = conn.execute(sa.text(f'SELECT COUNT(DISTINCT id) FROM "{code}"')).scalar_one()
    if got != want or landed != records - bad:
        raise SystemExit(
            f"run of {code} is not as expected: {got} (want {want}), "
            f"{landed} distinct rows in its table (want {records - bad})"
        )


async def pair(
    http: httpx.AsyncClient,
    stack: BenchStack,
    plan: Plan,
    index: int,
    records: int,
    max_bad: int,
    lake: str,
) -> dict[str, tuple[float, float | None]]:
    order = ("clean", "poisoned") if index % 2 == 0 else ("poisoned", "clean")
    out = {}
    for kind in order:
        code = plan.codes[(index, kind)]
        wall, workflow, stats = await run(http, stack.api, code, max_bad)
        check(code, stats, records, plan.bad if kind == "poisoned" else 0, lake)
        out[kind] = (wall, workflow)
    return out


def summary(clean: list[float], poisoned: list[float]) -> dict[str, Any]:
    mc, mp = statistics.median(clean), statistics.median(poisoned)
    return {
        "clean_s": [round(x, 3) for x in clean],
        "poisoned_s": [round(x, 3) for x in poisoned],
        "median_clean_s": round(mc, 3),
        "median_poisoned_s": round(mp, 3),
        "ratio_of_medians": round(mp / mc, 4),
        "median_pair_ratio": round(
            statistics.median([p / c for c, p in zip(clean, poisoned, strict=True)]), 4
        ),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="counted pairs (after one warm-up)")
    ap.add_argument("--records", type=int, default=10_000, help="records per run")
    ap.add_argument(
        "--max-bad", type=int, help="max_bad_records of both runs (default: twice the bad ones)"
    )
    ap.add_argument("--latency-ms", type=float, default=0.0, help="the source's delay per page")
    args = ap.parse_args()
    if args.pairs < 1 or args.records < 100:
        raise SystemExit("--pairs 1 or more, --records 100 or more (1 % of them is spoilt)")
    bad = args.records // 100
    max_bad = args.max_bad if args.max_bad is not None else 2 * bad

    with contextlib.ExitStack() as resources:
        lake_dir = Path(tempfile.mkdtemp(prefix="artemis-lake-"))
        resources.callback(shutil.rmtree, lake_dir, True)
        lake = f"sqlite:///{lake_dir / 'lake.db'}"
        state = Issues(args.latency_ms / 1000)
        source = ThreadedServer(issues_app(state)).start()
        resources.callback(source.stop)
        plan = Plan(args.pairs, args.records, bad, state, source.url)
        config = {"output_defaults": {"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}}}
        stack = resources.enter_context(bench_stack(config, before_start=plan.import_all))
        async with httpx.AsyncClient(timeout=900) as http:
            # warm-up: connections, the workflow sandbox, the sink's engine; not counted
            await pair(http, stack, plan, -1, args.records, max_bad, lake)
            runs = [
                await pair(http, stack, plan, i, args.records, max_bad, lake)
                for i in range(args.pairs)
            ]
    wall = summary([r["clean"][0] for r in runs], [r["poisoned"][0] for r in runs])
    result: dict[str, Any] = {
        "records": args.records,
        "bad_records": bad,
        "max_bad_records": max_bad,
        "page_size": PAGE_SIZE,
        "pairs": args.pairs,
        "latency_ms": args.latency_ms,
        **wall,
        "bound": BOUND,
        "within_bound": wall["median_pair_ratio"] <= BOUND and wall["ratio_of_medians"] <= BOUND,
    }
    clean_flow = [r["clean"][1] for r in runs]
    poisoned_flow = [r["poisoned"][1] for r in runs]
    if None not in clean_flow and None not in poisoned_flow:
        # the workflows' own durations: the same runs without the API's and client's part
        result["workflow"] = summary(
            [x for x in clean_flow if x is not None], [x for x in poisoned_flow if x is not None]
        )
    result["cpu_count"] = os.cpu_count()
    result["cpus_usable"] = len(os.sched_getaffinity(0))
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
