"""An OAuth2 refresh token that rotates on every use, shared by two worker processes that
harvest one provenance through Temporal at once, then by a worker started after both
stopped (docs/registry.md "Refresh tokens"). The authorization server and the source are
tests/registry/test_refresh_tokens.py's ``RotatingServer``: a spent refresh token
presented again is refused and revokes the family, so a refresh sent twice with the same
token fails the test."""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from typing import Any

import sqlalchemy as sa
from aiohttp import web

from tests.conftest import new_task_id, start_worker_process
from tests.e2e.test_literature import harvest_source, import_doc
from tests.e2e.test_worker_crash import worker_config
from tests.helpers import eventually, stop_processes
from tests.registry.test_refresh_tokens import RotatingServer, refresh_doc

# An access token lives a second here (a minute, or ten, at a real service): each phase
# below harvests for PAGES * PAGE_DELAY_S = 3.8 s at least, some ten lifetimes in all.
LIFETIME_S = 1.0
PAGES, SIZE, PAGE_DELAY_S = 48, 5, 0.08
RUNS_AT_ONCE = 4
ROW = {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z"}


class PagedRotating(RotatingServer):
    """The rotating server whose source answers ``PAGES`` pages of ``SIZE`` records, then
    an empty page, each after ``PAGE_DELAY_S``, so that a run's requests span several
    token lifetimes."""

    async def page(self, request: web.Request) -> web.Response:
        await asyncio.sleep(PAGE_DELAY_S)
        n = int(request.query.get("page", "1"))
        items = [{"id": (n - 1) * SIZE + i, "page": n} for i in range(SIZE if n <= PAGES else 0)]
        return web.json_response({"items": items})


async def paged_rotating(monkeypatch) -> PagedRotating:
    """The server, its client and seed refresh token in the environment the worker
    processes inherit (the import seals the seed into the vault)."""
    client_id, client_secret = f"client-{secrets.token_hex(6)}", f"cs-{secrets.token_hex(16)}"
    seed = f"rt0-{secrets.token_hex(16)}"
    monkeypatch.setenv("RT_CLIENT_ID", client_id)
    monkeypatch.setenv("RT_CLIENT_SECRET", client_secret)
    monkeypatch.setenv("RT_REFRESH_TOKEN", seed)
    server = PagedRotating(client_id, client_secret, seed, LIFETIME_S)
    return await server.start()  # type: ignore[return-value]


def paged_doc(code: str, auth: RotatingServer) -> dict[str, Any]:
    doc = refresh_doc(code, auth)
    doc["pagination_cfg"] = [
        {**ROW, "pagination_mode_code": "PAGE_NUMBER", "page_size_value": SIZE}
    ]
    # A rate-limit row gives the provenance a task queue of its own, each worker taking
    # two of its fetches at a time: with four runs at once, both workers fetch.
    doc["rate_limit_cfg"] = [{**ROW, "qps_limit": 200.0, "max_concurrency": 2}]
    doc["record_model"] = [{**ROW, "key_json": ["id"], "fields_json": {"id": "int", "page": "int"}}]
    return doc


async def harvest_runs(stack, code: str, n: int) -> list[dict[str, Any]]:
    """``n`` source_harvest runs of ``code`` started at once; each one's final task."""
    ids = [new_task_id() for _ in range(n)]
    for task_id in ids:
        resp = await harvest_source(
            stack, task_id, mode="async", provenance=code, start="2025-01-01"
        )
        assert resp.status_code == 202, resp.text
    return [await stack.wait_status(task_id, timeout=180) for task_id in ids]


def started(tmp_path) -> int:
    """How many worker processes have said they started (in their shared log)."""
    log = tmp_path / "worker.log"
    return log.read_text().count('"worker_started"') if log.exists() else 0


async def fetch_identities(stack, finals: list[dict[str, Any]]) -> set[str]:
    """The workers (by Temporal identity) that ran the runs' fetch activities."""
    names: set[str] = set()
    for final in finals:
        history = await stack.client.get_workflow_handle(final["workflow_id"]).fetch_history()
        scheduled = {
            e.event_id
            for e in history.events
            if e.activity_task_scheduled_event_attributes.activity_type.name == "fetch_pages"
        }
        names |= {
            e.activity_task_started_event_attributes.identity
            for e in history.events
            if e.activity_task_started_event_attributes.scheduled_event_id in scheduled
        }
    return names


async def histories_text(stack, finals: list[dict[str, Any]]) -> str:
    texts = []
    for final in finals:
        history = await stack.client.get_workflow_handle(final["workflow_id"]).fetch_history()
        texts.append(history.to_json())
    return "\n".join(texts)


async def test_two_worker_processes_share_a_rotating_refresh_token_and_a_restart_goes_on(
    make_stack, tmp_path, monkeypatch
):
    auth = await paged_rotating(monkeypatch)
    seed = auth.live
    code = f"rotating-{uuid.uuid4().hex[:8]}"
    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        worker=False,
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}},
        # Several fetch activities per run: the two workers' pollers share them.
        runs={"pages_per_fetch": 4},
    )
    config = worker_config(stack, tmp_path)
    import_doc(stack, paged_doc(code, auth))
    workers: list[Any] = []
    try:
        workers = [start_worker_process(config, tmp_path / f"worker{i}.out") for i in (1, 2)]
        await eventually(lambda: started(tmp_path) == 2, "both workers to start")
        first = await harvest_runs(stack, code, RUNS_AT_ONCE)
        stop_processes(*workers)
        refreshed_before = len(auth.issued) - 1
        # The access token the first workers stored runs out meanwhile: the restarted
        # worker must refresh, with the refresh token they left.
        live_at_restart = auth.live
        expired = asyncio.get_running_loop().time() + LIFETIME_S
        await eventually(
            lambda: asyncio.get_running_loop().time() > expired, "the stored token to expire"
        )
        workers.append(start_worker_process(config, tmp_path / "worker3.out"))
        await eventually(lambda: started(tmp_path) == 3, "the new worker to start")
        second = await harvest_runs(stack, code, 2)
    finally:
        stop_processes(*workers)
        await auth.stop()

    for final in first + second:
        assert final["status"] == "completed", final
        assert final["stats"]["records_emitted"] == PAGES * SIZE, final["stats"]
    # Both workers fetched for the first runs.
    assert len(await fetch_identities(stack, first)) == 2
    # The authorization server never refused a refresh, and never saw two at once.
    assert auth.refused == [] and not auth.revoked, auth.refused
    assert auth.overlaps == 0
    refreshes = len(auth.issued) - 1
    assert refreshes >= 8, refreshes
    assert refreshed_before >= 4 and refreshes > refreshed_before, (refreshed_before, refreshes)
    # Each refresh token went to the server once: the seed first, the restart's first
    # refresh with the one the stopped workers left.
    assert auth.presented[seed] == 1 and auth.presented[live_at_restart] == 1
    assert all(auth.presented.get(t) == 1 for t in auth.spent()), auth.presented
    # Every record landed once.
    with sa.create_engine(lake).connect() as conn:
        table = code.replace("-", "_")
        assert conn.execute(sa.text(f'SELECT count(DISTINCT id) FROM "{table}"')).scalar() == (
            PAGES * SIZE
        )
    # No token (refresh or access) in the runs' histories, the workers' logs, or the
    # registry in clear.
    tokens = [*auth.issued, *auth.access]
    said = "\n".join(p.read_text() for p in tmp_path.glob("worker*"))
    assert '"oauth2_token_refreshed"' in said
    assert not [t for t in tokens if t in said]
    assert not [t for t in tokens if t in await histories_text(stack, first + second)]
    with sa.create_engine(stack.settings.database.url).connect() as conn:
        rows = {
            name: conn.execute(sa.text(f"SELECT * FROM {name}")).mappings().all()
            for name in ("reg_prov_credential", "reg_prov_token_state")
        }
    # The state row holds the live token, sealed, and counts every refresh.
    (state,) = rows["reg_prov_token_state"]
    assert state["version"] == refreshes and state["encryption_key_id"]
    dump = json.dumps({k: [list(map(str, r.values())) for r in v] for k, v in rows.items()})
    assert not [t for t in tokens if t in dump]
