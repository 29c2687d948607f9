"""A source's own rate-limit headers close the provenance's gate before a 429, for every
worker (artemis/registry/limit_headers.py), against real servers on 127.0.0.1 that keep
a budget per window and answer as their public documents say:

- GitHub's REST API ("Rate limits for the REST API"): every answer carries
  ``x-ratelimit-remaining`` ("the number of requests remaining in the current rate limit
  window") and ``x-ratelimit-reset`` ("the time at which the current rate limit window
  resets in UTC epoch seconds"); past the budget the answer is 429 with remaining 0.
- draft-ietf-httpapi-ratelimit-headers-10: ``RateLimit: "default";r=50;t=30`` (§4: ``r``
  the remaining quota units, ``t`` the seconds until more quota) and ``RateLimit-Policy:
  "default";q=100;w=60`` (§3).

The servers count their 429s: with header reading on a run gets none, with it off (the
control) it does."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import Counter
from typing import Any

import pytest
import yaml
from aiohttp import web
from alembic import command
from sqlalchemy import inspect

from artemis import ratelimit
from artemis.config import load_settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.migrate import alembic_config
from artemis.registry.client import ContractClient
from artemis.registry.yaml_io import import_yaml
from tests.helpers import http_client
from tests.registry.net import (
    Server,
    contract_client,
    contract_of,
    provenance,
    settings_for,
    unique_code,
)


class BudgetApi:
    """A budget of ``budget`` requests per fixed window of ``window`` whole seconds (the
    windows start at multiples of it, epoch time, as an hourly limit starts on the hour);
    a request past the budget is answered 429. ``style``: ``github`` answers the
    ``x-ratelimit-*`` headers (reset in epoch seconds), ``ietf`` the ``RateLimit`` and
    ``RateLimit-Policy`` fields (``t`` rounded up: never earlier than the reset)."""

    def __init__(self, budget: int, window: int, style: str) -> None:
        self.budget, self.window, self.style = budget, window, style
        self.current, self.used = -1, 0
        self.served = self.refused = 0
        self.arrived: list[float] = []  # each request's arrival, epoch seconds

    async def handle(self, request: web.Request) -> web.Response:
        now = time.time()
        self.arrived.append(now)
        window = int(now // self.window)
        if window != self.current:
            self.current, self.used = window, 0
        ok = self.used < self.budget
        self.used += ok
        if ok:
            self.served += 1
        else:
            self.refused += 1
        left, reset_at = self.budget - self.used, (window + 1) * self.window
        if self.style == "github":
            headers = {
                "x-ratelimit-limit": str(self.budget),
                "x-ratelimit-remaining": str(left),
                "x-ratelimit-used": str(self.used),
                "x-ratelimit-reset": str(reset_at),
            }
        else:
            headers = {
                "RateLimit": f'"default";r={left};t={math.ceil(reset_at - now)}',
                "RateLimit-Policy": f'"default";q={self.budget};w={self.window}',
            }
        if not ok:
            return web.json_response(
                {"message": "rate limit exceeded"}, status=429, headers=headers
            )
        return web.json_response(self.body(request), headers=headers)

    def body(self, request: web.Request) -> dict[str, Any]:
        """The answer to a request inside the budget."""
        return {"items": [{"id": 1}]}


@pytest.fixture
async def github():
    api = BudgetApi(budget=100, window=1, style="github")
    server = await Server({("GET", "/items"): api.handle}).start()
    yield server, api
    await server.stop()


@pytest.fixture
async def ietf():
    api = BudgetApi(budget=40, window=1, style="ietf")
    server = await Server({("GET", "/items"): api.handle}).start()
    yield server, api
    await server.stop()


async def harvest(clients: list[ContractClient], n: int, concurrency: int) -> Counter[int]:
    """``n`` requests, ``concurrency`` at a time spread over ``clients`` (the workers):
    the statuses they got."""
    left = iter(range(n))
    statuses: Counter[int] = Counter()

    async def loop(cc: ContractClient) -> None:
        async with http_client() as http:
            for _ in left:
                answer = await cc.send(http, "GET", f"{cc.base}/items", {}, "GET /items")
                statuses[answer.status_code] += 1

    await asyncio.gather(*(loop(clients[i % len(clients)]) for i in range(concurrency)))
    return statuses


def _rate_limit(**row: Any) -> dict[str, Any]:
    return provenance(unique_code("rl"), "http://placeholder", rate_limit_cfg=[row])


def _client(reg, key_file: str, base: str, **row: Any) -> ContractClient:
    doc = _rate_limit(**row)
    doc["provenance"]["base_url_default"] = base
    return contract_client(reg, key_file, doc)


async def test_a_source_answering_x_ratelimit_gets_no_429_in_500_requests(reg, key_file, github):
    server, api = github
    # 4 requests in flight: a reserve of 3 keeps the ones past the gate inside the budget.
    cc = _client(
        reg, key_file, server.url, ratelimit_headers_code="X_RATELIMIT", remaining_reserve_value=3
    )
    began = time.monotonic()
    assert await harvest([cc], 500, concurrency=4) == {200: 500}
    assert (api.served, api.refused) == (500, 0)
    # 100 a window: the run waited for four resets at least, so it spans more than 3 s
    # (the first window partial: it began up to a second before the first reset).
    assert time.monotonic() - began > 3.0


async def test_without_header_reading_the_same_run_meets_429s(reg, key_file, github):
    server, api = github
    cc = _client(reg, key_file, server.url)
    assert cc.limit_headers is None and cc.gate_for() is None
    statuses = await harvest([cc], 500, concurrency=4)
    assert statuses[429] == api.refused >= 1
    assert statuses[200] == api.served == 500 - api.refused


async def test_the_ietf_fields_close_the_gate_until_t(reg, key_file, ietf):
    server, api = ietf
    cc = _client(
        reg,
        key_file,
        server.url,
        ratelimit_headers_code="IETF",
        remaining_reserve_value=1,
        qps_limit=1000,
    )
    # 40 a window: the run waits for at least one reset
    assert await harvest([cc], 60, concurrency=2) == {200: 60}
    assert (api.served, api.refused) == (60, 0)


async def test_two_workers_share_the_closed_gate(reg, key_file, github):
    server, api = github
    doc = _rate_limit(ratelimit_headers_code="X_RATELIMIT", remaining_reserve_value=3)
    doc["provenance"]["base_url_default"] = server.url
    first = contract_client(reg, key_file, doc)
    # Another worker process: its own gate object, the same row in the database.
    ratelimit._gates.clear()
    second = ContractClient(contract_of(reg, doc["provenance"]["provenance_code"]), first.settings)
    assert first.gate is not second.gate and first.gate.key == second.gate.key
    assert await harvest([first, second], 150, concurrency=4) == {200: 150}
    assert (api.served, api.refused) == (150, 0)
    # One worker spends the budget; the other's next request waits for the reset.
    async with http_client() as http:
        while True:
            answer = await first.send(http, "GET", f"{server.url}/items", {}, "GET /items")
            if int(answer.headers["x-ratelimit-remaining"]) <= 3:
                break
        reset_at = float(answer.headers["x-ratelimit-reset"])
        await second.send(http, "GET", f"{server.url}/items", {}, "GET /items")
    assert api.arrived[-1] >= reset_at
    assert api.refused == 0


async def test_a_gate_closed_past_the_longest_wait_is_a_retryable_wait(reg, key_file):
    async def spent(request: web.Request) -> web.Response:
        headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}
        return web.json_response({"items": []}, headers=headers)

    server = await Server({("GET", "/items"): spent}).start()
    try:
        doc = _rate_limit(ratelimit_headers_code="X_RATELIMIT", reset_format_code="DELTA_SECONDS")
        doc["provenance"]["base_url_default"] = server.url
        import_yaml(reg, yaml.safe_dump(doc), key_file)
        settings = load_settings(
            None,
            database={"url": reg.url.render_as_string(hide_password=False)},
            vault={"master_key_file": key_file},
            runs={"retry_max_interval_s": 5.0},
        )
        cc = ContractClient(contract_of(reg, doc["provenance"]["provenance_code"]), settings)
        async with http_client() as http:
            await cc.send(http, "GET", f"{server.url}/items", {}, "GET /items")
            with pytest.raises(ArtemisError) as e:
                await cc.send(http, "GET", f"{server.url}/items", {}, "GET /items")
    finally:
        await server.stop()
    assert e.value.code is ErrorCode.SOURCE_ERROR and e.value.retryable
    assert 25 < (e.value.retry_after_s or 0) <= 30.01
    assert "budget is spent" in e.value.message
    assert len(server.seen) == 1  # the second request never went


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ({"reset_header_name": "X-Reset"}, "reset_header_name is read only with"),
        (
            {"ratelimit_headers_code": "IETF", "reset_format_code": "EPOCH_SECONDS"},
            "IETF's t is DELTA_SECONDS",
        ),
        (
            {"ratelimit_headers_code": "X_RATELIMIT", "policy_header_name": "P"},
            "policy_header_name is read only with ratelimit_headers_code IETF",
        ),
        (
            {"ratelimit_headers_code": "X_RATELIMIT", "remaining_header_name": "X Left"},
            "is not an HTTP field name",
        ),
        (
            {"ratelimit_headers_code": "X_RATELIMIT", "remaining_reserve_value": -1},
            "remaining_reserve_value must be 0 or more",
        ),
        ({"ratelimit_headers_code": "GITHUB"}, "X_RATELIMIT"),
    ],
)
def test_header_columns_that_cannot_act_are_refused_at_import(reg, key_file, row, said):
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(_rate_limit(**row)), key_file)
    assert said in e.value.message


def test_a_row_written_around_the_import_stops_the_run(reg, key_file):
    contract = contract_client(reg, key_file, _rate_limit(qps_limit=5)).contract
    bad = {**(contract.rate_limit or {}), "reset_header_name": "X-Reset"}
    with pytest.raises(ArtemisError) as e:
        ContractClient(dataclasses.replace(contract, rate_limit=bad), settings_for(reg, key_file))
    assert e.value.code is ErrorCode.CONFIG_ERROR and not e.value.retryable
    assert "reset_header_name is read only with" in e.value.message


def test_the_header_columns_go_down_and_up_again(reg):
    cfg = alembic_config(str(reg.url.render_as_string(hide_password=False)))

    def columns(table: str) -> set[str]:
        return {c["name"] for c in inspect(reg).get_columns(table)}

    try:
        command.downgrade(cfg, "0019_resources")
        assert "closed_until" not in columns("rate_gate")
        assert "ratelimit_headers_code" not in columns("reg_prov_rate_limit_cfg")
    finally:
        command.upgrade(cfg, "head")
    assert "closed_until" in columns("rate_gate")
    command.check(cfg)
