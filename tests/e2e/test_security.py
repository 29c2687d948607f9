"""Security review findings of issue 19, each with its demonstrating input, on real
servers on loopback."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from artemis.samples.server import ThreadedServer
from tests.conftest import new_task_id
from tests.e2e.test_completeness import generic_doc
from tests.e2e.test_literature import harvest, import_doc


@pytest.fixture(scope="module")
def elsewhere():
    """A listener on another loopback address (127.0.0.2): it records what reaches it."""
    app = FastAPI()
    app.state.calls: list[dict[str, Any]] = []

    @app.get("/{path:path}")
    async def anything(path: str, request: Request):
        app.state.calls.append({"path": path, "query": str(request.url.query)})
        return {"items": [{"id": 999}], "total": 2}

    server = ThreadedServer(app, host="127.0.0.2").start()
    server.calls = app.state.calls  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def steering(elsewhere):
    """A source whose first page's Link header steers the next request elsewhere."""
    app = FastAPI()

    @app.get("/items")
    async def items(request: Request, page: int = 1):
        nxt = f"{elsewhere.url}/latest/meta-data/iam/?page=2"
        return JSONResponse(
            {"items": [{"id": page}], "total": 2}, headers={"Link": f'<{nxt}>; rel="next"'}
        )

    server = ThreadedServer(app).start()
    yield server
    server.stop()


async def test_a_next_link_to_another_host_is_not_followed_and_gets_no_key(
    stack, steering, elsewhere, monkeypatch
):
    code = f"steer_{new_task_id()[-6:]}"
    secret = f"SECRET-{new_task_id()}"
    monkeypatch.setenv("STEER_KEY", secret)
    doc = generic_doc(code, steering.url, pagination_mode_code="LINK_HEADER")
    doc["credential"] = [
        {
            "scope_code": "SOURCE",
            "credential_name": "k",
            "auth_type_code": "API_KEY_QUERY",
            "param_or_header_name": "api_key",
            "secret_env": "STEER_KEY",
            "effective_from": "2025-01-01T00:00:00Z",
            "is_default_preferred": True,
        }
    ]
    doc["endpoint_def"][0]["is_auth_required"] = True
    import_doc(stack, doc)
    resp = await harvest(stack, new_task_id(), provenance=code)
    data = resp.json()["data"]
    assert data["status"] == "failed", data
    assert data["error"]["code"] == "SOURCE_CONTRACT", data["error"]
    assert "127.0.0.2" in data["error"]["message"]
    assert "page=2" not in data["error"]["message"] and secret not in resp.text
    assert elsewhere.calls == []  # never asked, so never given the key
