"""Accept floor: what Temporal alone takes, under `bench/accept.py`'s two numbers.

A dev server of its own (as the bench stack starts it) and plain Python code, no Artemis:

- latency: one client, W concurrent `start_workflow` calls per wave, timed at the client;
  nothing runs them (no worker polls their queue; they are terminated at the end);
- throughput (``--shape``): the same waves of a workflow with a small run's Temporal shape
  and no work in it — two local activities (the `running` record, prepare), an activity
  (fetch, which emits concurrently with it), three local activities (finalize, clean-up, the final
  record) — run by one in-process worker (unsandboxed, as Artemis' workers run), timed
  until every run completed; and, lighter still for reference, an activity and a local
  activity.

Prints one JSON line: {"wave", "waves", "start_p50_ms", "start_p99_ms", "start_max_ms",
"client_cpu_ms_per_start"} and with ``--shape`` also {"shape_runs_per_s", "light_runs_per_s"}
and the CPU ms a run of the server and of the bench's process (client and worker) for each:
{"shape_temporal_cpu_ms", "shape_worker_cpu_ms", "light_temporal_cpu_ms", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_models import SA_TASK_CODE, SA_TASK_ID  # noqa: E402
from bench.floor_shape import (  # noqa: E402
    FloorContract,
    FloorIO,
    FloorLight,
    FloorShape,
    floor_contract_step,
    floor_io_step,
    floor_step,
)
from bench.stack import remove_bench_dir  # noqa: E402
from infra.devserver import DevServer, free_port  # noqa: E402


async def raw_starts(client: Client, runs: int, wave: int) -> tuple[list[float], float]:
    """``runs`` plain `start_workflow` calls in waves of ``wave`` — (ms each, sorted; the
    client's CPU ms a start) — of a workflow type no worker polls (after a warm-up:
    connection, namespace caches); terminated afterwards."""
    queue = f"floor-{uuid.uuid4().hex[:8]}"
    started: list[str] = []

    async def start() -> float:
        wf_id = f"floor-{uuid.uuid4().hex}"
        t0 = time.perf_counter()
        await client.start_workflow("FloorWorkflow", {"n": 1}, id=wf_id, task_queue=queue)
        started.append(wf_id)
        return (time.perf_counter() - t0) * 1000

    for _ in range(5):
        await start()
    times: list[float] = []
    cpu0 = time.process_time()
    for first in range(0, runs, wave):
        times += await asyncio.gather(*(start() for _ in range(min(wave, runs - first))))
    cpu_ms = (time.process_time() - cpu0) * 1000 / len(times)
    for wf_id in started:
        await client.get_workflow_handle(wf_id).terminate("accept floor bench")
    return sorted(times), cpu_ms


TASK_CODE = SearchAttributeKey.for_keyword(SA_TASK_CODE)
TASK_ID = SearchAttributeKey.for_keyword(SA_TASK_ID)


async def shape_rate(
    client: Client,
    wave: int,
    waves: int,
    shape: Any,
    arg: Any = 0,
    attributes: bool = False,
) -> float:
    """Runs/s of ``shape`` (its input ``arg``) in waves, by one in-process worker.
    ``attributes``: each started with the two keyword search attributes the API sets on a
    run (``ArtemisTaskCode``, ``ArtemisTaskId``: Temporal indexes them for the UI's
    filters)."""
    queue = f"shape-{uuid.uuid4().hex[:8]}"
    # Unsandboxed, as Artemis' workers run (worker.sandboxed_workflows is off by default):
    # the floor is what Temporal allows, not what the sandbox costs.
    async with Worker(
        client,
        task_queue=queue,
        workflows=[FloorShape, FloorLight, FloorIO, FloorContract],
        activities=[floor_step, floor_io_step, floor_contract_step],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):

        async def one() -> None:
            task_id = uuid.uuid4().hex
            await client.execute_workflow(
                shape.run,
                arg,
                id=f"shape-{task_id}",
                task_queue=queue,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(TASK_CODE, "pull_stock_quotes"),
                        SearchAttributePair(TASK_ID, task_id),
                    ]
                )
                if attributes
                else None,
            )

        await asyncio.gather(*(one() for _ in range(3)))  # warm-up
        t0 = time.perf_counter()
        for _ in range(waves):
            await asyncio.gather(*(one() for _ in range(wave)))
        return wave * waves / (time.perf_counter() - t0)


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wave", type=int, default=50)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--shape", action="store_true", help="also: runs/s of a small run's shape")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="artemis-floor-"))
    server = DevServer(
        port=free_port(), ui_port=None, db_file=None, log_file=tmp / "temporal.log"
    ).start()
    try:
        client = await Client.connect(server.address)
        times, cpu_ms = await raw_starts(client, args.wave * args.waves, args.wave)
        out = {
            "wave": args.wave,
            "waves": args.waves,
            "start_p50_ms": round(statistics.median(times), 1),
            "start_p99_ms": round(times[int(len(times) * 0.99) - 1], 1),
            "start_max_ms": round(times[-1], 1),
            "client_cpu_ms_per_start": round(cpu_ms, 2),
        }
        if args.shape:
            pid = server.proc.pid if server.proc is not None else 0
            for name, shape in (("shape", FloorShape), ("light", FloorLight)):
                before, own = cpu_s(pid), time.process_time()
                rate = await shape_rate(client, args.wave, args.waves, shape)
                runs = args.wave * args.waves
                out[f"{name}_runs_per_s"] = round(rate, 1)
                # the CPU ms a run of the server and of this process (client and worker)
                out[f"{name}_temporal_cpu_ms"] = round((cpu_s(pid) - before) * 1000 / runs, 1)
                out[f"{name}_worker_cpu_ms"] = round((time.process_time() - own) * 1000 / runs, 1)
        print(json.dumps(out))
    finally:
        server.stop()
        remove_bench_dir(tmp)


if __name__ == "__main__":
    asyncio.run(main())
