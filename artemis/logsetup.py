"""The one logging set-up: structlog for our own lines, the standard library (Temporal's
replay-safe workflow/activity loggers, httpx, uvicorn) rendered through the same chain,
with the fixed field set of SPEC §6 on every line and secrets redacted."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import re
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog

from artemis.config import LoggingSettings

FIELDS = ("trace_id", "span_id", "request_id", "task_code", "task_id", "workflow_id")

# Secret values registered at run time (tokens, cookie values); matched literally.
_registered_secrets: set[str] = set()
_PATTERNS = [
    (re.compile(r"(web_session=)[^;\s\"',&]+"), r"\1***REDACTED***"),
    (re.compile(r"(\"cookie_value\"\s*:\s*)\"[^\"]*\""), r'\1"***REDACTED***"'),
    (
        re.compile(
            r"((?:authorization|x-callback-token)['\"]?\s*[:=]\s*['\"]?)(bearer\s+)?[^\s'\",}]+",
            re.I,
        ),
        r"\1\2***REDACTED***",
    ),
]
REDACTED = "***REDACTED***"


class QuietOnClosedPipe:
    """A text stream that stops writing once its reader has gone (a closed pipe) instead
    of raising: a long-running command (`artemis dev`, `worker`, `api`) keeps serving when
    whatever read its output exits."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        self.closed_pipe = True
        # Python flushes stdout at exit: point it at nothing, so that flush is quiet too.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())

    def isatty(self) -> bool:
        return bool(self._stream.isatty())

    def fileno(self) -> int:
        return int(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def register_secret(value: str | None) -> None:
    """Make ``value`` redacted wherever it would appear in a log line."""
    if value and len(value) >= 4:
        _registered_secrets.add(value)


def redact_text(text: str) -> str:
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    for secret in _registered_secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            k: (REDACTED if str(k).lower() in _SECRET_KEYS else _redact_value(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


_SECRET_KEYS = {
    "cookie_value",
    "auth_token",
    "api_key",
    "token",
    "password",
    "authorization",
    "default_token",
    "x-callback-token",
}


def _redact_processor(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (REDACTED if k.lower() in _SECRET_KEYS and v else _redact_value(v))
        for k, v in event_dict.items()
    }


def _temporal_context(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Lift the context that Temporal's loggers and our workflow helpers put in ``extra``."""
    record = event_dict.get("_record")
    if record is not None:
        wf = getattr(record, "temporal_workflow", None)
        act = getattr(record, "temporal_activity", None)
        if isinstance(wf, dict):
            event_dict.setdefault("workflow_id", wf.get("workflow_id"))
            event_dict.setdefault("run_id", wf.get("run_id"))
        if isinstance(act, dict):
            event_dict.setdefault("workflow_id", act.get("workflow_id"))
            event_dict.setdefault("activity_type", act.get("activity_type"))
            event_dict.setdefault("attempt", act.get("attempt"))
        extra = getattr(record, "artemis", None)
        if isinstance(extra, dict):
            for k, v in extra.items():
                event_dict.setdefault(k, v)
    return event_dict


def _fixed_fields(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    for f in FIELDS:
        event_dict.setdefault(f, None)
    if "exc_info" in event_dict and "error" not in event_dict:
        exc = event_dict.get("exc_info")
        if isinstance(exc, BaseException):
            event_dict["error"] = f"{type(exc).__name__}: {exc}"
    return event_dict


def _caller(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    module = event_dict.pop("module", None)
    lineno = event_dict.pop("lineno", None)
    event_dict.pop("func_name", None)
    if module and "caller" not in event_dict:
        event_dict["caller"] = f"{module}:{lineno}"
    return event_dict


def _drop_record(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict.pop("_record", None)
    event_dict.pop("_from_structlog", None)
    return event_dict


class _NoLocalsTraceback:
    """Tracebacks rendered as plain text (never with local variables) and redacted."""

    def __call__(self, _: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        exc_info = event_dict.pop("exc_info", None)
        if exc_info:
            if exc_info is True:
                exc_info = sys.exc_info()
            elif isinstance(exc_info, BaseException):
                exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
            if exc_info and exc_info[0] is not None:
                import traceback

                text = "".join(traceback.format_exception(*exc_info))
                event_dict["exception"] = redact_text(text)
                event_dict.setdefault(
                    "error", redact_text(f"{exc_info[0].__name__}: {exc_info[1]}")
                )
        return event_dict


_configured: dict[str, Any] = {}


def configure_logging(settings: LoggingSettings, *, force: bool = False) -> None:
    """Install the logging chain once per process (tests may call it again with ``force``)."""
    key = settings.model_dump_json()
    if _configured.get("key") == key and not force:
        return
    _configured["key"] = key

    level = logging.getLevelName("WARNING" if settings.level == "WARN" else settings.level)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
        _temporal_context,
    ]
    if settings.include_caller:
        shared.append(
            structlog.processors.CallsiteParameterAdder(
                [
                    structlog.processors.CallsiteParameter.MODULE,
                    structlog.processors.CallsiteParameter.LINENO,
                    structlog.processors.CallsiteParameter.FUNC_NAME,
                ]
            )
        )
        shared.append(_caller)
    shared += [_fixed_fields, _NoLocalsTraceback(), _redact_processor]

    renderer: Any
    if settings.format == "json":
        renderer = structlog.processors.JSONRenderer(default=str)
    else:
        renderer = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _drop_record,
            renderer,
        ],
    )
    handler: logging.Handler
    if settings.output == "file":
        path = Path(settings.file.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            path,
            maxBytes=settings.file.max_size_mb * 1024 * 1024,
            backupCount=settings.file.max_backups,
            encoding="utf-8",
        )
    else:
        stream = sys.stdout if settings.output == "stdout" else sys.stderr
        # A reader that went away (a closed pipe) silences the log, never the process.
        handler = logging.StreamHandler(QuietOnClosedPipe(stream))
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_artemis", False):
            root.removeHandler(h)
            h.close()
    setattr(handler, "_artemis", True)  # noqa: B010  (marks the handler we own)
    root.addHandler(handler)
    root.setLevel(level)
    # Chatty libraries: keep their warnings, drop per-request info lines.
    for name in ("httpx", "httpcore", "uvicorn.access", "hpack", "alembic"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    # Temporal's loggers append their context dict to the message; we lift it into fields.
    from temporalio import activity, workflow

    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
