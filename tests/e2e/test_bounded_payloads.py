"""Nothing that grows with a caller's input travels in one workflow payload: a backfill of
daily windows over several generations completes on the whole stack, each record once,
with every workflow task's payloads far below Temporal's 2 MB limit; a backfill past
``runs.max_windows`` is refused up front, naming the bound (docs/performance.md,
"Bounded payloads"). tests/e2e/test_workflow_payload_bounds.py measures the same bound on
larger runs with stand-in activities.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from artemis.temporal.runs import largest_workflow_task
from tests.conftest import new_task_id
from tests.e2e.test_literature import harvest_source, import_doc
from tests.e2e.test_source_harvest import (  # noqa: F401  (api: a fixture)
    SHOP_WINDOW,
    Api,
    api,
    delivered,
    order,
    orders_doc,
)
from tests.helpers import eventually


@pytest.fixture
def shop(api) -> Api:  # noqa: F811
    """Shopify's "list orders", as tests/e2e/test_source_harvest.py serves it."""
    return Api(*api)


# The bound docs/performance.md states: the payloads one workflow task completes with.
WORKFLOW_TASK_BOUND = 256 * 1024
DAILY = {
    "scope_code": "TASK",
    "task_type": "backfill",
    "effective_from": "2025-01-01T00:00:00Z",
    "window_mode_code": "SLIDING",
    "window_size_value": 1,
    "window_size_unit_code": "DAY",
    **SHOP_WINDOW,
}


async def histories(client, workflow_id: str, generations: int) -> list[WorkflowHistory]:
    """The ``generations`` runs of ``workflow_id`` (Temporal's list may lag its runs: it
    is asked again until it lists them all)."""

    async def listed() -> list[Any] | None:
        found = [wf async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
        return found if len(found) >= generations else None

    out = []
    for wf in await eventually(listed, f"{generations} runs of {workflow_id} listed"):
        out.append(await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
    assert len(out) == generations, len(out)
    return out


async def test_daily_windows_complete_across_generations_with_bounded_payloads(make_stack, shop):
    """60 daily windows, 20 children a generation: the parent continues as new twice, each
    record lands once, and no workflow task sends more than the stated bound.
    (Two and ten years of daily windows, 730 and 3,650 children at the default 500 a
    generation, are bench/backfill.py's: minutes each on two cores.)"""
    stack = await make_stack(runs={"children_per_run": 20})
    code = f"shop-daily-{shop.ns}"
    doc = orders_doc(code, shop.base, SHOP_WINDOW, task_windows=[DAILY])
    doc["rate_limit_cfg"] = [
        {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z", "max_concurrency": 8}
    ]
    import_doc(stack, doc)
    first, days = date(2023, 1, 1), 60
    shop.orders.extend(
        order(n + 1, f"{first + timedelta(days=n)}T12:00:00-05:00") for n in range(days)
    )
    task_id = new_task_id()
    resp = await harvest_source(
        stack,
        task_id,
        mode="async",
        provenance=code,
        task_type="backfill",
        start=str(first),
        end=str(first + timedelta(days=days - 1)),
    )
    assert resp.status_code == 202, resp.text
    data = await stack.wait_status(task_id, timeout=900)
    assert data["status"] == "completed", data
    assert data["stats"]["records_fetched"] == days
    assert sorted(await delivered(stack, task_id)) == list(range(1, days + 1))
    # 60 children, 20 a generation
    runs = await histories(stack.client, resp.json()["data"]["workflow_id"], 3)
    biggest = max(largest_workflow_task(h.events) for h in runs)
    assert 0 < biggest < WORKFLOW_TASK_BOUND, biggest
    # the parent's inputs carry no contract per child
    started = [
        e
        for h in runs
        for e in h.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert len(started) == days
    for e in started:
        (payload,) = e.start_child_workflow_execution_initiated_event_attributes.input.payloads
        assert b'"contract_ref"' in payload.data and b'"record_model"' not in payload.data


async def test_a_backfill_past_max_windows_is_refused_up_front(make_stack, shop):
    stack = await make_stack(runs={"max_windows": 365})
    code = f"shop-bound-{shop.ns}"
    import_doc(stack, orders_doc(code, shop.base, SHOP_WINDOW, task_windows=[DAILY]))
    resp = await harvest_source(
        stack,
        new_task_id(),
        provenance=code,
        task_type="backfill",
        start="2024-01-01",
        end="2025-09-01",
    )
    assert resp.status_code == 422, resp.text
    message: str = resp.json()["error"]["message"]
    assert "610 windows" in message and "runs.max_windows (365)" in message, message
    assert shop.requests() == []
    # the first and last days a window may name
    for params, needle in (
        ({"start": "0001-01-01", "end": "2024-01-01"}, "before 1900-01-01"),
        ({"start": "2024-01-01", "end": "9999-12-31"}, "params.end: 9999-12-31 is in the future"),
    ):
        resp = await harvest_source(
            stack, new_task_id(), provenance=code, task_type="backfill", **params
        )
        assert resp.status_code == 422 and needle in resp.json()["error"]["message"], resp.text
