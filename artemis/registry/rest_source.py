"""A registry source's SEARCH endpoint as a ``RestSource``: its paginator, default query
params and body, records and record-key paths, all from the frozen contract; with a
DETAIL endpoint, the search's ids fetched by it (``DetailSource``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.client import ContractClient, Sending, paginator_for
from artemis.registry.request_modes import contract_problems
from artemis.registry.resolve import merge_params, param_name
from artemis.sources.base import Source
from artemis.sources.detail import DetailRequests, DetailSource
from artemis.sources.responses import parse_rules
from artemis.sources.rest import JSON_TYPE, Request, RestSource, Search, SourceHooks, place
from artemis.sources.xmldoc import base_types


@dataclass(frozen=True)
class Shaping:
    """What a task makes of a source's records: ``transform`` turns a raw record into the
    task's shape; ``record_key`` is the key path used when the pagination cfg names
    none."""

    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    record_key: str | None = None


@dataclass(frozen=True)
class _Searching:
    """One search of a run: its query and window, its page size (None: the contract's)
    and how many requests it may send at once."""

    query: str | None
    window: dict[str, Any]
    page_size: int | None
    parallel: int


def rest_source(
    cc: ContractClient,
    query: str | None,
    window: dict[str, Any],
    page_size: int | None,
    parallel: int = 1,
    shaping: Shaping | None = None,
) -> Source:
    """The contract's SEARCH endpoint paged by its pagination cfg, its records shaped as
    ``shaping`` says.

    A GET search sends the run's own values (``query``, the window) in the query string
    over ``default_query_params``; a POST search sends them in its body over
    ``default_body_payload`` (a dot in a name nests it), with ``default_query_params`` in
    the query string. With a DETAIL endpoint, the search's records are ids and the
    records delivered are the DETAIL answers'."""
    _refuse_problems(cc)
    detail = cc.contract.endpoints.get("DETAIL")
    shaping = shaping or Shaping()
    searching = _Searching(query, window, page_size, parallel)
    search = _search_source(cc, searching, detail, shaping)
    if not detail:
        return search
    return _detail_source(cc, search, detail, parallel, shaping.transform)


def _refuse_problems(cc: ContractClient) -> None:
    """A contract that cannot be paged as a REST source is a config error, not retried."""
    problems = contract_problems(cc.contract)
    if problems:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"provenance {cc.code!r}: {'; '.join(problems)}",
            retryable=False,
        )


def _search_request(
    ep: dict[str, Any], query: str | None, window: dict[str, Any]
) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """The search's method, query params and body: the run's own values (``query``, the
    window) go in the body of a POST, in the query string of a GET."""
    asked = {"query": query} if query else {}
    runtime = {**asked, **window}
    method = (ep.get("http_method_code") or "GET").upper()
    if method == "POST":
        params = merge_params(ep.get("default_query_params"), None)
        body: dict[str, Any] | None = place(ep.get("default_body_payload"), runtime)
    else:
        params = merge_params(ep.get("default_query_params"), runtime)
        body = None
    return method, params, body


def _sender(cc: ContractClient, endpoint: dict[str, Any] | None) -> Any:
    # The endpoint a request is for picks its credential and its rate bucket. A
    # request's params are its query string, whatever its method: a POST without a
    # body (a scroll's continue request in QUERY mode) is not turned into a form.
    code = cc.code

    def send(client: Any, req: Request) -> Any:
        how = Sending(req.body, req.content_type, endpoint, query_only=True)
        return cc.send(
            client, req.method, req.url, req.params, f"{code} {req.method} {req.url}", how
        )

    return send


def _search_source(
    cc: ContractClient,
    searching: _Searching,
    detail: dict[str, Any] | None,
    shaping: Shaping,
) -> RestSource:
    """The SEARCH endpoint's ``RestSource``; its records are ids when ``detail`` follows."""
    contract, code = cc.contract, cc.code
    transform, record_key = shaping.transform, shaping.record_key
    parallel, page_size = searching.parallel, searching.page_size
    ep = contract.endpoint or {}
    method, params, body = _search_request(ep, searching.query, searching.window)
    pg = contract.pagination or {}
    fields = (contract.record_model or {}).get("fields_json")
    fmt = ep.get("response_format_code") or "JSON"
    return RestSource(
        cc.url(ep),
        paginator_for(contract, page_size),
        Search(
            params=params,
            records_path=pg.get("records_jsonpath") or "$.items",
            record_key=pg.get("record_key_jsonpath") or record_key,
            parallel_pages=min(
                [parallel, *[v for v in [(contract.rate_limit or {}).get("max_concurrency")] if v]]
            ),
            method=method,
            body=body,
            content_type=ep.get("request_content_type") or JSON_TYPE,
            paging_in=pg.get("paging_params_in_code") or "QUERY",
            response_format=fmt,
            record_types=base_types(fields) if fmt == "XML" and not detail else None,
        ),
        SourceHooks(
            transform=None if detail else transform,
            status_error=cc.status_error,
            send=_sender(cc, contract.endpoint),
            actions=parse_rules(ep.get("response_actions_json")),
        ),
        name=code,
    )


def _detail_source(
    cc: ContractClient,
    search: RestSource,
    detail: dict[str, Any],
    parallel: int,
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> DetailSource:
    """The search's ids fetched by the DETAIL endpoint, batched by the batching cfg."""
    contract = cc.contract
    pg = contract.pagination or {}
    fields = (contract.record_model or {}).get("fields_json")
    bt = contract.batching or {}
    detail_fmt = detail.get("response_format_code") or "JSON"
    limits = [
        v
        for v in (
            bt.get("max_parallel_requests"),
            (contract.rate_limit or {}).get("max_concurrency"),
        )
        if v
    ]
    details = DetailRequests(
        url=cc.url(detail),
        method=(detail.get("http_method_code") or "GET").upper(),
        params=merge_params(detail.get("default_query_params"), None),
        body=detail.get("default_body_payload"),
        content_type=detail.get("request_content_type") or JSON_TYPE,
        id_param=param_name("id", detail, bt, "id_param_name", "id"),
        joiner=bt.get("id_joiner") or ",",
        batch_size=bt.get("detail_batch_size") or 200,
        post_over=bt.get("post_threshold_ids"),
        template=bt.get("request_template_json"),
        records_path=bt.get("detail_records_jsonpath") or "$.items",
        response_format=detail_fmt,
        record_types=base_types(fields) if detail_fmt == "XML" else None,
    )
    hooks = SourceHooks(
        transform=transform,
        send=_sender(cc, detail),
        status_error=cc.status_error,
        actions=parse_rules(detail.get("response_actions_json")),
    )
    return DetailSource(
        search,
        details,
        hooks,
        # Named by one of the two (contract_problems refuses a contract without).
        id_path=str(bt.get("detail_id_jsonpath") or pg.get("record_key_jsonpath")),
        parallel=max(1, min([parallel, *limits])),
        name=cc.code,
    )
