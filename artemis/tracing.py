"""W3C trace context: an inbound ``traceparent`` is read, and outbound ones are
written, by OpenTelemetry's own W3C propagator (malformed → a fresh trace); each outbound
hop gets a child span id; and the OpenTelemetry SDK is set up here.

``TraceContext`` is the plain form of a span context that crosses the Temporal boundary
(activities' arguments are dataclasses; an OpenTelemetry context is not serialisable)."""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from artemis.config import TelemetrySettings

_PROPAGATOR = TraceContextTextMapPropagator()
_IDS = RandomIdGenerator()


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    sampled: bool = True

    def span_context(self) -> SpanContext:
        return SpanContext(
            trace_id=int(self.trace_id, 16),
            span_id=int(self.span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED if self.sampled else TraceFlags.DEFAULT),
        )

    def traceparent(self) -> str:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=otel_context_for(self))
        return carrier["traceparent"]

    def child(self) -> TraceContext:
        """A new span in the same trace (one per outbound hop)."""
        return TraceContext(self.trace_id, new_span_id(), self.span_id, self.sampled)


def new_trace_id() -> str:
    return trace.format_trace_id(_IDS.generate_trace_id())


def new_span_id() -> str:
    return trace.format_span_id(_IDS.generate_span_id())


def parse_traceparent(value: str | None) -> TraceContext | None:
    """The span an inbound ``traceparent`` names; None when absent or malformed."""
    if not value:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": value.strip()})
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return None
    return TraceContext(
        trace.format_trace_id(sc.trace_id),
        trace.format_span_id(sc.span_id),
        None,
        sc.trace_flags.sampled,
    )


def extract_trace(traceparent: str | None) -> TraceContext:
    """The context for a new request: a child of the inbound span, or a fresh trace."""
    parent = parse_traceparent(traceparent)
    if parent is None:
        return TraceContext(new_trace_id(), new_span_id())
    return TraceContext(parent.trace_id, new_span_id(), parent.span_id, parent.sampled)


_CURRENT: ContextVar[TraceContext] = ContextVar("artemis_trace")


def use_trace(ctx: TraceContext) -> Token[TraceContext]:
    """Make ``ctx`` the current span (the activity boundary does, per activity)."""
    return _CURRENT.set(ctx)


def current_trace() -> TraceContext:
    """The span of the run activity being executed (set by the worker's boundary)."""
    return _CURRENT.get()


_provider_installed: dict[str, object] = {}


def exporting(settings: TelemetrySettings) -> bool:
    """Whether spans go anywhere: telemetry on with an exporter other than ``none``."""
    return settings.enabled and settings.exporter != "none"


def setup_telemetry(settings: TelemetrySettings) -> None:
    """Install an OpenTelemetry TracerProvider once per process.

    ``exporter: none`` (or telemetry off) samples no span: nothing would be exported (the
    recording of spans was about 6 % of a worker's CPU on small runs, docs/performance.md),
    and Temporal's tracing interceptor is not installed then either
    (artemis/temporal/client.py).
    """
    if _provider_installed:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBasedTraceIdRatio

    sampler = {"always": ALWAYS_ON, "never": ALWAYS_OFF}.get(
        settings.sampling if exporting(settings) else "never",
        ParentBasedTraceIdRatio(settings.sampling_ratio),
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


def otel_context_for(ctx: TraceContext):  # noqa: ANN201
    """An OpenTelemetry context whose remote parent is ``ctx`` (for the starter's span)."""
    return trace.set_span_in_context(NonRecordingSpan(ctx.span_context()))
