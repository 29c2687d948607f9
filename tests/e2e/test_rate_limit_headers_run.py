"""Rate-limit headers in a harvest run (docs/registry.md "Rate-limit headers"): a source
answering GitHub's ``x-ratelimit-remaining`` / ``x-ratelimit-reset`` and 429 once the
budget is spent (tests/registry/test_rate_limit_headers.py's ``BudgetApi``) is harvested
through the API, the worker and Temporal, 500 pages four at a time: with header reading
no request is refused; a control run of such a source with header reading off meets
429s."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import new_task_id
from tests.e2e.test_literature import harvest_source, import_doc
from tests.helpers import eventually
from tests.registry.net import Server
from tests.registry.test_rate_limit_headers import BudgetApi

PAGES = 500
ROW = {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z"}


class PagedBudget(BudgetApi):
    """The budget server as a paged source: page ``n`` holds record ``n``, of ``PAGES``
    (the total stated, so that a run asks pages four at a time)."""

    def body(self, request: web.Request) -> dict[str, Any]:
        n = int(request.query.get("page", "1"))
        return {"items": [{"id": n}] if n <= PAGES else [], "total": PAGES}


@pytest.fixture
async def budget():
    api = PagedBudget(budget=100, window=1, style="github")
    server = await Server({("GET", "/items"): api.handle}).start()
    yield server, api
    await server.stop()


@pytest.fixture
async def slow_budget():
    """The control's source: 50 requests every 30 s, which a run that does not read the
    headers spends in its first seconds however loaded the machine."""
    api = PagedBudget(budget=50, window=30, style="github")
    server = await Server({("GET", "/items"): api.handle}).start()
    yield server, api
    await server.stop()


def budget_doc(code: str, base: str, **limits: Any) -> dict[str, Any]:
    return {
        "provenance": {"provenance_code": code, "base_url_default": base},
        "endpoint_def": [
            {
                **ROW,
                "endpoint_name": "items",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/items",
            }
        ],
        "pagination_cfg": [
            {
                **ROW,
                "pagination_mode_code": "PAGE_NUMBER",
                "page_size_value": 1,
                "total_count_jsonpath": "$.total",
            }
        ],
        "rate_limit_cfg": [{**ROW, "max_concurrency": 4, **limits}],
        "record_model": [{**ROW, "key_json": ["id"], "fields_json": {"id": "int"}}],
    }


async def test_a_run_reading_x_ratelimit_meets_no_429_and_one_without_does(
    make_stack, budget, slow_budget
):
    server, api = budget
    stack = await make_stack(runs={"fetch_concurrency": 4})
    reading = f"budget-{uuid.uuid4().hex[:8]}"
    # Four requests in flight: a reserve of three keeps those past the gate in the budget.
    import_doc(
        stack,
        budget_doc(
            reading, server.url, ratelimit_headers_code="X_RATELIMIT", remaining_reserve_value=3
        ),
    )
    resp = await harvest_source(stack, new_task_id(), provenance=reading, start="2025-01-01")
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    assert data["stats"]["records_emitted"] == PAGES, data["stats"]
    assert api.served >= PAGES and api.refused == 0, (api.served, api.refused)

    # The control: a source of the same kind, its headers not read.
    server, api = slow_budget
    control = f"budget-{uuid.uuid4().hex[:8]}"
    import_doc(stack, budget_doc(control, server.url))
    task_id = new_task_id()
    resp = await harvest_source(
        stack, task_id, mode="async", provenance=control, start="2025-01-01"
    )
    assert resp.status_code == 202, resp.text
    try:
        await eventually(lambda: api.refused > 0, "the control run to meet a 429", timeout=120)
    finally:
        await stack.http.post(f"/tasks/{task_id}/cancel", json={"reason": "control seen"})
    final = await stack.wait_status(task_id, timeout=60)
    assert final["status"] in ("cancelled", "completed"), final
