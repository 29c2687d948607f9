"""A JSON search API (Crossref's ``/works`` among them) as a ``RestSource`` built from the
contract: its paginator, default query params, records and record-key paths."""

from __future__ import annotations

from typing import Any

from artemis.literature.contract import ContractClient, paginator_for
from artemis.literature.normalize import normalize_crossref
from artemis.registry.resolve import merge_params
from artemis.sources.rest import RestSource


def rest_source(
    cc: ContractClient,
    family: str,
    query: str | None,
    window: dict[str, Any],
    page_size: int | None,
    parallel: int = 1,
) -> RestSource:
    """The contract's SEARCH endpoint paged by its pagination cfg; ``family`` (of
    ``api_family``) ``crossref`` adds the Crossref record shape and ``$.DOI`` as key."""
    contract, code = cc.contract, cc.code
    ep = contract.endpoint or {}
    asked = {"query": query} if query else {}
    params = merge_params(ep.get("default_query_params"), {**asked, **window})
    transform = (lambda item: normalize_crossref(item, code)) if family == "crossref" else None
    pg = contract.pagination or {}
    return RestSource(
        cc.url(ep),
        paginator_for(contract, page_size),
        params=params,
        records_path=pg.get("records_jsonpath") or "$.items",
        name=code,
        record_key=pg.get("record_key_jsonpath") or ("$.DOI" if family == "crossref" else None),
        transform=transform,
        status_error=cc.status_error,
        send=lambda client, url, q: cc.send(client, "GET", url, q, f"{code} GET {url}"),
        # Page-number/offset pages once the total is known: the run's fetch concurrency,
        # bounded by the provenance's max_concurrency (the rate is its gate's).
        parallel_pages=min(
            [parallel, *[v for v in [(contract.rate_limit or {}).get("max_concurrency")] if v]]
        ),
    )
