"""A run that says `completed` delivered everything the source offered
(docs/architecture.md): runs end only on the source's own word, loops are caught by
content, and what was delivered is reconciled against the source's own count. Every
source here is a real HTTP server on 127.0.0.1, shaped as the APIs they stand for or the
real recordings say."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from artemis.crawler.models import SourceNote
from artemis_samples.server import ThreadedServer
from tests import recordings
from tests.conftest import new_task_id
from tests.e2e.test_crawl import crawl_stack, rows
from tests.e2e.test_literature import (
    _delivered,
    _delivered_tree,
    harvest,
    harvest_source,
    import_doc,
    variant,
)


def generic_doc(code: str, base_url: str, **pagination: Any) -> dict[str, Any]:
    """A registry provenance for a plain JSON API (PAGE_NUMBER over ``/items``)."""
    return {
        "provenance": {
            "provenance_code": code,
            "provenance_name": code,
            "base_url_default": base_url,
        },
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "endpoint_name": "items",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_usage_code": "SEARCH",
                "http_method_code": "GET",
                "path_template": "/items",
                "response_format_code": "JSON",
                "is_auth_required": False,
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "pagination_mode_code": "PAGE_NUMBER",
                "page_size_value": 20,
                "page_number_param_name": "page",
                "page_size_param_name": "size",
                "total_count_jsonpath": "$.total",
                "records_jsonpath": "$.items",
                **pagination,
            }
        ],
    }


@pytest.fixture(scope="module")
def sources():
    """Misbehaving JSON APIs: one that states 100 and serves 60, one that serves its
    second page again, and a quote API that renamed ``next_page`` to ``nextPage``."""
    app = FastAPI()
    app.state.calls = Counter()

    @app.get("/short/items")
    async def short(page: int = 1, size: int = 20):
        app.state.calls["short"] += 1
        first = (page - 1) * size
        items = [{"id": i} for i in range(first, min(first + size, 60))]
        return {"items": items, "total": 100}  # states 100, holds 60

    @app.get("/loop/items")
    async def loop(page: int = 1, size: int = 20):
        app.state.calls["loop"] += 1
        served = min(page, 2)  # page 3 and on: page 2 again
        return {"items": [{"id": (served - 1) * size + i} for i in range(size)], "total": 200}

    @app.get("/alternate/items")
    async def alternate(page: int = 1, size: int = 20):
        app.state.calls["alternate"] += 1
        served = 1 + (page - 1) % 2  # pages A, B, A, B, ...: never two alike in a row
        return {"items": [{"id": (served - 1) * size + i} for i in range(size)], "total": 100}

    @app.get("/renamed/quotes")
    async def renamed(symbol: str, start: str, end: str, page: int = 1, page_size: int = 10):
        app.state.calls["renamed"] += 1
        items = [
            {
                "symbol": symbol,
                "date": f"2025-11-{(page - 1) * page_size + i + 1:02d}",
                "open": 1,
                "high": 2,
                "low": 0.5,
                "close": 1.5,
                "volume": 10,
            }
            for i in range(page_size)
        ]
        return JSONResponse(
            {
                "symbol": symbol,
                "items": items,
                "page": page,
                "nextPage": page + 1 if page < 3 else None,
            }
        )

    server = ThreadedServer(app).start()
    yield server
    server.stop()


async def _fail(stack, body: dict[str, Any], code: str) -> dict[str, Any]:
    resp = await stack.run(body, code=code)
    payload = resp.json()
    assert resp.status_code == 502, payload
    assert payload["success"] is False and payload["data"]["status"] == "failed", payload
    return payload


async def test_quote_api_with_a_renamed_next_field_fails_source_contract_not_completed(
    stack, sources
):
    task_id = new_task_id()
    body = {
        "meta": {"task_id": task_id},
        "params": {"symbols": ["AAPL"], "base_url": f"{sources.url}/renamed", "page_size": 10},
    }
    payload = await _fail(stack, body, "pull_stock_quotes")
    error = payload["error"]
    assert error["code"] == "SOURCE_CONTRACT" and error["retryable"] is False
    assert "'next_page'" in error["message"] and "no such key" in error["message"]
    assert "GET " in error["message"] and "/renamed/quotes" in error["message"]  # the request
    # never retried: one request, and nothing of the run reported as delivered in full
    assert sources.server.config.app.state.calls["renamed"] == 1
    stored = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
    assert stored["status"] == "failed" and stored["error"]["code"] == "SOURCE_CONTRACT"


async def test_source_stating_100_serving_60_fails_incomplete_and_a_tolerance_lets_it_pass(
    stack, sources
):
    import_doc(stack, generic_doc("short_api", f"{sources.url}/short"))
    payload = await _fail(
        stack,
        {"meta": {"task_id": new_task_id()}, "params": {"provenance": "short_api"}},
        "source_harvest",
    )
    error = payload["error"]
    assert error["code"] == "INCOMPLETE" and error["retryable"] is False
    assert "expected 100" in error["message"] and "got 60" in error["message"]
    assert "page=4" in error["message"]  # where the run stopped: the empty page
    stats = payload["data"]["stats"]
    assert stats["expected_total"] == 100 and stats["records_fetched"] == 60
    # what the source gave was still delivered, once
    batches = await stack.sink_batches(f"source_harvest/{payload['data']['task_id']}:")
    by_key = {b["idempotency_key"]: b["records"] for b in batches if b["status"] == 200}
    ids = Counter(r["id"] for records in by_key.values() for r in records)
    assert len(ids) == 60 and set(ids.values()) == {1}

    task_id = new_task_id()
    resp = await harvest_source(
        stack, task_id, provenance="short_api", completeness_tolerance_pct=50
    )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", data
    assert data["stats"]["expected_total"] == 100 and data["stats"]["records_fetched"] == 60
    # the same numbers in the task store, the progress answer and the stream's end
    shown = (await stack.http.get(f"/tasks/{task_id}")).json()["data"]
    assert shown["stats"]["expected_total"] == 100 and shown["stats"]["records_fetched"] == 60
    events = await _events(stack, task_id)
    complete = [e for e in events if e["event"] == "complete"]
    assert complete and complete[0]["stats"]["expected_total"] == 100


async def _events(stack, task_id: str) -> list[dict[str, Any]]:
    resp = await stack.http.get(f"/tasks/{task_id}/events", params={"follow": "false"})
    return [json.loads(line[5:]) for line in resp.text.splitlines() if line.startswith("data:")]


async def test_a_source_serving_the_previous_page_again_fails_source_loop_at_once(stack, sources):
    import_doc(stack, generic_doc("loop_api", f"{sources.url}/loop"))
    before = sources.server.config.app.state.calls["loop"]
    payload = await _fail(
        stack,
        {"meta": {"task_id": new_task_id()}, "params": {"provenance": "loop_api"}},
        "source_harvest",
    )
    assert payload["error"]["code"] == "SOURCE_LOOP", payload
    assert "page=3" in payload["error"]["message"]  # the page that repeated its predecessor
    # pages 1, 2 and the repeat (3), plus at most the pages sent with it: once the total
    # is known, page-number pages go out runs.fetch_concurrency (4) at a time
    assert 3 <= sources.server.config.app.state.calls["loop"] - before <= 3 + 3


async def test_a_source_serving_an_earlier_page_again_fails_source_loop(stack, sources):
    """A, B, A, B... with a stated total of 100: counting records would say 100 of 100."""
    import_doc(stack, generic_doc("alternate_api", f"{sources.url}/alternate"))
    before = sources.server.config.app.state.calls["alternate"]
    payload = await _fail(
        stack,
        {"meta": {"task_id": new_task_id()}, "params": {"provenance": "alternate_api"}},
        "source_harvest",
    )
    assert payload["error"]["code"] == "SOURCE_LOOP", payload
    message = payload["error"]["message"]
    assert "page 2 of the run" in message and "its page 0" in message and "page=3" in message
    # Pages 1, 2 and the repeat (3), plus at most the pages in flight concurrently with it (pages
    # whose position is known go out runs.fetch_concurrency, 4, at a time).
    assert 3 <= sources.server.config.app.state.calls["alternate"] - before <= 3 + 3


async def test_spec_shaped_platform_with_23_notes_over_5_search_pages_stores_and_sends_all(
    make_stack,
):
    stack, platform = await crawl_stack(make_stack, {"sample-z": 1}, search_page_size=5)
    assert stack.settings.crawler.platforms[platform].next_page_path == "next_page"  # the sample's
    await stack.samples_http.post("/_control/platform", json={"notes_per_keyword": 23})
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"platform": platform, "keywords": ["spec"]}},
        code="crawl_notes",
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"]["status"] == "completed"
    stored = rows(stack, SourceNote, platform=platform)
    assert len(stored) == 23 and len({r.note_id for r in stored}) == 23
    sent: Counter = Counter()
    for b in await stack.sink_batches(f"crawl_notes/{task_id}:"):
        if b["status"] == 200:
            sent.update(r["note_id"] for r in b["records"])
    assert len(sent) == 23 and set(sent.values()) == {1}
    stats = (await stack.samples_http.get("/_platform/stats")).json()
    assert stats["search_calls"] == 5  # 5+5+5+5+3, the last with next_page null


# -- the real recordings as sources ---------------------------------------------------

needs_recordings = pytest.mark.skipif(
    not recordings.available(), reason="../shared/fixtures is not here"
)


@pytest.fixture(scope="module")
def recorded():
    server = ThreadedServer(recordings.create_app()).start()
    yield server
    server.stop()


@needs_recordings
@pytest.mark.parametrize("chain", ["widget", "ecology"])
async def test_recorded_crossref_chain_with_a_constant_cursor_delivers_every_record_once(
    stack, recorded, chain
):
    doc = variant(stack, "crossref", f"crossref_rec_{chain}")
    doc["provenance"]["base_url_default"] = f"{recorded.url}/crossref"
    doc.pop("rate_limit_cfg")
    import_doc(stack, doc)
    pages = recordings.load_chain(chain)
    cursors = {p["message"]["next-cursor"] for p in pages}
    assert len(cursors) == 1  # the recordings: one cursor value for the whole session
    rows_ = pages[0]["message"]["items-per-page"]
    task_id = new_task_id()
    resp = await harvest(
        stack, task_id, provenance=f"crossref_rec_{chain}", query=chain, page_size=rows_
    )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    counts = await _delivered(stack, task_id)
    expected = {i["DOI"].lower() for p in pages for i in p["message"]["items"]}
    assert {doi for _, doi in counts} == expected and set(counts.values()) == {1}
    assert data["stats"]["expected_total"] == data["stats"]["records_fetched"] == len(expected)


@needs_recordings
async def test_recorded_pubmed_pages_harvest_every_recorded_article_once(stack, recorded):
    doc = variant(stack, "pubmed", "pubmed_rec")
    doc["provenance"]["base_url_default"] = f"{recorded.url}/pubmed"
    doc.pop("rate_limit_cfg")
    import_doc(stack, doc)
    task_id = new_task_id()
    resp = await harvest(stack, task_id, provenance="pubmed_rec", query="recorded", page_size=3)
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    counts = await _delivered(stack, task_id)
    assert {pmid for _, pmid in counts} == set(recordings.recorded_articles())
    assert set(counts.values()) == {1}
    assert data["stats"]["expected_total"] == data["stats"]["records_fetched"] == 8


# -- PubMed's real cap ---------------------------------------------------------------------


@pytest.mark.parametrize("hits", [10_000, 25_000])
async def test_pubmed_window_over_the_real_9999_cap_is_split_and_delivered_once(stack, hits):
    doc = variant(stack, "pubmed", f"pubmed_cap_{hits}")
    doc.pop("rate_limit_cfg")
    doc["batching_cfg"][0].update(detail_batch_size=2500, post_threshold_ids=200)
    import_doc(stack, doc)
    per_day = 1000
    await stack.samples_http.post(
        "/_control/literature",
        json={"enforce_rate": False, "pubmed_total": hits, "pubmed_per_day": per_day},
    )
    try:
        task_id = new_task_id()
        days = hits // per_day
        resp = await harvest(
            stack,
            task_id,
            provenance=f"pubmed_cap_{hits}",
            query=f"cap-{task_id}",
            start="2025-01-01",
            end=f"2025-01-{days:02d}",
            page_size=5000,
        )
    finally:
        await stack.samples_http.post(
            "/_control/literature",
            json={"enforce_rate": True, "pubmed_total": 3000, "pubmed_per_day": 30},
        )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    counts = await _delivered_tree(stack, task_id)
    assert len(counts) == hits and set(counts.values()) == {1}
    assert data["stats"]["expected_total"] == hits and data["stats"]["records_fetched"] == hits
    calls = (await stack.samples_http.get("/_literature/calls")).json()
    mine = [
        c for c in calls if c["api"] == "esearch" and c["params"].get("term") == f"cap-{task_id}"
    ]
    # no page was asked past the cap, so no answer came back clamped or refused
    assert all(int(c["params"]["retstart"]) + int(c["params"]["retmax"]) <= 9999 for c in mine)


async def test_sample_pubmed_refuses_past_the_cap_in_band_as_the_live_service_does(stack):
    """The shape the live service answers at and past the cap (biopython #4189, #4353)."""
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        await http.post(
            "/_control/literature",
            json={"enforce_rate": False, "pubmed_total": 20_000, "pubmed_per_day": 1000},
        )
        try:
            past = await http.get(
                "/entrez/eutils/esearch.fcgi",
                params={"db": "pubmed", "term": "x", "retmode": "json", "retstart": 15000},
            )
            crossing = await http.get(
                "/entrez/eutils/esearch.fcgi",
                params={
                    "db": "pubmed",
                    "term": "x",
                    "retmode": "json",
                    "retstart": 9500,
                    "retmax": 1000,
                },
            )
        finally:
            await http.post(
                "/_control/literature",
                json={"enforce_rate": True, "pubmed_total": 3000, "pubmed_per_day": 30},
            )
    assert past.status_code == 200
    with pytest.raises(ValueError):
        json.loads(past.text)  # a raw newline inside the JSON string: strict JSON refuses it
    assert (
        "cannot be larger than 9998"
        in json.loads(past.text, strict=False)["esearchresult"]["ERROR"]
    )
    result = crossing.json()["esearchresult"]
    assert len(result["idlist"]) == 499 and result["count"] == "20000"
    assert result["warninglist"]["outputmessages"] == [
        "Restrictions achieved. start and count adjusted to 9500, 499"
    ]
