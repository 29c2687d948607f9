"""Page-number and offset pages in parallel once the source stated its total, against a
real HTTP server on loopback that counts the requests it has in flight."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import pytest
from fastapi import FastAPI, Request

from artemis.paging import OffsetPaginator
from artemis.sources import PageNumberPaginator, RestSource
from artemis.sources.rest import Search
from artemis_samples.server import ThreadedServer
from tests.helpers import http_client

TOTAL = 23


class Counting:
    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.requests: list[dict[str, str]] = []
        self.short_offset: int | None = None  # an offset answered with one record fewer
        self.cap: int | None = None  # the most records the server gives a page


def make_app(state: Counting) -> FastAPI:
    app = FastAPI()

    async def answer(request: Request, start: int, size: int) -> dict[str, Any]:
        state.requests.append(dict(request.query_params))
        state.in_flight += 1
        state.most = max(state.most, state.in_flight)
        try:
            await asyncio.sleep(0.05)
        finally:
            state.in_flight -= 1
        if state.short_offset is not None and start == state.short_offset:
            size -= 1
        if state.cap is not None:
            size = min(size, state.cap)
        items = [{"id": i} for i in range(start, min(TOTAL, start + size))]
        return {"items": items, "total": TOTAL}

    @app.get("/offset")
    async def offset(request: Request, offset: int = 0, limit: int = 5) -> dict[str, Any]:
        return await answer(request, offset, limit)

    @app.get("/pages")
    async def pages(request: Request, page: int = 1, page_size: int = 5) -> dict[str, Any]:
        return await answer(request, (page - 1) * page_size, page_size)

    return app


@pytest.fixture
def server():
    state = Counting()
    srv = ThreadedServer(make_app(state)).start()
    yield srv.url, state
    srv.stop()


def offset_source(url: str, parallel: int) -> RestSource:
    return RestSource(
        f"{url}/offset",
        OffsetPaginator(limit=5, total_path="$.total"),
        Search(record_key="$.id", parallel_pages=parallel),
    )


def pages_source(url: str, parallel: int) -> RestSource:
    return RestSource(
        f"{url}/pages",
        PageNumberPaginator(page_size=5, next_page_path=None, total_path="$.total"),
        Search(record_key="$.id", parallel_pages=parallel),
    )


async def collect(source: RestSource, checkpoint=None, stop_after: int | None = None):
    ids: list[int] = []
    last = None
    async with http_client() as client:
        async with aclosing(source.pages(client, checkpoint)) as pages:
            n = 0
            async for page in pages:
                ids += [r["id"] for r in page.records]
                last = page.checkpoint
                n += 1
                if stop_after is not None and n == stop_after:
                    break
    return ids, last


@pytest.mark.parametrize("make", [offset_source, pages_source])
async def test_pages_go_out_together_and_arrive_in_order_each_once(server, make) -> None:
    url, state = server
    ids, last = await collect(make(url, 4))
    assert ids == list(range(TOTAL)) and last is None
    # the first page alone (the total is not known before it), then up to 4 at once
    assert 2 <= state.most <= 4
    assert len(state.requests) == 5  # ceil(23 / 5): not one request wasted


@pytest.mark.parametrize("make", [offset_source, pages_source])
async def test_one_at_a_time_without_parallel_pages(server, make) -> None:
    url, state = server
    ids, _ = await collect(make(url, 1))
    assert ids == list(range(TOTAL)) and state.most == 1


async def test_a_retry_resumes_after_the_last_page_handed_over(server) -> None:
    url, state = server
    first, checkpoint = await collect(offset_source(url, 4), stop_after=2)
    assert first == list(range(10)) and checkpoint is not None
    sent_before = len(state.requests)
    rest, last = await collect(offset_source(url, 4), checkpoint)
    assert first + rest == list(range(TOTAL)) and last is None
    # the resumed fetch asks for the 3 pages left; at most the pages that were in flight
    # when the first one stopped were asked twice
    assert len(state.requests) - sent_before == 3
    assert sent_before <= 2 + 3


async def test_a_short_page_makes_the_guesses_wrong_and_nothing_is_lost(server) -> None:
    url, state = server
    state.short_offset = 5  # offset 5 answers 4 records: every later offset moves by one
    ids, last = await collect(offset_source(url, 4))
    assert ids == list(range(TOTAL)) and last is None
    asked = [int(r["offset"]) for r in state.requests]
    # every offset the paginator needed was asked; the stale guesses were dropped unused
    assert {0, 5, 9, 14, 19}.issubset(asked)


async def test_a_source_capping_its_pages_stops_the_guessing(server) -> None:
    url, state = server
    state.cap = 3  # asked for 5 a page, it gives 3: every offset guess would miss
    ids, last = await collect(offset_source(url, 4))
    assert ids == list(range(TOTAL)) and last is None
    # the 8 pages it takes, plus one round of missed guesses (3), no more
    assert 8 <= len(state.requests) <= 8 + 3
