"""The one logging set-up: structlog for our own lines, the standard library (Temporal's
replay-safe workflow/activity loggers, httpx, uvicorn) rendered through the same chain,
with one fixed field set on every line and secrets redacted."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog

from artemis.config import LoggingSettings
from artemis.pipes import QuietOnClosedPipe
from artemis.redact import REDACTED, redact_text

FIELDS = ("trace_id", "span_id", "request_id", "task_code", "task_id", "workflow_id")


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
    shared = _shared_processors(settings)
    renderer = _renderer(settings)

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
    handler = _handler(settings)
    handler.setFormatter(formatter)
    _install_handler(handler, level)
    # Chatty libraries: keep their warnings, drop per-request info lines.
    for name in ("httpx", "httpcore", "uvicorn.access", "hpack", "alembic"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    # Temporal's loggers append their context dict to the message; we lift it into fields.
    from temporalio import activity, workflow

    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False


def _shared_processors(settings: LoggingSettings) -> list[Any]:
    """The processors structlog's own events and the stdlib's records both pass."""
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
    return shared


def _renderer(settings: LoggingSettings) -> Any:
    if settings.format == "json":
        return structlog.processors.JSONRenderer(default=str)
    return structlog.dev.ConsoleRenderer(
        colors=False, exception_formatter=structlog.dev.plain_traceback
    )


def _handler(settings: LoggingSettings) -> logging.Handler:
    """The handler ``settings.output`` names: a rotating file, stdout or stderr."""
    if settings.output == "file":
        path = Path(settings.file.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return logging.handlers.RotatingFileHandler(
            path,
            maxBytes=settings.file.max_size_mb * 1024 * 1024,
            backupCount=settings.file.max_backups,
            encoding="utf-8",
        )
    stream = sys.stdout if settings.output == "stdout" else sys.stderr
    # A reader that went away (a closed pipe) silences the log, never the process.
    return logging.StreamHandler(QuietOnClosedPipe(stream))


def _install_handler(handler: logging.Handler, level: int) -> None:
    """``handler`` replaces the root logger's handler a previous configuration installed."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_artemis", False):
            root.removeHandler(h)
            h.close()
    setattr(handler, "_artemis", True)  # noqa: B010  (marks the handler we own)
    root.addHandler(handler)
    root.setLevel(level)


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
