"""CronJob callback protocol (docs/api.md): throttled progress, finalize once.

Retries of finalize are not done here: the finalize activity's Temporal retry policy
(0.5 s, 1 s, 2 s; non-retryable on 4xx) is their home, so a worker crash between tries
loses nothing. This module sends one request per call and says what happened.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from artemis.config import CallbackSettings, SecuritySettings
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, HttpClient, body_excerpt
from artemis.logsetup import get_logger
from artemis.metrics import CALLBACKS
from artemis.redact import scoped
from artemis.run_models import FinalizeOutcome
from artemis.run_state import CallbackResult, verdict_of
from artemis.security import check_request_host, is_bare_host
from artemis.tracing import TraceContext
from artemis.transport_errors import AnswerTooLarge, TransportError

log = get_logger(__name__)


@dataclass
class CallbackTarget:
    """Where and how to call the CronJob back. Holds no secret: the token is looked up
    inside the activity (run secret or ``callback.default_token``)."""

    # The CronJob's id of the run (``meta.run_id`` on the wire; docs/architecture.md,
    # "Words": not Temporal's run id).
    caller_run_id: str | None
    base_url: str | None
    override_host: str | None = None
    override_port: int | None = None
    auth_header: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.caller_run_id) and bool(self.base_url)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def of(cls, data: dict[str, Any]) -> CallbackTarget:
        """A target from ``to_dict``'s shape; ``run_id``, the wire's name of the caller's
        run id, is taken as ``caller_run_id``."""
        data = dict(data)
        if "run_id" in data:
            data.setdefault("caller_run_id", data.pop("run_id"))
        return cls(**data)


def resolve_base_url(
    target: CallbackTarget, settings: CallbackSettings, allowed_hosts: list[str]
) -> str:
    """Apply override host/port (request first, then config) and check the allow-list
    (``Settings.callback_hosts()``: the callback URL comes from the request)."""
    assert target.base_url
    try:
        parts = urlsplit(target.base_url)
        parts.port  # noqa: B018  (raises on a port out of range)
    except ValueError as e:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT, f"meta.callback.base_url: not a valid URL ({e})"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"meta.callback.base_url: an http(s) URL, got {target.base_url!r}",
        )
    if target.override_host is not None and not is_bare_host(target.override_host):
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"meta.callback.override_host: a host name or IP address, got {target.override_host!r}",
        )
    host = target.override_host or settings.override_host or parts.hostname
    port = target.override_port or settings.override_port or parts.port
    check_request_host(host, allowed_hosts, "meta.callback", port or _default_port(parts.scheme))
    netloc = f"[{host}]" if ":" in host else host
    if port:
        netloc = f"{netloc}:{port}"
    url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    # What will actually be called is what was checked.
    check_request_host(
        urlsplit(url).hostname or "",
        allowed_hosts,
        "meta.callback",
        port or _default_port(parts.scheme),
    )
    return url


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


@dataclass
class CallingRun:
    """The run a callback speaks for: its trace, the token it sends (a secret: never
    logged), the request that started it, and ``run_key`` (`{code}/{task_id}`, the stem
    of every Idempotency-Key it sends; the caller's run id when absent)."""

    trace: TraceContext
    token: str | None = None
    request_id: str | None = None
    run_key: str | None = None


class CallbackClient:
    def __init__(
        self,
        target: CallbackTarget,
        settings: CallbackSettings,
        client: HttpClient,
        run: CallingRun,
        allowed_hosts: list[str] | None = None,
    ) -> None:
        self.target = target
        self.run_key = run.run_key or str(target.caller_run_id)
        self.settings = settings
        self.client = client
        self.trace = run.trace
        self.token = token = run.token
        self.request_id = run.request_id
        scoped(token)  # this run's text only: the token may be a request's
        if allowed_hosts is None:
            allowed_hosts = SecuritySettings().allowed_hosts
        self.base = resolve_base_url(target, settings, allowed_hosts) if target.enabled else None

    def _headers(self, idempotency_key: str) -> dict[str, str]:
        # The same key on every attempt of the same call, so the CronJob can drop repeats.
        headers = {
            "traceparent": self.trace.child().traceparent(),
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key,
        }
        if self.token:
            headers[self.target.auth_header or self.settings.default_auth_header] = self.token
        if self.request_id:
            headers["X-Request-ID"] = self.request_id
        return headers

    async def progress(
        self,
        current: int,
        total: int,
        message: str | None,
        last_sent_ms: float | None,
        seq: int = 0,
    ) -> float | None:
        """Send progress unless throttled. Returns the new last-sent time (ms), or the old one.
        ``seq`` is the page the progress follows (its Idempotency-Key is the same when a
        retried attempt sends it again).

        Never raises: progress is best effort.
        """
        if not self.base:
            return last_sent_ms
        now_ms = time.time() * 1000
        if total == 0 and current > 0:
            log.warning(
                "callback_progress",
                caller_run_id=self.target.caller_run_id,
                current=current,
                total=total,
                skipped="total_zero",
            )
            return last_sent_ms
        throttled = (
            last_sent_ms is not None
            and now_ms - last_sent_ms < self.settings.progress_min_interval_ms
            and current != total
        )
        percent = int(current * 100 / total) if total > 0 else 0
        fields = {
            "run_id": self.target.caller_run_id,
            "current": current,
            "total": total,
            "percent": percent,
        }
        if throttled:
            CALLBACKS.labels("progress", "throttled").inc()
            log.debug("callback_progress", **fields, skipped_due_to_throttle=True)
            return last_sent_ms
        url = f"{self.base}/{self.target.caller_run_id}/progress"
        body = {"current": current, "total": total, "message": message}
        try:
            resp = await self._post(url, body, f"{self.run_key}:progress:{seq}")
            ok = 200 <= resp.status_code < 300
            CALLBACKS.labels("progress", "ok" if ok else CallbackResult.FAILED.value).inc()
            log.info(
                "callback_progress",
                **fields,
                skipped_due_to_throttle=False,
                status=resp.status_code,
                ok=ok,
            )
        except TransportError as e:
            CALLBACKS.labels("progress", CallbackResult.FAILED.value).inc()
            log.warning("callback_progress", **fields, ok=False, error=f"{type(e).__name__}: {e}")
        return now_ms

    async def _post(self, url: str, body: dict[str, Any], idempotency_key: str) -> Answer:
        """One callback request: the JSON body, our headers under ``idempotency_key``."""
        return await self.client.post(
            url,
            body=json.dumps(body),
            headers=self._headers(idempotency_key),
            timeout=self.settings.timeout_seconds,
        )

    async def finalize(
        self, body: dict[str, Any], attempt: int, key_suffix: str = ""
    ) -> tuple[FinalizeOutcome, str]:
        """One finalize try. Returns (outcome, detail). ``key_suffix`` tells a run finished
        by POST /tasks/{id}/retry from the finalize its failed attempt already sent."""
        if not self.base:
            log.debug("callback_disabled", reason="no caller run id or base_url")
            return FinalizeOutcome.SKIPPED, "no callback configured"
        url = f"{self.base}/{self.target.caller_run_id}/callback"
        try:
            resp = await self._post(url, body, f"{self.run_key}:finalize{key_suffix}")
        except TransportError as e:
            detail = f"{type(e).__name__}: {e}"
            log.warning(
                "callback_finalize_failure",
                caller_run_id=self.target.caller_run_id,
                error=detail,
                attempt=attempt,
            )
            if isinstance(e, AnswerTooLarge):
                return FinalizeOutcome.REJECTED, detail  # a retry reads it again
            return FinalizeOutcome.RETRY, detail
        if 200 <= resp.status_code < 300:
            log.info(
                "callback_finalize_success",
                caller_run_id=self.target.caller_run_id,
                code=resp.status_code,
                result=body.get("result"),
                attempt=attempt,
            )
            return FinalizeOutcome.DELIVERED, str(resp.status_code)
        # the CronJob's reply is its own text: a short, redacted excerpt of it only
        detail = f"HTTP {resp.status_code}: {body_excerpt(resp)}"
        log.warning(
            "callback_finalize_failure",
            caller_run_id=self.target.caller_run_id,
            error=detail,
            attempt=attempt,
            status=resp.status_code,
        )
        if 400 <= resp.status_code < 500:
            return FinalizeOutcome.REJECTED, detail
        return FinalizeOutcome.RETRY, detail


def finalize_body(status: str, stats: dict[str, Any], error_message: str | None) -> dict[str, Any]:
    """The exact finalize bodies of the protocol (the verdict: ``run_state.verdict_of``)."""
    verdict = verdict_of(status)
    if verdict == CallbackResult.SUCCESS:
        return {
            "result": verdict.value,
            "code": 200,
            "body": json.dumps(stats, separators=(",", ":"), sort_keys=True),
        }
    if verdict == CallbackResult.FAILED_TIMEOUT:
        return {"result": verdict.value, "error_message": "callback_deadline_exceeded"}
    return {"result": verdict.value, "error_message": error_message or status}
