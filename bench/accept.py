"""Accept benchmark: how fast the API takes runs, and how many small runs finish a second.

Starts the stack (dev server, samples, one worker, the API, each its own process), then,
in each of ``--rounds`` rounds, sends N async starts of `pull_stock_quotes` (one symbol,
one page each) in waves of W concurrent requests, timing each answer at the client, and
waits until every run has completed (each workflow's result, long-polled from Temporal as
the raw waves' are; then one read of the task listing checks that every record says
completed).

Then the raw start call, on the same server in the same run:

- ``raw_start_*``: in each round, as many runs as were accepted, in the same waves,
  started by `start_workflow` itself (the request the API sends, built as the API builds
  it; one Temporal client), the worker running them as it ran the accepted ones — what
  the API adds over the call it makes. Each round has its raw wave next to its accept
  waves (after them, or before them in every other round): ``p99_over_raw`` is the p99 of
  all accepted starts over the p99 of all raw ones, as many of each, read at the same
  moments of the machine's drift; ``round_p99_over_raw`` is each round's own;
- ``idle_start_*``: waves of a workflow type nothing polls (`bench/accept_floor.py`'s
  raw starts): what Temporal alone takes to accept a start, with nothing else running;
- ``floor_shape_runs_per_s``: `accept_floor.py --shape`'s empty workflow of a small run's
  shape, in waves as the runs', on the same server before each round and once after
  the last; ``round_over_floor``: each round's runs/s over the mean of the floor just
  before and just after it, and ``over_floor`` their median (the machine's speed drifts
  within minutes: a round is compared with the floor measured alongside it).

Prints one JSON line: {"runs", "wave", "accept_p50_ms", "accept_p99_ms", "accept_max_ms",
"rounds", "runs_per_s", "round_runs_per_s", "seconds", "raw_start_p50_ms",
"raw_start_p99_ms", "p99_over_raw", "round_p99_over_raw", "raw_runs_per_s",
"idle_start_p50_ms", "idle_start_p99_ms", "p99_over_idle",
"floor_shape_runs_per_s", "round_over_floor", "over_floor",
"accept_cpu_ms_per_run", "total_cpu_ms_per_run", "cpu_ms_per_run", "cpu_bound_runs_per_s"}
— the CPU ms a run of the API, the worker(s), the Temporal server, the sample servers
and the bench's own client, while the waves were accepted and from the first start to
the last completion; their sum, and the runs a second that sum allows on this machine's
cores (what the run costs, apart from how well the pieces overlap). Three more floors,
each measured alongside every reading of the empty one on request (`bench/floor_shape.py`):
``--io-floor`` the empty shape with a bench run's two HTTP requests in it (its page, its
sink POST); ``--sa-floor`` the empty shape started with the two keyword search attributes
the API sets on every run (``ArtemisTaskCode``, ``ArtemisTaskId``; Temporal indexes them
for the UI's filters); ``--contract-floor`` both, and the writes the contract asks of a
small run in plain sqlite3 (the task record twice, the page staged and dropped, the
stream's eight events) — a run with no Artemis code in it. Each adds
{"floor_<name>_runs_per_s", "<name>_floor_over_floor", "round_over_<name>_floor",
"over_<name>_floor"} (name: io, sa, contract): that floor against the empty one, and the
runs against it. ``floor_cpu_ms_per_run`` (and ``floor_<name>_cpu_ms_per_run``): the CPU
ms a floor run costs each process, as ``total_cpu_ms_per_run`` (its worker and client are
the bench's own process: "bench"), over all its readings and their warm-up runs.
``--eager`` starts the dev server with eager activity execution and eager workflow start
enabled (dynamic config), to measure what they change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.config import load_settings  # noqa: E402
from artemis.run_models import (  # noqa: E402
    WORKFLOW_NAME,
    RunRequest,
    workflow_id_for,
)
from artemis.run_state import RunStatus  # noqa: E402
from artemis.sinks import resolve_output  # noqa: E402
from artemis.tasks.registry import get_task  # noqa: E402
from artemis.temporal.client import connect  # noqa: E402
from bench.accept_floor import raw_starts, shape_rate  # noqa: E402
from bench.floor_shape import FloorContract, FloorIO, FloorShape, close_http  # noqa: E402
from bench.stack import BenchStack, bench_stack  # noqa: E402
from infra.devserver import EAGER_DYNAMIC_CONFIG  # noqa: E402
from starter.run_reads import KEY_TASK_CODE, KEY_TASK_ID  # noqa: E402

CODE = "pull_stock_quotes"

EAGER = EAGER_DYNAMIC_CONFIG


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


class RawWaves:
    """Runs like the accepted ones started by `start_workflow` itself (the request the API
    sends, built as the API builds it; one Temporal client), in the same waves, run by the
    same worker: what the API adds over the call it makes."""

    def __init__(self, stack: BenchStack) -> None:
        self.stack = stack
        self.settings = load_settings(stack.tmp / "config.yaml")
        self.task = get_task(CODE)
        self.tuning = self.settings.runs.run_tuning()
        self.client: Client | None = None

    def request(self, n: int) -> RunRequest:
        settings = self.settings
        params = body(self.stack.samples, 20_000 + n)["params"]
        output = resolve_output(
            CODE,
            settings.output_defaults.get(CODE, {}),
            None,
            self.task.record_spec(self.task.prepare_params(params, settings)),
            settings.database.url,
        )
        return RunRequest(
            task_code=CODE,
            task_id=uuid.uuid4().hex,
            params=params,
            trace_id=uuid.uuid4().hex,
            output=output,
            timeout_s=settings.server.run_timeout_s,
            tuning=self.tuning,
        )

    async def start(self, req: RunRequest) -> tuple[float, WorkflowHandle]:
        assert self.client is not None
        t0 = time.perf_counter()
        handle = await self.client.start_workflow(
            WORKFLOW_NAME,
            req,
            id=workflow_id_for(CODE, req.task_id),
            task_queue=self.settings.temporal.task_queue,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(KEY_TASK_CODE, CODE),
                    SearchAttributePair(KEY_TASK_ID, req.task_id),
                ]
            ),
        )
        return (time.perf_counter() - t0) * 1000, handle

    async def open(self) -> None:
        self.client = await connect(self.settings)
        for n in range(3):  # warm-up, as the accept waves had
            await (await self.start(self.request(-1 - n)))[1].result()

    async def waves(self, runs: int, wave: int, n0: int) -> tuple[list[float], float]:
        """(ms each start took; seconds until every one completed)."""
        began = time.perf_counter()
        started: list[tuple[float, WorkflowHandle]] = []
        for first in range(n0, n0 + runs, wave):
            reqs = [self.request(n) for n in range(first, min(n0 + runs, first + wave))]
            started += await asyncio.gather(*(self.start(r) for r in reqs))
        await asyncio.gather(*(h.result() for _, h in started))
        return [t for t, _ in started], time.perf_counter() - began


def io_target(stack: BenchStack) -> dict[str, Any]:
    """A bench run's page and sink, for the floors that do the run's I/O."""
    return {
        "quotes": f"{stack.samples}/quotes",
        "params": {"symbol": "FLOOR", "start": "2025-01-01", "end": "2025-01-05"},
        "sink": f"{stack.samples}/sink/floor",
    }


# The floors measured alongside the empty one on request (--io-floor, --sa-floor,
# --contract-floor): name -> runs/s (client, stack, wave, waves).
EXTRA_FLOORS: dict[str, Callable[[Client, BenchStack, int, int], Awaitable[float]]] = {
    # the empty shape with a bench run's page and sink requests (bench/floor_shape.py)
    "io": lambda client, stack, wave, waves: shape_rate(
        client, wave, waves, FloorIO, io_target(stack)
    ),
    # the empty shape started with the run's two keyword search attributes
    "sa": lambda client, stack, wave, waves: shape_rate(
        client, wave, waves, FloorShape, attributes=True
    ),
    # FloorIO with the search attributes and the contract's writes in plain sqlite3
    "contract": lambda client, stack, wave, waves: shape_rate(
        client,
        wave,
        waves,
        FloorContract,
        {**io_target(stack), "db": str(stack.tmp / "contract-floor.db")},
        attributes=True,
    ),
}


async def check_completed(http: aiohttp.ClientSession, api: str, task_ids: set[str]) -> None:
    """Every accepted run's record in the task store says completed (the listing, read
    once after the bench; a run that ended otherwise ends the bench)."""
    seen: set[str] = set()
    cursor: str | None = None
    while True:
        query = {"status": str(RunStatus.COMPLETED), "limit": "500"}
        if cursor:
            query["cursor"] = cursor
        async with http.get(f"{api}/tasks", params=query) as resp:
            page = (await resp.json())["data"]
        seen |= {t["task_id"] for t in page["items"]} & task_ids
        cursor = page.get("next_cursor")
        if not cursor:
            break
    if seen != task_ids:
        raise SystemExit(f"{len(task_ids - seen)} runs are not recorded completed")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--wave", type=int, default=50)
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of RUNS accepted runs, each after its own floor reading",
    )
    ap.add_argument("--eager", action="store_true", help="eager activities and starts on")
    ap.add_argument(
        "--io-floor",
        action="store_true",
        help="also the floor with the run's two HTTP requests in it (bench/floor_shape.py)",
    )
    ap.add_argument(
        "--sa-floor",
        action="store_true",
        help="also the floor started with the run's two keyword search attributes",
    )
    ap.add_argument(
        "--contract-floor",
        action="store_true",
        help="also the floor doing the I/O and writes the contract asks of a small run",
    )
    args = ap.parse_args()
    dynamic = EAGER if args.eager else None
    config = {
        "output_defaults": {
            "pull_stock_quotes": {"sinks": ["http"], "http_endpoint": "{samples}/sink/accept"}
        }
    }
    with bench_stack(config, dynamic_config=dynamic) as stack:
        # aiohttp: a third of httpx's client CPU a request (artemis/http.py), so that the
        # bench's own client weighs little in what it times
        connector = aiohttp.TCPConnector(limit=args.wave)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            url = f"{stack.api}/tasks/pull_stock_quotes/run?mode=async"
            # warm-up: connections, the worker, caches
            for n in range(3):
                async with http.post(url, json=body(stack.samples, 10_000 + n)) as resp:
                    await resp.read()

            async def start(n: int) -> tuple[float, str]:
                t0 = time.perf_counter()
                async with http.post(url, json=body(stack.samples, n)) as resp:
                    text = await resp.text()
                took = time.perf_counter() - t0
                if resp.status != 202:
                    raise SystemExit(f"start refused: {resp.status} {text[:300]}")
                return took, json.loads(text)["data"]["task_id"]

            client = await connect(load_settings(stack.tmp / "config.yaml"))
            # The floor: an empty workflow of the run's shape on the same server, measured
            # before each round's accept waves and once after the last. The machine's speed
            # drifts by up to half within minutes; a round's ratio is its runs/s over the
            # mean of the floor just before it and the floor just after it, and
            # `over_floor` is the median of the rounds' ratios.
            floor_client = await Client.connect(stack.temporal)
            # The raw start p99 likewise: a raw wave of as many runs in each round, next to
            # its accept waves (first in every other round), so that the two p99s are
            # read from as many starts, at the same moments of the machine's drift.
            raw = RawWaves(stack)
            await raw.open()
            waves = max(1, args.runs // args.wave)
            floor: list[float] = []
            extra = [name for name in EXTRA_FLOORS if getattr(args, f"{name}_floor")]
            extra_floor: dict[str, list[float]] = {name: [] for name in extra}
            rates: list[float] = []
            accepted: list[tuple[float, str]] = []
            raw_ms: list[list[float]] = []
            raw_seconds = 0.0
            seconds = 0.0
            cpu0 = stack.cpu_s()
            cpu_accept = {k: 0.0 for k in cpu0}
            total_cpu = {k: 0.0 for k in cpu0}

            async def raw_round(round_no: int) -> None:
                nonlocal raw_seconds
                times, took = await raw.waves(args.runs, args.wave, round_no * args.runs)
                raw_ms.append(times)
                raw_seconds += took

            # CPU of the floors' runs, by process (their worker and client are the bench's)
            floor_cpu: dict[str, dict[str, float]] = {
                name: {k: 0.0 for k in cpu0} for name in ["shape", *extra]
            }

            async def floors() -> None:
                for name in ["shape", *extra]:
                    before = stack.cpu_s()
                    if name == "shape":
                        floor.append(await shape_rate(floor_client, args.wave, waves, FloorShape))
                    else:
                        rate = await EXTRA_FLOORS[name](floor_client, stack, args.wave, waves)
                        extra_floor[name].append(rate)
                    after = stack.cpu_s()
                    for k in cpu0:
                        floor_cpu[name][k] += after[k] - before[k]

            for round_no in range(args.rounds):
                await floors()
                if round_no % 2:
                    await raw_round(round_no)
                began = time.perf_counter()
                before = stack.cpu_s()
                these: list[tuple[float, str]] = []
                for first in range(0, args.runs, args.wave):
                    wave = range(first, min(args.runs, first + args.wave))
                    n0 = round_no * args.runs
                    these += await asyncio.gather(*(start(n0 + n) for n in wave))
                accepting = stack.cpu_s()
                # Completion: each run's workflow result, long-polled from Temporal as the
                # raw waves' are (and as accept_floor's are). The run's last write to the
                # task store is a local activity before the workflow completes, so a
                # completed workflow has its record written; that every record says
                # completed is checked below, once. (Polling the listing every 50 ms
                # instead costs the API 4–10 ms of CPU a run on top of the run's own,
                # growing with the number of runs: the bench would measure its own load.)
                await asyncio.gather(
                    *(
                        client.get_workflow_handle(workflow_id_for(CODE, t)).result()
                        for _, t in these
                    )
                )
                took = time.perf_counter() - began
                after = stack.cpu_s()
                for k in cpu0:
                    cpu_accept[k] += accepting[k] - before[k]
                    total_cpu[k] += after[k] - before[k]
                seconds += took
                rates.append(args.runs / took)
                accepted += these
                if round_no % 2 == 0:
                    await raw_round(round_no)
            await check_completed(http, stack.api, {task_id for _, task_id in accepted})
        idle, _ = await raw_starts(floor_client, args.runs, args.wave)
        await floors()
        await close_http()
        ratios = [r / statistics.mean(floor[i : i + 2]) for i, r in enumerate(rates)]
        extras: dict[str, Any] = {}
        for name, readings in extra_floor.items():
            against = [r / statistics.mean(readings[i : i + 2]) for i, r in enumerate(rates)]
            extras |= {
                f"floor_{name}_runs_per_s": [round(f, 1) for f in readings],
                f"{name}_floor_over_floor": round(
                    statistics.median(x / f for x, f in zip(readings, floor, strict=True)), 2
                ),
                f"round_over_{name}_floor": [round(r, 2) for r in against],
                f"over_{name}_floor": round(statistics.median(against), 2),
            }
        n_runs = args.runs * args.rounds
        zero = {k: 0.0 for k in total_cpu}
        # each floor reading: its waves and shape_rate's three warm-up runs
        n_floor = (args.wave * waves + 3) * len(floor)
        for name, used in floor_cpu.items():
            key = "floor_cpu_ms_per_run" if name == "shape" else f"floor_{name}_cpu_ms_per_run"
            extras[key] = per_run(zero, used, n_floor)
        total = per_run(zero, total_cpu, n_runs)
        ms = sorted(t * 1000 for t, _ in accepted)
        p99 = percentile(ms, 0.99)
        raw_all = sorted(t for times in raw_ms for t in times)
        raw_p99 = percentile(raw_all, 0.99)
        # each round's accept p99 over its own raw wave's (100 starts each: noisier)
        round_p99 = [
            percentile(
                sorted(t * 1000 for t, _ in accepted[i * args.runs : (i + 1) * args.runs]), 0.99
            )
            / percentile(sorted(raw_ms[i]), 0.99)
            for i in range(args.rounds)
        ]
        print(
            json.dumps(
                {
                    "runs": args.runs,
                    "wave": args.wave,
                    "accept_p50_ms": round(statistics.median(ms), 1),
                    "accept_p99_ms": round(p99, 1),
                    "accept_max_ms": round(ms[-1], 1),
                    "rounds": args.rounds,
                    "runs_per_s": round(n_runs / seconds, 1),
                    "round_runs_per_s": [round(r, 1) for r in rates],
                    "seconds": round(seconds, 2),
                    "raw_start_p50_ms": round(statistics.median(raw_all), 1),
                    "raw_start_p99_ms": round(raw_p99, 1),
                    "p99_over_raw": round(p99 / raw_p99, 2),
                    "round_p99_over_raw": [round(r, 2) for r in round_p99],
                    "raw_runs_per_s": round(len(raw_all) / raw_seconds, 1),
                    "idle_start_p50_ms": round(statistics.median(idle), 1),
                    "idle_start_p99_ms": round(percentile(idle, 0.99), 1),
                    "p99_over_idle": round(p99 / percentile(idle, 0.99), 2),
                    "floor_shape_runs_per_s": [round(f, 1) for f in floor],
                    "round_over_floor": [round(r, 2) for r in ratios],
                    "over_floor": round(statistics.median(ratios), 2),
                    **extras,
                    "eager": args.eager,
                    # CPU ms a run, by process: while the waves were accepted, and from the
                    # first start to the last completion (samples: the sources and sinks;
                    # bench: this process, its client)
                    "accept_cpu_ms_per_run": per_run(zero, cpu_accept, n_runs),
                    "total_cpu_ms_per_run": total,
                    "cpu_ms_per_run": round(sum(total.values()), 1),
                    "cpu_bound_runs_per_s": round(
                        len(os.sched_getaffinity(0)) * 1000 / sum(total.values()), 1
                    ),
                }
            )
        )


if __name__ == "__main__":
    asyncio.run(main())
