"""The one place that builds Temporal clients (worker, starter API, CLI, tests)."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client, TLSConfig
from temporalio.contrib.opentelemetry import TracingInterceptor

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.tracing import setup_telemetry


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


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
            interceptors=[TracingInterceptor()],
        )
    except Exception as e:  # the SDK raises RuntimeError with the gRPC detail
        raise ArtemisError(
            ErrorCode.NOT_READY,
            f"cannot reach Temporal at {t.address} (namespace {t.namespace}): {e}",
        ) from None
