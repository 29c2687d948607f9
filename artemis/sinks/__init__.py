"""Sinks receive processed records, one batch at a time, idempotently."""

from artemis.sinks.base import EmitContext, Sink, build_sinks
from artemis.sinks.http import HttpSink, LogSink

__all__ = ["EmitContext", "HttpSink", "LogSink", "Sink", "build_sinks"]
