"""No SSRF through a start request: every URL a request names — a source URL in its
params, a sink endpoint in ``output``, the CronJob callback — goes to a host in
``security.allowed_hosts`` (the callback: ``Settings.callback_hosts()``), resolves now,
and to an address the allow-list admits. A URL on the origin the operator configured for
the same slot (``task_defaults``, ``output_defaults``, ``callback.base_url``) is the
operator's, and trusted. The workers check the address again when they connect
(``artemis.http.HttpClient.guarded``). The rules themselves are ``artemis/security.py``'s
and ``artemis/netguard.py``'s."""

from __future__ import annotations

from typing import Any

from artemis.callback import CallbackTarget, resolve_base_url
from artemis.config import Settings
from artemis.netguard import Resolver
from artemis.security import (
    check_header_names,
    check_request_url,
    check_resolved,
    same_origin,
    url_host_port,
)
from artemis.tasks.base import TaskUnit


async def check_request_urls(
    settings: Settings,
    code: str,
    task: TaskUnit,
    params: dict[str, Any],
    output: dict[str, Any] | None,
    callback: dict[str, Any] | None,
) -> None:
    """INVALID_INPUT naming the field when a URL of the request may not be reached
    (``task.request_url_params`` names the params that hold one)."""
    allowed = settings.security.allowed_hosts
    checks: list[tuple[str, str, list[str]]] = []  # (url, field, allow-list)
    defaults = settings.task_defaults.get(code, {})
    for name in task.request_url_params:
        value = params.get(name)
        if isinstance(value, str) and not same_origin(value, defaults.get(name)):
            check_request_url(value, allowed, f"params.{name}")
            checks.append((value, f"params.{name}", allowed))
    if callback and callback.get("base_url"):
        own = settings.callback_hosts()
        called = resolve_base_url(CallbackTarget.of(callback), settings.callback, own)
        if not same_origin(called, settings.callback.base_url):
            checks.append((called, "meta.callback", own))
    if output:
        endpoint = output.get("http_endpoint")
        trusted = settings.output_defaults.get(code, {}).get("http_endpoint")
        if endpoint is not None and not same_origin(str(endpoint), trusted):
            check_request_url(str(endpoint), allowed, "output.http_endpoint")
            checks.append((str(endpoint), "output.http_endpoint", allowed))
        headers = output.get("http_headers") or {}
        if isinstance(headers, dict):
            check_header_names(list(headers), "output.http_headers")
    resolver = Resolver(settings.security.dns_server)
    for url, what, listed in checks:
        host, port = url_host_port(url, what)
        await check_resolved(host, listed, what, port, resolver)
