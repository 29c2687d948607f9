"""Whose run it is, where a credential may go, and where an address is checked — each on
real processes with the input that shows it:

- the operator's sink header stays with the operator's endpoint; a request naming a
  second listener (127.0.0.2) gets none of it;
- a name with no address when the run starts is refused; a name that resolves to a
  public address for the API and to loopback when the worker connects is never fetched;
- a request token equal to a task code is redacted in its own run's lines only;
- client tokens see and control only their own runs, task ids are per owner, an
  operator sees and controls all, the codec route is for admins;
- execution locks are per owner, a retried run stays its owner's;
- a run's secrets stay while its workflow is open, though its task record expired or its
  start's answer was lost, and a clean-up pass gets past a store that fails.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from temporalio.client import Client, Interceptor, OutboundInterceptor
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

from activities.housekeeping import HousekeepingActivities
from artemis.db import RunSecret, get_engine
from artemis.run_models import CleanupInput
from artemis.taskstore import StorageUnavailable
from artemis.taskstore.sql import AsyncTask, SqlTaskStorage
from artemis.vault import CALLBACK_TOKEN, START_SEP, RunSecrets
from artemis_samples.app import create_app as create_samples_app
from artemis_samples.server import ThreadedServer
from starter.run_reads import KEY_OWNER
from tests.conftest import new_task_id, serve_api
from tests.dnsstub import DnsStub
from tests.helpers import eventually, secret_keys

OPERATOR_TOKEN = "Bearer operator-sink-secret-0123456789"


@pytest.fixture
def second_listener():
    """A recording sink on 127.0.0.2: another host, as far as URLs go."""
    server = ThreadedServer(create_samples_app(), host="127.0.0.2").start()
    yield server
    server.stop()


@pytest.fixture
def dns_stub():
    stub = DnsStub().start()
    yield stub
    stub.stop()


class Counting(BaseHTTPRequestHandler):
    """A listener that only counts what reaches it (it answers every GET with a page that
    would end a quotes run, so a request that got through would show as a completed run)."""

    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        Counting.hits.append(self.path)
        body = json.dumps({"symbol": "X", "items": [], "page": 1, "next_page": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def loopback_listener():
    Counting.hits = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


async def test_the_operators_sink_header_never_follows_an_endpoint_a_request_names(
    make_stack, samples, second_listener
):
    stack = await make_stack(
        output_defaults={
            "pull_stock_quotes": {
                "sinks": ["http"],
                "http_endpoint": f"{samples.url}/sink/operator",
                "http_headers": {"Authorization": OPERATOR_TOKEN},
            }
        },
        security={"allowed_hosts": ["127.0.0.1", "127.0.0.2"]},
    )
    mine, theirs = new_task_id(), new_task_id()
    params = {"symbols": ["OPR"], "page_size": 5}
    own = await stack.run({"meta": {"task_id": mine}, "params": params})
    assert own.json()["data"]["status"] == "completed", own.text
    operator_batches = await stack.sink_batches(f"pull_stock_quotes/{mine}:")
    assert operator_batches and {b["authorization"] for b in operator_batches} == {OPERATOR_TOKEN}
    elsewhere = f"{second_listener.url}/sink/elsewhere"
    other = await stack.run(
        {"meta": {"task_id": theirs}, "params": params, "output": {"http_endpoint": elsewhere}}
    )
    assert other.json()["data"]["status"] == "completed", other.text
    async with httpx.AsyncClient(base_url=second_listener.url) as http:
        got = (await http.get("/_sink/batches")).json()
    got = [
        b for b in got if (b["idempotency_key"] or "").startswith(f"pull_stock_quotes/{theirs}:")
    ]
    assert len(got) == len(operator_batches) >= 4  # every page went there ...
    assert {b["authorization"] for b in got} == {None}  # ... none with the operator's token


async def test_a_name_with_no_address_at_start_is_refused(make_stack, dns_stub):
    stack = await make_stack(security={"allowed_hosts": ["*"], "dns_server": dns_stub.address})
    resp = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"base_url": "http://late.test:8300"}},
        mode="async",
    )
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["code"] == "INVALID_INPUT"
    assert "params.base_url" in err["message"] and "does not resolve" in err["message"]


async def test_a_name_that_turns_to_loopback_after_the_start_is_never_fetched(
    make_stack, dns_stub, loopback_listener
):
    port = loopback_listener.server_address[1]
    # public for the API's check, loopback for every lookup after it (the worker's)
    dns_stub.set("rebind.test", ["93.184.216.34"], ["127.0.0.1"])
    stack = await make_stack(security={"allowed_hosts": ["*"], "dns_server": dns_stub.address})
    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "params": {"base_url": f"http://rebind.test:{port}", "symbols": ["RB"]},
        },
        mode="async",
    )
    assert resp.status_code == 202, resp.text
    done = await stack.wait_status(task_id, timeout=90)
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "INVALID_INPUT", done["error"]
    assert "rebind.test" in done["error"]["message"]
    assert "internal addresses only (127.0.0.1)" in done["error"]["message"]
    assert Counting.hits == []  # not one request reached the loopback listener
    assert ("rebind.test", "A") in dns_stub.queries


async def test_a_request_token_equal_to_a_task_code_is_redacted_in_its_own_run_only(stack, app_log):
    token = "pull_stock_quotes"  # a word every line of a quotes run carries
    first, run_id, body = stack.callback_run(["RDA"], callback={"auth_token": token})
    resp = await stack.run(body)
    assert resp.json()["data"]["status"] == "completed", resp.text
    assert {c["token"] for c in await stack.cronjob_calls(run_id)} == {token}
    second = new_task_id()
    resp = await stack.run({"meta": {"task_id": second}, "params": {"symbols": ["RDB"]}})
    assert resp.json()["data"]["status"] == "completed", resp.text
    lines = [json.loads(x) for x in app_log.read_text().splitlines() if second in x]
    worker_lines = [x for x in lines if x.get("task_id") == second]
    assert len(worker_lines) >= 5, lines
    assert {x["task_code"] for x in worker_lines} == {"pull_stock_quotes"}
    short = await stack.run(
        {
            "meta": {
                "task_id": new_task_id(),
                "run_id": "r-short",
                "callback": {"base_url": f"{stack.samples_url}/cronjob/runs", "auth_token": "abc1"},
            },
            "params": {"symbols": ["RDC"]},
        }
    )
    assert short.status_code == 422 and "meta.callback.auth_token" in short.text


TOKENS = {
    "a": "client-a-token-0123456789",
    "b": "client-b-token-0123456789",
    "ops": "operator-token-0123456789",
}


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


ROLE_TOKENS = [
    {"name": "a", "token": TOKENS["a"], "role": "client"},
    {"name": "b", "token": TOKENS["b"], "role": "client"},
    {"name": "ops", "token": TOKENS["ops"], "role": "operator"},
]


async def test_clients_own_their_runs_and_operators_see_all(make_stack):
    stack = await make_stack(server={"api_tokens": ROLE_TOKENS})
    await stack.fault("latency", latency_ms=100)
    try:
        shared = new_task_id()
        params = {"symbols": ["OWN"], "page_size": 2}
        a = await stack.run(
            {"meta": {"task_id": shared}, "params": params}, mode="async", headers=_auth("a")
        )
        assert a.status_code == 202, a.text
        a_id = a.json()["data"]["task_id"]
        assert a_id == f"a~{shared}"
        # held by the operator while the clients try their hands on it
        paused = await stack.http.post(
            f"/tasks/{a_id}/pause", json={"reason": "ops"}, headers=_auth("ops")
        )
        assert paused.status_code == 202, paused.text
        # B's start under the same id is B's own run; A's is untouched
        b = await stack.run(
            {"meta": {"task_id": shared}, "params": params}, mode="async", headers=_auth("b")
        )
        assert b.status_code == 202, b.text
        b_id = b.json()["data"]["task_id"]
        assert b_id == f"b~{shared}"
        assert b.json()["data"]["workflow_id"] != a.json()["data"]["workflow_id"]
        held = await stack.http.post(
            f"/tasks/{b_id}/pause", json={"reason": "ops"}, headers=_auth("ops")
        )
        assert held.status_code == 202, held.text
        # B cannot see or touch A's run
        for path in (f"/tasks/{a_id}", f"/tasks/{a_id}/events?follow=false"):
            assert (await stack.http.get(path, headers=_auth("b"))).status_code == 404, path
        for action in ("cancel", "pause", "resume", "retry"):
            resp = await stack.http.post(f"/tasks/{a_id}/{action}", json={}, headers=_auth("b"))
            assert resp.status_code == 404, (action, resp.text)
        resp = await stack.http.post(
            f"/tasks/{a_id}/rate-limit", json={"qps": 5}, headers=_auth("b")
        )
        assert resp.status_code == 404
        listed = (await stack.http.get("/tasks", headers=_auth("b"))).json()["data"]["items"]
        assert a_id not in {x["task_id"] for x in listed}
        # A reads its own run by the bare id it gave, and by the full one
        for path in (f"/tasks/{shared}", f"/tasks/{a_id}"):
            mine = await stack.http.get(path, headers=_auth("a"))
            assert mine.status_code == 200 and mine.json()["data"]["task_id"] == a_id
            assert mine.json()["data"]["owner"] == "a"
        # the operator sees both and controls both
        for tid in (a_id, b_id):
            seen = await stack.http.get(f"/tasks/{tid}", headers=_auth("ops"))
            assert seen.status_code == 200, seen.text
        everyone = (await stack.http.get("/tasks?limit=500", headers=_auth("ops"))).json()
        assert {a_id, b_id} <= {x["task_id"] for x in everyone["data"]["items"]}
        cancelled = await stack.http.post(f"/tasks/{b_id}/cancel", json={}, headers=_auth("ops"))
        assert cancelled.status_code == 202, cancelled.text
        resumed = await stack.http.post(f"/tasks/{a_id}/resume", json={}, headers=_auth("ops"))
        assert resumed.status_code == 202, resumed.text
    finally:
        await stack.fault("latency", latency_ms=0)
    done_a = await stack.wait_status(a_id, timeout=90, headers=_auth("ops"))
    assert done_a["status"] == "completed"
    done_b = await stack.wait_status(b_id, timeout=90, headers=_auth("ops"))
    assert done_b["status"] == "cancelled"

    # the owner is a search attribute: the Temporal UI filters by it
    async def listed_by_owner() -> list[str]:
        query = f"ArtemisOwner = 'a' AND ArtemisTaskId = '{a_id}'"
        return [w.id async for w in stack.client.list_workflows(query)]

    found = await eventually(listed_by_owner, "the run listed by its owner", timeout=30)
    assert found == [a.json()["data"]["workflow_id"]]


async def test_the_codec_route_is_for_admins(make_stack):
    stack = await make_stack(
        worker=False,
        server={
            "api_tokens": [
                *ROLE_TOKENS,
                {"name": "root", "token": "admin-token-0123456789", "role": "admin"},
            ]
        },
        temporal={"payload_encryption": True},
    )
    for who in ("a", "ops"):
        codec = await stack.http.post("/codec/decode", json={"payloads": []}, headers=_auth(who))
        assert codec.status_code == 403, codec.text
        assert codec.json()["error"]["code"] == "FORBIDDEN"
    admin = await stack.http.post(
        "/codec/decode",
        json={"payloads": []},
        headers={"Authorization": "Bearer admin-token-0123456789"},
    )
    assert admin.status_code == 200, admin.text


async def test_a_run_keeps_its_secrets_only_while_it_runs(stack):
    """Secrets go with the run's end; an attached repeat's secrets are dropped at once."""
    await stack.fault("latency", latency_ms=100)
    try:
        task_id, run_id, body = stack.callback_run(
            ["SEC"], callback={"auth_token": "first-callback-token-0123"}, page_size=2
        )
        assert (await stack.run(body, mode="async")).status_code == 202
        assert len(secret_keys(stack, task_id)) == 1
        body["meta"]["callback"]["auth_token"] = "second-callback-token-0123"
        assert (await stack.run(body, mode="async")).status_code == 202  # attached
        assert len(secret_keys(stack, task_id)) == 1  # the repeat's are gone
    finally:
        await stack.fault("latency", latency_ms=0)
    assert (await stack.wait_status(task_id, timeout=90))["status"] == "completed"
    assert {c["token"] for c in await stack.finals(run_id)} == {"first-callback-token-0123"}

    async def gone() -> bool:
        return secret_keys(stack, task_id) == []

    await eventually(gone, "the run's secrets to go with its end", timeout=30)


def _crawl(workflow_name: str) -> dict[str, Any]:
    return {
        "meta": {"task_id": new_task_id()},
        "params": {"platform": "sample", "keywords": ["k"], "workflow_name": workflow_name},
    }


async def test_execution_locks_are_per_owner(make_stack):
    stack = await make_stack(worker=False, server={"api_tokens": ROLE_TOKENS})
    name = f"w-{new_task_id()}"
    opened: list[str] = []
    try:
        started = {}
        for who in ("a", "b"):
            resp = await stack.run(_crawl(name), "async", "crawl_notes", _auth(who))
            assert resp.status_code == 202, (who, resp.text)  # B is not locked out by A
            data = resp.json()["data"]
            assert data["workflow_id"] == f"artemis/crawl_notes/{data['task_id']}"
            opened += [data["workflow_id"], f"artemis/lock/{who}~{name}"]
            started[who] = data["task_id"]
        # a second start of one owner's lock is refused naming that owner's own holder
        for who, other in (("a", "b"), ("b", "a")):
            resp = await stack.run(_crawl(name), "async", "crawl_notes", _auth(who))
            assert resp.status_code == 409, resp.text
            err = resp.json()["error"]
            assert err["code"] == "EXECUTION_LOCKED" and started[who] in err["message"]
            assert started[other] not in resp.text
    finally:
        for wf in opened:
            await stack.client.get_workflow_handle(wf).terminate("test")


async def test_a_retried_run_stays_its_owners(make_stack):
    stack = await make_stack(
        server={"api_tokens": ROLE_TOKENS},
        runs={"retry_max_interval_s": 1.0, "outage_tolerance_s": 1},
    )
    await stack.fault("sink", status=503, for_s=3600)
    try:
        resp = await stack.run(
            {"meta": {"task_id": new_task_id()}, "params": {"symbols": ["RTO"]}},
            headers=_auth("a"),
        )
    finally:
        await stack.fault("sink")
    data = resp.json()["data"]
    assert data["status"] == "failed" and data["error"]["code"] == "SINK_UNAVAILABLE", data
    task_id = data["task_id"]
    retried = await stack.http.post(f"/tasks/{task_id}/retry", json={}, headers=_auth("a"))
    assert retried.status_code == 202, retried.text
    handle = stack.client.get_workflow_handle(retried.json()["data"]["workflow_id"])
    desc = await handle.describe()
    assert desc.run_id == retried.json()["data"]["run_id"]  # the retry's own execution
    assert desc.typed_search_attributes.get(KEY_OWNER) == "a"
    done = await stack.wait_status(task_id, timeout=90, headers=_auth("a"))
    assert done["status"] == "completed", done


async def test_the_clean_up_keeps_the_secrets_of_open_runs_and_gets_past_a_failing_store(
    make_stack, monkeypatch
):
    """A run quiet for longer than the task store's ttl has no record; its workflow is
    still open, so its secrets stay. A closed run's and a start's that never became a run
    go. A key whose run the store cannot tell is kept, and the pass goes on."""
    stack = await make_stack(worker=False)  # nobody picks the runs up: they stay open
    ids: dict[str, str] = {}
    workflows: dict[str, str] = {}
    for name in ("open", "closed", "flaky"):
        ids[name], _, body = stack.callback_run(
            [name.upper()], callback={"auth_token": f"{name}-run-token-0123456789"}
        )
        resp = await stack.run(body, mode="async")
        assert resp.status_code == 202, resp.text
        workflows[name] = resp.json()["data"]["workflow_id"]
    await stack.client.get_workflow_handle(workflows["closed"]).terminate("test")
    never = new_task_id()  # a start that never became a run
    RunSecrets(stack.settings.database.url, stack.settings.vault.master_key_file).put_many(
        f"pull_stock_quotes/{never}{START_SEP}0123456789abcdef",
        {CALLBACK_TOKEN: "never-run-token-0123456789"},
    )
    store = SqlTaskStorage(stack.settings.database.url)

    def recorded() -> bool:
        return all(store.load(task_id) is not None for task_id in ids.values())

    await eventually(recorded, "the pending records", timeout=10)
    # a day later: their records have expired, their secrets are past the orphan age
    now = datetime.now(UTC)
    mine = [*ids.values(), never]
    engine = get_engine(stack.settings.database.url)
    with engine.begin() as conn:
        conn.execute(
            update(AsyncTask.__table__)  # type: ignore[attr-defined]
            .where(AsyncTask.__table__.c.task_id.in_(mine))  # type: ignore[attr-defined]
            .values(expires_at=now - timedelta(seconds=1))
        )
        for task_id in mine:
            conn.execute(
                update(RunSecret.__table__)  # type: ignore[attr-defined]
                .where(RunSecret.__table__.c.run_key.like(f"pull_stock_quotes/{task_id}@%"))  # type: ignore[attr-defined]
                .values(created_at=now - timedelta(hours=2))
            )
    assert all(store.load(task_id) is None for task_id in mine)
    housekeeping = HousekeepingActivities(stack.settings)
    real_load = housekeeping.task_store.load

    def failing_load(task_id: str) -> Any:
        if task_id == ids["flaky"]:
            raise StorageUnavailable("the database is unreachable")
        return real_load(task_id)

    monkeypatch.setattr(housekeeping.task_store, "load", failing_load)
    try:
        result = await ActivityEnvironment(client=stack.client).run(
            housekeeping.cleanup_old_tasks, CleanupInput(hours=24)
        )
        assert result is not None  # the pass ended, past the store's failure
        assert len(secret_keys(stack, ids["open"])) == 1  # its workflow is open
        assert len(secret_keys(stack, ids["flaky"])) == 1  # not known: kept for next time
        assert secret_keys(stack, ids["closed"]) == []
        assert secret_keys(stack, never) == []
    finally:
        for name in ("open", "flaky"):
            await stack.client.get_workflow_handle(workflows[name]).terminate("test")


class _LoseStartAnswer(Interceptor):
    """Temporal starts the workflow; the answer never reaches the API (a timeout)."""

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        class Lose(OutboundInterceptor):
            async def start_workflow(self, input: Any) -> Any:
                await super().start_workflow(input)
                raise RPCError("deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b"")

        return Lose(next)


async def test_a_start_whose_answer_was_lost_keeps_its_secrets_for_its_run(make_stack):
    stack = await make_stack()
    lossy = Client(**{**stack.client.config(), "interceptors": [_LoseStartAnswer()]})
    server, serving, url = await serve_api(stack.settings, lossy)
    try:
        task_id, run_id, body = stack.callback_run(
            ["LST"], callback={"auth_token": "lost-answer-token-0123456789"}
        )
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            resp = await http.post(
                "/tasks/pull_stock_quotes/run", params={"mode": "async"}, json=body
            )
        assert resp.status_code >= 500, resp.text  # the API cannot say it started
    finally:
        server.should_exit = True
        await serving
    # the run was made all the same, and it calls back with the token it was sent with
    done = await stack.wait_status(task_id, timeout=90)
    assert done["status"] == "completed", done
    assert {c["token"] for c in await stack.finals(run_id)} == {"lost-answer-token-0123456789"}
