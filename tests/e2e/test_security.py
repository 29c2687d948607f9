"""Findings of a security review, each with its demonstrating input, on real
servers on loopback."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from artemis_samples.server import ThreadedServer
from tests.conftest import new_task_id
from tests.e2e.test_completeness import generic_doc
from tests.e2e.test_literature import harvest_source, import_doc


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
    resp = await harvest_source(stack, new_task_id(), provenance=code)
    data = resp.json()["data"]
    assert data["status"] == "failed", data
    assert data["error"]["code"] == "SOURCE_CONTRACT", data["error"]
    assert "127.0.0.2" in data["error"]["message"]
    assert "page=2" not in data["error"]["message"] and secret not in resp.text
    assert elsewhere.calls == []  # never asked, so never given the key


def test_an_empty_api_token_is_refused_at_start(tmp_path):
    import subprocess
    import sys

    from artemis.config import load_settings
    from artemis.errors import ArtemisError
    from tests.conftest import ROOT

    for tokens in ([""], ["   "], ["good-token-0123456789", ""]):
        with pytest.raises(ArtemisError) as e:
            load_settings(None, server={"api_tokens": tokens})
        assert e.value.code.value == "CONFIG_ERROR" and "server.api_tokens" in e.value.message
    config = tmp_path / "c.yaml"
    config.write_text('server:\n  api_tokens: [""]\n')
    proc = subprocess.run(
        [sys.executable, "-m", "starter.cli", "api", "--config", str(config), "--host", "0.0.0.0"],
        env={"COOKIE_MASTER_KEY": "k" * 48, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "server.api_tokens" in proc.stdout + proc.stderr


async def test_a_web_page_cannot_start_cancel_or_read_through_the_dev_api(stack):
    import httpx

    # text/plain is what a page's form or fetch() sends without a preflight
    resp = await stack.http.post(
        "/tasks/pull_stock_quotes/run?mode=async",
        content=b'{"params": {"symbols": ["CSRF"]}}',
        headers={"Content-Type": "text/plain"},
    )
    assert resp.status_code == 415, resp.text
    assert resp.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    async with httpx.AsyncClient(base_url=stack.api_url) as bare:
        # a body-less state change without JSON and without a token
        resp = await bare.post(f"/tasks/{new_task_id()}/cancel")
        assert resp.status_code == 415, resp.text
        resp = await bare.delete(f"/tasks/{new_task_id()}")
        assert resp.status_code == 415, resp.text
        # DNS rebinding: a page on evil.example resolved to 127.0.0.1
        resp = await bare.get("/tasks", headers={"Host": "evil.example:8000"})
        assert resp.status_code == 421, resp.text
        assert resp.json()["error"]["code"] == "MISDIRECTED_REQUEST"
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
            assert (await bare.get("/tasks", headers={"Host": host})).status_code == 200
        # a JSON client is served as before
        resp = await bare.post(f"/tasks/{new_task_id()}/cancel", json={})
        assert resp.status_code == 404, resp.text


async def test_tokens_a_security_scheme_and_a_non_ascii_bearer(make_stack):
    import httpx

    token = "t0ken-of-thirty-two-characters-xx"
    stack = await make_stack(server={"api_tokens": [token]})
    async with httpx.AsyncClient(base_url=stack.api_url) as bare:
        for header in (b"", b"Bearer wrong", "Bearer \xe9".encode(), b"Basic x"):
            resp = await bare.get("/tasks", headers={"Authorization": header} if header else {})
            assert resp.status_code == 401, (header, resp.text)  # never 500
        assert (await bare.get("/openapi.json")).status_code == 401
        assert (await bare.get("/health")).status_code == 200
        auth = {"Authorization": f"Bearer {token}"}
        schema = (await bare.get("/openapi.json", headers=auth)).json()
        assert schema["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"
        assert {"bearerToken": []} in schema["paths"]["/tasks"]["get"]["security"]
        assert "security" not in schema["paths"]["/health"]["get"]
        # with a token, a body-less state change needs no JSON header, any Host is fine
        resp = await bare.post(f"/tasks/{new_task_id()}/cancel", headers=auth)
        assert resp.status_code == 404, resp.text


async def test_a_decompression_bomb_fails_the_run_and_the_worker_stays_small(make_stack, tmp_path):
    from pathlib import Path

    from tests.conftest import settings_with, start_worker_process, write_config
    from tests.helpers import eventually, stop_processes

    stack = await make_stack(worker=False)
    config = write_config(
        tmp_path / "worker.yaml",
        settings_with(
            stack.settings, logging={"output": "file", "file": {"path": str(tmp_path / "w.log")}}
        ),
    )
    worker = start_worker_process(config, tmp_path / "worker.out")

    def peak_mb() -> float:
        for line in Path(f"/proc/{worker.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    try:
        # 300 KB of gzip that inflates to 300 MB of JSON; a few of them, so that a request
        # from elsewhere on the shared sample server cannot take the run's (cleared below)
        await stack.fault("quotes", bomb_mb=300, times=3)
        resp = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["GZ"]}})
        data = resp.json()["data"]
        assert data["status"] == "failed", data
        assert data["error"]["code"] == "SOURCE_CONTRACT", data["error"]
        assert "answer larger than 67108864 bytes" in data["error"]["message"]
        print(f"BOMB_WORKER_PEAK_MB={peak_mb():.0f}")
        assert peak_mb() < 400, peak_mb()
        await stack.fault("quotes")
        ok = await stack.run({"meta": {"task_id": new_task_id()}, "params": {"symbols": ["GZ"]}})
        assert ok.json()["data"]["status"] == "completed", ok.text
        assert await eventually(lambda: worker.poll() is None, "the worker to be alive")
    finally:
        await stack.fault("quotes")
        stop_processes(worker)


@pytest.fixture(scope="module")
def echoing():
    """A source that echoes the request's API key in its error answer."""
    app = FastAPI()

    @app.get("/items")
    async def items(request: Request):
        key = request.query_params.get("api_key", "")
        return JSONResponse({"error": f"key {key} is not valid for this account"}, 400)

    server = ThreadedServer(app).start()
    yield server
    server.stop()


async def test_an_upstream_echoing_the_key_does_not_put_it_in_failures_events_or_store(
    stack, echoing, monkeypatch
):
    from tests.e2e.test_events import read_sse

    code = f"echo_{new_task_id()[-6:]}"
    secret = f"ECHOED-{new_task_id()}"
    monkeypatch.setenv("ECHO_KEY", secret)
    doc = generic_doc(code, echoing.url)
    doc["credential"] = [
        {
            "scope_code": "SOURCE",
            "credential_name": "k",
            "auth_type_code": "API_KEY_QUERY",
            "param_or_header_name": "api_key",
            "secret_env": "ECHO_KEY",
            "effective_from": "2025-01-01T00:00:00Z",
            "is_default_preferred": True,
        }
    ]
    doc["endpoint_def"][0]["is_auth_required"] = True
    import_doc(stack, doc)
    task_id = new_task_id()
    resp = await harvest_source(stack, task_id, provenance=code)
    data = resp.json()["data"]
    assert data["status"] == "failed" and data["error"]["code"] == "SOURCE_ERROR", data
    assert "is not valid for this account" in data["error"]["message"]  # the text stays
    assert secret not in resp.text
    history = await stack.client.get_workflow_handle(data["workflow_id"]).fetch_history()
    assert secret not in history.to_json()
    events = await read_sse(stack.api_url, task_id)
    assert events and all(secret not in str(e) for e in events)
    stored = (await stack.http.get(f"/tasks/{task_id}")).text
    assert secret not in stored and "is not valid" in stored


async def test_bad_ids_urls_and_sizes_are_422_naming_the_field(stack):
    async def run(body: dict[str, Any], code: str = "pull_stock_quotes") -> Any:
        return await stack.run(body, code=code, mode="async")

    cb = {"base_url": f"{stack.samples_url}/cronjob/runs"}
    # run_id becomes a path segment of the CronJob's URLs
    resp = await run({"meta": {"run_id": "../../admin?x=", "callback": cb}, "params": {}})
    assert resp.status_code == 422 and "meta.run_id" in resp.text, resp.text
    # a callback token is a run secret of bounded size
    long_token = {**cb, "auth_token": "t" * 4097}
    resp = await run({"meta": {"run_id": "r-long", "callback": long_token}, "params": {}})
    assert resp.status_code == 422 and "meta.callback.auth_token" in resp.text, resp.text
    # malformed URLs: 422, never 500
    for url in ("http://[::1", "http://127.0.0.1:99999/x"):
        resp = await run({"meta": {"run_id": "r1", "callback": {"base_url": url}}, "params": {}})
        assert resp.status_code == 422, (url, resp.text)
        resp = await run({"params": {"symbols": ["A"], "base_url": url}})
        assert resp.status_code == 422, (url, resp.text)
    resp = await run({"params": {"symbols": [f"S{i}" for i in range(501)]}})
    assert resp.status_code == 422 and "params.symbols" in resp.text
    resp = await stack.http.post("/notes/details", json={"platform": "sample", "note_ids": [".."]})
    assert resp.status_code == 422 and "note id" in resp.text, resp.text
    resp = await run(
        {"params": {"platform": "sample", "keywords": ["k"], "workflow_name": "x" * 101}},
        code="crawl_notes",
    )
    assert resp.status_code == 422 and "workflow_name" in resp.text
    resp = await run(
        {"params": {"platform": "sample", "keywords": ["k"], "workflow_name": "a/b c"}},
        code="crawl_notes",
    )
    assert resp.status_code == 422 and "workflow_name" in resp.text


def test_db_upgrade_prints_no_password(tmp_path, pg_server):
    import os
    import subprocess
    import sys

    from sqlalchemy.engine import make_url

    from tests.conftest import ROOT

    # trust authentication on the test server: the password is sent and ignored
    url = make_url(pg_server.url).set(password="hunter2pw").render_as_string(hide_password=False)
    proc = subprocess.run(
        [sys.executable, "-m", "starter.cli", "db", "upgrade"],
        env={**os.environ, "ARTEMIS__DATABASE__URL": url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "up to" in proc.stdout, proc.stdout + proc.stderr  # (rich wraps the line)
    assert "***" in proc.stdout and "hunter2pw" not in proc.stdout + proc.stderr


async def test_ready_is_a_cached_probe(stack, monkeypatch):
    from starter.api.routes import health

    calls = 0
    real = health._probe

    async def counting(request):  # noqa: ANN001
        nonlocal calls
        calls += 1
        return await real(request)

    monkeypatch.setattr(health, "_probe", counting)
    for _ in range(20):
        assert (await stack.http.get("/ready")).status_code == 200
    assert calls <= 2, calls  # twenty calls within a second or two: one or two probes


async def test_a_repeated_task_id_never_swaps_the_running_runs_token(stack):
    await stack.fault("latency", latency_ms=100)
    try:
        task_id, run_id = new_task_id(), f"cron-{new_task_id()}"
        meta = {
            "task_id": task_id,
            "run_id": run_id,
            "callback": {
                "base_url": f"{stack.samples_url}/cronjob/runs",
                "auth_token": "first-token-0123456789",
            },
        }
        body = {"meta": meta, "params": {"symbols": ["TOK"], "page_size": 2}}
        assert (await stack.run(body, mode="async")).status_code == 202
        again = {
            **body,
            "meta": {
                **meta,
                "callback": {**meta["callback"], "auth_token": "evil-token-0123456789"},
            },
        }
        assert (await stack.run(again, mode="async")).status_code == 202  # attached
        await stack.wait_status(task_id, timeout=90)
    finally:
        await stack.fault("latency", latency_ms=0)
    tokens = {c["token"] for c in await stack.cronjob_calls(run_id)}
    assert tokens == {"first-token-0123456789"}, tokens


async def test_the_default_token_goes_only_to_the_configured_cronjob(make_stack, samples):
    token = "default-cron-token-0123456789"
    elsewhere = f"{samples.url}/cronjob/runs"
    configured = f"http://localhost:{samples.port}/cronjob/runs"  # another origin (name)
    stack = await make_stack(
        callback={
            "default_token": token,
            "base_url": configured,
            # both may be called back (without it: the configured origin alone)
            "allowed_hosts": ["127.0.0.1", "localhost"],
        },
    )
    calls = {}
    for name, base in (("elsewhere", elsewhere), ("configured", configured)):
        run_id = f"cron-{name}-{new_task_id()}"
        resp = await stack.run(
            {
                "meta": {
                    "task_id": new_task_id(),
                    "run_id": run_id,
                    "callback": {"base_url": base},
                },
                "params": {"symbols": ["DT"]},
            }
        )
        assert resp.json()["data"]["status"] == "completed", resp.text
        calls[name] = {c["token"] for c in await stack.cronjob_calls(run_id)}
    assert calls["elsewhere"] == {None}  # an allowed host the request named: no token of ours
    assert calls["configured"] == {token}
    # by default a request may call back the configured CronJob's origin only
    strict = await make_stack(callback={"default_token": token, "base_url": configured})
    resp = await strict.run(
        {
            "meta": {
                "task_id": new_task_id(),
                "run_id": "r-x",
                "callback": {"base_url": elsewhere},
            },
            "params": {"symbols": ["DT"]},
        }
    )
    assert resp.status_code == 422 and "meta.callback" in resp.text, resp.text


async def test_a_sink_header_from_the_request_stays_out_of_history_store_and_logs(stack, app_log):
    import subprocess

    from infra.devserver import temporal_binary

    secret = f"Bearer sink-{new_task_id()}"
    query_secret = f"q{new_task_id()}"
    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "params": {"symbols": ["HDR"]},
            "output": {
                "sinks": ["http"],
                "http_endpoint": f"{stack.samples_url}/sink/hdr?sig={query_secret}",
                "http_headers": {"Authorization": secret},
            },
        }
    )
    data = resp.json()["data"]
    assert data["status"] == "completed", resp.text
    batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    assert batches and {b["authorization"] for b in batches} == {secret}  # the sink got it
    assert {b["query"] for b in batches} == {f"sig={query_secret}"}
    shown = subprocess.run(
        [
            temporal_binary(),
            "workflow",
            "show",
            "--workflow-id",
            data["workflow_id"],
            "--address",
            stack.settings.temporal.address,
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    history = shown.stdout + "\n".join(_decoded_payloads(json.loads(shown.stdout)))
    assert "http_headers" in history and "@run-secret" in history  # names only
    assert secret.split()[1] not in history and query_secret not in history
    stored = (await stack.http.get(f"/tasks/{task_id}")).text
    assert secret.split()[1] not in stored and query_secret not in stored
    log = app_log.read_text()
    assert secret.split()[1] not in log and query_secret not in log


def _decoded_payloads(node: Any) -> list[str]:
    """Every payload's data in a history as JSON shows it (base64), decoded."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "data" and isinstance(v, str):
                try:
                    out.append(base64.b64decode(v).decode("utf-8", "replace"))
                except (binascii.Error, ValueError):
                    pass
            else:
                out += _decoded_payloads(v)
    elif isinstance(node, list):
        for v in node:
            out += _decoded_payloads(v)
    return out
