"""A registry source's SEARCH endpoint as a ``RestSource``: its paginator, default query
params, records and record-key paths, all from the frozen contract."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from artemis.registry.client import ContractClient, paginator_for
from artemis.registry.resolve import merge_params
from artemis.sources.rest import RestSource


def rest_source(
    cc: ContractClient,
    query: str | None,
    window: dict[str, Any],
    page_size: int | None,
    parallel: int = 1,
    *,
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    record_key: str | None = None,
) -> RestSource:
    """The contract's SEARCH endpoint paged by its pagination cfg. ``transform`` turns a
    raw record into the task's shape; ``record_key`` is the key path used when the
    pagination cfg names none."""
    contract, code = cc.contract, cc.code
    ep = contract.endpoint or {}
    asked = {"query": query} if query else {}
    params = merge_params(ep.get("default_query_params"), {**asked, **window})
    pg = contract.pagination or {}
    return RestSource(
        cc.url(ep),
        paginator_for(contract, page_size),
        params=params,
        records_path=pg.get("records_jsonpath") or "$.items",
        name=code,
        record_key=pg.get("record_key_jsonpath") or record_key,
        transform=transform,
        status_error=cc.status_error,
        send=lambda client, url, q: cc.send(client, "GET", url, q, f"{code} GET {url}"),
        # Page-number/offset pages once the total is known: the run's fetch concurrency,
        # bounded by the provenance's max_concurrency (the rate is its gate's).
        parallel_pages=min(
            [parallel, *[v for v in [(contract.rate_limit or {}).get("max_concurrency")] if v]]
        ),
    )
