"""Every pagination mode of the registry, from a contract to pages, against a real server."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from artemis.paging import paginator_from_checkpoint
from artemis.registry.client import paginator_for
from artemis.registry.resolve import Contract
from artemis.sources.rest import RestSource, Search
from artemis_samples.server import ThreadedServer
from tests.helpers import http_client

ITEMS = [{"n": i} for i in range(23)]


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/page")
    async def page(p: int = 1, size: int = 5):
        chunk = ITEMS[(p - 1) * size : p * size]
        return {"data": chunk, "meta": {"total": len(ITEMS)}}

    @app.get("/offset")
    async def offset(start: int = 0, count: int = 5):
        return {"data": ITEMS[start : start + count], "meta": {"total": len(ITEMS)}}

    # An API with its own end marker that answers 404 past the last page (states no
    # total): a paginator that does not heed the marker fails here.
    @app.get("/page_marked")
    async def page_marked(p: int = 1, size: int = 5):
        last = -(-len(ITEMS) // size)
        if p > last:
            return JSONResponse({"error": f"no page {p}"}, status_code=404)
        chunk = ITEMS[(p - 1) * size : p * size]
        return {"data": chunk, "next": p + 1 if p < last else None, "more": p < last}

    @app.get("/offset_marked")
    async def offset_marked(start: int = 0, count: int = 5):
        if start >= len(ITEMS):
            return JSONResponse({"error": f"no offset {start}"}, status_code=404)
        end = start + count
        more = end < len(ITEMS)
        return {"data": ITEMS[start:end], "next": end if more else None, "more": more}

    @app.get("/cursor")
    async def cursor(c: str = "", rows: int = 5):
        pos = 0 if c in ("", "*") else int(c)
        chunk = ITEMS[pos : pos + rows]
        return {"data": chunk, "next": str(pos + len(chunk))}

    @app.get("/token")
    async def token(t: str | None = None):
        pos = int(t or 0)
        chunk = ITEMS[pos : pos + 5]
        nxt = str(pos + 5) if pos + 5 < len(ITEMS) else None
        return {"data": chunk, "nextToken": nxt}

    @app.get("/link")
    async def link(request: Request, page: int = 1):
        chunk = ITEMS[(page - 1) * 5 : page * 5]
        base = f"{str(request.base_url)}link"
        # As GitHub does: every page of a paginated answer has a Link header; the last
        # one has no rel="next".
        links = [f'<{base}?page=1>; rel="first"', f'<{base}?page=5>; rel="last"']
        if page * 5 < len(ITEMS):
            links.insert(0, f'<{base}?page={page + 1}>; rel="next"')
        if page > 1:
            links.append(f'<{base}?page={page - 1}>; rel="prev"')
        headers = {"Link": ", ".join(links)}
        return JSONResponse({"data": chunk}, headers=headers)

    return app


@pytest.fixture(scope="module")
def server():
    s = ThreadedServer(make_app()).start()
    yield s
    s.stop()


def contract(pagination: dict) -> Contract:
    return Contract(
        provenance={"provenance_code": "x"},
        task_type=None,
        at="",
        usage="SEARCH",
        endpoint=None,
        endpoints={},
        pagination=pagination,
        window_offset=None,
        http=None,
        batching=None,
        retry=None,
        rate_limit=None,
    )


CASES = {
    "page": {
        "pagination_mode_code": "PAGE_NUMBER",
        "page_size_value": 5,
        "page_number_param_name": "p",
        "page_size_param_name": "size",
        "total_count_jsonpath": "$.meta.total",
    },
    "offset": {
        "pagination_mode_code": "OFFSET",
        "page_size_value": 5,
        "offset_param_name": "start",
        "limit_param_name": "count",
        "total_count_jsonpath": "$.meta.total",
    },
    "cursor": {
        "pagination_mode_code": "CURSOR",
        "page_size_value": 5,
        "cursor_param_name": "c",
        "page_size_param_name": "rows",
        "next_cursor_jsonpath": "$.next",
        "initial_cursor_value": "*",
    },
    "token": {
        "pagination_mode_code": "TOKEN",
        "token_param_name": "t",
        "next_token_jsonpath": "$.nextToken",
    },
    "link": {"pagination_mode_code": "LINK_HEADER"},
    "page_marked?next": {
        "pagination_mode_code": "PAGE_NUMBER",
        "page_size_value": 5,
        "page_number_param_name": "p",
        "page_size_param_name": "size",
        "next_page_jsonpath": "$.next",
    },
    "page_marked?more": {
        "pagination_mode_code": "PAGE_NUMBER",
        "page_size_value": 5,
        "page_number_param_name": "p",
        "page_size_param_name": "size",
        "has_more_jsonpath": "$.more",
    },
    "offset_marked?next": {
        "pagination_mode_code": "OFFSET",
        "page_size_value": 5,
        "offset_param_name": "start",
        "limit_param_name": "count",
        "next_page_jsonpath": "$.next",
    },
    "offset_marked?more": {
        "pagination_mode_code": "OFFSET",
        "page_size_value": 5,
        "offset_param_name": "start",
        "limit_param_name": "count",
        "has_more_jsonpath": "$.more",
    },
}


@pytest.mark.parametrize("path", sorted(CASES))
async def test_mode_reads_every_item_once_and_resumes_from_any_checkpoint(server, path):
    async with http_client() as client:

        def source():
            return RestSource(
                f"{server.url}/{path.split('?')[0]}",
                paginator_for(contract(CASES[path])),
                Search(records_path="$.data"),
                name=path,
            )

        pages = [p async for p in source().pages(client, None)]
        assert [r["n"] for p in pages for r in p.records] == list(range(23))
        assert pages[-1].checkpoint is None
        # resuming from the checkpoint after page k yields exactly the rest
        for k, page in enumerate(pages[:-1]):
            cp = page.checkpoint
            assert paginator_from_checkpoint(cp).kind == paginator_for(contract(CASES[path])).kind
            rest = [p async for p in source().pages(client, cp)]
            got = [r["n"] for p in rest for r in p.records]
            expected = [r["n"] for p in pages[k + 1 :] for r in p.records]
            assert got == expected


def test_unknown_mode_is_a_config_error():
    from artemis.errors import ArtemisError

    with pytest.raises(ArtemisError, match="RANGE"):
        paginator_for(contract({"pagination_mode_code": "RANGE"}))


@pytest.mark.parametrize(
    "mode, marker, found",
    [
        ("PAGE_NUMBER", {"next_page_jsonpath": "$.next_page"}, "no such key"),
        ("PAGE_NUMBER", {"has_more_jsonpath": "$.has_more"}, "no such key"),
        ("OFFSET", {"next_page_jsonpath": "$.next_offset"}, "no such key"),
        ("OFFSET", {"has_more_jsonpath": "$.next"}, "int 5"),
        ("PAGE_NUMBER", {"has_more_jsonpath": "$.data"}, "list"),
    ],
)
async def test_a_missing_or_mistyped_end_marker_is_a_source_contract_error(
    server, mode, marker, found
):
    from artemis.errors import ArtemisError, ErrorCode

    path = "page_marked" if mode == "PAGE_NUMBER" else "offset_marked"
    cfg = {
        "pagination_mode_code": mode,
        "page_size_value": 5,
        "page_number_param_name": "p",
        "page_size_param_name": "size",
        "offset_param_name": "start",
        "limit_param_name": "count",
        **marker,
    }
    source = RestSource(
        f"{server.url}/{path}",
        paginator_for(contract(cfg)),
        Search(records_path="$.data"),
        name=path,
    )
    async with http_client() as client:
        with pytest.raises(ArtemisError) as e:
            _ = [p async for p in source.pages(client, None)]
    assert e.value.code is ErrorCode.SOURCE_CONTRACT
    assert repr(next(iter(marker.values()))) in e.value.message and found in e.value.message
