"""Record workflow histories of the current code for the replay corpus (docs/architecture.md).

Starts the whole stack (dev server, sample servers, one worker, one API; separate
processes), drives every workflow type through the ways a run ends — completed (with
continue-as-new), failed, cancelled by signal and by Temporal, timed out, a literature
harvest per API family, a backfill with children, a window split over a result cap, a
crawl, note details and the housekeeping loops (each continued as new once, then
stopped) — then writes each closed execution's history to
``tests/histories/<label>/<workflow type>-<scenario>-<status>[-<n>].json``.

    python bench/record_histories.py --label <release>   # or: make histories LABEL=<release>
    python bench/record_histories.py --label <release> --housekeeping-only

``make test`` replays every stored history against the current code; a release adds its
own set. Prints one JSON line: {"label", "histories", "by_type"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artemis.run_models import CancelRequest, lock_workflow_id  # noqa: E402
from artemis.run_state import TERMINAL, RunStatus  # noqa: E402
from artemis_samples.platform import note_ids  # noqa: E402
from bench.stack import BenchStack, bench_stack  # noqa: E402

COOKIE = "web_session=sample-recorder-0001"


def prepare(stack: BenchStack) -> None:
    """Registry variants pointing at the sample servers, and a pooled cookie."""
    for name, base in (("pubmed", f"{stack.samples}/entrez"), ("crossref", stack.samples)):
        doc = yaml.safe_load((ROOT / "infra" / "registry" / f"{name}.yaml").read_text())
        doc["provenance"]["base_url_default"] = base
        (stack.tmp / f"{name}.yaml").write_text(yaml.safe_dump(doc))
        stack.cli("registry", "import", str(stack.tmp / f"{name}.yaml"))
    # The walk-through's catalogue: a harvest that quarantines a record, then its replay.
    doc = yaml.safe_load((ROOT / "infra" / "registry" / "catalog.yaml").read_text())
    doc["provenance"]["base_url_default"] = f"{stack.samples}/catalog"
    (stack.tmp / "catalog.yaml").write_text(yaml.safe_dump(doc))
    stack.cli("registry", "import", str(stack.tmp / "catalog.yaml"))
    # A PubMed twin with a tiny result cap, so that a window splits cheaply.
    doc = yaml.safe_load((ROOT / "infra" / "registry" / "pubmed.yaml").read_text())
    doc["provenance"]["base_url_default"] = f"{stack.samples}/entrez"
    doc["provenance"]["provenance_code"] = "pubmedsplit"
    doc["provenance"]["provenance_name"] = "PubMed (small cap)"
    for row in doc["pagination_cfg"]:
        row["max_result_window"] = 50
        row["page_size_value"] = 50
    (stack.tmp / "pubmedsplit.yaml").write_text(yaml.safe_dump(doc))
    stack.cli("registry", "import", str(stack.tmp / "pubmedsplit.yaml"))
    subprocess.run(
        [sys.executable, "-m", "starter.cli", "cookies", "add"]
        + ["--platform", "sample", "--name", "recorder", "--priority", "1"],
        input=COOKIE,
        text=True,
        env=stack.env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


class Driver:
    def __init__(self, stack: BenchStack, http: httpx.AsyncClient) -> None:
        self.stack = stack
        self.http = http
        self.scenarios: dict[str, str] = {}  # workflow id -> scenario
        self.n = 0

    async def control(self, target: str, **spec: Any) -> None:
        await self.http.post(f"{self.stack.samples}/_control/{target}", json=spec)

    async def start(self, scenario: str, code: str, params: dict[str, Any], **meta: Any) -> str:
        self.n += 1
        task_id = f"rec-{scenario}-{self.n}"
        resp = await self.http.post(
            f"{self.stack.api}/tasks/{code}/run?mode=async",
            json={"meta": {"task_id": task_id, **meta}, "params": params},
        )
        if resp.status_code != 202:
            raise SystemExit(f"{scenario}: start refused: {resp.text[:300]}")
        self.scenarios[resp.json()["data"]["workflow_id"]] = scenario
        return task_id

    async def wait(self, task_id: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = (await self.http.get(f"{self.stack.api}/tasks/{task_id}")).json()["data"]
            if data and data.get("status") in TERMINAL:
                return str(data["status"])
            await asyncio.sleep(0.2)
        raise SystemExit(f"{task_id} did not finish within {timeout} s")


async def drive(stack: BenchStack, client: Any) -> dict[str, str]:
    async with httpx.AsyncClient(timeout=60) as http:
        d = Driver(stack, http)
        quotes = {
            "start": "2025-11-01",
            "end": "2025-11-30",
            "page_size": 5,
            "base_url": stack.samples,
        }
        # Completed, continuing as new (runs.max_batches_per_run is 2), with a CronJob.
        t = await d.start(
            "completed",
            "pull_stock_quotes",
            {**quotes, "symbols": ["AAPL", "MSFT"]},
            run_id="rec-run-1",
            callback={"base_url": f"{stack.samples}/cronjob/runs"},
        )
        await d.wait(t)
        # Failed: the sink refuses a page (4xx).
        await d.control("sink", status=400, times=1)
        await d.wait(await d.start("failed", "pull_stock_quotes", {**quotes, "symbols": ["X"]}))
        await d.control("latency", latency_ms=100)
        # Cancelled by the cancel signal, through the API (Temporal's cancellation with a
        # reason), by Temporal alone, and timed out.
        t = await d.start("cancel-signal", "pull_stock_quotes", {**quotes, "symbols": ["Y"]})
        await asyncio.sleep(1.0)
        wid = next(w for w, s in d.scenarios.items() if s == "cancel-signal")
        await client.get_workflow_handle(wid).signal("cancel", CancelRequest(reason="recorder"))
        await d.wait(t)
        t = await d.start("cancel-api", "pull_stock_quotes", {**quotes, "symbols": ["W"]})
        await asyncio.sleep(1.0)
        await http.post(f"{stack.api}/tasks/{t}/cancel", json={"reason": "recorder"})
        await d.wait(t)
        t = await d.start("cancel-temporal", "pull_stock_quotes", {**quotes, "symbols": ["Z"]})
        await asyncio.sleep(1.0)
        wid = next(w for w, s in d.scenarios.items() if s == "cancel-temporal")
        await client.get_workflow_handle(wid).cancel()
        await d.wait(t)
        t = await d.start(
            "timeout", "pull_stock_quotes", {**quotes, "symbols": ["T"]}, timeout_s=1.5
        )
        await d.wait(t)
        # Paused mid-fetch: the fetch in flight is cancelled and returns at its
        # next page; the run waits paused, then resumes.
        await d.control("latency", latency_ms=400)
        t = await d.start("paused", "pull_stock_quotes", {**quotes, "symbols": ["P"]})
        await asyncio.sleep(1.0)
        await http.post(f"{stack.api}/tasks/{t}/pause", json={"reason": "recorder"})
        deadline = time.monotonic() + 60
        while (await http.get(f"{stack.api}/tasks/{t}")).json()["data"][
            "status"
        ] != RunStatus.PAUSED:
            if time.monotonic() > deadline:
                raise SystemExit("paused: the run did not pause")
            await asyncio.sleep(0.1)
        await http.post(f"{stack.api}/tasks/{t}/resume", json={})
        await d.wait(t)
        await d.control("latency", latency_ms=0)
        # Outages: a sink down for a while, then a source; a run that gave up past
        # its tolerance and was finished by POST /tasks/{id}/retry.
        await d.control("sink", status=503, for_s=3)
        await d.wait(
            await d.start("sink-waited", "pull_stock_quotes", {**quotes, "symbols": ["W"]})
        )
        await d.control("quotes", status=503, for_s=3)
        await d.wait(
            await d.start("source-waited", "pull_stock_quotes", {**quotes, "symbols": ["V"]})
        )
        await d.control("sink", status=503, for_s=3600)
        t = await d.start(
            "gave-up",
            "pull_stock_quotes",
            {**quotes, "symbols": ["G"], "outage_tolerance_s": 2},
            run_id="rec-run-2",
            callback={"base_url": f"{stack.samples}/cronjob/runs"},
        )
        if await d.wait(t) != RunStatus.FAILED:
            raise SystemExit("gave-up: the run did not fail past its tolerance")
        await d.control("sink")
        resp = await http.post(f"{stack.api}/tasks/{t}/retry", json={})
        if resp.status_code != 202:
            raise SystemExit(f"retry refused: {resp.text[:300]}")
        if await d.wait(t) != RunStatus.COMPLETED:
            raise SystemExit("gave-up: the retried run did not complete")
        # Literature: each API family, a backfill with children, a window split over a cap.
        await d.control("literature", enforce_rate=False, reset=True)
        window = {"start": "2025-01-01", "end": "2025-01-02"}
        lit = "literature_harvest"
        await d.wait(await d.start("pubmed", lit, {"provenance": "pubmed", **window}))
        await d.wait(
            await d.start("crossref", lit, {"provenance": "crossref", "page_size": 20, **window})
        )
        await d.wait(
            await d.start(
                "backfill",
                lit,
                {
                    "provenance": "crossref",
                    "task_type": "backfill",
                    "start": "2025-01-30",
                    "end": "2025-02-01",
                    "page_size": 50,
                },
            )
        )
        await d.wait(
            await d.start(
                "split",
                lit,
                {"provenance": "pubmedsplit", "start": "2025-01-01", "end": "2025-01-03"},
            )
        )
        # A record set aside (a price written as a string), then replayed.
        await d.control("catalog", reset=True, spoil=[5])
        t = await d.start("quarantine", "source_harvest", {"provenance": "catalog"})
        if await d.wait(t) != RunStatus.COMPLETED:
            raise SystemExit("quarantine: the run did not complete")
        resp = await http.post(f"{stack.api}/quarantine/replay", json={"task_id": t})
        if resp.status_code != 202:
            raise SystemExit(f"quarantine replay: {resp.text[:300]}")
        replay = resp.json()["data"]["workflow_id"]
        d.scenarios[replay] = "replay"
        await client.get_workflow_handle(replay).result()
        # The crawler: a crawl, then note details.
        await d.control("platform", reset=True, notes_per_keyword=12)
        await d.wait(
            await d.start("crawl", "crawl_notes", {"platform": "sample", "keywords": ["rec"]})
        )
        d.scenarios[lock_workflow_id("crawl_notes:sample")] = "crawl"  # the lock it held
        resp = await http.post(
            f"{stack.api}/notes/details",
            json={"platform": "sample", "note_ids": note_ids("rec", 2)},
        )
        if resp.status_code not in (200, 207):
            raise SystemExit(f"note details: {resp.text[:300]}")
        await scheduled(d, {**quotes, "symbols": ["AAPL"]})
        return d.scenarios


async def scheduled(d: Driver, params: dict[str, Any]) -> None:
    """A schedule's start, triggered: its starter workflow starts a run through the API's
    start path and waits for the run's end (``ScheduledStart-scheduled-completed``)."""
    api, http = d.stack.api, d.http
    body = {"name": "rec", "task": "pull_stock_quotes", "params": params, "every": "1d"}
    resp = await http.post(f"{api}/schedules", json=body)
    if resp.status_code != 201:
        raise SystemExit(f"schedule: {resp.text[:300]}")
    resp = await http.post(f"{api}/schedules/rec/trigger", json={})
    if resp.status_code != 202:
        raise SystemExit(f"schedule trigger: {resp.text[:300]}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        recent = (await http.get(f"{api}/schedules/rec")).json()["data"]["recent"]
        if any(r.get("outcome") == "start failed" for r in recent):
            raise SystemExit(f"schedule: the start failed: {recent}")
        done = [r for r in recent if r.get("outcome") == "started"]
        if done:
            d.scenarios[done[0]["starter_workflow_id"]] = "scheduled"
            d.scenarios[done[0]["workflow_id"]] = "scheduled"
            break
        await asyncio.sleep(0.2)
    else:
        raise SystemExit(f"schedule: the triggered start did not end within 120 s: {recent}")
    await http.request("DELETE", f"{api}/schedules/rec", json={})


async def finish_housekeeping(stack: BenchStack, client: Any) -> dict[str, str]:
    """The housekeeping loops the worker started (one per job, workflows/housekeeping.py)
    closed in the shapes a cluster sees. Each is re-configured (as a worker restarted with
    new settings does) to tick every second and to continue as new after 2.5 s: its run
    re-plans its wait (a timer cancelled), makes a pass and continues as new; the next
    run ticks three times on its timer and continues as new; the third is stopped after
    its first pass (every_s None, as alerts.enabled false does). Per job: two
    ``loop-continued_as_new`` histories and one ``loop-completed``."""
    from dataclasses import replace

    from temporalio.service import RPCError

    from artemis.config import load_settings
    from workers.main import housekeeping_jobs

    settings = load_settings(stack.tmp / "config.yaml")
    queue = settings.temporal.task_queue
    scenarios: dict[str, str] = {}
    for job in housekeeping_jobs(settings):
        wf_id = job.workflow_id(queue)
        scenarios[wf_id] = "loop"
        handle = client.get_workflow_handle(wf_id)
        deadline = time.monotonic() + 60
        while True:  # started by the worker at its start-up
            try:
                first = (await handle.describe()).run_id
                break
            except RPCError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{wf_id}: no housekeeping loop") from None
                await asyncio.sleep(0.2)
        await handle.signal("configure", replace(job.inp, every_s=1.0, run_for_s=2.5))
        runs = [first]
        while len(runs) < 3:  # the first run and the next have continued as new
            if time.monotonic() > deadline:
                raise SystemExit(f"{wf_id}: did not continue as new twice")
            await asyncio.sleep(0.1)
            current = (await handle.describe()).run_id
            if current != runs[-1]:
                runs.append(current)
        while not any(  # the third run's first pass done, its second a second away
            e.HasField("activity_task_completed_event_attributes")
            for e in (await handle.fetch_history()).events
        ):
            if time.monotonic() > deadline:
                raise SystemExit(f"{wf_id}: no pass in its third run")
            await asyncio.sleep(0.1)
        await handle.signal("configure", replace(job.inp, every_s=None))
        await asyncio.wait_for(handle.result(), 60)
    return scenarios


async def record(stack: BenchStack, out: Path, housekeeping_only: bool = False) -> dict[str, Any]:
    from temporalio.client import Client

    cfg = yaml.safe_load((stack.tmp / "config.yaml").read_text())
    client = await Client.connect(cfg["temporal"]["address"])
    scenarios = {} if housekeeping_only else await drive(stack, client)
    scenarios.update(await finish_housekeeping(stack, client))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = [w async for w in client.list_workflows("ExecutionStatus = 'Running'")]
        if not running:
            break
        await asyncio.sleep(0.5)
    out.mkdir(parents=True, exist_ok=True)
    by_type: Counter[str] = Counter()
    names: Counter[str] = Counter()
    async for wf in client.list_workflows():
        if wf.status is None or wf.status.name == "RUNNING":
            continue
        root = wf.id.split(".")[0] if wf.workflow_type == "TaskRunWorkflow" else wf.id
        scenario = scenarios.get(wf.id) or scenarios.get(root)
        if scenario is None:
            scenario = "child" if wf.parent_id else wf.workflow_type.lower()
            scenario = next((s for w, s in scenarios.items() if w in wf.id), scenario)
        base = f"{wf.workflow_type}-{scenario}-{wf.status.name.lower()}"
        names[base] += 1
        name = f"{base}-{names[base]}" if names[base] > 1 else base
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        (out / f"{name}.json").write_text(history.to_json())
        by_type[wf.workflow_type] += 1
    return {"histories": sum(by_type.values()), "by_type": dict(by_type)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", required=True, help="the release these histories come from")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "histories")
    ap.add_argument(
        "--housekeeping-only",
        action="store_true",
        help="record the housekeeping loops alone (no task runs)",
    )
    args = ap.parse_args()
    config = {
        # small batches and generations, so that runs (and a backfill's fan-out) continue
        # as new
        "runs": {
            "pages_per_fetch": 2,
            "max_batches_per_run": 2,
            "retry_max_interval_s": 1,
            "children_per_run": 1,
        },
        "output_defaults": {
            "pull_stock_quotes": {"sinks": ["http"], "http_endpoint": "{samples}/sink/quotes"},
            "literature_harvest": {"sinks": ["http"], "http_endpoint": "{samples}/sink/lit"},
            "crawl_notes": {"sinks": ["http"], "http_endpoint": "{samples}/sink/notes"},
            "source_harvest": {"sinks": ["http"], "http_endpoint": "{samples}/sink/catalog"},
        },
        "security": {"allowed_hosts": ["127.0.0.1"]},
        "crawler": {"platforms": {"sample": {"base_url": "{samples}/platform"}}},
    }
    with bench_stack(config, before_start=prepare) as stack:
        result = asyncio.run(record(stack, args.out / args.label, args.housekeeping_only))
    print(json.dumps({"label": args.label, **result}))


if __name__ == "__main__":
    main()
