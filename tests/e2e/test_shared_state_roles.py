"""Shared state is the operator's (docs/security.md): a client token's run may neither
rewrite a provenance's record model nor move its update pointer, into the future or at
all; an operator's run does, and its next update asks from a past instant. Real API
with role tokens, worker, Temporal and a GitHub-issues-shaped source on loopback."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.conftest import new_task_id
from tests.e2e.test_literature import import_doc
from tests.e2e.test_source_harvest import (  # noqa: F401  (api: a fixture)
    DATE_POINTER,
    Api,
    api,
    issue,
    issues_doc,
    watermark,
)

TOKENS = {"cli": "client-token-0123456789", "ops": "operator-token-0123456789"}
CLIENT = {"Authorization": f"Bearer {TOKENS['cli']}"}
OPERATOR = {"Authorization": f"Bearer {TOKENS['ops']}"}


@pytest.fixture
def source(api) -> Api:  # noqa: F811
    return Api(*api)


async def _run(stack, headers: dict[str, str], **params):
    body = {"meta": {"task_id": new_task_id()}, "params": params}
    return await stack.run(body, code="source_harvest", headers=headers)


async def test_a_clients_run_leaves_the_model_and_the_pointer_to_the_operator(make_stack, source):
    stack = await make_stack(
        server={
            "api_tokens": [
                {"name": "cli", "token": TOKENS["cli"], "role": "client"},
                {"name": "ops", "token": TOKENS["ops"], "role": "operator"},
            ]
        }
    )
    code = f"gh-roles-{source.ns}"
    doc = issues_doc(code, source.base, DATE_POINTER)
    doc["rate_limit_cfg"] = [
        {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z", "max_concurrency": 2}
    ]
    import_doc(stack, doc)
    source.issues.extend([issue(1, 1, "2025-03-01T10:00:00Z"), issue(2, 2, "2025-03-01T12:00:00Z")])

    # A client may not rewrite the model every owner's runs read...
    resp = await _run(stack, CLIENT, provenance=code, schema_contract="evolve")
    error = resp.json()["error"]
    assert resp.status_code == 403 and error["code"] == "FORBIDDEN", resp.text
    assert "schema_contract" in error["message"] and "operator or admin" in error["message"]
    # ...nor ask a window that ends in the future (for anyone).
    for headers in (CLIENT, OPERATOR):
        resp = await _run(
            stack,
            headers,
            provenance=code,
            task_type="update",
            start="2025-03-01",
            end="2999-12-31",
        )
        assert resp.status_code == 422, resp.text
        assert "params.end: 2999-12-31 is in the future" in resp.json()["error"]["message"]
    # ...nor more windows at once than the operator set for the source.
    resp = await _run(
        stack,
        CLIENT,
        provenance=code,
        task_type="backfill",
        start="2025-03-01",
        end="2025-03-02",
        parallelism=3,
    )
    assert resp.status_code == 422, resp.text
    assert "rate_limit.max_concurrency (2)" in resp.json()["error"]["message"]
    assert source.requests() == []

    # A client's update of a window of its own runs, and leaves the pointer where it was.
    resp = await _run(
        stack, CLIENT, provenance=code, task_type="update", start="2025-03-01", end="2025-03-02"
    )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    assert data["stats"]["records_fetched"] == 2
    assert watermark(stack, code) == (None, None)

    # The operator's update moves it, to the largest updated_at it saw (a past instant)...
    resp = await _run(stack, OPERATOR, provenance=code, task_type="update", start="2025-03-01")
    assert resp.json()["data"]["status"] == "completed", resp.text
    mark, _ = watermark(stack, code)
    assert mark == datetime(2025, 3, 1, 12, tzinfo=UTC)
    # ...and the operator's next update asks from there, less the overlap.
    before = len(source.requests())
    resp = await _run(stack, OPERATOR, provenance=code, task_type="update")
    assert resp.json()["data"]["status"] == "completed", resp.text
    asked = [r["params"]["since"] for r in source.requests()[before:]]
    assert asked and set(asked) == {"2025-03-01T11:59:00Z"}
