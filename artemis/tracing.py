"""W3C trace context (SPEC §6): parse an inbound ``traceparent`` (malformed → a fresh trace),
make child span ids for each outbound hop, and set up the OpenTelemetry SDK."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from artemis.config import TelemetrySettings

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    sampled: bool = True

    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"

    def child(self) -> TraceContext:
        """A new span in the same trace (one per outbound hop)."""
        return TraceContext(self.trace_id, new_span_id(), self.span_id, self.sampled)


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    return secrets.token_hex(8)


def parse_traceparent(value: str | None) -> TraceContext | None:
    """Parse ``00-<trace_id>-<span_id>-<flags>``; None when absent or malformed."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if not m:
        return None
    version, trace_id, span_id, flags = m.groups()
    if version == "ff" or set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    return TraceContext(trace_id, span_id, None, bool(int(flags, 16) & 1))


def extract_trace(traceparent: str | None) -> TraceContext:
    """The context for a new request: a child of the inbound span, or a fresh trace."""
    parent = parse_traceparent(traceparent)
    if parent is None:
        return TraceContext(new_trace_id(), new_span_id())
    return TraceContext(parent.trace_id, new_span_id(), parent.span_id, parent.sampled)


def trace_from_ids(trace_id: str | None, span_id: str | None = None) -> TraceContext:
    if trace_id and re.fullmatch(r"[0-9a-f]{32}", trace_id):
        return TraceContext(trace_id, span_id or new_span_id())
    return TraceContext(new_trace_id(), new_span_id())


_provider_installed: dict[str, object] = {}


def setup_telemetry(settings: TelemetrySettings) -> None:
    """Install an OpenTelemetry TracerProvider once per process.

    ``exporter: none`` still creates real spans (Temporal's interceptor needs them to carry
    context), it just exports nothing.
    """
    if _provider_installed:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBasedTraceIdRatio

    sampler = {"always": ALWAYS_ON, "never": ALWAYS_OFF}.get(
        settings.sampling, ParentBasedTraceIdRatio(settings.sampling_ratio)
    )
    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}), sampler=sampler
    )
    if settings.enabled and settings.exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif settings.enabled and settings.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # Without an endpoint the exporter reads OTEL_EXPORTER_OTLP_* from the environment.
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider_installed["provider"] = provider


def otel_context_for(ctx: TraceContext):
    """An OpenTelemetry context whose remote parent is ``ctx`` (for the starter's span)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    sc = SpanContext(
        trace_id=int(ctx.trace_id, 16),
        span_id=int(ctx.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if ctx.sampled else TraceFlags.DEFAULT),
    )
    return trace.set_span_in_context(NonRecordingSpan(sc))
