"""A source_harvest run whose source answers a page with a 404 its provenance's response
rule ignores (docs/registry.md "Answers that are not errors"), through the real API,
worker and Temporal: the run completes with the records before it, and its stats count
the ignored answer as ``responses_ignored``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from artemis_samples.server import ThreadedServer
from tests.conftest import new_task_id
from tests.e2e.test_literature import harvest_source, import_doc

# Pages asked, by test namespace.
ASKED: dict[str, list[int]] = {}


def items_app() -> FastAPI:
    """``GET /{ns}/items?page=N&per_page=M``: two full pages of items, then 404 (the
    parent the items belonged to was deleted meanwhile)."""
    app = FastAPI()

    @app.get("/{ns}/items")
    async def items(ns: str, page: int = 1, per_page: int = 2) -> JSONResponse:
        ASKED.setdefault(ns, []).append(page)
        if page > 2:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        first = (page - 1) * per_page + 1
        chunk = [{"id": i, "name": f"item {i}"} for i in range(first, first + per_page)]
        return JSONResponse({"items": chunk})

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    running = ThreadedServer(items_app()).start()
    yield running
    running.stop()


def items_doc(code: str, base: str) -> dict[str, Any]:
    row = {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z"}
    return {
        "provenance": {
            "provenance_code": code,
            "base_url_default": base,
            "record_model": {"key": ["id"], "fields": {"id": "int", "name": "str"}},
        },
        "endpoint_def": [
            {
                **row,
                "endpoint_name": "items",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/items",
                "response_actions_json": [{"status": 404, "action": "ignore"}],
            }
        ],
        "pagination_cfg": [
            {
                **row,
                "pagination_mode_code": "PAGE_NUMBER",
                "page_size_value": 2,
                "page_size_param_name": "per_page",
                "records_jsonpath": "$.items",
                "record_key_jsonpath": "$.id",
            }
        ],
    }


async def test_an_ignored_answer_ends_the_run_s_paging_and_is_counted_in_its_stats(stack, server):
    ns = f"n{uuid.uuid4().hex[:10]}"
    code = f"answers-{ns}"
    import_doc(stack, items_doc(code, f"{server.url}/{ns}"))
    resp = await harvest_source(stack, new_task_id(), provenance=code)
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    stats = data["stats"]
    assert stats["responses_ignored"] == 1
    assert stats["records_fetched"] == 4 and stats["pages"] == 3
    assert ASKED[ns] == [1, 2, 3]
