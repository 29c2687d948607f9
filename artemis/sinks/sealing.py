"""A run's sink secrets: what of a run's ``output`` is a secret (a credential header, an
endpoint or a database/object-store URL carrying credentials) is stored encrypted as a
run secret and replaced in workflow history by a marker; the activities read it back."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from artemis.errors import ArtemisError, ErrorCode
from artemis.redact import scoped
from artemis.security import same_origin
from artemis.sinks.factory import OPERATOR_ONLY

# A request's sink secrets (docs/security.md): header values of ``output.http_headers`` and an
# ``output.http_endpoint`` carrying a user, password or query are run secrets — encrypted
# in ``run_secret``, resolved inside the activities — and workflow history carries this
# marker in their place.
SECRET_REF = "@run-secret"
_HEADER_SECRET = "output.http_headers:"
_ENDPOINT_SECRET = "output.http_endpoint"


def seal_output(output: dict[str, Any], put: Any) -> dict[str, Any]:
    """``output`` for history: each secret value stored by ``put(name, value)`` and
    replaced by SECRET_REF."""
    sealed = dict(output)
    headers = output.get("http_headers")
    if isinstance(headers, dict) and headers:
        for name, value in headers.items():
            put(f"{_HEADER_SECRET}{name}", str(value))
        sealed["http_headers"] = dict.fromkeys(headers, SECRET_REF)
    endpoint = output.get("http_endpoint")
    if isinstance(endpoint, str):
        parts = urlsplit(endpoint)
        if parts.username or parts.password or parts.query:
            put(_ENDPOINT_SECRET, endpoint)
            sealed["http_endpoint"] = SECRET_REF
    # The operator's URLs of a resolved output (a database or object store) may carry a
    # user and password: those are run secrets too.
    for section, keys in OPERATOR_ONLY.items():
        cfg = output.get(section)
        if not isinstance(cfg, dict):
            continue
        for key in keys:
            value = cfg.get(key)
            if isinstance(value, str) and _has_credentials(value):
                put(f"output.{section}.{key}", value)
                sealed[section] = {**sealed[section], key: SECRET_REF}
    return sealed


def _has_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return bool(parts.password or parts.query)
    except ValueError:
        return False


def unseal_output(
    output: dict[str, Any], get: Any, opened_secrets: list[tuple[str, str]] | None = None
) -> dict[str, Any]:
    """``output`` with its run secrets read back by ``get(name)`` (inside an activity). Each
    secret read is appended to ``opened_secrets`` as (name, value) for the caller to redact
    in its own context (``register_sink_secret``; a thread's context is not the caller's),
    or redacted in the current context when no list is given. A secret that is gone is
    INVALID_INPUT."""

    def read(name: str) -> str:
        value = get(name)
        if value is None:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{name.rstrip(':')}: the run's secret is gone (cleaned up)",
                retryable=False,
            )
        if opened_secrets is None:
            register_sink_secret(name, str(value))
        else:
            opened_secrets.append((name, str(value)))
        return str(value)

    if not output:
        return output
    opened = dict(output)
    headers = output.get("http_headers")
    if isinstance(headers, dict) and SECRET_REF in headers.values():
        opened["http_headers"] = {
            k: read(f"{_HEADER_SECRET}{k}") if v == SECRET_REF else v for k, v in headers.items()
        }
    for section in OPERATOR_ONLY:
        cfg = output.get(section)
        if isinstance(cfg, dict) and SECRET_REF in cfg.values():
            opened[section] = {
                k: read(f"output.{section}.{k}") if v == SECRET_REF else v for k, v in cfg.items()
            }
    if output.get("http_endpoint") == SECRET_REF:
        opened["http_endpoint"] = read(_ENDPOINT_SECRET)
    return opened


# What in a sink secret is redacted from logs and error texts: a header's value when its
# name says it is a credential, a URL's password and the values of its credential-named
# query keys. Redaction replaces substrings everywhere, so a plain value ("data", a
# "require" of sslmode) is not registered: it would garble every line it appears in.
_SECRET_NAME = re.compile(r"auth|token|key|secret|pass|cookie|session|sig|cred", re.I)


def is_credential_name(name: str) -> bool:
    """Whether a header or query key's name says its value is a credential."""
    return bool(_SECRET_NAME.search(name))


def register_sink_secret(name: str, value: str) -> None:
    """Redact, in the current run's text only, what in the run secret ``name``
    (``output.http_headers:H``, ``output.http_endpoint``, ``output.sql.url`` …) is a
    credential."""
    if name.startswith(_HEADER_SECRET):
        if _SECRET_NAME.search(name[len(_HEADER_SECRET) :]):
            scoped(value)
        return
    try:
        parts = urlsplit(value)
    except ValueError:
        scoped(value)
        return
    if parts.password:
        scoped(parts.password)
    for key, v in parse_qsl(parts.query):
        if _SECRET_NAME.search(key):
            scoped(v)


def operator_secret(name: str, output: dict[str, Any], defaults: dict[str, Any]) -> str | None:
    """A run secret as the operator's configuration (``output_defaults.<code>``) holds it
    now, for a replay after the run's own secrets were cleaned up: an operator's URL
    (``output.sql.url`` …), or a header of the operator's endpoint when the run sent to
    that endpoint. A request's own secret has no such fallback (None)."""
    if name.startswith(_HEADER_SECRET):
        endpoint = output.get("http_endpoint")
        if endpoint == SECRET_REF or not same_origin(str(endpoint), defaults.get("http_endpoint")):
            return None
        value = (defaults.get("http_headers") or {}).get(name[len(_HEADER_SECRET) :])
        return None if value is None else str(value)
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "output" and parts[1] in OPERATOR_ONLY:
        value = (defaults.get(parts[1]) or {}).get(parts[2])
        return None if value is None else str(value)
    return None
