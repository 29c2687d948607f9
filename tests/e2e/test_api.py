"""The starter API's envelope, errors, headers and auth, on a real server."""

from __future__ import annotations

import httpx

from tests.conftest import new_task_id


def assert_envelope(body: dict) -> None:
    assert set(body) == {"success", "data", "error", "meta"}
    assert set(body["meta"]) == {"request_id", "trace_id", "latency_ms"}
    assert body["meta"]["request_id"] and len(body["meta"]["trace_id"]) == 32


async def test_unknown_task_code_is_404_task_not_found(stack):
    resp = await stack.run({"params": {}}, code="no_such_task")
    assert resp.status_code == 404
    body = resp.json()
    assert_envelope(body)
    assert body["success"] is False and body["error"]["code"] == "TASK_NOT_FOUND"
    assert "no_such_task" in body["error"]["message"]
    assert body["error"]["retryable"] is False


async def test_unknown_task_id_is_404(stack):
    resp = await stack.http.get(f"/tasks/{new_task_id()}")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "TASK_NOT_FOUND"
    resp = await stack.http.post(f"/tasks/{new_task_id()}/cancel")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "TASK_NOT_FOUND"


async def test_malformed_json_is_422_naming_where(stack):
    resp = await stack.http.post(
        "/tasks/pull_stock_quotes/run",
        content=b'{"params": {"symbols": [}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 422
    body = resp.json()
    assert_envelope(body)
    assert body["error"]["code"] == "INVALID_INPUT"
    assert "malformed JSON" in body["error"]["message"] and "column" in body["error"]["message"]


async def test_bad_params_are_422_naming_the_field(stack):
    cases = [
        ({"params": {"symbols": []}}, "params.symbols"),
        ({"params": {"start": "not-a-date"}}, "params.start"),
        ({"params": {"page_size": 5000}}, "params.page_size"),
        ({"params": {"start": "2025-11-30", "end": "2025-11-01"}}, "end"),
        ({"params": {"colour": "blue"}}, "params.colour"),
        ({"meta": {"timeout_s": -1}, "params": {}}, "body.meta.timeout_s"),
        ({"meta": {"timeout_s": 8.8e82}, "params": {}}, "body.meta.timeout_s"),
        ({"meta": {"task_id": "has spaces"}, "params": {}}, "body.meta.task_id"),
        ({"meta": {}, "body": {}, "params": {}}, "not both"),
        ({"surprise": 1}, "body.surprise"),
        ([1, 2], "expected a JSON object"),
        ({"params": {}, "output": {"sinks": ["kafka"]}}, "unknown sink 'kafka'"),
    ]
    for payload, needle in cases:
        resp = await stack.http.post("/tasks/pull_stock_quotes/run", json=payload)
        assert resp.status_code == 422, (payload, resp.text)
        err = resp.json()["error"]
        assert err["code"] == "INVALID_INPUT"
        assert needle in err["message"], (needle, err["message"])


async def test_bad_mode_is_422(stack):
    resp = await stack.http.post("/tasks/pull_stock_quotes/run?mode=later", json={})
    assert resp.status_code == 422 and "mode" in resp.json()["error"]["message"]


async def test_body_over_max_bytes_is_413(make_stack):
    stack = await make_stack(server={"max_body_bytes": 200})
    resp = await stack.http.post(
        "/tasks/pull_stock_quotes/run", json={"params": {"symbols": ["A" * 10] * 50}}
    )
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"

    async def chunks():  # no Content-Length: refused while streaming
        for _ in range(10):
            yield b" " * 100

    resp = await stack.http.post("/tasks/pull_stock_quotes/run", content=chunks())
    assert resp.status_code == 413


async def test_tokens_required_everywhere_but_the_probes(make_stack):
    stack = await make_stack(server={"api_tokens": ["tok-1", "tok-2"]})
    assert (await stack.http.get("/health")).status_code == 200
    ready = await stack.http.get("/ready")
    assert ready.status_code == 200, ready.text
    assert ready.json()["data"] == {
        "status": "ready",
        "checks": {"temporal": "ok", "search_attributes": "ok", "database": "ok"},
    }
    for method, path in (
        ("GET", "/metrics"),
        ("GET", "/task-types"),
        ("POST", f"/tasks/{new_task_id()}/pause"),
        ("POST", f"/tasks/{new_task_id()}/cancel"),
        ("GET", "/docs"),
        ("GET", "/tasks"),
        ("POST", "/notes/details"),
        ("GET", f"/tasks/{new_task_id()}/events"),
        ("GET", f"/tasks/{new_task_id()}"),
        ("POST", "/tasks/pull_stock_quotes/run"),
        ("GET", "/openapi.json"),
    ):
        resp = await stack.http.request(method, path)
        assert resp.status_code == 401, path
        assert resp.json()["error"]["code"] == "UNAUTHORIZED"
    bad = await stack.http.get("/tasks", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    good = await stack.http.get("/tasks", headers={"Authorization": "Bearer tok-2"})
    assert good.status_code == 200


async def test_ready_names_the_dependency_that_is_down_and_nothing_else(make_stack):
    secret_url = "postgresql+psycopg://artemis:s3cret-pw@127.0.0.1:9/artemis"
    stack = await make_stack(worker=False, server={"api_tokens": ["tok-1"]})
    stack.settings.database.url = secret_url  # the API reads it per probe
    resp = await stack.http.get("/ready")
    assert resp.status_code == 503
    body = resp.json()
    assert body["data"]["checks"]["temporal"] == "ok"
    assert body["data"]["checks"]["database"].startswith("unreachable (")
    assert "s3cret" not in resp.text and "9/artemis" not in resp.text and "psycopg" not in resp.text


async def test_malformed_traceparent_starts_a_fresh_trace(stack):
    resp = await stack.run(
        {"params": {"symbols": ["AAPL"]}}, headers={"traceparent": "garbage-trace"}
    )
    assert resp.status_code == 200
    assert len(resp.json()["meta"]["trace_id"]) == 32
    assert resp.headers["traceparent"].split("-")[1] == resp.json()["meta"]["trace_id"]


async def test_request_id_is_made_when_absent_and_echoed(stack):
    resp = await stack.http.get("/health")
    made = resp.headers["x-request-id"]
    assert made and resp.json()["meta"]["request_id"] == made
    resp = await stack.http.get("/health", headers={"X-Request-ID": "abc-123"})
    assert resp.headers["x-request-id"] == "abc-123"
    assert resp.json()["meta"]["request_id"] == "abc-123"


async def test_health_ready_and_openapi(stack):
    health = (await stack.http.get("/health")).json()
    assert health["success"] and health["data"] == {"status": "ok"}
    ready = await stack.http.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["data"]["checks"] == {
        "temporal": "ok",
        "search_attributes": "ok",
        "database": "ok",
    }
    spec = (await stack.http.get("/openapi.json")).json()
    for path in (
        "/tasks/{code}/run",
        "/tasks/{task_id}",
        "/tasks/{task_id}/cancel",
        "/health",
        "/ready",
    ):
        assert path in spec["paths"]


async def test_ready_is_503_when_temporal_is_unreachable(make_stack, base_settings):
    from tests.conftest import serve_api, settings_with

    settings = settings_with(base_settings, temporal={"address": "127.0.0.1:1"})
    server, task, url = await serve_api(settings, None)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            resp = await http.get("/ready")
            assert resp.status_code == 503
            assert resp.json()["error"]["code"] == "NOT_READY"
            assert "temporal" in resp.json()["error"]["message"]
            run = await http.post("/tasks/pull_stock_quotes/run", json={})
            assert run.status_code == 503 and "127.0.0.1:1" in run.json()["error"]["message"]
    finally:
        server.should_exit = True
        await task


async def test_unknown_route_gets_the_envelope(stack):
    resp = await stack.http.get("/nope")
    assert resp.status_code == 404
    assert_envelope(resp.json())
    assert resp.json()["error"]["code"] == "NOT_FOUND"


async def test_status_of_a_running_task_has_progress_and_steps(make_stack):
    stack = await make_stack()
    await stack.fault("latency", latency_ms=50)
    try:
        task_id = new_task_id()
        await stack.run(
            {"meta": {"task_id": task_id}, "params": {"symbols": ["AAPL"], "page_size": 1}},
            mode="async",
        )
        data = await stack.wait_status(task_id, {"running"})
        p = data["progress"]
        assert p["stage"] in ("step_prepare", "step_fetch")
        assert [s["id"] for s in p["steps"]] == [
            "step_prepare",
            "step_fetch",
            "step_process",
            "step_emit",
            "step_finalize",
        ]
        for key in ("current", "total", "pages", "records_fetched", "records_emitted"):
            assert key in p
        await stack.http.post(f"/tasks/{task_id}/cancel")
        await stack.wait_status(task_id)
    finally:
        await stack.fault("latency", latency_ms=0)


async def test_a_request_cannot_point_a_run_at_a_host_outside_the_allow_list(stack):
    """No SSRF: params, output and callback URLs from a request name allowed hosts only."""
    before = (await stack.samples_http.get("/_stats")).json()
    cases = [
        (
            {"params": {"symbols": ["A"], "base_url": "http://169.254.169.254/latest/meta-data"}},
            "params.base_url",
            "169.254.169.254",
        ),
        (
            {
                "params": {"symbols": ["A"]},
                "output": {"sinks": ["http"], "http_endpoint": "http://10.0.0.7:8080/collect"},
            },
            "output.http_endpoint",
            "10.0.0.7",
        ),
        (
            {
                "meta": {"run_id": "r1", "callback": {"base_url": "http://cron.elsewhere:80/runs"}},
                "params": {"symbols": ["A"]},
            },
            "meta.callback",
            "cron.elsewhere",
        ),
        (
            {
                "meta": {
                    "run_id": "r1",
                    "callback": {
                        "base_url": f"{stack.samples_url}/cronjob/runs",
                        "override_host": "192.168.1.9",
                    },
                },
                "params": {"symbols": ["A"]},
            },
            "meta.callback",
            "192.168.1.9",
        ),
    ]
    cases += [
        (
            {"params": {"symbols": ["A"]}, "output": {"http_headers": {"Traceparent": "x"}}},
            "output.http_headers",
            "Traceparent",
        ),
        (
            {
                "meta": {
                    "run_id": "r1",
                    "callback": {
                        "base_url": f"{stack.samples_url}/cronjob/runs",
                        "auth_header": "Host",
                    },
                },
                "params": {"symbols": ["A"]},
            },
            "meta.callback.auth_header",
            "Host",
        ),
    ]
    for body, field, host in cases:
        task_id = new_task_id()
        body.setdefault("meta", {})["task_id"] = task_id
        resp = await stack.run(body, mode="async")
        assert resp.status_code == 422, (field, resp.text)
        error = resp.json()["error"]
        assert error["code"] == "INVALID_INPUT"
        assert field in error["message"] and repr(host) in error["message"]
        if not field.endswith(("headers", "auth_header")):
            assert "security.allowed_hosts" in error["message"]
        assert (await stack.http.get(f"/tasks/{task_id}")).status_code == 404  # never started
    assert (await stack.samples_http.get("/_stats")).json() == before  # nothing fetched or sent
    # loopback (the default list) is fine, and a URL from config is trusted as it is
    ok = await stack.run({"params": {"symbols": ["A"], "base_url": stack.samples_url}})
    assert ok.status_code == 200 and ok.json()["data"]["status"] == "completed"


async def test_allowed_hosts_setting_opens_a_host(make_stack, samples):
    """A wildcard opens a partner's names; the name must resolve, and to an address the
    list admits (here the partner's name points at the sample sink on 127.0.0.1, which
    the IP entry admits)."""
    from tests.dnsstub import DnsStub

    dns = DnsStub().start()
    try:
        dns.set("feed.partner.example", ["127.0.0.1"])
        stack = await make_stack(
            security={
                "allowed_hosts": ["127.0.0.1", "*.partner.example"],
                "dns_server": dns.address,
            }
        )
        task_id = new_task_id()
        endpoint = f"http://feed.partner.example:{samples.port}/sink/partner"
        resp = await stack.run(
            {
                "meta": {"task_id": task_id},
                "params": {"symbols": ["A"]},
                "output": {"sinks": ["http"], "http_endpoint": endpoint},
            },
        )
        assert resp.status_code == 200, resp.text  # accepted: the host is on the list
        assert resp.json()["data"]["status"] == "completed", resp.text
        batches = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
        assert batches and {b["name"] for b in batches} == {"partner"}
        refused = await stack.run(
            {
                "params": {"symbols": ["A"]},
                "output": {"sinks": ["http"], "http_endpoint": "http://partner.example.evil/in"},
            },
        )
        assert refused.status_code == 422
    finally:
        dns.stop()


def test_the_api_keeps_an_idle_connection_for_server_keep_alive_s(tmp_path):
    """`artemis api` holds an idle keep-alive connection for `server.keep_alive_s`, not
    uvicorn's 5 s: a pooled client (or a balancer with a longer idle timeout) that sends
    on it after 5 s gets an answer, not a closed connection."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from infra.devserver import _die_with, port_open
    from tests.conftest import ROOT
    from tests.helpers import quiet_port, stop_processes

    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    def answered(sock: socket.socket) -> bytes:
        """The status line and headers of the answer to one request (its body read too)."""
        sock.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(4096)
            if not chunk:
                return got  # closed by the server
            got += chunk
        head, body = got.split(b"\r\n\r\n", 1)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += sock.recv(4096)
        return head

    procs: list[subprocess.Popen] = []

    def start(keep_alive_s: int) -> int:
        port = quiet_port()
        config = tmp_path / f"ka{keep_alive_s}.yaml"
        config.write_text(
            f"database: {{url: 'sqlite:///{tmp_path}/ka{keep_alive_s}.db'}}\n"
            f"server: {{keep_alive_s: {keep_alive_s}}}\n"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "starter.cli", "api", "--config", str(config)]
                + ["--port", str(port)],
                env={**os.environ, "COOKIE_MASTER_KEY": "k" * 48},
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with(os.getpid()),
            )
        )
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", port):
            assert procs[-1].poll() is None, "artemis api exited"
            assert time.monotonic() < deadline, "artemis api did not listen within 60 s"
            time.sleep(0.1)
        return port

    try:
        long_port, short_port = start(30), start(1)
        with socket.create_connection(("127.0.0.1", long_port), timeout=30) as kept:
            with socket.create_connection(("127.0.0.1", short_port), timeout=30) as dropped:
                assert answered(kept).startswith(b"HTTP/1.1 200")
                assert answered(dropped).startswith(b"HTTP/1.1 200")
                # The short one is closed by the server once idle for its second...
                dropped.settimeout(20)
                assert dropped.recv(1) == b""
                # ... while the long one, idle past uvicorn's own 5 s, still answers.
                time.sleep(6)
                assert answered(kept).startswith(b"HTTP/1.1 200")
    finally:
        stop_processes(*procs)


async def test_the_answer_names_the_params_task_defaults_gave(stack):
    resp = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"symbols": ["DEF"]}}, mode="async"
    )
    assert resp.status_code == 202, resp.text
    applied = resp.json()["data"]["defaults_applied"]
    # the suite's task_defaults.pull_stock_quotes, less what the request gave
    assert applied == ["base_url", "end", "page_size", "start"], applied
    await stack.wait_status(resp.json()["data"]["task_id"])
