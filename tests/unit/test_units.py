"""A run's units fetched concurrently (artemis/tasks/base.py), against the sample quote
API on loopback: every page once, several units in flight at a time, and a resumed fetch
that picks every unit up where the last checkpoint handed over left it."""

from __future__ import annotations

import httpx
import pytest

from artemis.sources import PageNumberPaginator, RestSource
from artemis.sources.rest import Search, SourceHooks
from artemis.tasks.base import UnitsCheckpoint, fetch_units
from tests.helpers import http_client

SYMBOLS = ["AAA", "BBB", "CCC", "DDD", "EEE"]


def sources(base: str, page_size: int = 10) -> list[RestSource]:
    # 2024-01-01..2024-02-20: 51 quotes a symbol, 6 pages of 10
    return [
        RestSource(
            f"{base}/quotes",
            PageNumberPaginator(page_size=page_size),
            Search(
                params={"symbol": s, "start": "2024-01-01", "end": "2024-02-20"},
                records_path="$.items",
            ),
            name=f"quotes:{s}",
        )
        for s in SYMBOLS
    ]


async def collect(base, checkpoint=None, concurrency=3, stop_after=None):
    pages = []
    async with http_client() as client:
        gen = fetch_units(sources(base), client, checkpoint, concurrency=concurrency, tolerance=0.0)
        try:
            async for page in gen:
                pages.append(page)
                if stop_after is not None and len(pages) >= stop_after:
                    break
        finally:
            await gen.aclose()
    return pages


def keys(pages) -> list[tuple[str, str]]:
    return [(r["symbol"], r["date"]) for p in pages for r in p.records]


async def test_every_record_once_with_units_in_flight_together(samples):
    httpx.post(f"{samples.url}/_control/latency", json={"latency_ms": 20})
    try:
        pages = await collect(samples.url, concurrency=3)
    finally:
        httpx.post(f"{samples.url}/_control/latency", json={"latency_ms": 0})
    got = keys(pages)
    assert len(got) == len(set(got)) == 5 * 51
    assert pages[-1].checkpoint is None and pages[-1].info.units_done == 5
    assert all(p.checkpoint is not None for p in pages[:-1])
    # Concurrent: the first pages come from three symbols, not one after another.
    first = {p.records[0]["symbol"] for p in pages[:3]}
    assert len(first) == 3


@pytest.mark.parametrize("stop_after", [1, 4, 9, 14])
async def test_a_resumed_fetch_delivers_the_rest_exactly_once(samples, stop_after):
    before = await collect(samples.url, concurrency=3, stop_after=stop_after)
    cp = before[-1].checkpoint
    assert cp is not None and cp["v"] == 2
    after = await collect(samples.url, checkpoint=cp, concurrency=3)
    got = keys(before) + keys(after)
    assert len(got) == len(set(got)) == 5 * 51


def test_the_checkpoint_of_earlier_builds_is_read():
    old = UnitsCheckpoint.load({"source": 2, "state": {"kind": "page_number"}, "expected": 7})
    assert old.done == {0, 1} and old.open == {2: {"kind": "page_number"}}
    assert old.expected == 7
    fresh = UnitsCheckpoint.load({"source": 3, "state": None})
    assert fresh.done == {0, 1, 2} and fresh.open == {}
    again = UnitsCheckpoint.load(old.dump())
    assert again == old


def test_an_operators_rate_paces_only_sources_without_a_limit_of_their_own():
    async def own_limit() -> None:
        return None

    async def operators_rate() -> None:
        return None

    plain = RestSource("http://127.0.0.1/quotes", PageNumberPaginator(page_size=10))
    limited = RestSource(
        "http://127.0.0.1/quotes",
        PageNumberPaginator(page_size=10),
        Search(),
        SourceHooks(before_request=own_limit),
    )
    for src in (plain, limited):
        src.limit_rate(operators_rate)
    assert plain.before_request is operators_rate
    assert limited.before_request is own_limit
