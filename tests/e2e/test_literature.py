"""literature_harvest runs through the registry contract against the sample PubMed and
Crossref servers."""

from __future__ import annotations

from collections import Counter

import httpx

from tests.conftest import new_task_id

KEYS = {"provenance", "id", "doi", "title", "journal", "published", "authors", "abstract"}


async def _delivered(stack, task_id: str) -> Counter:
    batches = await stack.sink_batches(f"literature_harvest/{task_id}:")
    by_key = {b["idempotency_key"]: b["records"] for b in batches if b["status"] == 200}
    counts: Counter = Counter()
    for records in by_key.values():
        for r in records:
            assert set(r) == KEYS
            counts[(r["provenance"], r["id"])] += 1
    return counts


async def test_pubmed_harvest_delivers_every_record_once(stack):
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        await http.post("/_control/literature", json={"reset": True})
    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "params": {
                "provenance": "pubmed",
                "task_type": "harvest",
                "query": "cancer",
                "start": "2025-01-01",
                "end": "2025-01-10",
            },
        },
        code="literature_harvest",
    )
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "completed", data
    counts = await _delivered(stack, task_id)
    assert len(counts) == 300 and set(counts.values()) == {1}  # 10 days x 30 per day
    assert data["stats"]["records_emitted"] == 300
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        calls = (await http.get("/_literature/calls")).json()
    searches = [c for c in calls if c["api"] == "esearch"]
    fetches = [c for c in calls if c["api"] == "efetch"]
    assert searches[0]["params"]["usehistory"] == "y"
    assert searches[0]["params"]["mindate"] == "2025/01/01"
    assert searches[0]["params"]["maxdate"] == "2025/01/10"
    assert searches[0]["params"]["datetype"] == "edat"
    assert all(c["params"].get("tool") and c["params"].get("email") for c in calls)
    assert [len(c["params"]["id"].split(",")) for c in fetches] == [200, 100]


async def test_crossref_harvest_with_cursor_delivers_every_record_once(stack):
    task_id = new_task_id()
    resp = await stack.run(
        {
            "meta": {"task_id": task_id},
            "params": {
                "provenance": "crossref",
                "task_type": "harvest",
                "query": "ecology",
                "start": "2025-01-01",
                "end": "2025-01-10",
                "page_size": 100,
            },
        },
        code="literature_harvest",
    )
    assert resp.status_code == 200, resp.text
    counts = await _delivered(stack, task_id)
    assert len(counts) == 300 and set(counts.values()) == {1}
    async with httpx.AsyncClient(base_url=stack.samples_url) as http:
        calls = [
            c
            for c in (await http.get("/_literature/calls")).json()
            if c["api"] == "works" and c["params"].get("query") == "ecology"
        ]
    assert calls[0]["params"]["cursor"] == "*" and calls[0]["params"]["rows"] == "100"
    assert calls[1]["params"]["cursor"] != "*"
    assert "offset" not in calls[0]["params"]
    assert calls[0]["params"]["filter"] == "from-index-date:2025-01-01,until-index-date:2025-01-10"
    assert calls[0]["params"]["mailto"]


async def test_unknown_provenance_and_bad_task_type_are_422(stack):
    resp = await stack.run({"params": {"provenance": "arxiv"}}, code="literature_harvest")
    assert (
        resp.status_code == 422 and "unknown provenance 'arxiv'" in resp.json()["error"]["message"]
    )
    resp = await stack.run(
        {"params": {"provenance": "pubmed", "task_type": "weekly"}}, code="literature_harvest"
    )
    assert resp.status_code == 422 and "params.task_type" in resp.json()["error"]["message"]
    resp = await stack.run(
        {"params": {"provenance": "pubmed", "contract": {}}}, code="literature_harvest"
    )
    assert resp.status_code == 422 and "params.contract" in resp.json()["error"]["message"]
