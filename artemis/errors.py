"""The one error-code enum of Artemis (docs/api.md) and the exception that carries it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class _CodeInfo:
    retryable: bool
    max_retries: int
    http_status: int


class ErrorCode(StrEnum):
    COOKIE_EXHAUSTED = "COOKIE_EXHAUSTED"
    COOKIE_INVALID = "COOKIE_INVALID"
    PLATFORM_ERROR = "PLATFORM_ERROR"
    TIMEOUT_ERROR = "TIMEOUT_ERROR"
    NETWORK_ERROR = "NETWORK_ERROR"
    PARTIAL_FAIL = "PARTIAL_FAIL"
    INVALID_INPUT = "INVALID_INPUT"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    EXECUTION_LOCKED = "EXECUTION_LOCKED"
    SOURCE_ERROR = "SOURCE_ERROR"
    # The source broke its own contract (a missing key, a wrong type, a body that is not
    # JSON/XML), served the previous page again, or delivered fewer records than it
    # stated: never an end of paging, always a visible failure (docs/architecture.md).
    SOURCE_CONTRACT = "SOURCE_CONTRACT"
    SOURCE_LOOP = "SOURCE_LOOP"
    INCOMPLETE = "INCOMPLETE"
    # More records were quarantined than the run's ``max_bad_records`` allows.
    BAD_RECORDS = "BAD_RECORDS"
    # A record that does not fit its record model (a missing field, a value of the wrong
    # type): the record's own fault, set aside or (on_bad_record: fail) failing the run.
    RECORD_MODEL = "RECORD_MODEL"
    SINK_ERROR = "SINK_ERROR"
    # A source or a sink failed transiently for longer than the run's outage tolerance
    # (docs/architecture.md): the run kept its state, POST /tasks/{id}/retry finishes it.
    SOURCE_UNAVAILABLE = "SOURCE_UNAVAILABLE"
    SINK_UNAVAILABLE = "SINK_UNAVAILABLE"
    CALLBACK_ERROR = "CALLBACK_ERROR"
    CONFIG_ERROR = "CONFIG_ERROR"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"
    # API-level codes that are not task failures.
    UNAUTHORIZED = "UNAUTHORIZED"
    # A valid token whose role may not use the route (a client on the codec route).
    FORBIDDEN = "FORBIDDEN"
    # A caller past a per-token or per-process cap (open event streams, say).
    TOO_MANY_REQUESTS = "TOO_MANY_REQUESTS"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    CONFLICT = "CONFLICT"
    NOT_FOUND = "NOT_FOUND"
    # A run's kept state is gone (cleaned up after runs.retain_failed_s): no retry.
    GONE = "GONE"
    # A body that is not application/json, or a state change without it and without a
    # token (CSRF); a Host header naming another site on a loopback API (DNS rebinding).
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    MISDIRECTED_REQUEST = "MISDIRECTED_REQUEST"
    # A query window whose hits exceed the source's result cap: the run splits it.
    RESULT_CAP_EXCEEDED = "RESULT_CAP_EXCEEDED"
    NOT_READY = "NOT_READY"
    # A server's TLS certificate failed verification (details.check: untrusted, expired,
    # hostname): permanent, never waited out as an outage.
    TLS_VERIFY_FAILED = "TLS_VERIFY_FAILED"

    @property
    def info(self) -> _CodeInfo:
        return _INFO[self]

    @property
    def retryable(self) -> bool:
        return self.info.retryable

    @property
    def http_status(self) -> int:
        return self.info.http_status


_INFO: dict[ErrorCode, _CodeInfo] = {
    ErrorCode.COOKIE_EXHAUSTED: _CodeInfo(False, 0, 503),
    ErrorCode.COOKIE_INVALID: _CodeInfo(True, 3, 502),
    ErrorCode.PLATFORM_ERROR: _CodeInfo(True, 2, 502),
    ErrorCode.TIMEOUT_ERROR: _CodeInfo(True, 2, 504),
    ErrorCode.NETWORK_ERROR: _CodeInfo(True, 3, 502),
    ErrorCode.PARTIAL_FAIL: _CodeInfo(True, 2, 207),
    ErrorCode.INVALID_INPUT: _CodeInfo(False, 0, 422),
    ErrorCode.TASK_NOT_FOUND: _CodeInfo(False, 0, 404),
    ErrorCode.EXECUTION_LOCKED: _CodeInfo(False, 0, 409),
    ErrorCode.SOURCE_ERROR: _CodeInfo(True, 4, 502),
    ErrorCode.SOURCE_CONTRACT: _CodeInfo(False, 0, 502),
    ErrorCode.SOURCE_LOOP: _CodeInfo(False, 0, 502),
    ErrorCode.INCOMPLETE: _CodeInfo(False, 0, 502),
    ErrorCode.BAD_RECORDS: _CodeInfo(False, 0, 502),
    ErrorCode.RECORD_MODEL: _CodeInfo(False, 0, 502),
    ErrorCode.SINK_ERROR: _CodeInfo(True, 4, 502),
    ErrorCode.SOURCE_UNAVAILABLE: _CodeInfo(True, 0, 503),
    ErrorCode.SINK_UNAVAILABLE: _CodeInfo(True, 0, 503),
    ErrorCode.CALLBACK_ERROR: _CodeInfo(True, 3, 502),
    ErrorCode.CONFIG_ERROR: _CodeInfo(False, 0, 500),
    ErrorCode.CANCELLED: _CodeInfo(False, 0, 409),
    ErrorCode.INTERNAL: _CodeInfo(True, 4, 500),
    ErrorCode.UNAUTHORIZED: _CodeInfo(False, 0, 401),
    ErrorCode.FORBIDDEN: _CodeInfo(False, 0, 403),
    ErrorCode.TOO_MANY_REQUESTS: _CodeInfo(True, 0, 429),
    ErrorCode.PAYLOAD_TOO_LARGE: _CodeInfo(False, 0, 413),
    ErrorCode.CONFLICT: _CodeInfo(False, 0, 409),
    ErrorCode.NOT_FOUND: _CodeInfo(False, 0, 404),
    ErrorCode.GONE: _CodeInfo(False, 0, 410),
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: _CodeInfo(False, 0, 415),
    ErrorCode.MISDIRECTED_REQUEST: _CodeInfo(False, 0, 421),
    ErrorCode.RESULT_CAP_EXCEEDED: _CodeInfo(False, 0, 502),
    ErrorCode.NOT_READY: _CodeInfo(True, 0, 503),
    ErrorCode.TLS_VERIFY_FAILED: _CodeInfo(False, 0, 502),
}


class ArtemisError(Exception):
    """An error with a code from ErrorCode.

    ``retryable`` defaults to the code's own; a source or sink may narrow it (a 4xx answer
    from a sink is a SINK_ERROR that no retry can fix).
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        details: dict | None = None,
        retry_after_s: float | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = code.retryable if retryable is None else retryable
        self.details = details or {}
        self.retry_after_s = retry_after_s
        # The API's answer, where it is not the code's own (a configuration the service
        # cannot run without, found at a request: 503 rather than 500).
        self.http_status = http_status or code.http_status

    def with_request(self, request: str) -> ArtemisError:
        """The same error, its message naming the request that got the answer."""
        self.message = f"{self.message} (request: {request})"
        self.args = (self.message,)
        return self

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"

    def to_dict(self) -> dict:
        return {
            "code": self.code.value,
            "type": type(self).__name__,
            "message": self.message,
            "retryable": self.retryable,
        }


# -- validation errors: the one formatter (request bodies, task params, configuration) --
def validation_fields(
    errors: Iterable[Mapping[str, Any]], prefix: str = ""
) -> list[dict[str, str]]:
    """Each error of a Pydantic validation (``ValidationError.errors()``, or FastAPI's
    ``RequestValidationError.errors()``) as ``{field, message}``, the field a dotted path
    under ``prefix``."""
    out = []
    for err in errors:
        loc = ".".join(str(p) for p in err["loc"])
        field = f"{prefix}.{loc}" if prefix and loc else (loc or prefix)
        out.append({"field": field, "message": str(err["msg"])})
    return out


def describe_fields(fields: Iterable[Mapping[str, str]]) -> str:
    """``field: message; field: message`` (what an error message says)."""
    return "; ".join(f"{f['field']}: {f['message']}" for f in fields)


def invalid_fields(errors: Iterable[Mapping[str, Any]], prefix: str = "") -> ArtemisError:
    """A 422 INVALID_INPUT naming each bad field under ``prefix``."""
    fields = validation_fields(errors, prefix)
    return ArtemisError(
        ErrorCode.INVALID_INPUT, describe_fields(fields), details={"fields": fields}
    )
