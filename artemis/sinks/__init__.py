"""Sinks receive processed records, one batch at a time, idempotently.

``base``: the Sink contract; ``factory``: a run's output checked, resolved and built into
sinks; ``sealing``: the output's secrets kept out of workflow history; ``http``, ``sql``,
``files``: the sinks; ``records``: a task's record model as the sinks see it."""

from artemis.sinks.base import EmitContext, RunEnd, Sink
from artemis.sinks.factory import (
    LANES,
    build_sinks,
    check_request_output,
    check_sinks,
    lane_output,
    resolve_lanes,
    resolve_output,
    resolved_spec,
)
from artemis.sinks.http import HttpSink, LogSink
from artemis.sinks.records import RecordSpec
from artemis.sinks.sealing import register_sink_secret, seal_output, unseal_output

__all__ = [
    "LANES",
    "EmitContext",
    "HttpSink",
    "LogSink",
    "RecordSpec",
    "RunEnd",
    "Sink",
    "build_sinks",
    "check_request_output",
    "check_sinks",
    "lane_output",
    "register_sink_secret",
    "resolve_lanes",
    "resolve_output",
    "resolved_spec",
    "seal_output",
    "unseal_output",
]
