"""source_harvest end to end: registry provenances of no paper family harvested, updated
and backfilled through real API and worker processes and Temporal, against real HTTP
servers on 127.0.0.1 shaped as public APIs document themselves, into real SQLite and
PostgreSQL tables and files.

The servers (one app, each test under its own first path segment so runs never see each
other's records or requests):

- GitHub's REST "list repository issues" (``GET /repos/{owner}/{repo}/issues`` with
  ``since``, ``state``, ``sort``, ``direction``, ``per_page``, ``page``; a ``Link`` header
  on every page of an answer of more than one page, the last without ``rel="next"``);
- GitHub's "list public repositories" (``GET /repositories?since=<id>``: only ids greater
  than ``since``, paged by ``since`` alone through the ``Link`` header);
- Shopify's REST Admin "list orders" (``GET /admin/api/2024-01/orders.json`` with
  ``updated_at_min`` / ``updated_at_max`` (inclusive, ISO 8601 with the shop's offset),
  ``since_id``, ``status``, ``limit``; cursor paging by ``page_info`` in the ``Link``
  header, whose requests may carry only ``limit``);
- WooCommerce's REST "list orders" (``GET /wp-json/wc/v3/orders`` with ``modified_after``,
  ``orderby``, ``order``, ``per_page``, ``page``): ``date_modified`` written and
  ``modified_after`` read as the site's wall clock, without an offset.

Each filters by its parameters itself and logs every request it got, so a test asserts
what the source was asked as well as what landed.
"""

from __future__ import annotations

import base64
import json
import math
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from artemis.registry.resolve import as_utc
from artemis_samples.server import ThreadedServer
from tests.conftest import new_task_id
from tests.e2e.test_literature import harvest, harvest_source, import_doc

# -- the servers -------------------------------------------------------------------------------


class Sources:
    """The app's records and request log per test namespace."""

    def __init__(self) -> None:
        self.issues: dict[str, list[dict[str, Any]]] = {}
        self.repos: dict[str, list[dict[str, Any]]] = {}
        self.orders: dict[str, list[dict[str, Any]]] = {}
        self.woo: dict[str, list[dict[str, Any]]] = {}
        self.log: dict[str, list[dict[str, Any]]] = {}
        # ns -> the page number answered 422 (a broken run)
        self.fail_page: dict[str, int] = {}

    def note(self, ns: str, request: Request) -> None:
        self.log.setdefault(ns, []).append(
            {"path": request.url.path, "params": dict(request.query_params)}
        )


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _links(links: dict[str, str]) -> dict[str, str]:
    return {"Link": ", ".join(f'<{u}>; rel="{rel}"' for rel, u in links.items())} if links else {}


def sources_app(state: Sources) -> FastAPI:
    app = FastAPI()

    @app.get("/{ns}/repos/{owner}/{repo}/issues")
    async def issues(
        ns: str,
        owner: str,
        repo: str,
        request: Request,
        since: str | None = None,
        sort: str = "created",
        direction: str = "desc",
        per_page: int = 30,
        page: int = 1,
    ) -> JSONResponse:
        state.note(ns, request)
        wanted = request.query_params.get("state", "open")
        if state.fail_page.get(ns) == page:
            return JSONResponse({"message": "Validation Failed"}, status_code=422)
        try:
            after = _at(since) if since else None
        except ValueError:
            return JSONResponse({"message": "Validation Failed"}, status_code=422)
        per_page = min(per_page, 100)
        items = [i for i in state.issues.get(ns, []) if wanted == "all" or i["state"] == wanted]
        if after is not None:  # "only results last updated after the given time"
            items = [i for i in items if _at(i["updated_at"]) >= after]
        field = "updated_at" if sort == "updated" else "created_at"
        items.sort(key=lambda i: (_at(i[field]), i["id"]), reverse=direction == "desc")
        last = max(1, math.ceil(len(items) / per_page))
        links: dict[str, str] = {}
        if last > 1:

            def at(n: int) -> str:
                return str(request.url.include_query_params(page=n))

            if page < last:
                links |= {"next": at(page + 1), "last": at(last)}
            if page > 1:
                links |= {"first": at(1), "prev": at(page - 1)}
        chunk = items[(page - 1) * per_page : page * per_page]
        return JSONResponse(chunk, headers=_links(links))

    @app.get("/{ns}/repositories")
    async def repositories(ns: str, request: Request, since: int | None = None) -> JSONResponse:
        state.note(ns, request)
        items = sorted(
            (r for r in state.repos.get(ns, []) if since is None or r["id"] > since),
            key=lambda r: r["id"],
        )
        chunk = items[:REPOS_PER_PAGE]
        # Every answer links its first page (a URI template); all but the last its next.
        base = f"{request.url.scheme}://{request.url.netloc}/{ns}/repositories"
        links = {"first": base + "{?since}"}
        if len(items) > REPOS_PER_PAGE:
            links = {"next": f"{base}?since={chunk[-1]['id']}", **links}
        return JSONResponse(chunk, headers=_links(links))

    @app.get("/{ns}/admin/api/2024-01/orders.json")
    async def orders(ns: str, request: Request, limit: int = 50) -> JSONResponse:
        state.note(ns, request)
        q = dict(request.query_params)
        if "page_info" in q:
            if set(q) - {"page_info", "limit", "fields"}:
                return JSONResponse(
                    {"errors": {"page_info": "page_info may only go with limit and fields"}},
                    status_code=400,
                )
            cursor = json.loads(base64.urlsafe_b64decode(q["page_info"]))
        else:
            cursor = {k: q.get(k) for k in ("updated_at_min", "updated_at_max", "since_id")}
            cursor |= {"status": q.get("status", "open"), "offset": 0}
        items = sorted(state.orders.get(ns, []), key=lambda o: o["id"])
        if cursor["status"] != "any":
            items = [o for o in items if o["status"] == cursor["status"]]
        if cursor["updated_at_min"]:
            items = [o for o in items if _at(o["updated_at"]) >= _at(cursor["updated_at_min"])]
        if cursor["updated_at_max"]:
            items = [o for o in items if _at(o["updated_at"]) <= _at(cursor["updated_at_max"])]
        if cursor["since_id"]:
            items = [o for o in items if o["id"] > int(cursor["since_id"])]
        limit = min(limit, 250)
        start = int(cursor["offset"])
        chunk = items[start : start + limit]
        url = f"{request.url.scheme}://{request.url.netloc}{request.url.path}"

        def at(offset: int) -> str:
            token = base64.urlsafe_b64encode(json.dumps({**cursor, "offset": offset}).encode())
            return f"{url}?{urlencode({'limit': limit, 'page_info': token.decode()})}"

        # Every page of a paged answer links its neighbours; the last has no "next".
        links: dict[str, str] = {}
        if start > 0:
            links["previous"] = at(max(0, start - limit))
        if start + limit < len(items):
            links["next"] = at(start + limit)
        return JSONResponse({"orders": chunk}, headers=_links(links))

    @app.get("/{ns}/wp-json/wc/v3/orders")
    async def woo_orders(
        ns: str,
        request: Request,
        modified_after: str | None = None,
        orderby: str = "date",
        order: str = "desc",
        per_page: int = 10,
        page: int = 1,
    ) -> JSONResponse:
        state.note(ns, request)
        # Dates without an offset are the site's local time (dates_are_gmt: false).
        site = ZoneInfo(WOO_SITE_ZONE)

        def local(text: str) -> datetime:
            at = _at(text)
            return at if at.tzinfo is None else at.astimezone(site).replace(tzinfo=None)

        items = list(state.woo.get(ns, []))
        if modified_after:
            items = [o for o in items if local(o["date_modified"]) > local(modified_after)]
        field = "date_modified" if orderby == "modified" else "date_created"
        items.sort(key=lambda o: (local(o[field]), o["id"]), reverse=order == "desc")
        pages = max(1, math.ceil(len(items) / per_page))
        links: dict[str, str] = {}
        if page < pages:
            links["next"] = str(request.url.include_query_params(page=page + 1))
        if page > 1:
            links["prev"] = str(request.url.include_query_params(page=page - 1))
        headers = {"X-WP-Total": str(len(items)), "X-WP-TotalPages": str(pages)}
        chunk = items[(page - 1) * per_page : page * per_page]
        return JSONResponse(chunk, headers=headers | _links(links))

    return app


REPOS_PER_PAGE = 2
WOO_SITE_ZONE = "Europe/Berlin"


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[ThreadedServer, Sources]]:
    state = Sources()
    server = ThreadedServer(sources_app(state)).start()
    yield server, state
    server.stop()


class Api:
    """One test's namespace on the servers: its base URL, records and request log."""

    def __init__(self, server: ThreadedServer, state: Sources) -> None:
        self.ns = f"n{uuid.uuid4().hex[:10]}"
        self.base = f"{server.url}/{self.ns}"
        self.state = state
        for records in (state.issues, state.repos, state.orders, state.woo):
            records[self.ns] = []

    @property
    def issues(self) -> list[dict[str, Any]]:
        return self.state.issues[self.ns]

    @property
    def repos(self) -> list[dict[str, Any]]:
        return self.state.repos[self.ns]

    @property
    def orders(self) -> list[dict[str, Any]]:
        return self.state.orders[self.ns]

    @property
    def woo(self) -> list[dict[str, Any]]:
        return self.state.woo[self.ns]

    def requests(self) -> list[dict[str, Any]]:
        return list(self.state.log.get(self.ns, []))

    def fail(self, page: int | None) -> None:
        if page is None:
            self.state.fail_page.pop(self.ns, None)
        else:
            self.state.fail_page[self.ns] = page


@pytest.fixture
def gh(api) -> Api:
    return Api(*api)


def issue(ident: int, number: int, updated_at: str, title: str = "", state: str = "open") -> dict:
    """An issue as GitHub's REST API answers it (the fields a harvest reads, and some)."""
    return {
        "id": ident,
        "node_id": f"I_{ident}",
        "number": number,
        "title": title or f"issue {number}",
        "state": state,
        "user": {"login": "octocat", "id": 1},
        "labels": [],
        "created_at": "2025-02-01T00:00:00Z",
        "updated_at": updated_at,
    }


ISSUE_MODEL = {
    "key": ["id"],
    "fields": {
        "id": "int",
        "number": "int",
        "title": "str",
        "state": "str",
        "updated_at": "datetime",
    },
}


def issues_doc(code: str, base: str, window: dict[str, Any] | None = None, **prov: Any) -> dict:
    """A provenance of GitHub's "list repository issues" at ``base``: Link-header paging
    two a page, every state, oldest update first; ``window``: its update's
    window_offset_cfg row (TASK scope)."""
    doc: dict[str, Any] = {
        "provenance": {
            "provenance_code": code,
            "base_url_default": base,
            "record_model": ISSUE_MODEL,
            **prov,
        },
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_name": "issues",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/repos/octo/hello/issues",
                "default_query_params": {"state": "all", "sort": "updated", "direction": "asc"},
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "pagination_mode_code": "LINK_HEADER",
                "page_size_value": 2,
                "page_size_param_name": "per_page",
                "records_jsonpath": "$",
                "record_key_jsonpath": "$.id",
            }
        ],
    }
    if window is not None:
        doc["window_offset_cfg"] = [
            {
                "scope_code": "TASK",
                "task_type": "update",
                "effective_from": "2025-01-01T00:00:00Z",
                **window,
            }
        ]
    return doc


# GitHub writes and reads its timestamps as YYYY-MM-DDTHH:MM:SSZ.
GITHUB_TIME = "%Y-%m-%dT%H:%M:%SZ"
DATE_POINTER = {
    "offset_type_code": "DATE",
    "watermark_field_name": "updated_at",
    "window_start_param_name": "since",
    "window_time_format": GITHUB_TIME,
    "overlap_value": 1,
    "overlap_unit_code": "MINUTE",
}


async def delivered(stack, task_id: str, prefix: str = "source_harvest") -> dict[Any, dict]:
    """The records a run (and its child runs) delivered to the http sink, by key; each
    key delivered once."""
    batches = await stack.sink_batches(f"{prefix}/{task_id}")
    by_page = {b["idempotency_key"]: b["records"] for b in batches if b["status"] == 200}
    out: dict[Any, dict] = {}
    for records in by_page.values():
        for r in records:
            assert r["id"] not in out, f"{r['id']} delivered twice"
            out[r["id"]] = r
    return out


async def run_ok(stack, **params: Any) -> dict[str, Any]:
    task_id = new_task_id()
    resp = await harvest_source(stack, task_id, **params)
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    return data


def watermark(stack, code: str, query: str = "") -> tuple[datetime | None, Any]:
    from artemis.db import get_engine
    from artemis.registry.resolve import find_provenance
    from artemis.registry.watermark import read_pointer

    with get_engine(stack.settings.database.url).connect() as conn:
        return read_pointer(conn, find_provenance(conn, code).id, "update", query)


def seen_rows(stack, task_id: str) -> int:
    from artemis.db import get_engine
    from artemis.registry.models import RegProvWatermarkSeen

    t = RegProvWatermarkSeen.__table__  # type: ignore[attr-defined]
    with get_engine(stack.settings.database.url).connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).select_from(t).where(t.c.run_id == task_id)
            ).scalar_one()
        )


# -- 1. pointers read from the records ---------------------------------------------------------


async def test_a_date_pointer_asks_the_next_update_from_the_largest_updated_at_less_the_overlap(
    stack, gh
):
    code = f"gh-issues-{gh.ns}"
    import_doc(stack, issues_doc(code, gh.base, DATE_POINTER))
    # Issue ids are not in update order: the pointer is the largest updated_at, not the
    # last record's nor the largest id's.
    gh.issues.extend(
        [
            issue(105, 1, "2025-03-01T10:00:00Z"),
            issue(101, 2, "2025-03-01T12:30:00Z"),
            issue(103, 3, "2025-03-01T11:00:00Z", state="closed"),
            issue(102, 4, "2025-03-01T14:00:00Z"),
            issue(104, 5, "2025-02-28T23:00:00Z"),  # before the first run's start
        ]
    )

    first = await run_ok(stack, provenance=code, task_type="update", start="2025-03-01")
    asked = gh.requests()
    # the first update asks from its start (midnight of the source's zone, UTC here),
    # written as GitHub writes times; then follows the Link header
    assert asked[0]["params"] == {
        "since": "2025-03-01T00:00:00Z",
        "state": "all",
        "sort": "updated",
        "direction": "asc",
        "per_page": "2",
    }
    assert [r["params"].get("page") for r in asked] == [None, "2"]
    assert all(r["params"]["since"] == "2025-03-01T00:00:00Z" for r in asked)
    got = await delivered(stack, first["task_id"])
    assert sorted(got) == [101, 102, 103, 105]
    # the records keep the model's fields only
    assert got[103] == {
        "id": 103,
        "number": 3,
        "title": "issue 3",
        "state": "closed",
        "updated_at": "2025-03-01T11:00:00Z",
    }
    mark, cursor = watermark(stack, code)
    assert mark == datetime(2025, 3, 1, 14, tzinfo=UTC) and cursor == "2025-03-01T14:00:00+00:00"
    assert seen_rows(stack, first["task_id"]) == 0  # taken into the watermark

    # Number 3 is edited and number 6 opened; the next update asks from 14:00 less 1 min.
    gh.issues[2] = issue(103, 3, "2025-03-02T09:30:00Z", title="renamed", state="closed")
    gh.issues.append(issue(106, 6, "2025-03-02T08:00:00Z"))
    before = len(gh.requests())
    second = await run_ok(stack, provenance=code, task_type="update")
    asked = gh.requests()[before:]
    assert [r["params"]["since"] for r in asked] == ["2025-03-01T13:59:00Z"] * 2
    assert [r["params"].get("page") for r in asked] == [None, "2"]
    got = await delivered(stack, second["task_id"])
    # the overlap's record again, the new one, and the edited one as it is now
    assert sorted(got) == [102, 103, 106]
    assert got[103]["title"] == "renamed"
    assert watermark(stack, code)[1] == "2025-03-02T09:30:00+00:00"

    # Nothing new: the overlap brings number 3 again and the pointer stays.
    before = len(gh.requests())
    third = await run_ok(stack, provenance=code, task_type="update")
    assert [r["params"]["since"] for r in gh.requests()[before:]] == ["2025-03-02T09:29:00Z"]
    assert sorted(await delivered(stack, third["task_id"])) == [103]
    assert watermark(stack, code)[1] == "2025-03-02T09:30:00+00:00"


async def test_a_failed_update_leaves_the_pointer_and_no_seen_values_behind(stack, gh):
    code = f"gh-issues-{gh.ns}"
    import_doc(stack, issues_doc(code, gh.base, DATE_POINTER))
    gh.issues.extend(issue(200 + n, n, f"2025-03-01T1{n}:00:00Z") for n in range(1, 4))
    await run_ok(stack, provenance=code, task_type="update", start="2025-03-01")
    assert watermark(stack, code)[1] == "2025-03-01T13:00:00+00:00"

    # Two newer issues; the source refuses the second page of the next run.
    gh.issues.extend(issue(200 + n, n, f"2025-03-02T1{n}:00:00Z") for n in range(4, 6))
    gh.fail(page=2)
    task_id = new_task_id()
    resp = await harvest_source(stack, task_id, provenance=code, task_type="update")
    data = resp.json()["data"]
    assert data["status"] == "failed", resp.text
    assert watermark(stack, code)[1] == "2025-03-01T13:00:00+00:00"
    assert seen_rows(stack, task_id) == 0

    # The run after it asks from the same place and gets all of them.
    gh.fail(page=None)
    before = len(gh.requests())
    again = await run_ok(stack, provenance=code, task_type="update")
    assert gh.requests()[before]["params"]["since"] == "2025-03-01T12:59:00Z"
    assert sorted(await delivered(stack, again["task_id"])) == [203, 204, 205]
    assert watermark(stack, code)[1] == "2025-03-02T15:00:00+00:00"


def repos_doc(code: str, base: str) -> dict[str, Any]:
    """GitHub's "list public repositories": an ID pointer sent back in ``since``, less
    two ids of overlap."""
    return {
        "provenance": {
            "provenance_code": code,
            "base_url_default": base,
            "record_model": {
                "key": ["id"],
                "fields": {"id": "int", "name": "str", "full_name": "str"},
            },
        },
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_name": "repositories",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/repositories",
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "pagination_mode_code": "LINK_HEADER",
                "records_jsonpath": "$",
                "record_key_jsonpath": "$.id",
            }
        ],
        "window_offset_cfg": [
            {
                "scope_code": "TASK",
                "task_type": "update",
                "effective_from": "2025-01-01T00:00:00Z",
                "offset_type_code": "ID",
                "watermark_field_name": "id",
                "watermark_id_param_name": "since",
                "overlap_value": 2,
            }
        ],
    }


def repo(ident: int) -> dict[str, Any]:
    return {"id": ident, "name": f"r{ident}", "full_name": f"octo/r{ident}", "private": False}


async def test_an_id_pointer_sends_the_largest_id_less_the_overlap(stack, gh):
    code = f"gh-repos-{gh.ns}"
    import_doc(stack, repos_doc(code, gh.base))
    gh.repos.extend(repo(i) for i in (3, 7, 12, 20, 21))

    # The first update needs no start: without a pointer it asks from the beginning.
    first = await run_ok(stack, provenance=code, task_type="update")
    assert [r["params"] for r in gh.requests()] == [
        {},
        {"since": "7"},
        {"since": "20"},
    ]
    assert sorted(await delivered(stack, first["task_id"])) == [3, 7, 12, 20, 21]
    assert watermark(stack, code)[1] == 21

    gh.repos.extend(repo(i) for i in (25, 30))
    before = len(gh.requests())
    second = await run_ok(stack, provenance=code, task_type="update")
    # 21 less 2 ids of overlap, then the source's own next links
    assert [r["params"] for r in gh.requests()[before:]] == [{"since": "19"}, {"since": "21"}]
    assert sorted(await delivered(stack, second["task_id"])) == [20, 21, 25, 30]
    assert watermark(stack, code)[1] == 30


def orders_doc(code: str, base: str, window: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Shopify's "list orders" of a shop in New York: times with the shop's offset,
    page_info paging three a page."""
    return {
        "provenance": {
            "provenance_code": code,
            "base_url_default": base,
            "timezone_default": "America/New_York",
            "record_model": {
                "key": ["id"],
                "fields": {
                    "id": "int",
                    "name": "str",
                    "updated_at": "datetime",
                    "total_price": "str",
                },
            },
        },
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_name": "orders",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/admin/api/2024-01/orders.json",
                "default_query_params": {"status": "any"},
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "pagination_mode_code": "LINK_HEADER",
                "page_size_value": 3,
                "page_size_param_name": "limit",
                "records_jsonpath": "$.orders",
                "record_key_jsonpath": "$.id",
            }
        ],
        "window_offset_cfg": [
            {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z", **window},
            *extra.get("task_windows", []),
        ],
    }


def order(ident: int, updated_at: str, status: str = "open") -> dict[str, Any]:
    return {
        "id": ident,
        "name": f"#{1000 + ident}",
        "updated_at": updated_at,
        "total_price": f"{ident}.00",
        "status": status,
        "line_items": [],
    }


@pytest.mark.parametrize(
    "overlap, second_asks, second_gets",
    [
        # no overlap: the pair is a keyset, its instant and its id both sent
        ({}, {"updated_at_min": "2025-03-01T15:00:00-05:00", "since_id": "5"}, [6, 7]),
        # an overlap moves the instant back; the id would cut the overlap's records out
        (
            {"overlap_value": 1, "overlap_unit_code": "MINUTE"},
            {"updated_at_min": "2025-03-01T14:59:00-05:00"},
            [4, 5, 6, 7],
        ),
    ],
    ids=["keyset", "overlap"],
)
async def test_a_composite_pointer_sends_its_instant_in_the_zone_and_its_id(
    stack, gh, overlap, second_asks, second_gets
):
    code = f"shop-orders-{gh.ns}"
    window = {
        "offset_type_code": "COMPOSITE",
        "watermark_field_name": "updated_at",
        "watermark_id_field_name": "id",
        "watermark_id_param_name": "since_id",
        "window_start_param_name": "updated_at_min",
        "window_time_format": "ISO",
        **overlap,
    }
    import_doc(stack, orders_doc(code, gh.base, window))
    gh.orders.extend(
        [
            order(1, "2025-03-01T09:00:00-05:00"),
            order(2, "2025-03-01T10:00:00-05:00", status="closed"),
            order(3, "2025-03-01T11:00:00-05:00"),
            # two orders updated at the same instant, the latest: the id breaks the tie
            order(5, "2025-03-01T15:00:00-05:00"),
            order(4, "2025-03-01T15:00:00-05:00"),
        ]
    )
    first = await run_ok(stack, provenance=code, task_type="update", start="2025-03-01")
    asked = gh.requests()
    # midnight in New York, written with the shop's offset; no id before a pointer exists
    assert asked[0]["params"] == {
        "updated_at_min": "2025-03-01T00:00:00-05:00",
        "status": "any",
        "limit": "3",
    }
    assert set(asked[1]["params"]) == {"limit", "page_info"} and len(asked) == 2
    assert sorted(await delivered(stack, first["task_id"])) == [1, 2, 3, 4, 5]
    assert watermark(stack, code)[1] == ["2025-03-01T20:00:00+00:00", 5]

    gh.orders.extend([order(6, "2025-03-02T08:00:00-05:00"), order(7, "2025-03-02T09:00:00-05:00")])
    before = len(gh.requests())
    second = await run_ok(stack, provenance=code, task_type="update")
    asked = gh.requests()[before:]
    assert asked[0] == {
        "path": f"/{gh.ns}/admin/api/2024-01/orders.json",
        "params": {**second_asks, "status": "any", "limit": "3"},
    }
    assert sorted(await delivered(stack, second["task_id"])) == second_gets
    assert watermark(stack, code) == (
        datetime(2025, 3, 2, 14, tzinfo=UTC),
        ["2025-03-02T14:00:00+00:00", 7],
    )


def woo_order(ident: int, modified: str) -> dict[str, Any]:
    """A WooCommerce order: ``date_modified`` in the site's zone without an offset,
    ``date_modified_gmt`` the same instant in UTC."""
    at = datetime.fromisoformat(modified).replace(tzinfo=ZoneInfo(WOO_SITE_ZONE))
    gmt = at.astimezone(UTC).replace(tzinfo=None).isoformat()
    return {
        "id": ident,
        "status": "processing",
        "date_modified": modified,
        "date_modified_gmt": gmt,
    }


async def test_a_date_pointer_reads_times_without_an_offset_in_the_sources_zone(stack, gh):
    """WooCommerce's REST API writes ``date_modified`` as the site's wall clock and reads
    ``modified_after`` the same way: the pointer is that local time's instant, and the
    next update asks from it (less the overlap) as the site's wall clock again."""
    code = f"woo-orders-{gh.ns}"
    doc = {
        "provenance": {
            "provenance_code": code,
            "base_url_default": gh.base,
            "timezone_default": WOO_SITE_ZONE,
            "record_model": {
                "key": ["id"],
                "fields": {"id": "int", "status": "str", "date_modified": "str"},
            },
        },
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_name": "orders",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/wp-json/wc/v3/orders",
                "default_query_params": {"orderby": "modified", "order": "asc"},
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "pagination_mode_code": "LINK_HEADER",
                "page_size_value": 2,
                "page_size_param_name": "per_page",
                "records_jsonpath": "$",
                "record_key_jsonpath": "$.id",
            }
        ],
        "window_offset_cfg": [
            {
                "scope_code": "TASK",
                "task_type": "update",
                "effective_from": "2025-01-01T00:00:00Z",
                "offset_type_code": "DATE",
                "watermark_field_name": "date_modified",
                "window_start_param_name": "modified_after",
                "window_time_format": "%Y-%m-%dT%H:%M:%S",
                "overlap_value": 1,
                "overlap_unit_code": "MINUTE",
            }
        ],
    }
    import_doc(stack, doc)
    gh.woo.extend(
        [
            woo_order(1, "2025-02-28T23:30:00"),  # the day before, in Berlin
            woo_order(2, "2025-03-01T10:00:00"),
            woo_order(3, "2025-03-01T11:00:00"),
        ]
    )
    first = await run_ok(stack, provenance=code, task_type="update", start="2025-03-01")
    assert gh.requests()[0]["params"]["modified_after"] == "2025-03-01T00:00:00"
    assert sorted(await delivered(stack, first["task_id"])) == [2, 3]
    # 11:00 in Berlin is 10:00 UTC
    assert watermark(stack, code)[1] == "2025-03-01T10:00:00+00:00"

    gh.woo.extend([woo_order(4, "2025-03-01T11:30:00"), woo_order(5, "2025-03-02T08:00:00")])
    before = len(gh.requests())
    second = await run_ok(stack, provenance=code, task_type="update")
    asked = gh.requests()[before:]
    assert asked[0]["params"] == {
        "modified_after": "2025-03-01T10:59:00",
        "orderby": "modified",
        "order": "asc",
        "per_page": "2",
    }
    assert sorted(await delivered(stack, second["task_id"])) == [3, 4, 5]
    assert watermark(stack, code)[1] == "2025-03-02T07:00:00+00:00"


# -- 2. lookback -------------------------------------------------------------------------------


async def test_the_first_update_without_a_start_asks_from_now_less_lag_and_lookback(stack, gh):
    code = f"gh-lookback-{gh.ns}"
    window = {
        **DATE_POINTER,
        "window_time_format": "ISO",
        "lookback_value": 3,
        "lookback_unit_code": "DAY",
        "watermark_lag_seconds": 600,
    }
    import_doc(stack, issues_doc(code, gh.base, window))
    now = datetime.now(UTC).replace(microsecond=0)
    gh.issues.extend(
        [
            issue(1, 1, (now - timedelta(days=4)).isoformat()),
            issue(2, 2, (now - timedelta(days=2)).isoformat()),
            issue(3, 3, (now - timedelta(minutes=5)).isoformat()),
        ]
    )
    before = datetime.now(UTC)
    data = await run_ok(stack, provenance=code, task_type="update")
    after = datetime.now(UTC)
    since = _at(gh.requests()[0]["params"]["since"])
    lag_and_lookback = timedelta(seconds=600) + timedelta(days=3)
    assert before - lag_and_lookback <= since <= after - lag_and_lookback
    assert sorted(await delivered(stack, data["task_id"])) == [2, 3]
    # the pointer: the newest record's updated_at, but never past now less the lag (a
    # record the source shows late is asked for next time)
    mark, cursor = watermark(stack, code)
    assert before - timedelta(seconds=600) <= mark <= after - timedelta(seconds=600)
    assert cursor == mark.isoformat()


async def test_a_first_update_that_found_nothing_keeps_where_it_started(stack, gh):
    """The next update asks from the first one's start (less the overlap), not from its
    own now less the lookback: what changed between the two runs is asked for."""
    code = f"gh-quiet-{gh.ns}"
    window = {**DATE_POINTER, "window_time_format": "ISO", "lookback_value": 2}
    import_doc(stack, issues_doc(code, gh.base, {**window, "lookback_unit_code": "HOUR"}))
    first = await run_ok(stack, provenance=code, task_type="update")
    since = _at(gh.requests()[0]["params"]["since"])
    assert await delivered(stack, first["task_id"]) == {}
    assert watermark(stack, code) == (since, None)

    second = await run_ok(stack, provenance=code, task_type="update")
    assert _at(gh.requests()[1]["params"]["since"]) == since - timedelta(minutes=1)
    assert await delivered(stack, second["task_id"]) == {}
    assert watermark(stack, code) == (since, None)

    # An issue changed a second after the first run's start: still asked for, then the
    # pointer is its own.
    changed = (since + timedelta(seconds=1)).replace(microsecond=0)
    gh.issues.append(issue(7, 7, changed.isoformat()))
    third = await run_ok(stack, provenance=code, task_type="update")
    assert _at(gh.requests()[2]["params"]["since"]) == since - timedelta(minutes=1)
    assert sorted(await delivered(stack, third["task_id"])) == [7]
    assert watermark(stack, code) == (changed, changed.isoformat())


async def test_the_first_update_without_start_or_lookback_is_refused_naming_params_start(stack, gh):
    code = f"gh-nolookback-{gh.ns}"
    import_doc(stack, issues_doc(code, gh.base, DATE_POINTER))
    gh.issues.append(issue(1, 1, "2025-03-01T10:00:00Z"))
    resp = await harvest_source(stack, new_task_id(), provenance=code, task_type="update")
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "INVALID_INPUT" and "params.start" in error["message"]
    assert "lookback_value" in error["message"]
    assert gh.requests() == []
    assert watermark(stack, code) == (None, None)


# -- 3. time zones -----------------------------------------------------------------------------

SHOP_WINDOW = {
    "window_start_param_name": "updated_at_min",
    "window_end_param_name": "updated_at_max",
    "window_time_format": "ISO",
}


async def test_a_harvests_days_are_midnights_of_the_sources_zone_across_a_dst_change(stack, gh):
    code = f"shop-days-{gh.ns}"
    import_doc(stack, orders_doc(code, gh.base, SHOP_WINDOW))
    gh.orders.extend(
        [
            order(1, "2025-03-08T04:59:59Z"),  # Mar 7, 23:59:59 in New York (EST)
            order(2, "2025-03-08T05:00:00Z"),  # Mar 8, 00:00 EST
            order(3, "2025-03-09T12:00:00Z"),
            order(4, "2025-03-10T03:59:59Z"),  # Mar 9, 23:59:59 EDT (clocks moved at 2:00)
            order(5, "2025-03-10T04:00:01Z"),  # Mar 10 in New York
        ]
    )
    data = await run_ok(stack, provenance=code, start="2025-03-08", end="2025-03-09")
    (asked,) = gh.requests()
    assert asked["params"] == {
        "updated_at_min": "2025-03-08T00:00:00-05:00",
        "updated_at_max": "2025-03-10T00:00:00-04:00",
        "status": "any",
        "limit": "3",
    }
    assert sorted(await delivered(stack, data["task_id"])) == [2, 3, 4]


@pytest.mark.parametrize(
    "unit, start, end, windows",
    [
        (
            "MONTH",
            "2025-01-20",
            "2025-03-09",
            [
                ("2025-01-20T00:00:00-05:00", "2025-02-01T00:00:00-05:00"),
                ("2025-02-01T00:00:00-05:00", "2025-03-01T00:00:00-05:00"),
                ("2025-03-01T00:00:00-05:00", "2025-03-10T00:00:00-04:00"),
            ],
        ),
        (
            "WEEK",
            "2025-03-05",
            "2025-03-18",
            [  # weeks start on Monday: Wed..Sun, then whole weeks
                ("2025-03-05T00:00:00-05:00", "2025-03-10T00:00:00-04:00"),
                ("2025-03-10T00:00:00-04:00", "2025-03-17T00:00:00-04:00"),
                ("2025-03-17T00:00:00-04:00", "2025-03-19T00:00:00-04:00"),
            ],
        ),
    ],
)
async def test_a_backfill_runs_calendar_windows_of_the_sources_zone(
    stack, gh, unit, start, end, windows
):
    code = f"shop-backfill-{gh.ns}"
    backfill = {
        "scope_code": "TASK",
        "task_type": "backfill",
        "effective_from": "2025-01-01T00:00:00Z",
        "window_mode_code": "CALENDAR",
        "window_size_value": 1,
        "window_size_unit_code": unit,
        **SHOP_WINDOW,
    }
    import_doc(stack, orders_doc(code, gh.base, SHOP_WINDOW, task_windows=[backfill]))
    # one order an hour after each window's first midnight, one a second before the
    # range's first midnight (outside), one at the range's last instant (inside)
    first, *_ = windows[0]
    gh.orders.extend(
        order(10 + n, _at(a).replace(hour=1).isoformat()) for n, (a, _) in enumerate(windows)
    )
    gh.orders.append(order(1, (_at(first) - timedelta(seconds=1)).isoformat()))
    gh.orders.append(order(2, (_at(windows[-1][1]) - timedelta(seconds=1)).isoformat()))
    task_id = new_task_id()
    resp = await harvest_source(
        stack, task_id, provenance=code, task_type="backfill", start=start, end=end
    )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    asked = sorted(
        (r["params"]["updated_at_min"], r["params"]["updated_at_max"]) for r in gh.requests()
    )
    assert asked == windows
    assert sorted(await delivered(stack, task_id)) == [2, *range(10, 10 + len(windows))]


# -- 4. lifecycle status -----------------------------------------------------------------------


async def test_only_an_active_provenance_runs(stack, gh):
    code = f"gh-paused-{gh.ns}"
    import_doc(stack, issues_doc(code, gh.base, lifecycle_status_code="PAUSED"))
    gh.issues.append(issue(1, 1, "2025-03-01T10:00:00Z"))
    resp = await harvest_source(stack, new_task_id(), provenance=code)
    error = resp.json()["error"]
    assert error["code"] == "CONFIG_ERROR" and error["retryable"] is False, resp.text
    assert "PAUSED" in error["message"] and "lifecycle_status_code" in error["message"]
    assert repr(code) in error["message"]
    assert gh.requests() == []
    # active again: it runs
    import_doc(stack, issues_doc(code, gh.base, lifecycle_status_code="ACTIVE"))
    data = await run_ok(stack, provenance=code)
    assert sorted(await delivered(stack, data["task_id"])) == [1]


# -- 5. which task runs which provenance -------------------------------------------------------


async def test_each_task_refuses_the_other_tasks_provenances_naming_it(stack, gh):
    code = f"gh-plain-{gh.ns}"
    import_doc(stack, issues_doc(code, gh.base))
    resp = await harvest(stack, new_task_id(), provenance=code)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    assert "source_harvest" in error["message"] and repr(code) in error["message"]
    for family in ("pubmed", "crossref"):
        resp = await harvest_source(stack, new_task_id(), provenance=family)
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["code"] == "INVALID_INPUT"
        assert "literature_harvest" in error["message"] and family.upper() in error["message"]
    assert gh.requests() == []


# -- 6. output places --------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def lake_url(request, tmp_path: Path) -> str:
    """The database records land in: a SQLite file, or a fresh database on a real
    PostgreSQL (skipped where none can run, as the db_engine fixture is)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lake.db'}"
    from tests.e2e.test_sinks import fresh_database

    return fresh_database(request.getfixturevalue("pg_server").url, f"lake_{os.urandom(4).hex()}")


async def lake_stack(make_stack, lake_url: str, tmp_path: Path, **sql: Any):
    return await make_stack(
        output_defaults={
            "source_harvest": {
                "sinks": ["sql", "files"],
                "sql": {"url": lake_url, **sql},
                "files": {"url": str(tmp_path / "files"), "format": "parquet"},
            }
        }
    )


def rows(url: str, table: str) -> list[dict[str, Any]]:
    with sa.create_engine(url).connect() as conn:
        t = sa.Table(table, sa.MetaData(), autoload_with=conn)
        return [dict(r._mapping) for r in conn.execute(sa.select(t).order_by(t.c.id))]


def columns(url: str, table: str) -> dict[str, str]:
    with sa.create_engine(url).connect() as conn:
        return {c["name"]: str(c["type"]) for c in sa.inspect(conn).get_columns(table)}


async def test_each_provenance_lands_in_its_own_table_and_folder(
    make_stack, gh, lake_url, tmp_path
):
    import pyarrow.parquet as pq

    # A code with characters a table name cannot hold, and one mapped to a table.
    plain, mapped = f"GH-issues.{gh.ns}", f"gh-mapped-{gh.ns}"
    stack = await lake_stack(make_stack, lake_url, tmp_path, tables={mapped: f"mapped_{gh.ns}"})
    gh.issues.extend(issue(n, n, f"2025-03-01T1{n}:00:00Z") for n in range(1, 4))
    import_doc(stack, issues_doc(plain, gh.base))
    import_doc(stack, issues_doc(mapped, gh.base))
    a = await run_ok(stack, provenance=plain)
    b = await run_ok(stack, provenance=mapped)
    assert a["stats"]["sinks"] == b["stats"]["sinks"] == {"sql": 3, "files": 3}
    # each run asked the source for its two pages
    assert [r["params"].get("page") for r in gh.requests()] == [None, "2"] * 2
    with sa.create_engine(lake_url).connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    assert {f"GH_issues_{gh.ns}", f"mapped_{gh.ns}"} <= tables
    assert f"gh_mapped_{gh.ns}" not in tables
    for table, run in ((f"GH_issues_{gh.ns}", a), (f"mapped_{gh.ns}", b)):
        got = rows(lake_url, table)
        assert [r["id"] for r in got] == [1, 2, 3]
        assert {r["_artemis_task_id"] for r in got} == {run["task_id"]}
        assert as_utc(got[0]["updated_at"]) == datetime(2025, 3, 1, 11, tzinfo=UTC)
    for code, run in ((plain, a), (mapped, b)):
        folder = tmp_path / "files" / code / run["task_id"]
        assert pq.read_table(folder).num_rows == 3, folder
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == sorted([plain, mapped])


async def test_a_provenance_without_a_record_model_is_refused_by_typed_sinks_only(
    make_stack, gh, tmp_path
):
    code = f"gh-untyped-{gh.ns}"
    doc = issues_doc(code, gh.base)
    del doc["provenance"]["record_model"]
    gh.issues.append(issue(1, 1, "2025-03-01T10:00:00Z"))
    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    for output, sink in (
        ({"sinks": ["sql"], "sql": {"url": lake}}, "sql"),
        ({"sinks": ["files"], "files": {"url": str(tmp_path), "format": "parquet"}}, "parquet"),
    ):
        stack = await make_stack(output_defaults={"source_harvest": output})
        import_doc(stack, doc)
        resp = await harvest_source(stack, new_task_id(), provenance=code)
        error = resp.json()["error"]
        assert error["code"] == "CONFIG_ERROR" and error["retryable"] is False, resp.text
        assert "declares no record model" in error["message"] and sink in error["message"]
        assert repr(code) in error["message"]
    assert gh.requests() == []
    assert not (tmp_path / "lake.db").exists()
    # JSON lines need no model: the records land as the source gave them
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["files"], "files": {"url": str(tmp_path)}}}
    )
    data = await run_ok(stack, provenance=code)
    (written,) = (tmp_path / code / data["task_id"]).glob("*.jsonl")
    record = json.loads(written.read_text().splitlines()[0])
    assert record["id"] == 1 and record["user"] == {"login": "octocat", "id": 1}


async def test_a_request_picking_a_typed_sink_for_a_provenance_without_a_model_is_its_error(
    make_stack, gh, tmp_path
):
    """The configuration alone is fine (JSON lines, an sql section not in use): the
    request's own pick is refused as the request's, naming what it set."""
    code = f"gh-untyped-ask-{gh.ns}"
    doc = issues_doc(code, gh.base)
    del doc["provenance"]["record_model"]
    stack = await make_stack(
        output_defaults={
            "source_harvest": {
                "sinks": ["files"],
                "files": {"url": str(tmp_path / "files")},
                "sql": {"url": f"sqlite:///{tmp_path / 'lake.db'}"},
            }
        }
    )
    import_doc(stack, doc)
    for output, field in (
        ({"files": {"format": "parquet"}}, "output.files.format"),
        ({"sinks": ["sql"]}, "output.sinks"),
    ):
        resp = await stack.run(
            {"meta": {"task_id": new_task_id()}, "params": {"provenance": code}, "output": output},
            code="source_harvest",
        )
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["code"] == "INVALID_INPUT" and error["message"].startswith(field), error
        assert "declares no record model" in error["message"]
    assert gh.requests() == []
    assert not (tmp_path / "lake.db").exists()


async def test_one_sql_table_for_every_provenance_is_refused_pointing_to_sql_tables(
    make_stack, gh, tmp_path
):
    code = f"gh-one-table-{gh.ns}"
    stack = await make_stack(
        output_defaults={
            "source_harvest": {
                "sinks": ["sql"],
                "sql": {"url": f"sqlite:///{tmp_path / 'lake.db'}", "table": "everything"},
            }
        }
    )
    import_doc(stack, issues_doc(code, gh.base))
    resp = await harvest_source(stack, new_task_id(), provenance=code)
    error = resp.json()["error"]
    assert error["code"] == "CONFIG_ERROR" and error["retryable"] is False, resp.text
    assert "output_defaults.source_harvest.sql.table" in error["message"]
    assert "sql.tables" in error["message"]
    assert gh.requests() == []


async def test_an_existing_table_of_another_shape_is_refused_at_start_naming_the_column(
    make_stack, gh, lake_url, tmp_path
):
    code = f"gh_shape_{gh.ns}"
    with sa.create_engine(lake_url).begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE {code} (id BIGINT PRIMARY KEY, number VARCHAR(20), "
                "title VARCHAR(200), state VARCHAR(20), updated_at TIMESTAMP, "
                "_artemis_task_id VARCHAR(200), _artemis_page_seq INTEGER, "
                "_artemis_loaded_at TIMESTAMP)"
            )
        )
    stack = await lake_stack(make_stack, lake_url, tmp_path)
    import_doc(stack, issues_doc(code, gh.base))
    gh.issues.append(issue(1, 1, "2025-03-01T10:00:00Z"))
    task_id = new_task_id()
    resp = await harvest_source(stack, task_id, provenance=code)
    error = resp.json()["error"]
    assert error["code"] == "CONFIG_ERROR" and error["retryable"] is False, resp.text
    assert "'number'" in error["message"] and repr(code) in error["message"]
    assert gh.requests() == []  # found before anything was fetched
    assert not (tmp_path / "files").exists()
    assert rows(lake_url, code) == []


async def test_a_model_grown_by_a_nullable_field_adds_its_column_and_fills_it(
    make_stack, gh, lake_url, tmp_path
):
    # a code that is not an identifier as it is: its table is quoted in every statement
    code, table = f"GH-grown.{gh.ns}", f"GH_grown_{gh.ns}"
    stack = await lake_stack(make_stack, lake_url, tmp_path)
    small = issues_doc(code, gh.base)
    small["provenance"]["record_model"] = {
        "key": ["id"],
        "fields": {"id": "int", "number": "int", "title": "str"},
    }
    import_doc(stack, small)
    gh.issues.extend(issue(n, n, f"2025-03-01T1{n}:00:00Z", state="closed") for n in (1, 2))
    first = await run_ok(stack, provenance=code)
    assert set(columns(lake_url, table)) >= {"id", "number", "title"}
    assert "state" not in columns(lake_url, table)

    grown = issues_doc(code, gh.base)
    grown["provenance"]["record_model"] = {
        "key": ["id"],
        "fields": {"id": "int", "number": "int", "title": "str", "state": "str | None"},
    }
    import_doc(stack, grown)
    gh.issues.append(issue(3, 3, "2025-03-01T13:00:00Z"))
    second = await run_ok(stack, provenance=code)
    assert "state" in columns(lake_url, table)
    got = rows(lake_url, table)
    assert [(r["id"], r["state"], r["_artemis_task_id"]) for r in got] == [
        (1, "closed", second["task_id"]),
        (2, "closed", second["task_id"]),
        (3, "open", second["task_id"]),
    ]
    assert first["stats"]["sinks"]["sql"] == 2 and second["stats"]["sinks"]["sql"] == 3
    # the second run asked the source once its table fitted: both of its pages
    assert [r["params"].get("page") for r in gh.requests()] == [None, None, "2"]


@pytest.mark.parametrize(
    "change, column",
    [
        ({"fields": {**ISSUE_MODEL["fields"], "number": "str"}}, "number"),
        ({"key": ["number"]}, "number"),
        ({"fields": {**ISSUE_MODEL["fields"], "milestone": "int"}}, "milestone"),
        # its column may not be null, and no record fills it any more
        ({"fields": {k: v for k, v in ISSUE_MODEL["fields"].items() if k != "number"}}, "number"),
    ],
    ids=["changed-type", "changed-key", "new-required-field", "dropped-required-field"],
)
async def test_a_model_that_no_longer_fits_its_table_is_refused_at_start_naming_the_column(
    make_stack, gh, lake_url, tmp_path, change, column
):
    code, table = f"GH-changed.{gh.ns}", f"GH_changed_{gh.ns}"
    stack = await lake_stack(make_stack, lake_url, tmp_path)
    import_doc(stack, issues_doc(code, gh.base))
    gh.issues.extend(issue(n, n, f"2025-03-01T1{n}:00:00Z") for n in (1, 2))
    await run_ok(stack, provenance=code)
    asked = len(gh.requests())

    changed = issues_doc(code, gh.base)
    changed["provenance"]["record_model"] = {**ISSUE_MODEL, **change}
    import_doc(stack, changed)
    resp = await harvest_source(stack, new_task_id(), provenance=code)
    error = resp.json()["error"]
    assert error["code"] == "CONFIG_ERROR" and error["retryable"] is False, resp.text
    assert repr(column) in error["message"] or f"({column};" in error["message"], error
    assert len(gh.requests()) == asked  # nothing fetched
    assert len(rows(lake_url, table)) == 2
