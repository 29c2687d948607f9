"""The sample servers' outage faults (``POST /_control/{quotes|sink|cronjob}``): a window
of error answers (``status`` + ``for_s``), a window of requests held unanswered (``hang``),
a window of answers whose body trickles in (``trickle_s``), ``GET /_control/{target}``
and ``POST /_control/reset``; the count-based ``times`` faults too. A server of
this module's own on 127.0.0.1, spoken to over real HTTP; waits are polls with deadlines."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from artemis.transport_errors import ReadTimeout
from artemis_samples.app import create_app
from artemis_samples.server import ThreadedServer
from tests.helpers import eventually, http_client

QUOTE = "/quotes?symbol=ACME&start=2024-01-02&end=2024-01-02"


@pytest.fixture(scope="module")
def server():
    srv = ThreadedServer(create_app()).start()
    yield srv.url
    # nothing held when the server stops: a held request ends at a reset
    httpx.post(f"{srv.url}/_control/reset", json={})
    srv.stop()


@pytest.fixture
async def http(server: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server, timeout=10) as client:
        await client.post("/_control/reset", json={})
        yield client
        await client.post("/_control/reset", json={})


async def fault(http: httpx.AsyncClient, target: str, **spec: Any) -> None:
    resp = await http.post(f"/_control/{target}", json=spec)
    assert resp.json() == {"ok": True}, resp.text


async def state(http: httpx.AsyncClient, target: str) -> dict[str, Any]:
    resp = await http.get(f"/_control/{target}")
    assert resp.status_code == 200, resp.text
    return resp.json()


async def test_a_status_window_fails_every_request_until_it_ends(http):
    # ``times`` is ignored with ``for_s``: more than one request fails
    await fault(http, "quotes", status=503, times=1, for_s=1.5, retry_after="2")
    now = await state(http, "quotes")
    assert now["active"] is True and now["mode"] == "status"
    assert 0 < now["seconds_left"] <= 1.5
    for _ in range(3):
        resp = await http.get(QUOTE)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "2"

    async def back() -> bool:
        return (await http.get(QUOTE)).status_code == 200

    began = time.monotonic()
    await eventually(back, "the quotes to answer again", timeout=10)
    assert time.monotonic() - began < 5
    now = await state(http, "quotes")
    assert now["active"] is False and now["mode"] is None and now["seconds_left"] == 0
    assert (await http.get(QUOTE)).json()["items"][0]["symbol"] == "ACME"


async def test_count_faults_work_as_before(http):
    await fault(http, "quotes", status=500, times=2, retry_after="3")
    now = await state(http, "quotes")
    assert now["active"] is True and now["mode"] == "times" and now["times"] == 2
    assert now["seconds_left"] is None
    first, second, third = [await http.get(QUOTE) for _ in range(3)]
    assert first.status_code == second.status_code == 500
    assert first.headers["retry-after"] == "3"
    assert third.status_code == 200
    assert (await state(http, "quotes"))["active"] is False
    # no ``times``: the next request alone fails
    await fault(http, "quotes", status=429)
    assert [(await http.get(QUOTE)).status_code for _ in range(2)] == [429, 200]


async def test_a_hang_window_holds_requests_until_it_ends(http):
    await fault(http, "quotes", hang=True, for_s=2)
    assert (await state(http, "quotes"))["mode"] == "hang"
    # a client with a read timeout cuts it
    began = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        await http.get(QUOTE, timeout=httpx.Timeout(5, read=0.4))
    assert time.monotonic() - began < 2
    # a patient one is answered, normally, once the window has ended
    resp = await http.get(QUOTE, timeout=10)
    assert resp.status_code == 200 and resp.json()["symbol"] == "ACME"
    assert (await state(http, "quotes"))["active"] is False
    assert (await http.get(QUOTE, timeout=1)).status_code == 200


async def test_a_reset_releases_a_held_request(http):
    await fault(http, "quotes", hang=True, for_s=60)
    held = asyncio.create_task(http.get(QUOTE, timeout=30))
    await eventually(lambda: _calls_of(http, "ACME"), "the request to reach the server", 10)
    assert not held.done()  # held: nothing answered it
    began = time.monotonic()
    await http.post("/_control/reset", json={})
    resp = await asyncio.wait_for(held, timeout=5)
    assert resp.status_code == 200 and time.monotonic() - began < 2


async def _calls_of(http: httpx.AsyncClient, symbol: str) -> bool:
    calls = (await http.get("/_quotes/calls")).json()
    return any(c["symbol"] == symbol for c in calls)


async def test_a_trickle_window_sends_headers_at_once_and_the_body_a_byte_at_a_time(http):
    expected = (await http.get(QUOTE)).json()["items"]
    await fault(http, "quotes", trickle_s=0.25, for_s=30)
    assert (await state(http, "quotes"))["mode"] == "trickle"
    # every read comes well within a 2 s per-read timeout ...
    per_read = httpx.Timeout(5, read=2.0)
    began = time.monotonic()
    async with http.stream("GET", QUOTE, timeout=per_read) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        assert time.monotonic() - began < 1  # the headers came at once
        chunks: list[bytes] = []
        reads = resp.aiter_raw()
        while sum(map(len, chunks)) < 5:
            chunks.append(await reads.__anext__())
        # ... yet 5 bytes take 4 pauses of 0.25 s at least (the server sends the 5th
        # no sooner than 1 s after the 1st, which follows the request)
        assert time.monotonic() - began >= 1.0
        assert len(chunks) >= 3, chunks  # a byte or two per read, not the body at once
        # ... and the rest goes at once when the fault is cleared
        await http.post("/_control/reset", json={})
        cleared = time.monotonic()
        async for chunk in reads:
            chunks.append(chunk)
        assert time.monotonic() - cleared < 1.5  # not ~200 bytes x 0.25 s
    body = json.loads(b"".join(chunks))
    assert body["symbol"] == "ACME" and body["items"] == expected


async def test_the_workers_client_cuts_a_trickling_answer(http, server):
    await fault(http, "quotes", trickle_s=0.3, for_s=30)
    async with http_client(timeout_seconds=1.0) as client:
        began = time.monotonic()
        with pytest.raises(ReadTimeout):
            await client.get(f"{server}{QUOTE}")
        assert time.monotonic() - began < 3


async def test_the_sink_honours_the_windows_and_records_every_post(http, server):
    batch = [{"id": 1}, {"id": 2}]
    await fault(http, "sink", status=503, for_s=1.5)
    for key in ("k1", "k2"):
        resp = await http.post("/sink/outage", json=batch, headers={"Idempotency-Key": key})
        assert resp.status_code == 503

    async def accepted() -> bool:
        resp = await http.post("/sink/outage", json=batch, headers={"Idempotency-Key": "k3"})
        return resp.status_code == 200

    await eventually(accepted, "the sink to take a batch again", timeout=10)
    seen = [b for b in (await http.get("/_sink/batches")).json() if b["name"] == "outage"]
    assert [(b["idempotency_key"], b["status"]) for b in seen[:2]] == [("k1", 503), ("k2", 503)]
    assert all(b["records"] is None for b in seen if b["status"] == 503)
    assert seen[-1]["status"] == 200 and seen[-1]["records"] == batch

    # a hung sink: the client gives up; the batch is taken once the window ends
    await fault(http, "sink", hang=True, for_s=1.5)
    short = httpx.Timeout(5, read=0.3)
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/sink/held", json=batch, headers={"Idempotency-Key": "h1"}, timeout=short)

    async def held_taken() -> list[dict[str, Any]]:
        return [b for b in (await http.get("/_sink/batches")).json() if b["name"] == "held"]

    taken = await eventually(held_taken, "the held batch to be recorded", timeout=10)
    assert taken[0]["status"] == 200 and taken[0]["records"] == batch

    # a trickling sink: the batch is taken, its answer dribbles out
    await fault(http, "sink", trickle_s=0.3, for_s=30)
    async with http_client(timeout_seconds=0.8) as client:
        with pytest.raises(ReadTimeout):
            await client.post(f"{server}/sink/slow", json=batch)
    slow = [b for b in (await http.get("/_sink/batches")).json() if b["name"] == "slow"]
    assert slow and slow[0]["status"] == 200


async def test_the_cronjob_callback_honours_the_windows(http, server):
    body = {"result": "success"}
    await fault(http, "cronjob", status=503, for_s=1.5)
    assert (await http.post("/cronjob/runs/r1/callback", json=body)).status_code == 503
    assert (await http.post("/cronjob/runs/r1/callback", json=body)).status_code == 503
    # progress calls are not the callback: never failed (as with the count faults)
    assert (await http.post("/cronjob/runs/r1/progress", json={})).status_code == 200

    async def taken() -> bool:
        return (await http.post("/cronjob/runs/r1/callback", json=body)).status_code == 200

    await eventually(taken, "the callback to be taken again", timeout=10)
    calls = [c for c in (await http.get("/_cronjob/calls")).json() if c["run_id"] == "r1"]
    statuses = [(c["kind"], c["status"]) for c in calls]
    assert statuses[:3] == [("callback", 503), ("callback", 503), ("progress", 200)]
    assert statuses[-1] == ("callback", 200)

    await fault(http, "cronjob", hang=True, for_s=1.5)
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/cronjob/runs/r2/callback", json=body, timeout=httpx.Timeout(5, read=0.3))

    await fault(http, "cronjob", trickle_s=0.3, for_s=30)
    async with http_client(timeout_seconds=0.8) as client:
        with pytest.raises(ReadTimeout):
            await client.post(f"{server}/cronjob/runs/r3/callback", json=body)


async def test_reset_clears_every_window(http):
    await fault(http, "quotes", status=503, for_s=60)
    await fault(http, "sink", hang=True, for_s=60)
    await fault(http, "cronjob", trickle_s=1, for_s=60)
    assert all([(await state(http, t))["active"] for t in ("quotes", "sink", "cronjob")])
    await http.post("/_control/reset", json={})
    for target in ("quotes", "sink", "cronjob"):
        assert (await state(http, target))["active"] is False
    fast = httpx.Timeout(5, read=1)
    assert (await http.get(QUOTE, timeout=fast)).status_code == 200
    assert (await http.post("/sink/after", json=[], timeout=fast)).status_code == 200
    resp = await http.post("/cronjob/runs/r9/callback", json={}, timeout=fast)
    assert resp.status_code == 200 and resp.json() == {"ok": True}


async def test_control_refuses_unknown_targets_and_bad_faults(http):
    assert (await http.get("/_control/nowhere")).status_code == 404
    assert (await http.post("/_control/nowhere", json={})).status_code == 404
    assert (await http.post("/_control/quotes", json={"for_s": "soon"})).status_code == 422
    assert (await http.post("/_control/quotes", json={"for_s": -1})).status_code == 422
    assert (await http.post("/_control/quotes", json=[1])).status_code == 422
    assert (await state(http, "quotes"))["active"] is False
