"""Sinks receive processed records, one batch at a time, idempotently."""

from artemis.sinks.base import EmitContext, RunEnd, Sink, build_sinks
from artemis.sinks.http import HttpSink, LogSink
from artemis.sinks.records import RecordSpec

__all__ = ["EmitContext", "HttpSink", "LogSink", "RecordSpec", "RunEnd", "Sink", "build_sinks"]
