"""No SSRF through a start request (SPEC §5): every URL a request names — a source URL in
its params, a sink endpoint in ``output``, the CronJob callback — goes to a host in
``security.allowed_hosts`` (the callback: ``Settings.callback_hosts()``), and a host
allowed by a wildcard does not resolve to an internal address. URLs from config and the
registry are trusted. The rules themselves are ``artemis/security.py``'s."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from artemis.callback import CallbackTarget, resolve_base_url
from artemis.config import Settings
from artemis.security import check_header_names, check_request_url, check_resolved
from artemis.tasks.base import TaskUnit


async def check_request_urls(
    settings: Settings,
    task: TaskUnit,
    params: dict[str, Any],
    output: dict[str, Any] | None,
    callback: dict[str, Any] | None,
) -> None:
    """INVALID_INPUT naming the field when a URL of the request may not be reached
    (``task.request_url_params`` names the params that hold one)."""
    allowed = settings.security.allowed_hosts
    hosts: list[tuple[str, str, list[str]]] = []
    for name in task.request_url_params:
        if isinstance(params.get(name), str):
            host = check_request_url(params[name], allowed, f"params.{name}")
            hosts.append((host, f"params.{name}", allowed))
    if callback and callback.get("base_url"):
        own = settings.callback_hosts()
        called = resolve_base_url(CallbackTarget(**callback), settings.callback, own)
        hosts.append((urlsplit(called).hostname or "", "meta.callback", own))
    if output:
        endpoint = output.get("http_endpoint")
        if endpoint is not None:
            host = check_request_url(str(endpoint), allowed, "output.http_endpoint")
            hosts.append((host, "output.http_endpoint", allowed))
        headers = output.get("http_headers") or {}
        if isinstance(headers, dict):
            check_header_names(list(headers), "output.http_headers")
    for host, what, listed in hosts:
        await check_resolved(host, listed, what)
