"""Parallel sub-resource requests: a `source_harvest` run of a tree of resources
(docs/resources.md) whose leaf sub-resources are asked for every record of a parent page
at once, ``rate_limit_cfg.max_concurrency`` (8) at a time, no ``qps_limit``, on the
whole stack in processes (bench/stack.py) against the sample code hosting API
(artemis_samples/forge.py), which answers every request after ``--latency-ms`` (50).

Shapes (``--shape``), each 200 leaf sub-requests of one page each:

- ``one-page`` (default): 100 repositories on one page of the root resource, each asking
  two leaf sub-resources (its issues, and the comments of its first issue): the 200
  sub-requests are one parallel batch, as the figure it is read against assumes.
- ``two-pages``: 200 repositories on two root pages of 100 (forge, as GitHub, answers at
  most 100 a page), each asking its issues: two batches of 100, one after the other.

The forge latency delays every request, the root pages too (they are not measured). Each
run's span is taken at the server from its ``_calls`` (``at``: arrival, ``done``: answer
ready): from the first sub-request's arrival to the last sub-request's answer. The bound:
1.3 × sub-requests × latency / concurrency (200 × 50 ms / 8 = 1.25 s: 1.625 s), held by
the median of ``--runs`` (5) runs, each a fresh task id; every run must land every record
(SQLite tables) and the server must never see more than the concurrency in flight.

    .venv/bin/python bench/tree_subrequests.py [--shape one-page|two-pages] [--runs 5]

Prints one JSON line: each run's span and where its time went, ``median_span_s``,
``ideal_s``, ``bound_s``, ``within_bound``, ``in_flight_max``, ``cpu_count``, ``wall_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_state import TERMINAL, RunStatus  # noqa: E402
from bench.backfill import importer  # noqa: E402
from bench.stack import BenchStack, bench_stack  # noqa: E402

SINCE = "2025-01-01T00:00:00Z"
ROOT_PATH = "/forge/orgs/acme/repos"
ROOT_PAGE = 100  # forge's largest page, as GitHub's
BOUND_FACTOR = 1.3
# repositories, the leaf sub-resources each asks, and the forge tree to serve
SHAPES: dict[str, dict[str, Any]] = {
    "one-page": {"repos": 100, "leaves": ["issues", "comments"], "comments": 1},
    "two-pages": {"repos": 200, "leaves": ["issues"], "comments": 0},
}
LEAVES: dict[str, dict[str, Any]] = {
    "issues": {
        "path": "/repos/{parent.full_name}/issues",
        "params": {"state": "all"},
        "records": "$.items",
        "fields": {"id": "int", "number": "int", "title": "str", "repo": "str"},
    },
    # The first issue of every repository: a second leaf of the same parent record.
    "comments": {
        "path": "/repos/{parent.full_name}/issues/1/comments",
        "params": {},
        "records": "$.comments",
        "fields": {"id": "int", "body": "str", "repo": "str"},
    },
}


def dated(**row: Any) -> dict[str, Any]:
    return {"scope_code": "SOURCE", "effective_from": SINCE, **row}


def leaf_rows(name: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A leaf sub-resource of the repositories: its endpoint, its paging (one request a
    parent, SINGLE) and its record model."""
    leaf = LEAVES[name]
    endpoint = dated(
        resource_name=name,
        parent_resource_name="repos",
        endpoint_name=name,
        endpoint_usage_code="SEARCH",
        path_template=leaf["path"],
        default_query_params=leaf["params"],
        include_from_parent_json={"full_name": "repo"},
    )
    paging = dated(
        resource_name=name,
        pagination_mode_code="SINGLE",
        records_jsonpath=leaf["records"],
        total_count_jsonpath="$.total_count",
    )
    model = dated(resource_name=name, key_json=["id"], fields_json=leaf["fields"])
    return endpoint, paging, model


def provenance(code: str, base: str, shape: str, concurrency: int) -> dict[str, Any]:
    """The benchmark's tree: repositories (``ROOT_PAGE`` a page) → the shape's leaves."""
    rows = [leaf_rows(name) for name in SHAPES[shape]["leaves"]]
    return {
        "provenance": {"provenance_code": code, "base_url_default": base},
        # no qps_limit: only the concurrency bounds the sub-requests
        "rate_limit_cfg": [dated(max_concurrency=concurrency)],
        "endpoint_def": [
            dated(
                resource_name="repos",
                endpoint_name="repos",
                endpoint_usage_code="SEARCH",
                path_template="/orgs/acme/repos",
            ),
            *(endpoint for endpoint, _, _ in rows),
        ],
        "pagination_cfg": [
            dated(
                resource_name="repos",
                pagination_mode_code="LINK_HEADER",
                page_size_param_name="per_page",
                page_size_value=ROOT_PAGE,
                records_jsonpath="$.items",
                total_count_jsonpath="$.total_count",
            ),
            *(paging for _, paging, _ in rows),
        ],
        "record_model": [
            dated(resource_name="repos", key_json=["id"], fields_json={"id": "int", "name": "str"}),
            *(model for _, _, model in rows),
        ],
    }


def in_flight(subs: list[dict[str, Any]]) -> tuple[int, list[tuple[float, float]]]:
    """The most sub-requests in flight at once at the server, and the stretches within the
    span when none was, as (start, length) (a request answered at the instant another
    arrives is not next to it)."""
    events = sorted([(c["at"], 1) for c in subs] + [(c["done"], -1) for c in subs])
    most = now = 0
    gaps, since = [], events[0][0]
    for at, step in events:
        if now == 0 and at > since:
            gaps.append((since, at - since))
        now += step
        most = max(most, now)
        since = at
    return most, gaps


def timing(calls: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """Where a run's time went at the server: the sub-requests' span (first arrival → last
    answer), their service time, and the slot time left unused (a slot is one of the
    ``concurrency`` requests allowed at once)."""
    roots = [c for c in calls if c["path"] == ROOT_PATH]
    subs = [c for c in calls if c["path"] != ROOT_PATH]
    bad = [c for c in calls if c["status"] != 200 or c["done"] is None]
    if bad:
        raise SystemExit(f"forge answered {len(bad)} requests badly: {bad[:3]}")
    first, last = min(c["at"] for c in subs), max(c["done"] for c in subs)
    span = last - first
    busy = sum(c["done"] - c["at"] for c in subs)
    most, gaps = in_flight(subs)
    # the longest stretches with none in flight: (ms after the first arrival, ms long)
    longest = sorted(gaps, key=lambda g: -g[1])[:3]
    return {
        "span_s": round(span, 3),
        "sub_requests": len(subs),
        "parent_pages": len(roots),
        "in_flight_max": most,
        "mean_in_flight": round(busy / span, 2),
        "service_ms_median": round(1000 * statistics.median(c["done"] - c["at"] for c in subs), 1),
        # slot time unused within the span, per sub-request: the client's turnaround
        "slot_idle_ms_per_request": round(1000 * (span * concurrency - busy) / len(subs), 1),
        "none_in_flight_s": round(sum(g[1] for g in gaps), 3),
        "none_in_flight_longest_ms": [
            [round(1000 * (g[0] - first)), round(1000 * g[1], 1)] for g in longest
        ],
        # from the first root page's answer to the first sub-request's arrival
        "lead_ms": round(1000 * (first - min(c["done"] for c in roots)), 1),
    }


async def wait_run(http: httpx.AsyncClient, api: str, code: str) -> float:
    """Start one `source_harvest` run through the API and wait for it: its wall time."""
    task_id = f"bench-{uuid.uuid4().hex[:12]}"
    body = {"meta": {"task_id": task_id}, "params": {"provenance": code}}
    began = time.perf_counter()
    resp = await http.post(f"{api}/tasks/source_harvest/run?mode=async", json=body)
    if resp.status_code != 202:
        raise SystemExit(f"run refused: {resp.status_code} {resp.text[:800]}")
    while True:
        data = (await http.get(f"{api}/tasks/{task_id}")).json()["data"]
        if data and data["status"] in TERMINAL:
            break
        await asyncio.sleep(0.25)
    if data["status"] != RunStatus.COMPLETED:
        raise SystemExit(f"run ended {data['status']}: {json.dumps(data)[:800]}")
    return time.perf_counter() - began


def check_landed(lake: str, code: str, shape: str) -> None:
    """Every record of every resource in its table (a run upserts the previous run's)."""
    spec = SHAPES[shape]
    want = {"repos": spec["repos"], **dict.fromkeys(spec["leaves"], spec["repos"])}
    with sa.create_engine(lake).connect() as conn:
        got = {
            name: conn.execute(sa.text(f'SELECT COUNT(*) FROM "{code}__{name}"')).scalar_one()
            for name in want
        }
    if got != want:
        raise SystemExit(f"landed {got}, expected {want}")


async def one_run(
    stack: BenchStack, args: argparse.Namespace, code: str, lake: str
) -> dict[str, Any]:
    spec = SHAPES[args.shape]
    tree = {"repos": spec["repos"], "issues": 1, "comments": spec["comments"]}
    control = {"reset": True, "scale": tree, "latency_ms": args.latency_ms}
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{stack.samples}/_control/forge", json=control)
        resp.raise_for_status()
        cpu = stack.cpu_s()
        wall = await wait_run(http, stack.api, code)
        used = stack.cpu_s()
        calls = (await http.get(f"{stack.samples}/forge/_calls")).json()
    check_landed(lake, code, args.shape)
    result = timing(calls, args.concurrency)
    want = spec["repos"] * len(spec["leaves"])
    if result["sub_requests"] != want:
        raise SystemExit(f"{result['sub_requests']} sub-requests, expected {want}")
    return {
        **result,
        "run_wall_s": round(wall, 2),
        "worker_cpu_s": round(used["worker"] - cpu["worker"], 2),
        "samples_cpu_s": round(used["samples"] - cpu["samples"], 2),
    }


def summary(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    subs = runs[0]["sub_requests"]
    ideal = subs * args.latency_ms / 1000 / args.concurrency
    median = statistics.median(r["span_s"] for r in runs)
    most = max(r["in_flight_max"] for r in runs)
    return {
        "shape": args.shape,
        "sub_requests_per_run": subs,
        "parent_pages_per_run": runs[0]["parent_pages"],
        "max_concurrency": args.concurrency,
        "qps_limit": None,
        "latency_ms": args.latency_ms,
        "latency_applies_to": "every forge request, the parent pages too",
        "span": "first sub-request's arrival to last sub-request's answer, at the server",
        "spans_s": [r["span_s"] for r in runs],
        "median_span_s": median,
        "ideal_s": round(ideal, 3),
        "bound_s": round(BOUND_FACTOR * ideal, 3),
        "within_bound": median <= BOUND_FACTOR * ideal,
        "in_flight_max": most,
        "concurrency_held": most <= args.concurrency,
        "runs": runs,
        "cpu_count": os.cpu_count(),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="one-page")
    ap.add_argument("--runs", type=int, default=5, help="runs; the median span is held")
    ap.add_argument("--concurrency", type=int, default=8, help="max_concurrency")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="forge latency a request")
    args = ap.parse_args()
    began = time.perf_counter()
    with contextlib.ExitStack() as resources:
        lake_dir = Path(tempfile.mkdtemp(prefix="artemis-lake-"))
        resources.callback(shutil.rmtree, lake_dir, True)
        lake = f"sqlite:///{lake_dir / 'lake.db'}"
        config = {"output_defaults": {"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}}}
        code = f"tree{uuid.uuid4().hex[:6]}"

        def before_start(stack: BenchStack) -> None:
            doc = provenance(code, f"{stack.samples}/forge", args.shape, args.concurrency)
            importer(doc)(stack)

        stack = resources.enter_context(bench_stack(config, before_start=before_start))
        runs = [await one_run(stack, args, code, lake) for _ in range(args.runs)]
    print(json.dumps({**summary(args, runs), "wall_s": round(time.perf_counter() - began, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
