"""Literature harvest benchmark: PubMed and Crossref harvests through the registry against
the sample servers (separate processes: dev server, samples, worker, API), measuring
records and pages per second and the busiest one-second request count at the server.

Prints one JSON line per provenance: {"provenance", "records", "pages", "seconds",
"pages_per_s", "records_per_s", "qps_limit", "server_busiest_1s", "server_avg_qps"}; then
one for two worker processes sharing a provenance at qps 4 / burst 1 (two harvests at
once, so both processes fetch): {"scenario": "two_workers", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stack import BenchStack, bench_stack  # noqa: E402


async def harvest(
    api: str,
    samples: str,
    provenance: str,
    queries: list[str],
    start: str,
    end: str,
    page_size: int | None,
) -> dict:
    """One harvest per query, all at once; the server's view of their requests."""

    async def one(http: httpx.AsyncClient, query: str) -> dict:
        params: dict[str, object] = {
            "provenance": provenance,
            "query": query,
            "start": start,
            "end": end,
        }
        if page_size:
            params["page_size"] = page_size
        resp = await http.post(
            f"{api}/tasks/literature_harvest/run?mode=sync", json={"params": params}
        )
        if resp.status_code != 200:
            raise SystemExit(f"{provenance} harvest failed: {resp.text[:400]}")
        return resp.json()["data"]["stats"]

    async with httpx.AsyncClient(timeout=600) as http:
        t0 = time.perf_counter()
        stats = await asyncio.gather(*(one(http, q) for q in queries))
        seconds = time.perf_counter() - t0
        calls = (await http.get(f"{samples}/_literature/calls")).json()
    mine = set(queries)
    times = sorted(
        c["at"]
        for c in calls
        if (
            c["params"].get("term") in mine
            or c["params"].get("query") in mine
            or (c["api"] == "efetch" and provenance == "pubmed")
        )
    )
    busiest = max((sum(1 for u in times if t <= u < t + 1.0) for t in times), default=0)
    span = (times[-1] - times[0]) if len(times) > 1 else 0
    records = sum(s["records_emitted"] for s in stats)
    pages = sum(s["pages"] for s in stats)
    return {
        "provenance": provenance,
        "records": records,
        "pages": pages,
        "seconds": round(seconds, 3),
        "pages_per_s": round(pages / seconds, 2),
        "records_per_s": round(records / seconds, 1),
        "server_requests": len(times),
        "server_busiest_1s": busiest,
        "server_avg_qps": round((len(times) - 1) / span, 2) if span else None,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=int, default=60, help="window length from 2025-01-01")
    ap.add_argument("--crossref-page-size", type=int, default=100)
    args = ap.parse_args()
    config = {
        "output_defaults": {
            "literature_harvest": {"sinks": ["http"], "http_endpoint": "{samples}/sink/lit"}
        }
    }

    def import_registry(stack: BenchStack) -> None:
        for code, name, base in (
            ("pubmed", "pubmed", f"{stack.samples}/entrez"),
            ("crossref", "crossref", stack.samples),
            ("crossref_q4", "crossref", stack.samples),
        ):
            doc = yaml.safe_load((ROOT / "infra" / "registry" / f"{name}.yaml").read_text())
            doc["provenance"]["provenance_code"] = code
            doc["provenance"]["base_url_default"] = base
            if code == "crossref_q4":
                doc["rate_limit_cfg"][0].update(qps_limit=4, burst_capacity=1, max_concurrency=2)
            f = stack.tmp / f"{code}.yaml"
            f.write_text(yaml.safe_dump(doc))
            stack.cli("registry", "import", str(f))

    with bench_stack(config, before_start=import_registry, workers=2) as stack:
        samples, api = stack.samples, stack.api
        end = (date(2025, 1, 1) + timedelta(days=args.days - 1)).isoformat()
        for provenance, page_size in (("pubmed", None), ("crossref", args.crossref_page_size)):
            result = await harvest(
                api, samples, provenance, [f"bench-{provenance}"], "2025-01-01", end, page_size
            )
            result["qps_limit"] = {"pubmed": 3, "crossref": 10}[provenance]
            print(json.dumps(result))
        # Two worker processes share crossref_q4 (qps 4, burst 1): two harvests at once.
        result = await harvest(
            api, samples, "crossref_q4", ["q4-a", "q4-b"], "2025-01-01", "2025-01-10", 15
        )
        result.update(scenario="two_workers", qps_limit=4, burst_capacity=1)
        print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
