"""W3C trace context parsing and the logging chain (fields, redaction, rotation)."""

from __future__ import annotations

import json
import logging

from artemis.config import LoggingSettings
from artemis.logsetup import configure_logging, get_logger
from artemis.redact import redact_text, register_secret
from artemis.tracing import extract_trace, parse_traceparent


def test_valid_traceparent_keeps_trace_and_makes_child_span():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ctx = extract_trace(tp)
    assert ctx.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert ctx.parent_span_id == "00f067aa0ba902b7"
    assert ctx.span_id != "00f067aa0ba902b7" and len(ctx.span_id) == 16
    child = ctx.child()
    assert child.trace_id == ctx.trace_id and child.span_id != ctx.span_id
    assert child.traceparent().startswith(f"00-{ctx.trace_id}-")


def test_malformed_traceparents_start_fresh_traces():
    for bad in (
        None,
        "",
        "garbage",
        "00-xyz-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ):
        assert parse_traceparent(bad) is None
        ctx = extract_trace(bad)
        assert len(ctx.trace_id) == 32 and ctx.parent_span_id is None
    assert extract_trace("garbage").trace_id != extract_trace("garbage").trace_id


def test_redaction_of_cookies_tokens_and_registered_secrets():
    register_secret("tok-very-secret-123")
    assert "abc" not in redact_text("Cookie: web_session=abc; other=1")
    assert redact_text('{"cookie_value": "abc"}') == '{"cookie_value": "***REDACTED***"}'
    assert "tok-very-secret-123" not in redact_text("sent tok-very-secret-123 upstream")
    assert "sekrit" not in redact_text("Authorization: Bearer sekrit")


def test_json_lines_carry_fixed_fields_and_rotate(tmp_path):
    path = tmp_path / "x.log"
    settings = LoggingSettings(
        format="json", output="file", file={"path": str(path), "max_size_mb": 1, "max_backups": 2}
    )
    try:
        configure_logging(settings, force=True)
        log = get_logger("test")
        log.info("hello", task_code="t", cookie_value="plain-cookie")
        logging.getLogger("httpx").warning("GET https://x/?q=1 web_session=leak")
        try:
            raise ValueError("boom web_session=inside-traceback")
        except ValueError:
            log.exception("failed")
        big = "x" * 2000
        for _ in range(1200):
            log.info("fill", pad=big)
        lines = [json.loads(line) for line in path.with_suffix(".log.2").read_text().splitlines()]
        first = lines[0]
        for field in (
            "timestamp",
            "level",
            "logger",
            "caller",
            "event",
            "trace_id",
            "span_id",
            "request_id",
            "task_code",
            "task_id",
            "workflow_id",
        ):
            assert field in first
        assert first["event"] == "hello" and first["cookie_value"] == "***REDACTED***"
        text = path.with_suffix(".log.2").read_text()
        assert "leak" not in text and "inside-traceback" not in text
        failed = next(line for line in lines if line["event"] == "failed")
        assert "ValueError" in failed["error"] and "exception" in failed
        assert not path.with_suffix(".log.3").exists()  # max_backups = 2
    finally:
        from artemis.config import LoggingSettings as LS

        configure_logging(LS(), force=True)
