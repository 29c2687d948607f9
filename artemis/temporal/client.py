"""The one place that builds Temporal clients (worker, starter API, CLI, tests), and the
check of the namespace's search attributes they need."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.failure.v1 import Failure
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, TLSConfig
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.converter import DataConverter, DefaultFailureConverter, PayloadConverter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.run_models import SEARCH_ATTRIBUTES
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


# -- the namespace's search attributes ------------------------------------------------------
# A run starts with ArtemisTaskCode, ArtemisTaskId and ArtemisOwner (and ArtemisRunId) and
# sets ArtemisProvenance and ArtemisTaskType itself: Temporal refuses a start naming an
# attribute the namespace lacks, and fails (for ever) the workflow task that sets one.
SEARCH_ATTRIBUTE_TYPE = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
# How long a check's answer stands before a start that found attributes missing asks
# again (a burst of refused starts asks Temporal once).
SEARCH_ATTRIBUTES_RECHECK_S = 1.0


def search_attribute_command(namespace: str, name: str) -> str:
    """The command that registers ``name`` as Artemis needs it."""
    return (
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {name} --type Keyword"
    )


async def search_attribute_problems(client: Client) -> dict[str, str]:
    """Artemis' search attributes (``SEARCH_ATTRIBUTES``) that ``client``'s namespace
    lacks or holds with another type than Keyword: {name: what is wrong}. Raises
    RPCError when Temporal does not answer the list (unreachable, no permission)."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    known = {**listed.system_attributes, **listed.custom_attributes}
    problems: dict[str, str] = {}
    for name in SEARCH_ATTRIBUTES:
        if name not in known:
            problems[name] = "not registered"
        elif known[name] != SEARCH_ATTRIBUTE_TYPE:
            kind = IndexedValueType.Name(known[name]).removeprefix("INDEXED_VALUE_TYPE_")
            problems[name] = f"registered as {kind.title()}, not Keyword"
    return problems


def search_attributes_error(namespace: str, problems: dict[str, str]) -> ArtemisError:
    """CONFIG_ERROR naming each attribute and the command that fixes it (one with another
    type is removed first: Temporal does not change an attribute's type)."""
    fixes = []
    for name, problem in problems.items():
        create = search_attribute_command(namespace, name)
        if problem != "not registered":
            create = (
                f"temporal operator search-attribute remove --namespace {namespace} "
                f"--name {name} --yes && {create}"
            )
        fixes.append(f"{name} ({problem}): `{create}`")
    return ArtemisError(
        ErrorCode.CONFIG_ERROR,
        f"Temporal namespace {namespace!r} lacks the search attributes runs need, so no run "
        "can start: " + "; ".join(fixes),
        details={"search_attributes": problems},
        # the service cannot start runs until the namespace is set up: unavailable
        http_status=503,
    )


class SearchAttributeCheck:
    """The namespace's search attributes as last checked (the API's ``/ready`` and its
    starts, the worker's start-up). Checked again when ``/ready`` is asked and when a
    start meets missing attributes, so that registering them heals without a restart."""

    def __init__(self, client: Client) -> None:
        self.client = client
        # {name: problem} as last checked (None: not checked, or the check failed)
        self.problems: dict[str, str] | None = None
        self.unchecked: str | None = None  # why the last check could not run
        self._checked_at = float("-inf")
        self._lock = asyncio.Lock()

    async def refresh(self, max_age_s: float = 0.0) -> dict[str, str] | None:
        """Check again (unless checked within ``max_age_s``): the problems, or None when
        Temporal did not answer the list (``unchecked`` says why)."""
        async with self._lock:  # concurrent callers share one check
            if time.monotonic() - self._checked_at < max_age_s:
                return self.problems
            try:
                self.problems = await search_attribute_problems(self.client)
                self.unchecked = None
            except RPCError as e:
                self.problems, self.unchecked = None, e.status.name if e.status else "RPCError"
            self._checked_at = time.monotonic()
            return self.problems

    def error(self) -> ArtemisError | None:
        """CONFIG_ERROR for the problems last found (None: none found)."""
        if not self.problems:
            return None
        return search_attributes_error(self.client.namespace, self.problems)

    async def require(self) -> None:
        """Before a start: CONFIG_ERROR naming the missing attributes and their commands.
        Once all were found, no call to Temporal; otherwise checked again (at most once a
        second). A check Temporal did not answer lets the start go on: Temporal itself
        then refuses what it must (``after_refusal``)."""
        if self.problems == {}:
            return
        await self.refresh(SEARCH_ATTRIBUTES_RECHECK_S)
        error = self.error()
        if error is not None:
            raise error

    async def after_refusal(self, e: BaseException) -> ArtemisError | None:
        """A start Temporal refused with ``e``: CONFIG_ERROR when the namespace lacks a
        search attribute (checked again now: the one refusal that is the operator's to
        fix), else None."""
        refusals = (RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.FAILED_PRECONDITION)
        if not (isinstance(e, RPCError) and e.status in refusals):
            return None
        await self.refresh()
        return self.error()
