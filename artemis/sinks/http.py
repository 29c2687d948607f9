"""HTTP sink: POST each batch as a JSON array with trace and idempotency headers."""

from __future__ import annotations

from typing import Any

from artemis import jsonio
from artemis.errors import ErrorCode
from artemis.http import HttpClient, status_error
from artemis.logsetup import get_logger
from artemis.sinks.base import EmitContext, Sink, shown_url
from artemis.transport_errors import TransportError, transport_error

log = get_logger(__name__)


class HttpSink(Sink):
    name = "http"

    def __init__(
        self, endpoint: str, headers: dict[str, str] | None = None, guarded: bool = False
    ) -> None:
        self.endpoint = endpoint
        self.headers = headers or {}
        # A request's endpoint (not the operator's): its connections go through the
        # guarded client, which checks the address each one is made to.
        self.guarded = guarded

    async def emit(
        self, client: HttpClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        span = ctx.trace.child()
        headers = {
            **self.headers,
            "Content-Type": "application/json",
            "traceparent": span.traceparent(),
            "Idempotency-Key": ctx.idempotency_key(self.name),
        }
        if ctx.request_id:
            headers["X-Request-ID"] = ctx.request_id
        body = jsonio.dumps(records)
        what = f"http sink POST {shown_url(self.endpoint)} (batch {ctx.seq})"
        try:
            if self.guarded:
                client = client.guarded()
            resp = await client.post(self.endpoint, body=body, headers=headers)
        except TransportError as e:
            raise transport_error(ErrorCode.SINK_ERROR, what, e) from None
        if resp.status_code >= 300:
            # A 4xx means the sink refuses this batch: no retry can help (SINK_ERROR, final).
            raise status_error(ErrorCode.SINK_ERROR, what, resp)
        log.debug(
            "sink_batch_delivered",
            sink=self.name,
            seq=ctx.seq,
            records=len(records),
            status=resp.status_code,
            span_id=span.span_id,
        )


class LogSink(Sink):
    """Writes one log line per batch: for trying a task without a receiver."""

    name = "log"

    async def emit(
        self, client: HttpClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        log.info(
            "log_sink_batch",
            seq=ctx.seq,
            records=len(records),
            first=records[0] if records else None,
        )
