"""The sample code hosting API (``artemis_samples/forge.py``) held to the GitHub REST
semantics it was written from: Link-header paging, ``state`` and ``since``, the ``404``
body, the next-URL paging of comments (a documented deviation), stated totals, and its
test controls. A server of this module's own on 127.0.0.1, spoken to over real HTTP; the
Link headers are read by httpx's own parser, not by Artemis'."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from artemis_samples.app import create_app
from artemis_samples.server import ThreadedServer
from tests.helpers import eventually

ISSUES = "/forge/repos/acme/{}/issues"
COMMENTS = "/forge/repos/acme/{}/issues/{}/comments"
# GitHub's form: `<url>; rel="…"` joined by ", ", in the order prev, next, last, first.
LINK = re.compile(r'<([^>]+)>; rel="(prev|next|last|first)"')


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    srv = ThreadedServer(create_app()).start()
    yield srv
    # nothing held when the server stops: a reset ends a held request's wait
    httpx.post(f"{srv.url}/_control/reset", json={})
    srv.stop()


@pytest.fixture
def http(server: ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.post("/_control/forge", json={"reset": True}).json() == {"ok": True}
        yield client
        client.post("/_control/forge", json={"reset": True})


def walk(http: httpx.Client, path: str, **params: Any) -> tuple[list[dict[str, Any]], set[int]]:
    """Every item of a Link-paged list, following rel="next"; and the totals stated."""
    items: list[dict[str, Any]] = []
    totals = set()
    resp = http.get(path, params=params)
    while True:
        assert resp.status_code == 200, resp.text
        items += resp.json()["items"]
        totals.add(resp.json()["total_count"])
        if "next" not in resp.links:
            return items, totals
        resp = http.get(resp.links["next"]["url"])


def comments_of(http: httpx.Client, url: str, **params: Any) -> list[dict[str, Any]]:
    """Every comment, following the body's ``next`` URL until it is null."""
    out: list[dict[str, Any]] = []
    body = http.get(url, params=params).json()
    while True:
        assert body["total_count"] >= len(out) + len(body["comments"])
        out += body["comments"]
        if body["next"] is None:
            return out
        body = http.get(body["next"]).json()


def test_link_headers_walk_every_issue_once_in_githubs_format(http):
    for repo, count in (("rockets", 30), ("anvils", 20)):
        items, totals = walk(http, ISSUES.format(repo), state="all", per_page=7)
        assert sorted(i["number"] for i in items) == list(range(1, count + 1))
        assert totals == {count}
        # default order: created, newest first
        assert [i["number"] for i in items] == list(range(count, 0, -1))
    first = http.get(ISSUES.format("rockets"), params={"state": "all", "per_page": 7})
    assert [rel for _, rel in LINK.findall(first.headers["link"])] == ["next", "last"]
    middle = http.get(first.links["next"]["url"])
    link = middle.headers["link"]
    assert [rel for _, rel in LINK.findall(link)] == ["prev", "next", "last", "first"]
    assert ", ".join(f'<{u}>; rel="{r}"' for u, r in LINK.findall(link)) == link
    assert middle.links["last"]["url"].endswith("state=all&per_page=7&page=5")
    last = http.get(middle.links["last"]["url"])
    assert [rel for _, rel in LINK.findall(last.headers["link"])] == ["prev", "first"]
    assert len(last.json()["items"]) == 2
    whole = http.get(ISSUES.format("anvils"), params={"state": "all", "per_page": 100})
    assert "link" not in whole.headers and len(whole.json()["items"]) == 20
    past = http.get(ISSUES.format("anvils"), params={"state": "all", "page": 9})
    assert past.status_code == 200 and past.json() == {"total_count": 20, "items": []}


def test_repositories_are_listed_with_their_total_and_paged_by_link(http):
    repos, totals = walk(http, "/forge/orgs/acme/repos", per_page=2)
    assert totals == {3}
    assert sorted(r["full_name"] for r in repos) == ["acme/anvils", "acme/rockets", "acme/traps"]
    assert all(r["owner"]["login"] == "acme" and r["id"] and r["updated_at"] for r in repos)
    by_name = http.get("/forge/orgs/ACME/repos", params={"sort": "full_name"}).json()
    assert [r["name"] for r in by_name["items"]] == ["anvils", "rockets", "traps"]
    assert "link" not in http.get("/forge/orgs/acme/repos").headers
    forks = http.get("/forge/orgs/acme/repos", params={"type": "forks"}).json()
    assert forks == {"total_count": 0, "items": []}
    bad = http.get("/forge/orgs/acme/repos", params={"sort": "stars"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "sort"


def test_only_open_issues_are_listed_unless_a_state_is_asked(http):
    listed = http.get(ISSUES.format("rockets"), params={"per_page": 100}).json()
    assert listed["total_count"] == 25 and {i["state"] for i in listed["items"]} == {"open"}
    closed = http.get(ISSUES.format("rockets"), params={"state": "closed"}).json()
    assert [i["number"] for i in closed["items"]] == [30, 24, 18, 12, 6]
    assert all(i["closed_at"] for i in closed["items"])


def test_since_keeps_the_issues_updated_at_or_after_it(http):
    everything, _ = walk(http, ISSUES.format("rockets"), state="all", sort="updated")
    instants = sorted({i["updated_at"] for i in everything})
    since = instants[len(instants) // 2]  # an issue's own updated_at: "at" counts
    expected = sorted(i["number"] for i in everything if i["updated_at"] >= since)
    query = {"state": "all", "since": since, "sort": "updated", "direction": "asc"}
    got, totals = walk(http, ISSUES.format("rockets"), per_page=4, **query)
    assert sorted(i["number"] for i in got) == expected and totals == {len(expected)}
    assert [i["updated_at"] for i in got] == sorted(i["updated_at"] for i in got)
    assert min(i["updated_at"] for i in got) == since
    bad = http.get(ISSUES.format("rockets"), params={"since": "last tuesday"})
    assert bad.status_code == 422 and bad.json()["message"] == "Validation Failed"
    assert bad.json()["errors"] == [{"resource": "Issue", "field": "since", "code": "invalid"}]


def test_a_repository_deleted_after_it_was_listed_answers_githubs_404(http):
    resp = http.get(ISSUES.format("traps"))
    assert resp.status_code == 404
    assert resp.json() == {
        "message": "Not Found",
        "documentation_url": "https://docs.github.com/rest/issues/issues#list-repository-issues",
    }
    assert http.get(COMMENTS.format("traps", 1)).status_code == 404
    assert http.get(COMMENTS.format("rockets", 31)).json()["message"] == "Not Found"
    assert http.get("/forge/orgs/nobody/repos").status_code == 404
    assert http.get("/forge/repos/acme/rockets/pulls").status_code == 404


def test_comments_page_by_a_next_url_that_ends_null_and_every_total_matches(http):
    four = comments_of(http, COMMENTS.format("rockets", 4), per_page=2)
    assert len(four) == 4
    assert [c["id"] for c in four] == sorted(c["id"] for c in four)  # ascending ids
    first = http.get(COMMENTS.format("rockets", 4), params={"per_page": 2})
    assert "link" not in first.headers and first.json()["total_count"] == 4
    assert first.json()["next"].startswith(f"{http.base_url}".rstrip("/") + "/forge/")
    assert http.get(COMMENTS.format("rockets", 5)).json() == {
        "total_count": 0,
        "comments": [],
        "next": None,
    }
    seen = 0
    for repo in ("rockets", "anvils"):
        issues, _ = walk(http, ISSUES.format(repo), state="all", per_page=100)
        for issue in issues:
            got = comments_of(http, COMMENTS.format(repo, issue["number"]), per_page=2)
            assert len(got) == issue["comments"] == issue["number"] % 5
            seen += len(got)
    assert seen == 100


def test_calls_lists_every_api_request_in_order(http):
    http.get("/forge/orgs/acme/repos", params={"per_page": 2})
    http.get(ISSUES.format("traps"))
    http.get(COMMENTS.format("rockets", 3), params={"since": "2026-01-01T00:00:00Z"})
    calls = http.get("/forge/_calls").json()
    timing = ("at", "done")
    assert [{k: v for k, v in c.items() if k not in timing} for c in calls] == [
        {"method": "GET", "path": "/forge/orgs/acme/repos", "query": "per_page=2", "status": 200},
        {"method": "GET", "path": "/forge/repos/acme/traps/issues", "query": "", "status": 404},
        {
            "method": "GET",
            "path": "/forge/repos/acme/rockets/issues/3/comments",
            "query": "since=2026-01-01T00%3A00%3A00Z",
            "status": 200,
        },
    ]


def test_calls_tell_when_each_request_arrived_and_was_answered(http):
    http.post("/_control/forge", json={"latency_ms": 60})
    before = time.time()
    http.get("/forge/orgs/acme/repos")
    http.get(ISSUES.format("rockets"))
    after = time.time()
    first, second = http.get("/forge/_calls").json()
    # the latency lies between arrival and answer; the second arrived after the first ended
    assert before <= first["at"] and first["at"] + 0.055 <= first["done"]
    assert first["done"] <= second["at"] and second["at"] + 0.055 <= second["done"] <= after


def test_touch_makes_issues_changed_for_an_incremental_run(http):
    at = "2026-07-01T12:00:00Z"
    before = {i["number"]: i for i in walk(http, ISSUES.format("rockets"), state="all")[0]}
    spec = {"touch": [3, 7], "repo": "acme/rockets", "at": at}
    assert http.post("/_control/forge", json=spec).json() == {"ok": True}
    changed = http.get(ISSUES.format("rockets"), params={"since": at, "state": "all"}).json()
    assert sorted(i["number"] for i in changed["items"]) == [3, 7]
    assert {i["updated_at"] for i in changed["items"]} == {at}
    for issue in changed["items"]:
        assert issue["comments"] == before[issue["number"]]["comments"] + 1
    new = http.get(COMMENTS.format("rockets", 7), params={"since": at}).json()
    assert new["total_count"] == 1 and new["comments"][0]["created_at"] == at
    assert len(comments_of(http, COMMENTS.format("rockets", 7))) == 3
    bad = http.post("/_control/forge", json={"touch": [99], "repo": "acme/rockets"})
    assert bad.status_code == 422


def test_scale_builds_a_bigger_tree_with_no_missing_repository(http):
    spec = {"scale": {"repos": 4, "issues": 150, "comments": 3}}
    assert http.post("/_control/forge", json=spec).json() == {"ok": True}
    repos, totals = walk(http, "/forge/orgs/acme/repos")
    assert totals == {4} and {r["name"] for r in repos} == {f"repo-000{k}" for k in range(1, 5)}
    for repo in repos:
        page = http.get(f"/forge/repos/{repo['full_name']}/issues?state=all&per_page=500")
        assert page.status_code == 200 and page.json()["total_count"] == 150
        assert len(page.json()["items"]) == 100  # per_page is 100 at most
        assert {i["comments"] for i in page.json()["items"]} == {3}
    got = comments_of(http, f"/forge/repos/{repos[0]['full_name']}/issues/150/comments")
    assert len(got) == 3
    http.post("/_control/reset", json={})
    assert http.get("/forge/orgs/acme/repos").json()["total_count"] == 3


def test_links_are_built_on_the_host_the_client_used(http):
    resp = http.get(
        ISSUES.format("rockets"), params={"per_page": 10}, headers={"Host": "forge.test:8443"}
    )
    assert resp.links["next"]["url"] == (
        "http://forge.test:8443/forge/repos/acme/rockets/issues?per_page=10&page=2"
    )


def test_bad_controls_are_refused(http):
    refused = (
        {"scale": {"repos": 0, "issues": 1, "comments": 1}},
        {"latency_ms": -1},
        {"hang_after": 2},  # no for_s: it would hold nothing
        {"touch": [1], "repo": "acme/traps"},
        [],
    )
    for spec in refused:
        assert http.post("/_control/forge", json=spec).status_code == 422, spec


async def test_latency_and_a_hang_after_n_requests(server: ThreadedServer):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        await http.post("/_control/forge", json={"reset": True, "latency_ms": 200})
        began = time.monotonic()
        assert (await http.get("/forge/orgs/acme/repos")).status_code == 200
        assert time.monotonic() - began >= 0.2
        await http.post("/_control/forge", json={"latency_ms": 0, "hang_after": 1, "for_s": 30})
        assert (await http.get(ISSUES.format("rockets"))).status_code == 200
        held = asyncio.ensure_future(http.get(ISSUES.format("anvils")))

        async def holding() -> bool:
            return (await http.get("/_control/forge")).json()["holding"] == 1

        await eventually(holding, "the second request to be held", timeout=5)
        held_call = (await http.get("/forge/_calls")).json()[-1]
        assert held_call["status"] is None and held_call["done"] is None
        assert not held.done()
        began = time.monotonic()
        await http.post("/_control/forge", json={"hang_after": None})  # set again: released
        assert (await held).status_code == 200 and time.monotonic() - began < 2
        assert (await http.get("/_control/forge")).json()["holding"] == 0
        # a window ends by itself, counted from the first request held
        await http.post("/_control/forge", json={"hang_after": 0, "for_s": 0.5})
        began = time.monotonic()
        assert (await http.get(ISSUES.format("rockets"))).status_code == 200
        assert 0.4 <= time.monotonic() - began < 3
        assert (await http.get(ISSUES.format("rockets"))).status_code == 200
        await http.post("/_control/forge", json={"reset": True})
