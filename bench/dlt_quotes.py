"""The harvest benchmark's jobs done by dlt's `rest_api` source, for the README's table.

Not part of the project (dlt is not a dependency): run it with a Python that has dlt,
next to the sample servers of this project::

    python3 -m venv /tmp/dltvenv && /tmp/dltvenv/bin/pip install dlt orjson httpx
    .venv/bin/artemis samples serve --port 8399 --latency-ms 10 &
    /tmp/dltvenv/bin/python bench/dlt_quotes.py --samples http://127.0.0.1:8399 \
        --symbols 4 --pages 50

dlt fetches each symbol's pages with its page-number paginator (``parallelized=True``
when there are several symbols), then normalises and loads them through a custom
destination that POSTs each batch of ``page_size`` records to the sample sink (orjson), as
Artemis's HTTP sink does. It checks that the sink received every record and prints one
JSON line: {"tool", "version", "symbols", "pages", "records", "seconds", "runs_s"}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from datetime import date, timedelta

import dlt
import httpx
import orjson
from dlt.sources.rest_api import rest_api_source

START = date(1960, 1, 1)


def run_once(samples: str, symbols: int, pages: int, page_size: int) -> float:
    end = START + timedelta(days=pages * page_size - 1)
    tag = uuid.uuid4().hex[:6]
    sink = f"{samples}/sink/dlt-{tag}"
    http = httpx.Client(timeout=30)

    @dlt.destination(batch_size=page_size, name="http_sink", loader_file_format="typed-jsonl")
    def http_sink(items, table) -> None:  # type: ignore[no-untyped-def]
        if table["name"].startswith("_dlt"):
            return
        resp = http.post(
            sink,
            content=orjson.dumps(items),
            headers={"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex},
        )
        resp.raise_for_status()

    source = rest_api_source(
        {
            "client": {"base_url": samples},
            "resource_defaults": {
                "endpoint": {
                    "data_selector": "items",
                    "paginator": {
                        "type": "page_number",
                        "base_page": 1,
                        "page_param": "page",
                        "total_path": None,
                        # dlt stops before requesting maximum_page itself
                        "maximum_page": pages + 1,
                    },
                },
            },
            "resources": [
                {
                    "name": f"quotes_{n}",
                    "endpoint": {
                        "path": "quotes",
                        "params": {
                            "symbol": f"DLT{tag}{n}".upper(),
                            "start": START.isoformat(),
                            "end": end.isoformat(),
                            "page_size": page_size,
                        },
                    },
                }
                for n in range(symbols)
            ],
        },
        # the symbols' generators extracted in parallel (dlt's thread pool)
        parallelized=symbols > 1,
    )
    with tempfile.TemporaryDirectory(prefix="dlt-bench-") as pipelines_dir:
        pipeline = dlt.pipeline(
            pipeline_name=f"bench_{tag}", destination=http_sink, pipelines_dir=pipelines_dir
        )
        t0 = time.perf_counter()
        pipeline.run(source)
        seconds = time.perf_counter() - t0
    got = sum(
        len(b["records"] or [])
        for b in http.get(f"{samples}/_sink/batches").json()
        if b["name"] == f"dlt-{tag}" and b["status"] == 200
    )
    want = symbols * pages * page_size
    if got != want:
        raise SystemExit(f"the sink received {got} records, expected {want}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", required=True, help="the sample servers' base URL")
    ap.add_argument("--symbols", type=int, default=1)
    ap.add_argument("--pages", type=int, default=200, help="pages per symbol")
    ap.add_argument("--page-size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    run_once(args.samples, args.symbols, 3, 10)  # warm-up
    runs = [
        run_once(args.samples, args.symbols, args.pages, args.page_size) for _ in range(args.repeat)
    ]
    print(
        json.dumps(
            {
                "tool": "dlt rest_api",
                "version": dlt.__version__,
                "symbols": args.symbols,
                "pages": args.pages,
                "records": args.symbols * args.pages * args.page_size,
                "seconds": round(statistics.median(runs), 3),
                "runs_s": [round(x, 3) for x in runs],
            }
        )
    )


if __name__ == "__main__":
    main()
