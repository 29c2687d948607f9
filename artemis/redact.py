"""Secret values kept out of text (SPEC §6, "Secrets"): the patterns of a cookie, a
callback token or an Authorization header, and the values registered at run time.

Apart from the logging set-up (``artemis.logsetup``, which redacts every log line with
it) so that the CLI redacts its error lines without importing structlog.
"""

from __future__ import annotations

import re

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
