"""Secret values kept out of text: the patterns of a cookie, a callback token or an
Authorization header, and the values known at run time.

Two kinds of known values. The operator's own (the registry's keys, the vault's cookies)
are redacted everywhere, for the life of the process (``register_secret``). The values a
request supplies (its callback token, its sink credentials) are redacted only in the text
of the run or request that holds them (``scoped``): they live in a context variable of the
activity or API request that read them, so a caller cannot blank a word out of other runs'
lines, and they go when that activity or request ends. Both are bounded: past the cap a
new value is refused (an error), never an old one forgotten.

Apart from the logging set-up (``artemis.logsetup``, which redacts every log line with
it) so that the CLI redacts its error lines without importing structlog.
"""

from __future__ import annotations

import contextvars
import re
import weakref
from typing import Any

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode

# The operator's secret values (registry keys, cookies); matched literally everywhere.
_registered_secrets: set[str] = set()
MAX_REGISTERED = 10_000
# Request secrets held by live scopes (activities, API requests) in this process.
MAX_SCOPED = 10_000
# A request token shorter than this is refused: a short value would also match ordinary
# words of the run's own lines, and is a weak credential anyway.
MIN_REQUEST_SECRET = 16

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


def register_secret(value: str | None) -> None:
    """Make the operator's ``value`` redacted wherever it would appear in a log line."""
    if not value or len(value) < 4 or value in _registered_secrets:
        return
    if len(_registered_secrets) >= MAX_REGISTERED:
        raise ArtemisError(
            ErrorCode.INTERNAL,
            f"this process already redacts {MAX_REGISTERED} secret values: a new one is "
            "refused rather than an old one forgotten (restart the worker)",
            retryable=True,
        )
    _registered_secrets.add(value)


def forget_secret(value: str | None) -> None:
    """Stop redacting a value the process itself replaced: an OAuth2 access token that a
    newer one superseded, once it has expired (the caller waits for that). It is never
    used again, and a worker that fetches a token an hour for months would otherwise fill
    ``MAX_REGISTERED`` with dead ones."""
    if value:
        _registered_secrets.discard(value)


class _Held:
    """The request secrets of one scope; counted while some context still holds it."""

    __slots__ = ("__weakref__", "values")

    def __init__(self, values: frozenset[str]) -> None:
        self.values = values


_scoped: contextvars.ContextVar[tuple[_Held, ...]] = contextvars.ContextVar(
    "artemis_request_secrets", default=()
)
_held_count = 0


def _release(n: int) -> None:
    global _held_count
    _held_count -= n


def scoped(*values: str | None) -> None:
    """Redact ``values`` (a request's secrets) in the text of the current context — the
    activity or API request running now, and what it starts — and nowhere else. Raises
    TOO_MANY_REQUESTS when this process already holds MAX_SCOPED such values."""
    global _held_count
    fresh = frozenset(v for v in values if v and len(v) >= 4)
    held = _scoped.get()
    fresh -= {v for h in held for v in h.values}
    if not fresh:
        return
    if _held_count + len(fresh) > MAX_SCOPED:
        raise ArtemisError(
            ErrorCode.TOO_MANY_REQUESTS,
            f"this process holds {MAX_SCOPED} request secrets of running work: a new one "
            "is refused until some of that work ends",
        )
    holder = _Held(fresh)
    _held_count += len(fresh)
    # Released when no context holds it any more (the activity's or request's task ended).
    weakref.finalize(holder, _release, len(fresh))
    _scoped.set((*held, holder))


def scoped_count() -> int:
    """How many request secrets live scopes hold in this process (for tests and metrics)."""
    return _held_count


def redact_text(text: str) -> str:
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    for secret in _registered_secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    for held in _scoped.get():
        for secret in held.values:
            if secret in text:
                text = text.replace(secret, REDACTED)
    return text


# Below this depth a JSON value is redacted whole (one string) rather than walked.
_MAX_WALK = 64


def holds_secret(value: Any) -> bool:
    """Whether the JSON text of ``value`` shows something ``redact_text`` would hide."""
    text = jsonio.dumps(value).decode(errors="replace")
    return redact_text(text) != text


def redact_json(value: Any) -> Any:
    """``value`` (a record: JSON) redacted as log lines are, and still JSON of the same
    shape: a string, key or number that is (or holds) a secret value is replaced by
    REDACTED where it stands, and so is a scalar whose ``"key": value`` text a pattern
    matches (an ``authorization`` field). A value nested past ``_MAX_WALK`` levels is
    REDACTED whole when its text holds a secret."""
    return _redacted(value, None, 0)


def _redacted(value: Any, key: str | None, depth: int) -> Any:
    if isinstance(value, dict | list) and depth >= _MAX_WALK:
        return REDACTED if holds_secret(value) else value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            shown = redact_text(str(k))
            out[shown] = _redacted(v, shown, depth + 1)
        return out
    if isinstance(value, list):
        return [_redacted(v, None, depth + 1) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        shown = redact_text(value)
        if shown != value:
            return shown
    # A number that is a secret, or a scalar a pattern finds next to its key.
    if holds_secret(value) or (key is not None and holds_secret({key: value})):
        return REDACTED
    return value
