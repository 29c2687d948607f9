"""NEXT_URL and SINGLE paging of a registry source, from a YAML provenance to pages,
against real HTTP servers on 127.0.0.1 answering as Django REST framework (``"next"``),
OData (``"@odata.nextLink"``, left out on the last page) and JSON:API (``links.next``)
document their next-page links; and what the import refuses about them. Each test
asserts what the server received."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import pytest
import yaml
from aiohttp import web

from artemis.errors import ArtemisError, ErrorCode
from artemis.paging import (
    NextUrlPaginator,
    SinglePaginator,
    paginator_from_checkpoint,
)
from artemis.registry.client import ContractClient
from artemis.registry.rest_source import rest_source
from artemis.registry.yaml_io import import_yaml
from tests.helpers import http_client
from tests.registry.net import Server, contract_client, provenance, unique_code

ITEMS = [{"id": i} for i in range(1, 8)]
SIZE = 3


class Api:
    """``GET /items`` paged ``SIZE`` at a time, the next page's URL written by
    ``next_of(origin, position)`` (None: the last page) where ``style`` puts it. Every
    request's path and query string is kept in ``asked``."""

    def __init__(self, style: str, next_of: Callable[[str, int], Any]) -> None:
        self.style, self.next_of = style, next_of
        self.asked: list[str] = []

    async def items(self, request: web.Request) -> web.Response:
        # Read as the server reads it: the client may percent-encode `$` in a parameter name.
        self.asked.append(unquote(request.path_qs))
        q = request.query
        pos = int(q.get("page_pos") or q.get("$skiptoken") or q.get("offset") or 0)
        size = int(q.get("page_size") or q.get("$top") or q.get("limit") or 100)
        chunk, end = ITEMS[pos : pos + size], pos + size
        nxt = self.next_of(str(request.url.origin()), end) if end < len(ITEMS) else None
        if self.style == "drf":
            return web.json_response({"count": len(ITEMS), "results": chunk, "next": nxt})
        if self.style == "odata":
            body: dict[str, Any] = {"@odata.count": len(ITEMS), "value": chunk}
            if nxt is not None:
                body["@odata.nextLink"] = nxt
            return web.json_response(body)
        return web.json_response({"data": chunk, "links": {"next": nxt}})

    def routes(self) -> dict[tuple[str, str], Any]:
        return {("GET", "/items"): self.items, ("GET", "/more"): self.items}


# Each API's next link as its documentation shows it: DRF an absolute URL carrying the
# page size, OData a URL relative to the host without $top, JSON:API a query-only one.
STYLES = {
    "drf": (
        "$.next",
        "$.results",
        "page_size",
        "$.count",
        lambda origin, end: f"{origin}/items?page_pos={end}&page_size={SIZE}",
    ),
    "odata": (
        "$['@odata.nextLink']",
        "$.value",
        "$top",
        "$['@odata.count']",
        lambda origin, end: f"/items?$skiptoken={end}",
    ),
    "jsonapi": ("$.links.next", "$.data", "limit", None, lambda origin, end: f"?offset={end}"),
}


def next_url_doc(base: str, path: str | None, records: str, size_param: str, **pg: Any) -> Any:
    """A provenance paged NEXT_URL, its search sending ``q=x``."""
    row: dict[str, Any] = {
        "pagination_mode_code": "NEXT_URL",
        "records_jsonpath": records,
        "page_size_value": SIZE,
        "page_size_param_name": size_param,
        "record_key_jsonpath": "$.id",
        **pg,
    }
    if path is not None:
        row["next_url_jsonpath"] = path
    doc = provenance(unique_code("next_url"), base, pagination_cfg=[row])
    doc["endpoint_def"][0]["default_query_params"] = {"q": "x"}
    return doc


async def drain(cc: ContractClient, checkpoint: Any = None, page_size: int | None = None) -> Any:
    async with http_client() as client:
        source = rest_source(cc, None, {}, page_size)
        return [p async for p in source.pages(client, checkpoint)]


def records(pages: list[Any]) -> list[Any]:
    return [r for p in pages for r in p.records]


@pytest.mark.parametrize("style", list(STYLES))
async def test_next_url_follows_each_apis_link_and_sends_the_page_size_once(reg, key_file, style):
    path, recs, size_param, total, next_of = STYLES[style]
    api = Api(style, next_of)
    server = await Server(api.routes()).start()
    try:
        doc = next_url_doc(server.url, path, recs, size_param, total_count_jsonpath=total)
        pages = await drain(contract_client(reg, key_file, doc))
    finally:
        await server.stop()
    assert records(pages) == ITEMS
    assert pages[-1].checkpoint is None
    assert pages[-1].info.expected_total == (len(ITEMS) if total else None)
    # The first request: the search's params and the page size; each next one: the URL
    # as given (resolved against the page's), the page size added only where it lacked it.
    first = {"drf": "/items?q=x&page_size=3", "odata": "/items?q=x&$top=3"}
    later = {
        "drf": ["/items?page_pos=3&page_size=3", "/items?page_pos=6&page_size=3"],
        "odata": ["/items?$skiptoken=3&$top=3", "/items?$skiptoken=6&$top=3"],
        "jsonapi": ["/items?offset=3&limit=3", "/items?offset=6&limit=3"],
    }
    assert api.asked == [first.get(style, "/items?q=x&limit=3"), *later[style]]


@pytest.mark.parametrize("ending", ["null", "absent"])
async def test_next_url_ends_on_a_null_or_absent_link(reg, key_file, ending):
    asked: list[str] = []

    async def items(request: web.Request) -> web.Response:
        asked.append(request.path_qs)
        if "page_pos" not in request.query:
            return web.json_response({"results": ITEMS[:3], "next": "/items?page_pos=3"})
        return web.json_response(
            {"results": ITEMS[3:], **({"next": None} if ending == "null" else {})}
        )

    server = await Server({("GET", "/items"): items}).start()
    try:
        # No next_url_jsonpath: the default, $.next.
        doc = next_url_doc(server.url, None, "$.results", "page_size")
        pages = await drain(contract_client(reg, key_file, doc))
    finally:
        await server.stop()
    assert records(pages) == ITEMS and len(asked) == 2
    assert asked[1] == "/items?page_pos=3&page_size=3"


async def test_a_next_url_relative_to_the_page_path_is_resolved_against_that_page(reg, key_file):
    # /items names "more?..." (→ /more), and /more names "?..." (→ /more?...).
    def next_of(origin: str, end: int) -> str:
        return f"more?offset={end}" if end == SIZE else f"?offset={end}"

    api = Api("jsonapi", next_of)
    server = await Server(api.routes()).start()
    try:
        doc = next_url_doc(server.url, "$.links.next", "$.data", "limit")
        pages = await drain(contract_client(reg, key_file, doc))
    finally:
        await server.stop()
    assert records(pages) == ITEMS
    assert api.asked == ["/items?q=x&limit=3", "/more?offset=3&limit=3", "/more?offset=6&limit=3"]


async def test_a_next_url_on_another_origin_is_refused_and_never_asked(reg, key_file):
    elsewhere = await Server({("GET", "/items"): Api("drf", lambda o, e: None).items}).start()
    api = Api("drf", lambda origin, end: f"{elsewhere.url}/items?page_pos={end}")
    server = await Server(api.routes()).start()
    try:
        doc = next_url_doc(server.url, "$.next", "$.results", "page_size")
        with pytest.raises(ArtemisError) as e:
            await drain(contract_client(reg, key_file, doc))
    finally:
        await server.stop()
        await elsewhere.stop()
    assert e.value.code is ErrorCode.SOURCE_CONTRACT
    assert "another origin" in e.value.message and "no credential is sent" in e.value.message
    assert len(api.asked) == 1 and elsewhere.seen == []


@pytest.mark.parametrize(
    "value, found", [(2, "int 2"), ({"href": "/items?p=2"}, "dict {'href'"), ("", "str ''")]
)
async def test_a_next_link_that_is_not_a_url_breaks_the_contract_naming_its_path(
    reg, key_file, value, found
):
    async def items(request: web.Request) -> web.Response:
        return web.json_response({"results": ITEMS[:3], "links": {"next": value}})

    server = await Server({("GET", "/items"): items}).start()
    try:
        doc = next_url_doc(server.url, "$.links.next", "$.results", "page_size")
        with pytest.raises(ArtemisError) as e:
            await drain(contract_client(reg, key_file, doc))
    finally:
        await server.stop()
    assert e.value.code is ErrorCode.SOURCE_CONTRACT
    assert "NextUrlPaginator: expected the next page's URL" in e.value.message
    assert "at '$.links.next', found " + found in e.value.message
    assert len(server.seen) == 1


async def test_a_retried_fetch_resumes_at_the_next_url_its_checkpoint_holds(reg, key_file):
    api = Api("odata", STYLES["odata"][4])
    server = await Server(api.routes()).start()
    try:
        cc = contract_client(
            reg, key_file, next_url_doc(server.url, "$['@odata.nextLink']", "$.value", "$top")
        )
        async with http_client() as client:
            pages = rest_source(cc, None, {}, None).pages(client, None)
            first = await anext(pages)
            await pages.aclose()
        # The checkpoint as a heartbeat carries it: plain JSON, the same paginator again.
        checkpoint = json.loads(json.dumps(first.checkpoint))
        assert checkpoint["kind"] == "next_url"
        assert checkpoint["next_url"] == f"{server.url}/items?$skiptoken=3"
        assert paginator_from_checkpoint(checkpoint).checkpoint() == checkpoint
        rest = await drain(cc, checkpoint)
    finally:
        await server.stop()
    assert records([first]) == ITEMS[:3] and records(rest) == ITEMS[3:]
    assert api.asked[1:] == ["/items?$skiptoken=3&$top=3", "/items?$skiptoken=6&$top=3"]


def test_an_empty_page_naming_itself_is_a_loop_not_endless_paging():
    p = NextUrlPaginator(next_url="https://a.example/items?p=2")
    p.request_url("https://a.example/items")
    with pytest.raises(ArtemisError) as e:
        p.update_state({"next": "/items?p=2"}, [])
    assert e.value.code is ErrorCode.SOURCE_LOOP


def test_a_stated_total_reached_ends_next_url_paging():
    p = NextUrlPaginator(total_path="$.count")
    p.request_url("https://a.example/items")
    p.take([1, 2])
    p.update_state({"count": 2, "next": "/items?p=2"}, [1, 2])
    assert not p.has_more and p.total == 2


# -- SINGLE -------------------------------------------------------------------------------
async def test_single_is_one_request_without_paging_parameters(reg, key_file):
    async def items(request: web.Request) -> web.Response:
        return web.json_response({"total": len(ITEMS), "currencies": ITEMS, "next": "/x"})

    server = await Server({("GET", "/items"): items}).start()
    try:
        row = {
            "pagination_mode_code": "SINGLE",
            "records_jsonpath": "$.currencies",
            "total_count_jsonpath": "$.total",
        }
        doc = provenance(unique_code("single"), server.url, pagination_cfg=[row])
        doc["endpoint_def"][0]["default_query_params"] = {"q": "x"}
        # A run's page size is not sent either.
        pages = await drain(contract_client(reg, key_file, doc), page_size=50)
    finally:
        await server.stop()
    assert records(pages) == ITEMS and len(pages) == 1 and pages[0].checkpoint is None
    assert pages[0].info.expected_total == len(ITEMS)
    assert [(s.path, s.query) for s in server.seen] == [("/items", {"q": "x"})]


def test_a_single_paginator_round_trips_its_checkpoint():
    p = SinglePaginator(total_path="$.n")
    assert p.update_request({"q": "x"}) == {"q": "x"}
    again = paginator_from_checkpoint(json.loads(json.dumps(p.checkpoint())))
    assert isinstance(again, SinglePaginator) and again.checkpoint() == p.checkpoint()


# -- what the import refuses -----------------------------------------------------------------
def refused(reg: Any, key_file: str, doc: dict[str, Any]) -> str:
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="own.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    return e.value.message


@pytest.mark.parametrize(
    "pg, expected",
    [
        (
            {"pagination_mode_code": "PAGE_NUMBER", "next_url_jsonpath": "$.next"},
            "pagination_cfg[0]: next_url_jsonpath is for NEXT_URL paging, not PAGE_NUMBER "
            "(which has next_page_jsonpath)",
        ),
        (
            {"pagination_mode_code": "LINK_HEADER", "next_url_jsonpath": "$.next"},
            "next_url_jsonpath is for NEXT_URL paging, not LINK_HEADER (which reads the next "
            "URL from the Link header)",
        ),
        (
            {"pagination_mode_code": "NEXT_URL", "paging_params_in_code": "BODY"},
            "NEXT_URL paging follows the next URL: its parameters are in the query",
        ),
        (
            {"pagination_mode_code": "SINGLE", "page_size_value": 50, "cursor_param_name": "c"},
            "pagination_cfg[0]: SINGLE is one request without paging: page_size_value, "
            "cursor_param_name would do nothing",
        ),
        (
            {"pagination_mode_code": "SINGLE", "max_result_window": 10000},
            "SINGLE is one request without paging: max_result_window would do nothing",
        ),
    ],
)
def test_the_import_refuses_next_url_and_single_fields_that_would_do_nothing(
    reg, key_file, pg, expected
):
    doc = provenance("own", "https://api.example", pagination_cfg=[pg])
    assert expected in refused(reg, key_file, doc)


def test_the_import_refuses_a_single_search_with_paging_parameter_names(reg, key_file):
    doc = provenance(
        "own", "https://api.example", pagination_cfg=[{"pagination_mode_code": "SINGLE"}]
    )
    doc["endpoint_def"][0]["page_size_param_name"] = "per_page"
    assert (
        "endpoint_def[0] with pagination_cfg[0]: the SEARCH endpoint's page_size_param_name: "
        "SINGLE paging sends no paging parameter"
    ) in refused(reg, key_file, doc)


def test_the_import_takes_a_next_url_file_and_the_contract_keeps_the_path(reg, key_file):
    doc = next_url_doc("https://api.example", "$['@odata.nextLink']", "$.value", "$top")
    cc = contract_client(reg, key_file, doc)
    assert (cc.contract.pagination or {})["next_url_jsonpath"] == "$['@odata.nextLink']"
