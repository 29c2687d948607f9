"""The CronJob callback client against a real recording server on 127.0.0.1."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from artemis.callback import (
    CallbackClient,
    CallbackTarget,
    CallingRun,
    FinalizeOutcome,
    finalize_body,
    resolve_base_url,
)
from artemis.config import CallbackSettings
from artemis.errors import ArtemisError
from artemis.tracing import extract_trace
from artemis_samples.app import create_app
from artemis_samples.server import ThreadedServer
from tests.helpers import http_client


@pytest.fixture(scope="module")
def cron():
    server = ThreadedServer(create_app()).start()
    yield server
    server.stop()


def test_finalize_bodies_are_exact():
    assert finalize_body("completed", {"b": 2, "a": 1}, None) == {
        "result": "success",
        "code": 200,
        "body": '{"a":1,"b":2}',
    }
    assert finalize_body("failed", {}, "SINK_ERROR: x") == {
        "result": "failed",
        "error_message": "SINK_ERROR: x",
    }
    assert finalize_body("cancelled", {}, "cancelled: r") == {
        "result": "failed",
        "error_message": "cancelled: r",
    }
    assert finalize_body("timeout", {}, "whatever") == {
        "result": "failed_timeout",
        "error_message": "callback_deadline_exceeded",
    }


def test_override_and_allow_list():
    s = CallbackSettings(override_host="10.1.2.3")
    t = CallbackTarget(caller_run_id="1", base_url="http://cron.internal:8080/api/runs/")
    assert resolve_base_url(t, s, ["10.1.2.3"]) == "http://10.1.2.3:8080/api/runs"
    t2 = CallbackTarget(
        caller_run_id="1",
        base_url="http://cron:8080/runs",
        override_port=9999,
        override_host="10.1.2.3",
    )
    assert resolve_base_url(t2, s, ["10.1.2.3"]) == "http://10.1.2.3:9999/runs"
    with pytest.raises(ArtemisError, match="security.allowed_hosts"):
        resolve_base_url(
            CallbackTarget(caller_run_id="1", base_url="http://evil:1/x"),
            CallbackSettings(),
            ["cron"],
        )
    with pytest.raises(ArtemisError, match="http"):
        resolve_base_url(
            CallbackTarget(caller_run_id="1", base_url="file:///etc/passwd"),
            CallbackSettings(),
            ["*"],
        )


async def test_progress_zero_total_is_not_sent_and_throttle_lets_the_last_through(cron):
    async with http_client() as http:
        await http.post(f"{cron.url}/_control/reset", json={})
        c = CallbackClient(
            CallbackTarget(caller_run_id="r9", base_url=f"{cron.url}/cronjob/runs"),
            CallbackSettings(progress_min_interval_ms=10_000),
            http,
            CallingRun(extract_trace(None), token="tkn-abcdef"),
            allowed_hosts=["127.0.0.1"],
        )
        last = await c.progress(1, 0, "nothing yet", None)
        assert last is None
        last = await c.progress(1, 10, "first", last)
        last = await c.progress(2, 10, "throttled", last)
        last = await c.progress(10, 10, "final", last)
        calls = (await http.get(f"{cron.url}/_cronjob/calls")).json()
        assert [c["body"]["message"] for c in calls] == ["first", "final"]
        assert all(c["token"] == "tkn-abcdef" for c in calls)


async def test_progress_failure_never_raises():
    async with http_client() as http:
        c = CallbackClient(
            CallbackTarget(caller_run_id="r", base_url="http://127.0.0.1:1/runs"),
            CallbackSettings(),
            http,
            CallingRun(extract_trace(None), token=None),
            allowed_hosts=["127.0.0.1"],
        )
        assert await c.progress(1, 2, "x", None) is not None
        outcome, detail = await c.finalize({"result": "success"}, 1)
        assert outcome == FinalizeOutcome.RETRY and "Connect" in detail


async def test_no_run_id_means_no_callback(cron):
    async with http_client() as http:
        await http.post(f"{cron.url}/_control/reset", json={})
        c = CallbackClient(
            CallbackTarget(caller_run_id=None, base_url=f"{cron.url}/cronjob/runs"),
            CallbackSettings(),
            http,
            CallingRun(extract_trace(None), token=None),
            allowed_hosts=["127.0.0.1"],
        )
        assert (await c.finalize({"result": "success"}, 1))[0] == FinalizeOutcome.SKIPPED
        assert (await http.get(f"{cron.url}/_cronjob/calls")).json() == []


def test_override_host_is_a_bare_host_and_the_built_url_is_what_is_checked():
    allowed = ["*.example.com"]
    for sneaky in ("169.254.169.254/x.example.com", "evil.org?.example.com", "a@b.example.com"):
        with pytest.raises(ArtemisError, match="override_host"):
            resolve_base_url(
                CallbackTarget(
                    caller_run_id="1", base_url="http://cron.example.com/runs", override_host=sneaky
                ),
                CallbackSettings(),
                allowed,
            )
    ok = CallbackTarget(
        caller_run_id="1", base_url="http://x/runs", override_host="cron.example.com"
    )
    assert resolve_base_url(ok, CallbackSettings(), allowed) == "http://cron.example.com/runs"


def test_reserved_headers_cannot_come_from_a_request():
    from artemis.security import check_header_names

    for name in (
        "Host",
        "idempotency-KEY",
        "Traceparent",
        "Content-Type",
        "Cookie",
        "Proxy-Authorization",
        "X-Forwarded-For",
        "x-forwarded-proto",
    ):
        with pytest.raises(ArtemisError, match=name):
            check_header_names([name], "output.http_headers")
    check_header_names(["X-Api-Key", "Authorization", "X-Forwarder"], "output.http_headers")


@pytest.fixture(scope="module")
def chatty_cron():
    """A CronJob that refuses a finalize with a 1 MiB reply echoing the callback token
    just before the 160th character."""
    app = FastAPI()

    @app.post("/runs/{run_id}/{kind}")
    async def reply(run_id: str, kind: str, request: Request) -> PlainTextResponse:
        token = request.headers.get("x-callback-token", "")
        return PlainTextResponse("#" * 150 + token + "=" * (1 << 20) + "TAIL", 400)

    server = ThreadedServer(app).start()
    yield server
    server.stop()


async def test_a_refused_finalize_keeps_a_short_redacted_excerpt_of_the_reply(chatty_cron):
    token = "finalize-token-0123456789"
    async with http_client() as http:
        c = CallbackClient(
            CallbackTarget(caller_run_id="r-chatty", base_url=f"{chatty_cron.url}/runs"),
            CallbackSettings(),
            http,
            CallingRun(extract_trace(None), token=token),
            allowed_hosts=["127.0.0.1"],
        )
        outcome, detail = await c.finalize({"result": "success"}, 1)
    assert outcome == FinalizeOutcome.REJECTED
    assert detail.startswith("HTTP 400: " + "#" * 150)
    assert token[:10] not in detail and "***RED" in detail
    assert len(detail) <= len("HTTP 400: ") + 160 and "TAIL" not in detail
