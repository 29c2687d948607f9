"""What an operator sees when Temporal cannot run Artemis' runs, on real dev servers:

- a namespace without one of the search attributes runs need (``ArtemisOwner``, as after
  an upgrade that did not register it): the worker starts and says so, ``/ready`` is 503
  naming it and the command that registers it, a start is CONFIG_ERROR (never 500
  INTERNAL); registering it heals the API without a restart, and an attribute removed
  after the API found it is named the same way when Temporal refuses the start;
- a run whose workflow task keeps failing (a broken build, tests/builds/task_run_stuck.py):
  ``GET /tasks/{id}`` shows it ``stuck`` with the reason, ``artemis audit`` has a finding
  for it, and the ``run_stuck`` alert fires once and resolves once it is terminated.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from artemis.crawler.alerts import stuck_key
from artemis.run_models import SA_OWNER
from artemis.temporal.client import connect, search_attribute_command
from infra.devserver import (
    TEST_DYNAMIC_CONFIG,
    DevServer,
    dynamic_config_args,
    free_port,
    temporal_binary,
)
from starter.cli.audit import _audit
from tests.builds.task_run_stuck import BUG, OversizedTaskRun, StuckTaskRun
from tests.conftest import new_task_id, serve_api, settings_with
from tests.helpers import eventually
from workers import main as worker_main
from workers.main import running_worker
from workflows.task_run import TaskRunWorkflow

RUN = "/tasks/pull_stock_quotes/run"
OWNER_COMMAND = (
    "temporal operator search-attribute create --namespace default --name ArtemisOwner "
    "--type Keyword"
)


class DevServerWithout(DevServer):
    """A dev server whose namespace lacks one of Artemis' search attributes."""

    def __init__(self, missing: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.missing = missing

    def command(self) -> list[str]:
        cmd = super().command()
        at = cmd.index(f"{self.missing}=Keyword")
        return cmd[: at - 1] + cmd[at + 1 :]


@pytest.fixture
def bare_temporal(tmp_path: Path):
    server = DevServerWithout(
        SA_OWNER,
        port=free_port(),
        ui_port=None,
        db_file=None,
        log_file=tmp_path / "temporal.log",
        extra_args=dynamic_config_args(TEST_DYNAMIC_CONFIG),
    ).start()
    yield server
    server.stop()


def search_attribute(server: DevServer, action: str, name: str) -> None:
    """`temporal operator search-attribute create|remove` against ``server``."""
    args = [temporal_binary(), "operator", "search-attribute", action]
    args += ["--address", server.address, "--namespace", "default", "--name", name]
    args += ["--type", "Keyword"] if action == "create" else ["--yes"]
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def logged(path: Path, event: str, logger: str) -> list[dict[str, Any]]:
    """The log lines of ``event`` by ``logger``."""
    lines = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and entry.get("logger") == logger:
            lines.append(entry)
    return lines


def quotes(task_id: str) -> dict[str, Any]:
    return {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"]}}


def assert_config_error(resp: httpx.Response) -> None:
    """A start refused for the missing attribute: CONFIG_ERROR naming it and its command."""
    assert resp.status_code == 503, resp.text  # unavailable until set up, never 500
    error = resp.json()["error"]
    assert error["code"] == "CONFIG_ERROR", error
    assert "ArtemisOwner (not registered)" in error["message"], error
    assert f"`{OWNER_COMMAND}`" in error["message"], error


async def test_a_missing_search_attribute_is_named_with_its_command_and_heals_once_registered(
    base_settings, bare_temporal, app_log
):
    assert search_attribute_command("default", SA_OWNER) == OWNER_COMMAND
    settings = settings_with(
        base_settings,
        temporal={
            "address": bare_temporal.address,
            "task_queue": f"tq-{uuid.uuid4().hex[:10]}",
            "deployment_name": None,
        },
    )
    client = await connect(settings)
    async with running_worker(settings, client):
        # The worker started all the same, and said what is missing and how to register it.
        (warning,) = logged(app_log, "search_attributes_missing", "artemis.worker")[-1:]
        assert OWNER_COMMAND in warning["error"] and warning["level"] == "warning", warning
        server, task, url = await serve_api(settings, client)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                await _missing_then_registered_then_removed(http, bare_temporal)
        finally:
            server.should_exit = True
            await task
    # the API said so at its start too
    assert any(
        OWNER_COMMAND in line["error"]
        for line in logged(app_log, "search_attributes_missing", "artemis.api")
    )


async def _missing_then_registered_then_removed(http: httpx.AsyncClient, server: DevServer):
    ready = await http.get("/ready")
    assert ready.status_code == 503, ready.text
    assert ready.json()["error"]["code"] == "NOT_READY"
    assert OWNER_COMMAND in ready.json()["error"]["message"]
    checks = ready.json()["data"]["checks"]
    assert checks["temporal"] == "ok" and checks["database"] == "ok", checks
    assert "ArtemisOwner (not registered)" in checks["search_attributes"], checks
    assert OWNER_COMMAND in checks["search_attributes"], checks
    # Every start is refused up front, sync or async: 503 CONFIG_ERROR, never 500 INTERNAL.
    for mode in ("sync", "async"):
        assert_config_error(await http.post(RUN, params={"mode": mode}, json=quotes(new_task_id())))

    # Registered: /ready and the starts heal, without a restart.
    await asyncio.to_thread(search_attribute, server, "create", SA_OWNER)

    async def ready_again() -> bool:
        resp = await http.get("/ready")
        return resp.status_code == 200 and resp.json()["data"]["checks"] == {
            "temporal": "ok",
            "search_attributes": "ok",
            "database": "ok",
        }

    await eventually(ready_again, "/ready to answer 200 once ArtemisOwner is registered")
    started = await http.post(RUN, params={"mode": "async"}, json=quotes(new_task_id()))
    assert started.status_code == 202 and started.json()["data"]["accepted"], started.text

    # Removed after the API found it: Temporal refuses the start, and the API says why.
    await asyncio.to_thread(search_attribute, server, "remove", SA_OWNER)
    assert_config_error(await http.post(RUN, params={"mode": "async"}, json=quotes(new_task_id())))

    async def not_ready() -> bool:  # /ready answers from a probe at most a second old
        resp = await http.get("/ready")
        return resp.status_code == 503 and OWNER_COMMAND in resp.text

    await eventually(not_ready, "/ready to answer 503 once ArtemisOwner is removed")


async def received(stack, key: str, status: str) -> list[dict[str, Any]]:
    """The alert messages of ``key`` with ``status`` the sample receiver got."""
    messages = (await stack.samples_http.get("/_alerts")).json()
    return [m for m in messages if m["key"] == key and m["status"] == status]


async def broken_build(make_stack, monkeypatch, workflow: type, **overrides: Any):
    """A stack whose worker runs ``workflow`` as the task run, in a deployment of its own
    (this broken build is no other stack's)."""
    broken = tuple(workflow if w is TaskRunWorkflow else w for w in worker_main.WORKFLOWS)
    monkeypatch.setattr(worker_main, "WORKFLOWS", broken)
    return await make_stack(temporal={"deployment_name": None}, **overrides)


async def start_stuck(stack) -> tuple[str, str, dict[str, Any]]:
    """(task id, workflow id, GET /tasks/{id}) of a run started on the broken build, once
    it shows ``stuck`` (its workflow task failed a third time: about ten seconds)."""
    task_id = new_task_id()
    resp = await stack.run(quotes(task_id), mode="async")
    assert resp.status_code == 202, resp.text
    view = await stack.wait_status(task_id, {"stuck"}, timeout=90)
    return task_id, resp.json()["data"]["workflow_id"], view


async def test_a_run_whose_workflow_task_keeps_failing_is_stuck_everywhere_an_operator_looks(
    make_stack, monkeypatch, samples
):
    stack = await broken_build(
        make_stack,
        monkeypatch,
        StuckTaskRun,
        alerts={"interval_s": 0.5, "webhook_url": f"{samples.url}/alerts/webhook"},
    )
    task_id, workflow_id, view = await start_stuck(stack)
    stuck = view["stuck"]
    assert stuck["cause"] == "WORKFLOW_WORKER_UNHANDLED_FAILURE", stuck
    assert stuck["failure_type"] == "RuntimeError", stuck
    assert f"{BUG} (task {task_id})" in stuck["message"], stuck
    assert stuck["attempts"] >= 3 and stuck["since"], stuck
    assert "failed" in stuck["reason"] and BUG in stuck["reason"], stuck
    assert "docs/operations.md#stuck-runs" in stuck["action"], stuck
    assert view["progress"]["stage"] == "stuck" and view["workflow_id"] == workflow_id

    # `artemis audit`: a finding for the run, naming the reason
    report = await asyncio.to_thread(_audit, stack.settings, 1)
    mine = [f for f in report.findings if f.where == f"temporal:{workflow_id}"]
    assert len(mine) == 1 and BUG in mine[0].what and task_id in mine[0].what, mine
    assert not report.passed

    # the alert: fired (the loop evaluates every half second), and only once
    key = stuck_key(workflow_id)
    fired = await eventually(lambda: received(stack, key, "firing"), "run_stuck to fire")
    assert fired[0]["alert"] == "run_stuck" and fired[0]["severity"] == "P1", fired
    assert BUG in fired[0]["message"] and task_id in fired[0]["message"], fired

    # Terminated (what docs/operations.md says for a bug): the run has ended, the alert
    # resolves, and the episode's firing message went out once.
    await stack.client.get_workflow_handle(workflow_id).terminate("stuck: a bug in the build")
    ended = await stack.wait_status(task_id, timeout=30)
    assert ended["status"] == "failed" and "stuck" not in ended, ended
    await eventually(lambda: received(stack, key, "resolved"), "run_stuck to resolve")
    assert len(await received(stack, key, "firing")) == 1
    assert len(await received(stack, key, "resolved")) == 1


async def test_a_run_past_the_payload_limit_is_stuck_naming_the_limit(make_stack, monkeypatch):
    stack = await broken_build(make_stack, monkeypatch, OversizedTaskRun)
    task_id, _, view = await start_stuck(stack)
    stuck = view["stuck"]
    assert stuck["cause"] == "PAYLOADS_TOO_LARGE", stuck
    assert "TMPRL1103" in stuck["message"], stuck
    assert "payload past Temporal's limit" in stuck["action"], stuck
    # a run that cannot go on: terminated, it ends `failed`
    await stack.client.get_workflow_handle(view["workflow_id"]).terminate("payload too large")
    assert (await stack.wait_status(task_id, timeout=30))["status"] == "failed"
