"""Bad records and schema drift end to end: a registry source whose records do not all
fit its model, harvested through the real API, worker and Temporal into a real SQLite
table; the quarantine read and replayed over HTTP.

The source is GitHub's "list repository issues" as its documentation describes it
(``per_page`` up to 100, ``page``, a ``Link`` header on every page of an answer of more
than one, ``rel="next"`` on all but the last), serving each test's records as they are
stored — spoilt ones included, which is the point (a real API that sends a bad record
sends it in its place)."""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from artemis.quarantine import store as quarantine
from artemis_samples.server import ThreadedServer
from tests.conftest import new_task_id, start_worker_process
from tests.e2e.test_events import read_sse
from tests.e2e.test_literature import import_doc
from tests.e2e.test_source_harvest import SHOP_WINDOW, Api, order, orders_doc
from tests.e2e.test_source_harvest import api as shop_api  # noqa: F401  (a fixture)
from tests.e2e.test_worker_crash import retried_after_heartbeat_timeout, worker_config
from tests.helpers import eventually, stop_processes

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
    """Records per namespace, served in the order stored."""

    def __init__(self) -> None:
        self.records: dict[str, list[Any]] = {}
        self.delay_s: dict[str, float] = {}


def issues_app(state: Issues) -> FastAPI:
    app = FastAPI()

    @app.get("/{ns}/repos/{owner}/{repo}/issues")
    async def list_issues(
        ns: str, owner: str, repo: str, request: Request, per_page: int = 30, page: int = 1
    ) -> JSONResponse:
        per_page = min(per_page, 100)
        await asyncio.sleep(state.delay_s.get(ns, 0))
        items = state.records.get(ns, [])
        last = max(1, math.ceil(len(items) / per_page))
        links = {}
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


@pytest.fixture(scope="module")
def issues_server() -> Iterator[tuple[ThreadedServer, Issues]]:
    state = Issues()
    server = ThreadedServer(issues_app(state)).start()
    yield server, state
    server.stop()


class Source:
    def __init__(self, server: ThreadedServer, state: Issues) -> None:
        self.ns = f"n{uuid.uuid4().hex[:10]}"
        self.base = f"{server.url}/{self.ns}"
        self.state = state

    def serve(self, records: list[Any]) -> None:
        self.state.records[self.ns] = records


@pytest.fixture
def gh(issues_server) -> Source:
    return Source(*issues_server)


def issue(ident: int) -> dict[str, Any]:
    """An issue as GitHub's REST API answers it (the fields the model names, and some)."""
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


def doc(code: str, base: str, model: dict[str, Any] | None = None, **record: Any) -> dict:
    """The issues endpoint, a hundred a page, in a record model of its own (``record``:
    more columns of the record_model row)."""
    return {
        "provenance": {"provenance_code": code, "base_url_default": base},
        "record_model": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "key_json": (model or MODEL)["key"],
                "fields_json": (model or MODEL)["fields"],
                **record,
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
                "page_size_value": 100,
                "page_size_param_name": "per_page",
                "records_jsonpath": "$",
            }
        ],
    }


def issues(n: int) -> list[dict[str, Any]]:
    return [issue(i) for i in range(1, n + 1)]


def poison(records: list[dict[str, Any]], wrong: int, no_key: int, not_object: int) -> dict:
    """Spoil records in place, spread over the pages: ``wrong`` get a score written as a
    string, ``no_key`` lose their id, ``not_object`` become a bare string. Returns the
    spoilt positions by kind."""
    rng = random.Random(37)
    picked = rng.sample(range(len(records)), wrong + no_key + not_object)
    kinds = {
        "score": picked[:wrong],
        "id": picked[wrong : wrong + no_key],
        None: picked[wrong + no_key :],
    }
    for i in kinds["score"]:
        records[i]["score"] = str(records[i]["score"])
    for i in kinds["id"]:
        del records[i]["id"]
    for i in kinds[None]:
        records[i] = f"broken record {i}"  # type: ignore[call-overload]
    return kinds


def table_rows(url: str, table: str) -> list[dict[str, Any]]:
    with sa.create_engine(url).connect() as conn:
        t = sa.Table(table, sa.MetaData(), autoload_with=conn)
        return [dict(r._mapping) for r in conn.execute(sa.select(t))]


def ledger_keys(url: str, prefix: str) -> list[str]:
    with sa.create_engine(url).connect() as conn:
        return [
            r[0]
            for r in conn.execute(
                sa.text(
                    "SELECT idempotency_key FROM _artemis_sink_ledger WHERE idempotency_key LIKE :p"
                ),
                {"p": prefix + "%"},
            )
        ]


async def sql_stack(make_stack, tmp_path: Path, **overrides: Any):
    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}}, **overrides
    )
    return stack, lake


def fixed(code: str, base: str, **record: Any) -> dict:
    """The provenance's record model switched now: the old row closed, a new one (with
    ``record``'s columns) in force from now."""
    now = datetime.now(UTC).isoformat()
    d = doc(code, base)
    row = d["record_model"][0]
    old = {**json.loads(json.dumps(row)), "effective_to": now}
    new = {**json.loads(json.dumps(row)), "effective_from": now, **record}
    return d | {"record_model": [old, new]}


async def start(stack, code: str, **params: Any) -> tuple[str, str, dict[str, Any]]:
    """A run of ``code`` with a CronJob callback: (task id, run id, the sync answer)."""
    task_id, run_id = new_task_id(), f"cron-{new_task_id()}"
    cb = {"base_url": f"{stack.samples_url}/cronjob/runs"}
    resp = await stack.run(
        {
            "meta": {"task_id": task_id, "run_id": run_id, "callback": cb},
            "params": {"provenance": code, **params},
        },
        code="source_harvest",
    )
    assert resp.status_code in (200, 502), resp.text
    return task_id, run_id, resp.json()


async def replay(stack, task_id: str, **body: Any) -> dict[str, Any]:
    """POST /quarantine/replay, then the replay workflow's result."""
    resp = await stack.http.post("/quarantine/replay", json={"task_id": task_id, **body})
    assert resp.status_code == 202, resp.text
    accepted = resp.json()["data"]
    handle = stack.client.get_workflow_handle(accepted["workflow_id"])
    return {**accepted, "result": await handle.result()}


async def test_one_percent_bad_records_are_quarantined_counted_everywhere(make_stack, gh, tmp_path):
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    records = issues(10_000)
    poison(records, wrong=40, no_key=30, not_object=30)
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, run_id, answer = await start(stack, code, max_bad_records=150)
    data = answer["data"]
    assert data["status"] == "completed", answer["error"]
    stats = data["stats"]
    assert stats["records_fetched"] == 10_000
    assert stats["records_quarantined"] == 100 and stats["records_emitted"] == 9_900
    assert stats["sinks"] == {"sql": 9_900}
    # delivered + quarantined = fetched (source_harvest keeps one record per record)
    assert stats["records_processed"] + stats["records_quarantined"] == stats["records_fetched"]
    table = code.replace("-", "_")
    assert len(table_rows(lake, table)) == 9_900
    # The quarantine: every bad record once, with the field that broke it.
    rows = quarantine.list_rows(
        stack.settings.database.url, quarantine.RowPage(task_id=task_id, limit=1000)
    )
    assert len(rows) == 100 and {r["status"] for r in rows} == {"quarantined"}
    by_field: dict[Any, int] = {}
    for r in rows:
        by_field[r["field_path"]] = by_field.get(r["field_path"], 0) + 1
    assert by_field == {"score": 40, "id": 30, None: 30}
    assert all(r["error_code"] == "RECORD_MODEL" for r in rows if r["field_path"])
    # the check that set each aside, and where a replay judges it again from
    assert all(r["stage"] == "judge" for r in rows if r["field_path"])
    assert all(r["stage"] == "process" for r in rows if not r["field_path"])
    assert {r["replay_from"] for r in rows} == {"process"}
    assert all(
        r["error_code"] == "SOURCE_CONTRACT" and "JSON object" in r["message"]
        for r in rows
        if r["field_path"] is None
    )
    # GET /tasks/{id}, the finalize body, the SSE stream and the Temporal UI's line.
    shown = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
    assert shown["stats"]["records_quarantined"] == 100
    finals = await stack.finals(run_id)
    assert len(finals) == 1
    assert json.loads(finals[0]["body"]["body"])["records_quarantined"] == 100
    events = await read_sse(stack.api_url, task_id)
    quarantined = [e for e in events if e["event"] == "quarantined"]
    assert sum(e["records"] for e in quarantined) == 100
    assert all(e["sample"]["message"] for e in quarantined)
    handle = stack.client.get_workflow_handle(data["workflow_id"])
    meta = await handle.query("__temporal_workflow_metadata")
    assert "100 quarantined" in meta.current_details
    # Over HTTP: the list, one row with its record.
    listed = (await stack.http.get("/quarantine", params={"task_id": task_id})).json()["data"]
    assert listed["counts"] == {"quarantined": 100} and len(listed["items"]) == 100
    one = (await stack.http.get(f"/quarantine/records/{listed['items'][0]['id']}")).json()["data"]
    assert one["record"] is not None and one["task_id"] == task_id

    # The model fixed (numbers written as strings read laxly): the 40 land, once; the
    # records without an id and the bare strings stay, judged again.
    import_doc(stack, fixed(code, gh.base, coerce_types_enabled=True))
    done = await replay(stack, task_id)
    assert done["rows"] == 100
    assert (done["result"]["landed"], done["result"]["still_bad"]) == (40, 60)
    assert len(table_rows(lake, table)) == 9_940
    counts = quarantine.counts(stack.settings.database.url, task_id)
    assert counts == {"quarantined": 60, "replayed": 40}
    left = quarantine.list_rows(
        stack.settings.database.url, quarantine.RowPage(task_id=task_id, status="quarantined")
    )
    assert {r["replays"] for r in left} == {1}


async def test_the_model_fixed_a_replay_lands_every_record_once(make_stack, gh, tmp_path):
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    records = issues(10_000)
    kinds = poison(records, wrong=100, no_key=0, not_object=0)
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, max_bad_records=100)
    assert answer["data"]["stats"]["records_quarantined"] == 100, answer
    table = code.replace("-", "_")
    import_doc(stack, fixed(code, gh.base, coerce_types_enabled=True))
    done = await replay(stack, task_id)
    assert (done["result"]["landed"], done["result"]["still_bad"]) == (100, 0)
    landed = table_rows(lake, table)
    assert len(landed) == 10_000 and len({r["id"] for r in landed}) == 10_000
    by_id = {r["id"]: r for r in landed}
    assert all(by_id[i + 1]["score"] == (i + 1) / 10 for i in kinds["score"])
    keys = ledger_keys(lake, f"source_harvest/{task_id}:")
    assert len(keys) == len(set(keys)) == 100 + 100  # 100 pages, 100 replayed records
    assert quarantine.counts(stack.settings.database.url, task_id) == {"replayed": 100}
    # Replayed again: nothing is left to land, nothing lands twice.
    again = await replay(stack, task_id)
    assert again["result"]["landed"] == 0 and len(table_rows(lake, table)) == 10_000


async def test_past_max_bad_records_the_run_fails_and_keeps_what_it_set_aside(
    make_stack, gh, tmp_path
):
    stack, _ = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    records = issues(10_000)
    poison(records, wrong=100, no_key=0, not_object=0)
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, max_bad_records=10)
    error = answer["error"]
    assert answer["data"]["status"] == "failed" and error["code"] == "BAD_RECORDS", answer
    assert "more than max_bad_records allows (10" in error["message"]
    held = quarantine.counts(stack.settings.database.url, task_id)["quarantined"]
    assert 10 < held <= 100  # the run stopped once past the bound, and kept them


async def test_on_bad_record_fail_fails_naming_the_record_and_field_and_writes_none_of_its_page(
    make_stack, gh, tmp_path
):
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    records = issues(300)
    records[150]["score"] = "1.5"  # on the second page
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, on_bad_record="fail")
    error = answer["error"]
    assert answer["data"]["status"] == "failed" and error["code"] == "RECORD_MODEL", answer
    assert "record 50" in error["message"] and "'score'" in error["message"]
    ids = {r["id"] for r in table_rows(lake, code.replace("-", "_"))}
    assert not ids & set(range(101, 201))  # nothing of that page
    assert quarantine.counts(stack.settings.database.url, task_id) == {}


def with_priority(n: int, from_id: int) -> list[dict[str, Any]]:
    """Issues whose source starts sending a ``priority`` field at ``from_id``."""
    records = issues(n)
    for r in records[from_id - 1 :]:
        r["priority"] = "high" if r["id"] % 2 else "low"
    return records


def columns(url: str, table: str) -> set[str]:
    with sa.create_engine(url).connect() as conn:
        return {c["name"] for c in sa.inspect(conn).get_columns(table)}


async def test_a_field_the_source_adds_is_an_event_and_dropped_by_default(make_stack, gh, tmp_path):
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    records = with_priority(300, from_id=151)
    for r in records[200:]:  # and stops sending a nullable field on the third page
        del r["score"]
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code)
    data = answer["data"]
    assert data["status"] == "completed", answer["error"]
    # node_id and user on every record (the model leaves them out), priority on 150
    assert data["stats"]["fields_dropped"] == 2 * 300 + 150
    assert data["stats"]["records_emitted"] == 300
    drift = [e for e in await read_sse(stack.api_url, task_id) if e["event"] == "schema_drift"]
    assert [(e["field"], e["change"], e["page"]) for e in drift] == [
        ("node_id", "added", 0),
        ("user", "added", 0),
        ("priority", "added", 1),
        ("score", "missing", 2),
    ]
    priority = drift[2]
    assert priority["example"] in ('"high"', '"low"')
    assert priority["type"] == "str | None" and priority["evolved"] is False
    assert drift[1]["type"] == "dict | None"
    table = code.replace("-", "_")
    assert "priority" not in columns(lake, table) and len(table_rows(lake, table)) == 300


async def test_freeze_fails_naming_the_new_field(make_stack, gh, tmp_path):
    stack, _ = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    gh.serve(with_priority(300, from_id=151))
    whole = {**MODEL, "fields": {**MODEL["fields"], "node_id": "str", "user": "dict"}}
    import_doc(stack, doc(code, gh.base, whole, schema_contract_code="FREEZE"))
    _, _, answer = await start(stack, code)
    error = answer["error"]
    assert answer["data"]["status"] == "failed" and error["code"] == "SOURCE_CONTRACT", answer
    assert "'priority'" in error["message"] and "freeze" in error["message"]
    assert error["message"].startswith("page 1:")  # the page it first came on


async def test_evolve_adds_the_field_to_the_next_runs_table(make_stack, gh, tmp_path):
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    gh.serve(with_priority(300, from_id=151))
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, schema_contract="evolve")
    assert answer["data"]["status"] == "completed", answer["error"]
    table = code.replace("-", "_")
    assert "priority" not in columns(lake, table)  # this run's model is the one it began with
    drift = [e for e in await read_sse(stack.api_url, task_id) if e["event"] == "schema_drift"]
    assert [(e["field"], e["evolved"]) for e in drift] == [
        ("node_id", True),
        ("user", True),
        ("priority", True),
    ]
    # The next run: the model has the field (nullable), the table the column, filled.
    _, _, again = await start(stack, code)
    assert again["data"]["status"] == "completed", again["error"]
    assert again["data"]["stats"]["fields_dropped"] == 0
    assert "priority" in columns(lake, table)
    by_id = {r["id"]: r for r in table_rows(lake, table)}
    assert by_id[151]["priority"] == "high" and by_id[152]["priority"] == "low"
    assert by_id[1]["priority"] is None and by_id[1]["node_id"] == "I_1"
    # Evolving again with a field already there is no change.
    _, _, third = await start(stack, code, schema_contract="evolve")
    assert third["data"]["status"] == "completed", third["error"]


async def test_drift_on_a_page_whose_send_failed_is_told_once(make_stack, gh):
    """The stream keeps a page, noting its drift (once per run and field), and then its
    send is refused (a 503): the batch path judges the page again and finds the drift
    noted already. The drift is told all the same, once, where it was noted."""
    stack = await make_stack()
    code = f"q-{gh.ns}"
    gh.serve(with_priority(300, from_id=151))
    import_doc(stack, doc(code, gh.base))
    await stack.fault("sink", status=503, times=1)
    task_id, _, answer = await start(stack, code)
    assert answer["data"]["status"] == "completed", answer["error"]
    batches = [b for b in await stack.sink_batches() if task_id in (b["idempotency_key"] or "")]
    assert [b["status"] for b in batches].count(503) == 1, batches  # the stream stopped
    delivered = [r["id"] for b in batches if b["records"] for r in b["records"]]
    assert sorted(set(delivered)) == list(range(1, 301))
    drift = [e for e in await read_sse(stack.api_url, task_id) if e["event"] == "schema_drift"]
    assert [(e["field"], e["page"]) for e in drift] == [
        ("node_id", 0),
        ("user", 0),
        ("priority", 1),
    ]


async def test_a_worker_killed_mid_page_leaves_every_record_delivered_or_quarantined_once(
    make_stack, gh, tmp_path
):
    stack, lake = await sql_stack(
        make_stack, tmp_path, worker=False, runs={"pages_per_fetch": 10, "heartbeat_timeout_s": 2}
    )
    code = f"q-{gh.ns}"
    records = issues(3_000)
    kinds = poison(records, wrong=15, no_key=0, not_object=15)
    gh.serve(records)
    gh.state.delay_s[gh.ns] = 0.15  # a batch of ten pages takes 1.5 s: killed inside one
    import_doc(stack, doc(code, gh.base))
    config = worker_config(stack, tmp_path, worker={"heartbeat_throttle_s": 0.2})
    first = start_worker_process(config, tmp_path / "worker1.out")
    second = None
    try:
        task_id = new_task_id()
        resp = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"provenance": code, "max_bad_records": 100}},
            code="source_harvest",
            mode="async",
        )
        assert resp.status_code == 202, resp.text

        async def halfway() -> bool:
            stats = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]["stats"]
            return 800 <= stats.get("records_fetched", 0) <= 2_200

        await eventually(halfway, "the run to be halfway", interval=0.02)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = start_worker_process(config, tmp_path / "worker2.out")
        final = await stack.wait_status(task_id, timeout=120)
    finally:
        stop_processes(first, second)
    assert final["status"] == "completed", final
    assert final["stats"]["records_quarantined"] == 30
    assert final["stats"]["records_emitted"] == 2_970
    landed = [r["id"] for r in table_rows(lake, code.replace("-", "_"))]
    held = quarantine.list_rows(
        stack.settings.database.url, quarantine.RowPage(task_id=task_id, limit=1000)
    )
    assert len(held) == 30 and len({(r["page_seq"], r["position"]) for r in held}) == 30
    bad = set(kinds["score"]) | set(kinds[None])
    assert sorted(landed) == [i + 1 for i in range(3_000) if i not in bad]
    assert sorted(r["page_seq"] * 100 + r["position"] for r in held) == sorted(bad)
    # the batch in flight when the worker died ran again on the second worker
    history = await stack.client.get_workflow_handle(final["workflow_id"]).fetch_history()
    retried_after_heartbeat_timeout(history)


async def test_a_backfills_windows_set_records_aside_under_the_run_that_was_started(
    stack,
    shop_api,  # noqa: F811
):
    """Shopify's "list orders" (the server of tests/e2e/test_source_harvest.py), backfilled
    in daily windows, one bad order a day."""
    shop = Api(*shop_api)
    code = f"shop-q-{shop.ns}"
    backfill = {
        "scope_code": "TASK",
        "task_type": "backfill",
        "effective_from": "2025-01-01T00:00:00Z",
        "window_mode_code": "CALENDAR",
        "window_size_value": 1,
        "window_size_unit_code": "DAY",
        **SHOP_WINDOW,
    }
    import_doc(stack, orders_doc(code, shop.base, SHOP_WINDOW, task_windows=[backfill]))
    for day in (3, 4, 5):
        for n in range(4):
            o = order(day * 10 + n, f"2025-03-0{day}T1{n}:00:00-05:00")
            if n == 1:
                o["total_price"] = 12.5  # a number where the model says str
            shop.orders.append(o)
    task_id, _, answer = await start(
        stack,
        code,
        task_type="backfill",
        start="2025-03-03",
        end="2025-03-05",
        max_bad_records=5,
    )
    data = answer["data"]
    assert data["status"] == "completed", answer["error"]
    assert data["stats"]["records_quarantined"] == 3 and data["stats"]["records_emitted"] == 9
    # one quarantine for the run the user started, over its three windows
    listed = (await stack.http.get("/quarantine", params={"task_id": task_id})).json()["data"]
    assert listed["counts"] == {"quarantined": 3}
    assert {r["field_path"] for r in listed["items"]} == {"total_price"}
    assert len({r["run_key"] for r in listed["items"]}) == 3  # each window's own page
    drift = [e for e in await read_sse(stack.api_url, task_id) if e["event"] == "schema_drift"]
    assert sorted(e["field"] for e in drift) == ["line_items", "status"]  # once per run
    done = await replay(stack, task_id)  # nothing fixed: judged again, still bad
    assert (done["result"]["landed"], done["result"]["still_bad"]) == (0, 3)
