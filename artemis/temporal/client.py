"""The one place that builds Temporal clients (worker, starter API, CLI, tests)."""

from __future__ import annotations

from pathlib import Path

from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, TLSConfig
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.converter import DataConverter, DefaultFailureConverter, PayloadConverter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.temporal.codec import FernetPayloadCodec, codec_for
from artemis.temporal.converter import ArtemisPayloadConverter
from artemis.tracing import exporting, setup_telemetry


class OperatorFailureConverter(DefaultFailureConverter):
    """Failures as an operator reads them in the Temporal UI: the error code (the failure
    type) and the message, without the SDK's stack trace and the worker's local paths
    (the worker's log keeps the traceback of every failed activity)."""

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        cur: Failure | None = failure
        while cur is not None:
            cur.stack_trace = ""
            cur = cur.cause if cur.HasField("cause") else None


def data_converter(codec: FernetPayloadCodec | None = None) -> DataConverter:
    """The data converter of every client (and of the replay tests): dataclass decoding
    with cached type hints (artemis/temporal/converter.py), the optional payload
    encryption, failures without stack traces."""
    return DataConverter(
        payload_converter_class=ArtemisPayloadConverter,
        payload_codec=codec,
        failure_converter_class=OperatorFailureConverter,
    )


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


_runtimes: dict[str, Runtime] = {}


def sdk_runtime(settings: Settings) -> Runtime | None:
    """A Temporal runtime exporting the SDK's own metrics (workflow/activity task slots,
    poll and schedule-to-start latencies, …) for Prometheus on ``metrics.sdk_port``.
    One per address per process: the runtime owns the exporter's listening socket."""
    m = settings.metrics
    if not m.enabled or m.sdk_port is None:
        return None
    bind = f"{m.host}:{m.sdk_port}"
    if bind not in _runtimes:
        _runtimes[bind] = Runtime(
            telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind))
        )
    return _runtimes[bind]


async def connect(settings: Settings) -> Client:
    setup_telemetry(settings.telemetry)
    t = settings.temporal
    tls: TLSConfig | bool = False
    if t.tls.enabled:
        tls = TLSConfig(
            server_root_ca_cert=_read(t.tls.server_root_ca_cert),
            client_cert=_read(t.tls.client_cert),
            client_private_key=_read(t.tls.client_private_key),
            domain=t.tls.domain,
        )
    elif t.api_key:
        tls = True  # Temporal Cloud API keys require TLS
    try:
        return await Client.connect(
            t.address,
            namespace=t.namespace,
            tls=tls,
            api_key=t.api_key,
            # Temporal's spans (workflow, activity, signal…) only when they are exported:
            # with ``exporter: none`` the interceptor's unsampled spans and the header it
            # writes on every command reach no one, and cost 4–8 ms of the worker's CPU and
            # 3–9 ms of Temporal's a small run (docs/performance.md). The
            # run's own trace (traceparent to sources, sinks and the CronJob) rides in the
            # activities' inputs either way (artemis/tracing.py).
            interceptors=[TracingInterceptor()] if exporting(settings.telemetry) else [],
            runtime=sdk_runtime(settings),
            data_converter=data_converter(codec_for(settings)),
        )
    except Exception as e:  # the SDK raises RuntimeError with the gRPC detail
        raise ArtemisError(
            ErrorCode.NOT_READY,
            f"cannot reach Temporal at {t.address} (namespace {t.namespace}): {e}",
        ) from None
