"""Schedules (docs/schedules.md) on the Temporal dev server, through the real API with
role tokens, the worker and a GitHub-issues-shaped source on loopback: a schedule every
minute starts update runs that complete, recorded in task storage with their owner and
moving the shared pointer; trigger, pause and delete; a start whose params are no
longer valid records its reason and the schedule goes on; `artemis schedules show`
prints it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from artemis.schedules import schedule_id
from tests.conftest import ROOT
from tests.e2e.test_literature import import_doc
from tests.e2e.test_source_harvest import (  # noqa: F401  (api: a fixture)
    DATE_POINTER,
    Api,
    api,
    issue,
    issues_doc,
    watermark,
)
from tests.helpers import ending, eventually
from workflows.scheduled_start import ScheduledStartWorkflow

TOKENS = {"cli": "client-token-sched-0123", "ops": "operator-token-sched-0123"}
CLIENT = {"Authorization": f"Bearer {TOKENS['cli']}"}
OPERATOR = {"Authorization": f"Bearer {TOKENS['ops']}"}
API_TOKENS = [
    {"name": "cli", "token": TOKENS["cli"], "role": "client"},
    {"name": "ops", "token": TOKENS["ops"], "role": "operator"},
]


@pytest.fixture
def source(api) -> Api:  # noqa: F811
    return Api(*api)


async def view(stack, name: str) -> dict[str, Any]:
    resp = await stack.http.get(f"/schedules/{name}", headers=OPERATOR)
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


async def starts(stack, name: str, n: int, outcome: str, timeout: float = 120) -> list[dict]:
    """The schedule's recent starts once ``n`` of them have ``outcome`` (and those that
    started a run, a run that ended)."""

    async def check() -> list[dict] | None:
        recent = (await view(stack, name))["recent"]
        done = [r for r in recent if r.get("outcome") == outcome]
        if outcome == "started":
            done = [r for r in done if r.get("status") not in (None, "pending", "running")]
        return recent if len(done) >= n else None

    return await eventually(check, f"{n} start(s) of {name} to be {outcome!r}", timeout=timeout)


def minute_offset(lead_s: int = 8) -> int:
    """The offset that puts an every-minute schedule's next start ``lead_s`` from now."""
    return (int(time.time()) + lead_s) % 60


async def test_a_schedule_every_minute_starts_update_runs_owned_by_its_maker(make_stack, source):
    stack = await make_stack(server={"api_tokens": API_TOKENS})
    code = f"gh-sched-{source.ns}"
    import_doc(stack, issues_doc(code, source.base, DATE_POINTER))
    source.issues.extend([issue(1, 1, "2025-03-01T10:00:00Z"), issue(2, 2, "2025-03-01T12:00:00Z")])
    name = f"hourly-{uuid.uuid4().hex[:8]}"
    body = {
        "name": name,
        "task": "source_harvest",
        "params": {"provenance": code, "task_type": "update", "start": "2025-03-01"},
        "every": "1m",
        "offset": minute_offset(),
        # The CronJob is called back, its run id the run's task id; the token is the
        # configured default (the schedule holds none).
        "callback": {"base_url": f"{stack.samples_url}/cronjob/runs"},
    }
    # A client may not make one: its runs would move the shared pointer.
    resp = await stack.http.post("/schedules", json=body, headers=CLIENT)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "FORBIDDEN", resp.text
    # Params a start would refuse are refused now.
    bad = {**body, "params": {**body["params"], "end": "2999-12-31"}}
    resp = await stack.http.post("/schedules", json=bad, headers=OPERATOR)
    assert resp.status_code == 422 and "params.end" in resp.text, resp.text

    resp = await stack.http.post("/schedules", json=body, headers=OPERATOR)
    assert resp.status_code == 201, resp.text
    made = resp.json()["data"]
    assert made["when"].startswith("every 1m") and made["owner"] == "ops", made
    assert made["made_by"] == "api" and not made["paused"]
    again = await stack.http.post("/schedules", json=body, headers=OPERATOR)
    assert again.status_code == 409, again.text
    # Temporal holds it, and lists it.
    sid = schedule_id(stack.settings.temporal.task_queue, name)
    desc = await stack.client.get_schedule_handle(sid).describe()
    assert desc.schedule.spec.intervals[0].every.total_seconds() == 60

    async def listed() -> bool:
        return sid in [s.id async for s in await stack.client.list_schedules()]

    await eventually(listed, "Temporal to list the schedule")

    # The first start, on the minute: an update run that completes, the operator's.
    recent = await starts(stack, name, 1, "started")
    first = recent[0]
    assert first["status"] == "completed" and first["task_id"].startswith("ops~"), first
    # Its task id names the instant Temporal scheduled it for: a retried start attaches.
    at = datetime.fromisoformat(first["scheduled_at"])
    assert first["task_id"] == f"ops~{name}-{at:%Y%m%dT%H%M%S}Z", first
    listed_runs = await stack.http.get(
        "/tasks", params={"code": "source_harvest"}, headers=OPERATOR
    )
    assert first["task_id"] in [t["task_id"] for t in listed_runs.json()["data"]["items"]]
    task = (await stack.http.get(f"/tasks/{first['task_id']}", headers=OPERATOR)).json()["data"]
    assert task["status"] == "completed" and task["stats"]["records_fetched"] == 2, task
    bare = first["task_id"].split("~", 1)[1]
    finals = await eventually(lambda: stack.finals(bare), "the run's finalize callback")
    assert finals[0]["body"]["result"] == "success", finals
    # A token for the callback is the workers' to name, never a schedule's.
    leak = {**body, "name": f"x{name}", "callback": {"token_env": "CRONJOB_TOKEN"}}
    resp = await stack.http.post("/schedules", json=leak, headers=OPERATOR)
    assert resp.status_code == 422 and "callback.token_env" in resp.text, resp.text
    # Its role is its maker's: the shared pointer moved.
    assert watermark(stack, code)[0] == datetime(2025, 3, 1, 12, tzinfo=UTC)

    # Trigger: one more at once (in another second than the first: the instant names it).
    await eventually(lambda: time.time() > at.timestamp() + 1.2, "the first start's second")
    resp = await stack.http.post(f"/schedules/{name}/trigger", headers=OPERATOR)
    assert resp.status_code == 202, resp.text
    recent = await starts(stack, name, 2, "started", timeout=60)
    assert len({r["task_id"] for r in recent if r.get("task_id")}) == 2

    # The starter workflow replays on this code.
    handle = stack.client.get_workflow_handle(recent[0]["starter_workflow_id"])
    history = await handle.fetch_history()
    assert ending(history) == "WORKFLOW_EXECUTION_COMPLETED"
    await Replayer(workflows=[ScheduledStartWorkflow]).replay_workflow(history)

    # Delete: gone from Temporal and from the API.
    resp = await stack.http.delete(f"/schedules/{name}", headers=OPERATOR)
    assert resp.status_code == 200, resp.text
    with pytest.raises(RPCError) as e:
        await stack.client.get_schedule_handle(sid).describe()
    assert e.value.status == RPCStatusCode.NOT_FOUND
    gone = await stack.http.get(f"/schedules/{name}", headers=OPERATOR)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "NOT_FOUND"


async def test_a_paused_schedule_starts_nothing_until_unpaused(make_stack, source):
    stack = await make_stack(server={"api_tokens": API_TOKENS})
    code = f"gh-pause-{source.ns}"
    import_doc(stack, issues_doc(code, source.base, DATE_POINTER))
    source.issues.append(issue(1, 1, "2025-03-01T10:00:00Z"))
    name = f"often-{uuid.uuid4().hex[:8]}"
    body = {
        "name": name,
        "task": "source_harvest",
        "params": {"provenance": code, "task_type": "update", "start": "2025-03-01"},
        "every": "3s",
    }
    assert (await stack.http.post("/schedules", json=body, headers=OPERATOR)).status_code == 201
    await starts(stack, name, 1, "started", timeout=60)
    resp = await stack.http.post(
        f"/schedules/{name}/pause", json={"note": "maintenance"}, headers=OPERATOR
    )
    assert resp.status_code == 200 and resp.json()["data"]["paused"], resp.text
    assert resp.json()["data"]["note"] == "maintenance"
    paused_at = (await view(stack, name))["starts"]
    # Four periods go by (on the server's clock): no start.
    until = time.monotonic() + 12
    await eventually(lambda: time.monotonic() > until, "four periods to pass", timeout=30)
    assert (await view(stack, name))["starts"] == paused_at
    resp = await stack.http.post(f"/schedules/{name}/unpause", headers=OPERATOR)
    assert resp.status_code == 200 and not resp.json()["data"]["paused"]

    async def started_again() -> bool:
        return (await view(stack, name))["starts"] > paused_at

    await eventually(started_again, "a start after unpausing", timeout=60)
    await stack.http.delete(f"/schedules/{name}", headers=OPERATOR)


def schedules_cli(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "starter.cli", "schedules", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "ARTEMIS_API": stack.api_url,
            "ARTEMIS_API_TOKEN": TOKENS["ops"],
            "COLUMNS": "200",
        },
        cwd=ROOT,
    )


async def test_a_start_whose_provenance_was_retired_says_why_and_the_schedule_goes_on(
    make_stack, source
):
    stack = await make_stack(server={"api_tokens": API_TOKENS})
    code = f"gh-retire-{source.ns}"
    import_doc(stack, issues_doc(code, source.base, DATE_POINTER))
    name = f"nightly-{uuid.uuid4().hex[:8]}"
    made = await asyncio.to_thread(
        schedules_cli,
        stack,
        "create",
        name,
        "--task",
        "source_harvest",
        "-p",
        f"provenance={code}",
        "--at",
        "02:00",
    )
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    # No time zone given: the provenance's (UTC unless its file says another).
    assert created["when"] == "at 02:00 every day" and created["time_zone"] == "UTC"

    from artemis.db import get_engine
    from artemis.registry.models import RegProvenance

    t = RegProvenance.__table__  # type: ignore[attr-defined]
    with get_engine(stack.settings.database.url).begin() as conn:
        conn.execute(
            sa.update(t).where(t.c.provenance_code == code).values(lifecycle_status_code="RETIRED")
        )
    for n in (1, 2):
        resp = await stack.http.post(f"/schedules/{name}/trigger", headers=OPERATOR)
        assert resp.status_code == 202, resp.text
        recent = await starts(stack, name, n, "start failed", timeout=60)
    failed = recent[0]
    assert "RETIRED" in failed["reason"] and code in failed["reason"], failed
    # The schedule goes on: not paused, its next start planned.
    now = await view(stack, name)
    assert not now["paused"] and now["next_starts"] and now["starts"] == 2
    shown = await asyncio.to_thread(schedules_cli, stack, "show", name, "-o", "table")
    assert shown.returncode == 0, shown.stderr
    assert "start failed" in shown.stdout and "RETIRED" in shown.stdout, shown.stdout
    listed = await asyncio.to_thread(schedules_cli, stack, "list", "-o", "json")
    assert name in [s["name"] for s in json.loads(listed.stdout)]
    deleted = await asyncio.to_thread(schedules_cli, stack, "delete", name)
    assert deleted.returncode == 0, deleted.stderr


# -- the configuration's schedules ---------------------------------------------------------
def config_schedules(names: list[str]) -> list[dict[str, Any]]:
    """Schedules of the configuration that start nothing while the test runs (made
    paused: they are only made, changed and removed here)."""
    return [
        {
            "name": n,
            "task": "literature_harvest",
            "params": {"provenance": "pubmed", "query": n, "start": "2025-01-01"},
            "at": "02:00",
            "time_zone": "Pacific/Kiritimati",
            "paused": True,
        }
        for n in names
    ]


def reconciled(tmp_path) -> list[dict[str, Any]]:
    """Every ``schedules_reconciled`` line the worker processes logged."""
    log = tmp_path / "worker.log"
    if not log.exists():
        return []
    lines = [json.loads(x) for x in log.read_text().splitlines() if '"schedules_reconciled"' in x]
    return lines


async def test_two_workers_reconcile_the_configurations_schedules_and_leave_others(
    make_stack, tmp_path
):
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleIntervalSpec,
        ScheduleSpec,
        ScheduleState,
    )

    from tests.conftest import start_worker_process
    from tests.e2e.test_worker_crash import worker_config
    from tests.helpers import stop_processes

    stack = await make_stack(worker=False, server={"api_tokens": API_TOKENS})
    queue = stack.settings.temporal.task_queue
    tag = uuid.uuid4().hex[:6]
    names = [f"cfg-{tag}-{i}" for i in range(3)]
    # One made by hand in Temporal (in the same id space, without Artemis' memo), and
    # one made through the API: a reconcile touches neither.
    hand = stack.client.get_schedule_handle(schedule_id(queue, f"hand-{tag}"))
    await stack.client.create_schedule(
        hand.id,
        Schedule(
            action=ScheduleActionStartWorkflow("SomeoneElses", id=f"hand-{tag}", task_queue=queue),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(days=7))]),
            state=ScheduleState(paused=True, note="by hand"),
        ),
    )
    by_api = {
        "name": f"api-{tag}",
        "task": "literature_harvest",
        "params": {"provenance": "pubmed", "query": "api", "start": "2025-01-01"},
        "every": "7d",
        "paused": True,
    }

    workers: list[Any] = []
    try:
        config = worker_config(stack, tmp_path, schedules=config_schedules(names))
        workers = [start_worker_process(config, tmp_path / f"w{i}.out") for i in (1, 2)]
        await eventually(lambda: len(reconciled(tmp_path)) == 2, "both workers to reconcile")
        resp = await stack.http.post("/schedules", json=by_api, headers=OPERATOR)
        assert resp.status_code == 201, resp.text
        # The configuration's are changed in the configuration, not through the API.
        refused = await stack.http.post(f"/schedules/{names[0]}/pause", headers=OPERATOR)
        assert refused.status_code == 409 and "change it there" in refused.text, refused.text
        counts = [(r["created"], r["kept"]) for r in reconciled(tmp_path)]
        # Between them, each schedule made once; the other worker found it made.
        assert sum(c for c, _ in counts) == 3 and sum(k for _, k in counts) == 3, counts
        for n in names:
            desc = await stack.client.get_schedule_handle(schedule_id(queue, n)).describe()
            assert desc.schedule.spec.time_zone_name == "Pacific/Kiritimati"

        async def listed() -> list[str]:
            resp = await stack.http.get("/schedules", headers=OPERATOR)
            got = sorted(s["name"] for s in resp.json()["data"]["items"] if tag in s["name"])
            return got if len(got) == 4 else []

        assert await eventually(listed, "the API to list four schedules") == sorted(
            [*names, f"api-{tag}"]
        )
        stop_processes(*workers)

        # The file drops one and changes another: the next start removes and updates them.
        changed = config_schedules(names[:2])
        changed[1]["at"] = "03:30"
        config = worker_config(stack, tmp_path, schedules=changed)
        workers.append(start_worker_process(config, tmp_path / "w3.out"))
        await eventually(lambda: len(reconciled(tmp_path)) == 3, "the new worker to reconcile")
        last = reconciled(tmp_path)[-1]
        assert (last["deleted"], last["updated"], last["kept"]) == (1, 1, 1), last
    finally:
        stop_processes(*workers)
    with pytest.raises(RPCError) as e:
        await stack.client.get_schedule_handle(schedule_id(queue, names[2])).describe()
    assert e.value.status == RPCStatusCode.NOT_FOUND
    moved = await stack.client.get_schedule_handle(schedule_id(queue, names[1])).describe()
    assert moved.schedule.spec.calendars[0].hour[0].start == 3
    still = await hand.describe()
    assert still.schedule.state.note == "by hand" and still.schedule.state.paused
    assert (await view(stack, f"api-{tag}"))["made_by"] == "api"
    # Neither the API nor the CLI may change the one made by hand.
    resp = await stack.http.post(f"/schedules/hand-{tag}/trigger", headers=OPERATOR)
    assert resp.status_code == 404 and "not made by Artemis" in resp.text, resp.text
    for name in [*names[:2], f"api-{tag}"]:
        await stack.http.delete(f"/schedules/{name}", headers=OPERATOR)
    await hand.delete()
