"""Bounded knobs and the low findings of the second security review, each on real
processes with the input that shows it:

- every number a request sets is finite and bounded: ``outage_tolerance_s: 1e308``,
  ``Infinity`` and ``NaN`` are 422 naming the field (so are ``meta.timeout_s`` and a
  rate limit's ``qps``);
- event streams are capped per token and per process (the 20th stream of one token is
  refused), a slot comes back when its stream ends (the client leaves, the run ends),
  and a stream ends at its maximum lifetime while its run goes on;
- an answer's long error body reaches the run's error only as a short, redacted excerpt;
- a request may not set ``Cookie``, ``Proxy-Authorization`` or ``X-Forwarded-*``;
- CORS answers on the codec routes only;
- an ``X-Request-ID`` that is not a plain token is replaced by a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from artemis_samples.server import ThreadedServer
from tests.conftest import new_task_id
from tests.e2e.test_completeness import generic_doc
from tests.e2e.test_events import read_sse
from tests.e2e.test_literature import harvest_source, import_doc
from tests.helpers import eventually

JSON = {"Content-Type": "application/json"}


def _fields(resp: httpx.Response) -> set[str]:
    error = resp.json()["error"]
    return {f["field"] for f in error.get("fields") or []} | {error["message"]}


def _names(resp: httpx.Response, field: str) -> bool:
    return any(field in f for f in _fields(resp))


async def test_numbers_a_request_sets_are_finite_and_bounded(make_stack):
    stack = await make_stack(worker=False)

    async def start(code: str, text: str) -> httpx.Response:
        # raw JSON text: Python's JSON reader takes NaN and Infinity, as a client may send
        return await stack.http.post(
            f"/tasks/{code}/run", params={"mode": "async"}, content=text.encode(), headers=JSON
        )

    for bad in ("1e308", "Infinity", "-Infinity", "NaN", "86401"):
        for wrapper in ("params", "body"):
            resp = await start(
                "pull_stock_quotes",
                f'{{"{wrapper}": {{"symbols": ["A"], "outage_tolerance_s": {bad}}}}}',
            )
            assert resp.status_code == 422, (bad, wrapper, resp.text)
            assert resp.json()["error"]["code"] == "INVALID_INPUT"
            assert _names(resp, "outage_tolerance_s"), resp.text
        crawl = await start(
            "crawl_notes",
            f'{{"params": {{"platform": "sample", "keywords": ["k"], '
            f'"outage_tolerance_s": {bad}}}}}',
        )
        assert crawl.status_code == 422 and _names(crawl, "outage_tolerance_s"), crawl.text
        literature = await start(
            "literature_harvest",
            f'{{"params": {{"provenance": "pubmed", "outage_tolerance_s": {bad}}}}}',
        )
        assert literature.status_code == 422, literature.text
        assert _names(literature, "outage_tolerance_s"), literature.text
        # a run's deadline is at most 30 days
        over = "2592001" if bad == "86401" else bad
        deadline = await start(
            "pull_stock_quotes", f'{{"meta": {{"timeout_s": {over}}}, "params": {{}}}}'
        )
        assert deadline.status_code == 422 and _names(deadline, "meta.timeout_s"), deadline.text
    pct = await start(
        "literature_harvest",
        '{"params": {"provenance": "pubmed", "completeness_tolerance_pct": NaN}}',
    )
    assert pct.status_code == 422 and _names(pct, "completeness_tolerance_pct"), pct.text

    # a day is the most an outage is waited out
    task_id = new_task_id()
    ok = await start(
        "pull_stock_quotes",
        f'{{"meta": {{"task_id": "{task_id}"}}, '
        f'"params": {{"symbols": ["A"], "outage_tolerance_s": 86400}}}}',
    )
    assert ok.status_code == 202, ok.text
    for bad in ("1e308", "Infinity", "NaN"):
        rate = await stack.http.post(
            f"/tasks/{task_id}/rate-limit", content=f'{{"qps": {bad}}}'.encode(), headers=JSON
        )
        assert rate.status_code == 422 and _names(rate, "qps"), (bad, rate.text)
    await stack.client.get_workflow_handle(ok.json()["data"]["workflow_id"]).terminate("test")


TOKENS = {"a": "stream-client-a-0123456789", "b": "stream-client-b-0123456789"}


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


class Streams:
    """Event streams held open (each its own connection) until closed or ended."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(30, read=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self.open: dict[str, list[httpx.Response]] = {}

    async def open_one(self, who: str, task_id: str) -> httpx.Response:
        """Open a stream; a 200 is kept open, anything else is read whole and returned."""
        request = self.http.build_request("GET", f"/tasks/{task_id}/events", headers=_auth(who))
        resp = await self.http.send(request, stream=True)
        if resp.status_code == 200:
            self.open.setdefault(who, []).append(resp)
        else:
            await resp.aread()
            await resp.aclose()
        return resp

    async def close_one(self, who: str) -> None:
        await self.open[who].pop().aclose()

    async def read_to_end(self, who: str) -> None:
        """Each open stream of ``who`` read until the server ends it."""
        for resp in self.open.pop(who, []):
            async for _ in resp.aiter_bytes():
                pass
            await resp.aclose()

    async def aclose(self) -> None:
        for streams in self.open.values():
            for resp in streams:
                await resp.aclose()
        await self.http.aclose()


async def _pending_run(stack, who: str) -> tuple[str, str]:
    """(task id, workflow id) of a run no worker picks up: its stream stays open."""
    resp = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"symbols": ["SSE"]}},
        mode="async",
        headers=_auth(who),
    )
    assert resp.status_code == 202, resp.text
    return resp.json()["data"]["task_id"], resp.json()["data"]["workflow_id"]


async def test_event_streams_are_capped_per_token_and_per_process(make_stack):
    stack = await make_stack(
        worker=False,
        server={
            "api_tokens": [{"name": n, "token": t, "role": "client"} for n, t in TOKENS.items()],
            "sse_max_streams": 20,
        },
    )
    a_task, a_workflow = await _pending_run(stack, "a")
    b_task, b_workflow = await _pending_run(stack, "b")
    streams = Streams(stack.api_url)
    try:
        # one token: 16 streams (server.sse_max_streams_per_token), then refused
        answers = [await streams.open_one("a", a_task) for _ in range(20)]
        assert [r.status_code for r in answers] == [200] * 16 + [429] * 4
        twentieth = answers[-1].json()["error"]
        assert twentieth["code"] == "TOO_MANY_REQUESTS"
        assert "sse_max_streams_per_token" in twentieth["message"]
        # another token has streams of its own, up to what the process serves in all
        for _ in range(4):
            assert (await streams.open_one("b", b_task)).status_code == 200
        full = await streams.open_one("b", b_task)
        assert full.status_code == 429 and "server.sse_max_streams)" in full.text, full.text

        # a client that leaves gives its slot back
        await streams.close_one("a")

        async def b_gets_one() -> bool:
            return (await streams.open_one("b", b_task)).status_code == 200

        await eventually(b_gets_one, "the slot of a closed stream", timeout=30)

        # a run that ends ends its streams, and their slots come back
        await stack.client.get_workflow_handle(a_workflow).terminate("test")
        await asyncio.wait_for(streams.read_to_end("a"), 30)
        answers = [await streams.open_one("b", b_task) for _ in range(12)]
        assert [r.status_code for r in answers] == [200] * 11 + [429]
        assert "sse_max_streams_per_token" in answers[-1].text
    finally:
        await streams.aclose()
        await stack.client.get_workflow_handle(b_workflow).terminate("test")


async def test_an_event_stream_ends_at_its_lifetime_and_resumes(make_stack):
    stack = await make_stack(worker=False, server={"sse_max_lifetime_s": 1.0})
    resp = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"symbols": ["LIFE"]}}, mode="async"
    )
    assert resp.status_code == 202, resp.text
    task_id, workflow_id = resp.json()["data"]["task_id"], resp.json()["data"]["workflow_id"]
    try:
        began = time.monotonic()
        first = await asyncio.wait_for(read_sse(stack.api_url, task_id), 30)
        assert time.monotonic() - began >= 1.0
        assert all(e["event"] not in ("complete", "error", "cancelled") for e in first)
        status = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]["status"]
        assert status in ("pending", "running"), status
        # the client reconnects after the last id it got, and is served again
        last = first[-1]["_sse"] if first else None
        again = await asyncio.wait_for(read_sse(stack.api_url, task_id, last_event_id=last), 30)
        assert all(e["event"] not in ("complete", "error", "cancelled") for e in again)
    finally:
        await stack.client.get_workflow_handle(workflow_id).terminate("test")


@pytest.fixture(scope="module")
def verbose_source():
    """A source whose error answer is 2 MiB long and echoes the request's API key just
    before the 160th character, so that the key runs across a short excerpt's end."""
    app = FastAPI()

    @app.get("/items")
    async def items(request: Request):
        key = request.query_params.get("api_key", "")
        return PlainTextResponse("~" * 140 + key + "^" * (2 << 20) + "TAIL", 400)

    server = ThreadedServer(app).start()
    yield server
    server.stop()


async def test_a_long_error_body_reaches_the_run_only_as_a_short_redacted_excerpt(
    stack, verbose_source, monkeypatch
):
    code = f"verbose_{new_task_id()[-6:]}"
    secret = f"LONG-ERROR-KEY-{new_task_id()}"
    monkeypatch.setenv("VERBOSE_KEY", secret)
    doc = generic_doc(code, verbose_source.url)
    doc["credential"] = [
        {
            "scope_code": "SOURCE",
            "credential_name": "k",
            "auth_type_code": "API_KEY_QUERY",
            "param_or_header_name": "api_key",
            "secret_env": "VERBOSE_KEY",
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
    message = data["error"]["message"]
    assert "answered 400" in message
    # the key, whole or its start, is nowhere: redacted inside the window, then cut
    assert secret not in resp.text and secret[:12] not in resp.text
    assert "***REDACTED***"[:6] in message
    # a short excerpt: the 140 characters before the key and at most a few after it
    assert message.count("~") == 140 and message.count("^") < 20 and "TAIL" not in message
    stored = (await stack.http.get(f"/tasks/{task_id}")).text
    assert secret[:12] not in stored and "^" * 20 not in stored


async def test_a_request_may_not_set_cookie_proxy_or_forwarded_headers(make_stack):
    stack = await make_stack(worker=False)
    endpoint = f"{stack.samples_url}/sink/t"
    for name in ("Cookie", "proxy-authorization", "X-Forwarded-For", "x-forwarded-host"):
        resp = await stack.run(
            {
                "params": {"symbols": ["HDR"]},
                "output": {
                    "http_endpoint": endpoint,
                    "http_headers": {name: "value-of-sixteen-characters-or-more"},
                },
            },
            mode="async",
        )
        assert resp.status_code == 422, (name, resp.text)
        assert _names(resp, "output.http_headers") and name in resp.text, resp.text
    cb = {
        "base_url": f"{stack.samples_url}/cronjob/runs",
        "auth_header": "Cookie",
        "auth_token": "callback-token-0123456789",
    }
    resp = await stack.run(
        {"meta": {"run_id": "r-cookie", "callback": cb}, "params": {"symbols": ["HDR"]}},
        mode="async",
    )
    assert resp.status_code == 422 and _names(resp, "meta.callback.auth_header"), resp.text


async def test_cors_answers_on_the_codec_routes_only(make_stack):
    stack = await make_stack(worker=False, temporal={"payload_encryption": True})
    origin = stack.settings.temporal.ui_url
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    codec = await stack.http.options("/codec/decode", headers=preflight)
    assert codec.status_code == 200, codec.text
    assert codec.headers["access-control-allow-origin"] == origin
    called = await stack.http.post(
        "/codec/decode", json={"payloads": []}, headers={"Origin": origin}
    )
    assert called.status_code == 200 and called.headers["access-control-allow-origin"] == origin
    for method, path in (("OPTIONS", "/tasks"), ("OPTIONS", "/tasks/pull_stock_quotes/run")):
        resp = await stack.http.request(method, path, headers=preflight)
        assert "access-control-allow-origin" not in resp.headers, (path, resp.headers)
    listed = await stack.http.get("/tasks", headers={"Origin": origin})
    assert listed.status_code == 200
    assert not any(h.startswith("access-control-") for h in listed.headers)


async def test_an_x_request_id_that_is_not_a_plain_token_is_replaced(make_stack):
    stack = await make_stack(worker=False)
    fresh = re.compile(r"[0-9a-f]{32}")
    kept = await stack.http.get("/health", headers={"X-Request-ID": "cron-42_a.b:c"})
    assert kept.headers["x-request-id"] == "cron-42_a.b:c"
    for bad in ("two words", "x" * 129, "<img src=x onerror=alert(1)>", "a`b", "${jndi:x}"):
        resp = await stack.http.get("/health", headers={"X-Request-ID": bad})
        assert resp.status_code == 200, (bad, resp.text)
        assert fresh.fullmatch(resp.headers["x-request-id"]), (bad, resp.headers)
    resp = await stack.http.get("/tasks", headers={"X-Request-ID": b"caf\xc3\xa9"})
    assert resp.status_code == 200 and fresh.fullmatch(resp.json()["meta"]["request_id"])

    # what a run carries (its Temporal details, its outgoing requests) is the new id
    evil = "<b>evil</b> `id`"
    started = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"symbols": ["RID"]}},
        mode="async",
        headers={"X-Request-ID": evil},
    )
    assert started.status_code == 202, started.text
    given = started.headers["x-request-id"]
    assert fresh.fullmatch(given)
    handle = stack.client.get_workflow_handle(started.json()["data"]["workflow_id"])
    details = await (await handle.describe()).static_details()
    assert details and given in details and "evil" not in details
    history = await handle.fetch_history()
    assert "evil" not in history.to_json()
    with contextlib.suppress(Exception):
        await handle.terminate("test")
