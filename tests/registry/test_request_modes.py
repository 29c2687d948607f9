"""Request modes of a registry source, from a contract to pages, against real HTTP servers
on 127.0.0.1 written from each API style's public documentation: a scroll API
(Elasticsearch's ``_search?scroll`` / ``_search/scroll``), a POST search with a JSON or form
body, an XML feed, ``Link``-header and token paging with a page size, and a SEARCH →
DETAIL flow. Each test asserts what the server received."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs

import pytest
from aiohttp import web

from artemis.config import load_settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.client import ContractClient
from artemis.registry.resolve import Contract
from artemis.registry.rest_source import rest_source
from tests.helpers import http_client


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class Log:
    """What a server received: one entry per request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def note(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        kind = request.headers.get("Content-Type", "")
        body: Any = None
        if raw and kind.startswith("application/json"):
            body = json.loads(raw)
        elif raw and kind.startswith("application/x-www-form-urlencoded"):
            body = {k: v if len(v) > 1 else v[0] for k, v in parse_qs(raw.decode()).items()}
        entry = {
            "method": request.method,
            "path": request.path,
            "query": {k: request.query.getall(k) for k in request.query},
            "content_type": kind or None,
            "body": body,
        }
        self.requests.append(entry)
        return entry


def contract(base: str, **dims: Any) -> ContractClient:
    endpoint = dims.pop("endpoint")
    detail = dims.pop("detail", None)
    endpoints = {"SEARCH": endpoint, **({"DETAIL": detail} if detail else {})}
    c = Contract(
        provenance={"provenance_code": "own", "base_url_default": base},
        task_type="harvest",
        at="",
        usage="SEARCH",
        endpoint=endpoint,
        endpoints=endpoints,
        pagination=dims.pop("pagination"),
        window_offset=None,
        http=None,
        batching=dims.pop("batching", None),
        retry=None,
        rate_limit=None,
        record_model=dims.pop("record_model", None),
    )
    assert not dims
    return ContractClient(c, load_settings(None))


async def drain(source: Any, checkpoint: dict[str, Any] | None = None) -> list[Any]:
    async with http_client() as client:
        return [p async for p in source.pages(client, checkpoint)]


def records(pages: list[Any]) -> list[Any]:
    return [r for p in pages for r in p.records]


# -- SCROLL: Elasticsearch / OpenSearch -------------------------------------------------------
DOCS = [{"_id": f"d{i}", "_source": {"n": i}} for i in range(10)]


class ScrollApi:
    """The scroll API as Elasticsearch documents it: ``POST /{index}/_search?scroll=1m``
    opens a scroll (``size`` in the body) and answers ``_scroll_id`` and ``hits.hits``;
    ``POST /_search/scroll {"scroll", "scroll_id"}`` continues it (the id may change:
    the latest one is to be used); an empty ``hits.hits`` is the end; ``DELETE
    /_search/scroll {"scroll_id"}`` clears it; an unknown or expired id is 404
    ``search_context_missing_exception``. Each parameter may be in the query string
    instead (``?scroll=1m&scroll_id=...``); a form body is refused, 406."""

    def __init__(self) -> None:
        self.log = Log()
        self.open: dict[str, dict[str, Any]] = {}  # scroll id -> context
        self.made = 0
        # The continue requests (by count, from 1) that find their scroll expired.
        self.expire: set[int] | None = set()
        self.continued = 0

    def _answer(self, ctx: dict[str, Any]) -> web.Response:
        self.made += 1
        sid = f"scroll-{self.made}"
        self.open[sid] = ctx
        chunk = DOCS[ctx["pos"] : ctx["pos"] + ctx["size"]]
        ctx["pos"] += len(chunk)
        return web.json_response(
            {
                "_scroll_id": sid,
                "took": 1,
                "hits": {"total": {"value": len(DOCS), "relation": "eq"}, "hits": chunk},
            }
        )

    @staticmethod
    def param(seen: dict[str, Any], name: str) -> Any:
        return (seen["body"] or {}).get(name) or next(iter(seen["query"].get(name, [])), None)

    @staticmethod
    def refused(seen: dict[str, Any]) -> web.Response | None:
        kind = seen["content_type"] or ""
        if kind.startswith("application/x-www-form-urlencoded"):
            return web.json_response(
                {"error": f"Content-Type header [{kind}] is not supported", "status": 406},
                status=406,
            )
        return None

    async def search(self, request: web.Request) -> web.Response:
        seen = await self.log.note(request)
        assert seen["query"].get("scroll") == ["1m"], seen
        return self.refused(seen) or self._answer(
            {"pos": 0, "size": int(self.param(seen, "size") or 10)}
        )

    async def scroll(self, request: web.Request) -> web.Response:
        seen = await self.log.note(request)
        no = self.refused(seen)
        if no is not None:
            return no
        sid = self.param(seen, "scroll_id")
        ctx = self.open.pop(sid, None)
        self.continued += 1
        if ctx is None or self.expire is None or self.continued in self.expire:
            return web.json_response(
                {"error": {"type": "search_context_missing_exception"}, "status": 404},
                status=404,
            )
        return self._answer(ctx)

    async def clear(self, request: web.Request) -> web.Response:
        seen = await self.log.note(request)
        sid = self.param(seen, "scroll_id")
        freed = 1 if self.open.pop(sid, None) is not None else 0
        return web.json_response({"succeeded": True, "num_freed": freed})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/idx/_search", self.search)
        app.router.add_post("/_search/scroll", self.scroll)
        app.router.add_delete("/_search/scroll", self.clear)
        return app

    def kinds(self) -> list[str]:
        return [f"{r['method']} {r['path']}" for r in self.log.requests]


def scroll_cc(base: str, total: bool, paging_in: str = "BODY") -> ContractClient:
    pagination = {
        "pagination_mode_code": "SCROLL",
        "paging_params_in_code": paging_in,
        "page_size_value": 4,
        "scroll_path_template": "/_search/scroll",
        "scroll_release_path_template": "/_search/scroll",
        "scroll_keep_alive_value": "1m",
        "scroll_id_jsonpath": "$._scroll_id",
        "records_jsonpath": "$.hits.hits",
        "record_key_jsonpath": "$._id",
    }
    if total:
        pagination["total_count_jsonpath"] = "$.hits.total.value"
    return contract(
        base,
        endpoint={
            "endpoint_name": "search",
            "endpoint_usage_code": "SEARCH",
            "http_method_code": "POST",
            "path_template": "/idx/_search",
            "default_body_payload": {"query": {"match_all": {}}, "sort": ["_doc"]},
        },
        pagination=pagination,
    )


@pytest.mark.parametrize("total", [True, False], ids=["ends-at-total", "ends-on-empty-page"])
async def test_scroll_carries_the_latest_id_delivers_each_record_once_and_releases_it(total):
    api = ScrollApi()
    async with serve(api.app()) as base:
        pages = await drain(rest_source(scroll_cc(base, total), None, {}, None))
    got = [r["_id"] for r in records(pages)]
    assert got == [d["_id"] for d in DOCS]
    first, *rest = api.log.requests
    assert (first["method"], first["path"], first["query"]) == (
        "POST",
        "/idx/_search",
        {"scroll": ["1m"]},
    )
    assert first["body"] == {"query": {"match_all": {}}, "sort": ["_doc"], "size": 4}
    continues = [r for r in rest if r["method"] == "POST"]
    # Each continue request carries the id the answer before it gave, and nothing else.
    assert [r["body"] for r in continues] == [
        {"scroll": "1m", "scroll_id": f"scroll-{k}"} for k in range(1, len(continues) + 1)
    ]
    assert all(r["content_type"] == "application/json" for r in continues)
    assert len(continues) == (2 if total else 3)  # 4 + 4 + 2 (+ the empty page)
    [release] = [r for r in rest if r["method"] == "DELETE"]
    assert release["body"] == {"scroll_id": f"scroll-{api.made}"}
    assert api.kinds()[-1] == "DELETE /_search/scroll" and api.open == {}
    assert pages[-1].checkpoint is None and pages[-1].info.taken == 10


async def test_a_query_mode_scroll_of_a_post_search_continues_in_the_query_string():
    """``paging_params_in_code: QUERY``: the search's body is its own, the paging in the
    query string; a continue request is a POST of the keep-alive and scroll id in the
    query string with no body (an Elasticsearch-style server refuses them as a form)."""
    api = ScrollApi()
    async with serve(api.app()) as base:
        pages = await drain(rest_source(scroll_cc(base, True, "QUERY"), None, {}, None))
    assert [r["_id"] for r in records(pages)] == [d["_id"] for d in DOCS]
    first, *rest = api.log.requests
    assert (first["method"], first["path"]) == ("POST", "/idx/_search")
    assert first["query"] == {"scroll": ["1m"], "size": ["4"]}
    assert first["body"] == {"query": {"match_all": {}}, "sort": ["_doc"]}
    continues = [r for r in rest if r["method"] == "POST"]
    assert [(r["path"], r["query"], r["body"]) for r in continues] == [
        ("/_search/scroll", {"scroll": ["1m"], "scroll_id": [f"scroll-{k}"]}, None) for k in (1, 2)
    ]
    assert not any((r["content_type"] or "").startswith("application/x-www") for r in rest)
    [release] = [r for r in rest if r["method"] == "DELETE"]
    assert release["query"] == {"scroll_id": [f"scroll-{api.made}"]} and release["body"] is None
    assert api.open == {} and pages[-1].info.taken == 10


async def test_a_resumed_scroll_releases_the_old_one_and_reopens_from_the_start():
    api = ScrollApi()
    async with serve(api.app()) as base:
        cc = scroll_cc(base, total=True)
        async with http_client() as client:
            gen = rest_source(cc, None, {}, None).pages(client, None)
            page = await gen.__anext__()
            await gen.aclose()
            # A fetch closed between pages keeps its scroll (the next batch continues it).
            assert "DELETE /_search/scroll" not in api.kinds()
            held = page.checkpoint
            assert held is not None and held["scroll_id"] == "scroll-1"
            resumed = rest_source(cc, None, {}, None)
            resumed.resumed = True
            rest = [p async for p in resumed.pages(client, held)]
    kinds = api.kinds()
    # The old scroll released first, then a new one opened by the search itself.
    assert kinds[1:3] == ["DELETE /_search/scroll", "POST /idx/_search"]
    assert api.log.requests[1]["body"] == {"scroll_id": "scroll-1"}
    again = [r["_id"] for r in records(rest)]
    # A scroll cannot be rewound: the new one delivers every record (sinks write by key).
    assert again == [d["_id"] for d in DOCS]
    assert rest[-1].info.taken == rest[-1].info.expected_total == 10
    assert api.open == {}


async def test_an_expired_scroll_is_reopened_and_one_that_keeps_expiring_fails_clearly():
    api = ScrollApi()
    api.expire = {2}  # the second continue request finds the scroll gone
    async with serve(api.app()) as base:
        pages = await drain(rest_source(scroll_cc(base, total=True), None, {}, None))
        assert {r["_id"] for r in records(pages)} == {d["_id"] for d in DOCS}
        assert api.kinds().count("POST /idx/_search") == 2  # opened again after the 404
        assert pages[-1].info.taken == 10

        always = ScrollApi()
        always.expire = None  # every continue request does
    async with serve(always.app()) as base:
        with pytest.raises(ArtemisError) as e:
            await drain(rest_source(scroll_cc(base, total=True), None, {}, None))
    assert e.value.details.get("status") == 404
    assert always.kinds().count("POST /idx/_search") == 4  # the first and 3 re-opens


# -- POST search -----------------------------------------------------------------------------
ITEMS = [{"id": i, "name": f"item {i}"} for i in range(1, 12)]


def post_search_app(log: Log) -> web.Application:
    """A search API documented as ``POST /search`` with a JSON body ``{"query",
    "filter": {...}, "page": {"number", "size"}}`` (JSON:API-style nested paging) or, as
    a form, ``offset`` and ``limit``; it answers ``{"data": [...], "meta": {"total"}}``."""

    async def search(request: web.Request) -> web.Response:
        seen = await log.note(request)
        body = seen["body"] or {}
        if seen["content_type"].startswith("application/json"):
            number, size = int(body["page"]["number"]), int(body["page"]["size"])
            chunk = ITEMS[(number - 1) * size : number * size]
        else:
            offset, limit = int(body["offset"]), int(body["limit"])
            chunk = ITEMS[offset : offset + limit]
        return web.json_response({"data": chunk, "meta": {"total": len(ITEMS)}})

    app = web.Application()
    app.router.add_post("/search", search)
    return app


async def test_a_post_search_sends_its_payload_the_run_values_and_the_paging_in_the_body():
    log = Log()
    async with serve(post_search_app(log)) as base:
        cc = contract(
            base,
            endpoint={
                "endpoint_name": "search",
                "endpoint_usage_code": "SEARCH",
                "http_method_code": "POST",
                "path_template": "/search",
                "default_query_params": {"format": "json"},
                "default_body_payload": {"filter": {"status": "open"}, "sort": "id", "old": 1},
                "request_content_type": "application/json",
            },
            pagination={
                "pagination_mode_code": "PAGE_NUMBER",
                "paging_params_in_code": "BODY",
                "page_number_param_name": "page.number",
                "page_size_param_name": "page.size",
                "page_size_value": 5,
                "next_page_jsonpath": None,
                "records_jsonpath": "$.data",
                "total_count_jsonpath": "$.meta.total",
            },
        )
        window = {"filter.from": "2025-01-01", "old": None}
        pages = await drain(rest_source(cc, "lamps", window, None))
    assert [r["id"] for r in records(pages)] == [i["id"] for i in ITEMS]
    assert [r["body"] for r in log.requests] == [
        {
            "filter": {"status": "open", "from": "2025-01-01"},
            "sort": "id",
            "query": "lamps",
            "page": {"number": n, "size": 5},
        }
        for n in (1, 2, 3)
    ]
    assert {r["content_type"] for r in log.requests} == {"application/json"}
    assert all(r["query"] == {"format": ["json"]} for r in log.requests)


async def test_a_form_post_search_sends_offset_and_limit_as_form_fields():
    log = Log()
    async with serve(post_search_app(log)) as base:
        cc = contract(
            base,
            endpoint={
                "endpoint_name": "search",
                "endpoint_usage_code": "SEARCH",
                "http_method_code": "POST",
                "path_template": "/search",
                "default_body_payload": {"status": "open"},
                "request_content_type": "application/x-www-form-urlencoded",
            },
            pagination={
                "pagination_mode_code": "OFFSET",
                "paging_params_in_code": "BODY",
                "page_size_value": 4,
                "records_jsonpath": "$.data",
                "total_count_jsonpath": "$.meta.total",
            },
        )
        pages = await drain(rest_source(cc, None, {}, None))
    assert len(records(pages)) == len(ITEMS)
    assert [r["body"] for r in log.requests] == [
        {"status": "open", "offset": str(o), "limit": "4"} for o in (0, 4, 8)
    ]
    assert {r["content_type"] for r in log.requests} == {"application/x-www-form-urlencoded"}
    assert all(r["query"] == {} for r in log.requests)


# -- XML -------------------------------------------------------------------------------------
def feed_app(log: Log) -> web.Application:
    """An XML catalogue feed: ``GET /feed?page=N&per_page=M`` answers
    ``<rss><channel total="7"><item id="..."><title/><tag/>...<price/></item>...``."""

    async def feed(request: web.Request) -> web.Response:
        seen = await log.note(request)
        page, size = int(seen["query"]["page"][0]), int(seen["query"]["per_page"][0])
        items = "".join(
            f'<item id="{i}"><title>Item {i}</title><tag>a</tag>'
            + ("<tag>b</tag>" if i % 2 else "")
            + f"<price>{i}.5</price><stock>{'true' if i % 3 else 'false'}</stock>"
            + f'<meta><shelf row="{i}">north</shelf></meta></item>'
            for i in range((page - 1) * size + 1, min(page * size, 7) + 1)
        )
        body = f'<?xml version="1.0"?><rss><channel total="7">{items}</channel></rss>'
        return web.Response(text=body, content_type="application/xml")

    async def bomb(request: web.Request) -> web.Response:
        body = '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaa">]><r><x>&a;</x></r>'
        return web.Response(text=body, content_type="application/xml")

    app = web.Application()
    app.router.add_get("/feed", feed)
    app.router.add_get("/bomb", bomb)
    return app


def xml_cc(base: str, path: str) -> ContractClient:
    return contract(
        base,
        endpoint={
            "endpoint_name": "feed",
            "endpoint_usage_code": "SEARCH",
            "path_template": path,
            "response_format_code": "XML",
        },
        pagination={
            "pagination_mode_code": "PAGE_NUMBER",
            "page_size_value": 3,
            "page_size_param_name": "per_page",
            "records_jsonpath": "./channel/item",
            "total_count_jsonpath": "./channel/@total",
            "record_key_jsonpath": "$['@id']",
        },
        record_model={
            "key_json": ["@id"],
            "fields_json": {"price": "float", "stock": "bool", "tag": "list[str]"},
        },
    )


async def test_xml_records_and_total_are_read_by_xml_paths():
    log = Log()
    async with serve(feed_app(log)) as base:
        pages = await drain(rest_source(xml_cc(base, "/feed"), None, {}, None))
    got = records(pages)
    assert [r["@id"] for r in got] == [str(i) for i in range(1, 8)]
    assert got[0] == {
        "@id": "1",
        "title": "Item 1",
        "tag": ["a", "b"],
        "price": 1.5,
        "stock": True,
        "meta": {"shelf": {"@row": "1", "#text": "north"}},
    }
    assert got[1]["tag"] == ["a"] and got[2]["stock"] is False  # typed by the record model
    assert pages[-1].info.expected_total == 7 and pages[-1].info.taken == 7
    assert [r["query"]["page"] for r in log.requests] == [["1"], ["2"], ["3"]]


async def test_an_xml_answer_declaring_entities_is_refused():
    async with serve(feed_app(Log())) as base:
        with pytest.raises(ArtemisError) as e:
            await drain(rest_source(xml_cc(base, "/bomb"), None, {}, None))
    assert e.value.code == ErrorCode.SOURCE_CONTRACT and "declares entities" in e.value.message


# -- LINK_HEADER and TOKEN send the page size ------------------------------------------------
def link_app(log: Log, keep_size: bool) -> web.Application:
    """GitHub-style: ``?per_page=N&page=K`` (default 30 a page), ``Link: <...>;
    rel="next"`` on every page but the last. ``keep_size`` false: a server whose next URLs
    drop ``per_page``."""

    async def repos(request: web.Request) -> web.Response:
        seen = await log.note(request)
        size = int(request.query.get("per_page", 30))
        page = int(request.query.get("page", 1))
        chunk = ITEMS[(page - 1) * size : page * size]
        more = f"&per_page={size}" if keep_size else ""
        origin = request.url.origin()
        # Every page of a paginated answer has a Link header; the last has no rel="next".
        links = [f'<{origin}/repos?page=1{more}>; rel="first"']
        if page * size < len(ITEMS):
            links.append(f'<{origin}/repos?page={page + 1}{more}>; rel="next"')
        assert seen
        return web.json_response(chunk, headers={"Link": ", ".join(links)})

    async def tokens(request: web.Request) -> web.Response:
        await log.note(request)
        size = int(request.query.get("pageSize", 30))
        pos = int(request.query.get("pageToken", 0))
        nxt = pos + size
        return web.json_response(
            {"items": ITEMS[pos:nxt], "nextPageToken": str(nxt) if nxt < len(ITEMS) else None}
        )

    app = web.Application()
    app.router.add_get("/repos", repos)
    app.router.add_get("/tokens", tokens)
    return app


@pytest.mark.parametrize("keep_size", [True, False], ids=["next-url-has-it", "next-url-lacks-it"])
async def test_link_header_paging_sends_the_page_size_once_on_every_request(keep_size):
    log = Log()
    async with serve(link_app(log, keep_size)) as base:
        cc = contract(
            base,
            endpoint={
                "endpoint_name": "repos",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/repos",
            },
            pagination={
                "pagination_mode_code": "LINK_HEADER",
                "page_size_value": 4,
                "page_size_param_name": "per_page",
                "records_jsonpath": "$",
            },
        )
        pages = await drain(rest_source(cc, None, {}, None))
    assert len(records(pages)) == len(ITEMS)
    assert log.requests[0]["query"] == {"per_page": ["4"]}
    # Never twice: the next URL's own per_page, or the one added to a URL without it.
    assert [r["query"]["per_page"] for r in log.requests] == [["4"]] * 3


async def test_token_paging_sends_the_page_size():
    log = Log()
    async with serve(link_app(log, True)) as base:
        cc = contract(
            base,
            endpoint={
                "endpoint_name": "t",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/tokens",
            },
            pagination={
                "pagination_mode_code": "TOKEN",
                "page_size_value": 5,
                "page_size_param_name": "pageSize",
                "token_param_name": "pageToken",
                "next_token_jsonpath": "$.nextPageToken",
                "records_jsonpath": "$.items",
            },
        )
        pages = await drain(rest_source(cc, None, {}, None))
    assert len(records(pages)) == len(ITEMS)
    assert [r["query"] for r in log.requests] == [
        {"pageSize": ["5"]},
        {"pageSize": ["5"], "pageToken": ["5"]},
        {"pageSize": ["5"], "pageToken": ["10"]},
    ]


# -- SEARCH → DETAIL -------------------------------------------------------------------------
def detail_app(log: Log) -> web.Application:
    """A search that lists ids (``GET /ids?page=N`` → ``{"hits": [{"ref": ...}], "next"}``)
    and two detail styles: a batch ``POST /items/batch`` with ``{"ids": [...]}`` answering
    ``{"data": [...]}``, and one record per ``GET /items/{id}``."""

    async def ids(request: web.Request) -> web.Response:
        await log.note(request)
        page = int(request.query.get("page", 1))
        chunk = ITEMS[(page - 1) * 5 : page * 5]
        nxt = page + 1 if page * 5 < len(ITEMS) else None
        return web.json_response({"hits": [{"ref": i["id"]} for i in chunk], "next": nxt})

    async def batch(request: web.Request) -> web.Response:
        seen = await log.note(request)
        wanted = set(seen["body"]["ids"])
        return web.json_response({"data": [i for i in ITEMS if i["id"] in wanted]})

    async def one(request: web.Request) -> web.Response:
        await log.note(request)
        ident = int(request.match_info["ident"])
        return web.json_response(next(i for i in ITEMS if i["id"] == ident))

    app = web.Application()
    app.router.add_get("/ids", ids)
    app.router.add_post("/items/batch", batch)
    app.router.add_get("/items/{ident}", one)
    return app


SEARCH_IDS = {
    "endpoint": {"endpoint_name": "ids", "endpoint_usage_code": "SEARCH", "path_template": "/ids"},
    "pagination": {
        "pagination_mode_code": "PAGE_NUMBER",
        "next_page_jsonpath": "$.next",
        "records_jsonpath": "$.hits",
    },
}


def batch_cc(base: str) -> ContractClient:
    return contract(
        base,
        **SEARCH_IDS,
        detail={
            "endpoint_name": "batch",
            "endpoint_usage_code": "DETAIL",
            "http_method_code": "POST",
            "path_template": "/items/batch",
            "default_query_params": {"v": "2"},
            "default_body_payload": {"fields": "all"},
        },
        batching={
            "detail_batch_size": 3,
            "detail_id_jsonpath": "$.ref",
            "detail_records_jsonpath": "$.data",
            "request_template_json": {
                "params": {"trace": "{ids}"},
                "body": {"ids": "{ids_json}", "why": "ids {ids}"},
            },
        },
    )


async def test_detail_requests_are_built_from_the_template_in_batches():
    log = Log()
    async with serve(detail_app(log)) as base:
        pages = await drain(rest_source(batch_cc(base), None, {}, None))
    assert records(pages) == ITEMS
    details = [r for r in log.requests if r["path"] == "/items/batch"]
    batches = [[1, 2, 3], [4, 5], [6, 7, 8], [9, 10], [11]]
    assert [r["body"] for r in details] == [
        {"fields": "all", "ids": b, "why": "ids " + ",".join(map(str, b))} for b in batches
    ]
    assert [r["query"] for r in details] == [
        {"v": ["2"], "trace": [",".join(map(str, b))]} for b in batches
    ]
    assert {r["method"] for r in details} == {"POST"}
    assert pages[-1].checkpoint is None and pages[-1].info.taken == len(ITEMS)


async def test_a_detail_run_resumes_with_the_ids_it_had_not_fetched():
    log = Log()
    async with serve(detail_app(log)) as base:
        first = await drain(rest_source(batch_cc(base), None, {}, None))
        held = first[2].checkpoint  # after ids 1-8 (the second search page's first batch)
        assert held is not None and held["ids_left"] == [9, 10]
        log.requests.clear()
        rest = await drain(rest_source(batch_cc(base), None, {}, None), held)
    assert [r["id"] for r in records(rest)] == [9, 10, 11]
    # The pending ids first, then the search goes on from its own checkpoint (page 3).
    assert [(r["path"], r["query"].get("page")) for r in log.requests] == [
        ("/items/batch", None),
        ("/ids", ["3"]),
        ("/items/batch", None),
    ]


async def test_a_detail_endpoint_of_one_record_per_id_gets_the_id_in_its_path():
    log = Log()
    async with serve(detail_app(log)) as base:
        cc = contract(
            base,
            **SEARCH_IDS,
            detail={
                "endpoint_name": "item",
                "endpoint_usage_code": "DETAIL",
                "path_template": "/items/{id}",
            },
            batching={
                "detail_batch_size": 1,
                "detail_id_jsonpath": "$.ref",
                "detail_records_jsonpath": "$",
                "max_parallel_requests": 4,
            },
        )
        pages = await drain(rest_source(cc, None, {}, 4))
    assert records(pages) == ITEMS
    gets = [r for r in log.requests if r["path"].startswith("/items/")]
    assert [r["path"] for r in gets] == [f"/items/{i['id']}" for i in ITEMS]
    assert all(r["method"] == "GET" and r["body"] is None for r in gets)


async def test_a_contract_that_cannot_work_stops_before_any_request():
    cc = contract(
        "http://127.0.0.1:9",
        endpoint={
            "endpoint_name": "s",
            "endpoint_usage_code": "SEARCH",
            "path_template": "/s",
            "default_body_payload": {"a": 1},
        },
        pagination={"pagination_mode_code": "SCROLL"},
    )
    with pytest.raises(ArtemisError) as e:
        rest_source(cc, None, {}, None)
    assert e.value.code == ErrorCode.CONFIG_ERROR
    assert "default_body_payload is for a POST search" in e.value.message
    assert "SCROLL paging needs scroll_path_template" in e.value.message
