"""Answers that are not errors, and errors inside a 200 (``response_actions_json``): a
provenance from YAML driven through ``ContractClient`` and ``rest_source`` against real
HTTP servers on 127.0.0.1 — a 404 and a 204 ignored, a 200 carrying an error retried or
failed, a substring rule, an error answer no rule matches failing as it always did — what
the import refuses, and how the ignored answers reach a run's stats."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from aiohttp import web
from structlog.testing import capture_logs

from artemis.completeness import shortfall
from artemis.errors import ArtemisError, ErrorCode
from artemis.fetch_state import FetchState
from artemis.outage import outage_of
from artemis.registry.resolve import Contract
from artemis.registry.rest_source import rest_source
from artemis.registry.yaml_io import import_yaml
from artemis.run_models import FetchResult
from artemis.run_state import RunState, stats_view
from artemis.sources import Page, PageInfo
from artemis.sources.responses import match_rule, parse_rules, rule_problems
from tests.helpers import http_client
from tests.registry.net import Server, contract_client, contract_of, provenance, unique_code

ITEMS = [{"id": i} for i in range(1, 6)]
RATE_LIMITED = {"error": "rate limited"}


def doc_with(base: str, rules: list[dict[str, Any]] | None, **pg: Any) -> dict[str, Any]:
    """A provenance paged by page number (2 records a page, ``$.items``) whose SEARCH
    endpoint has ``rules``."""
    row = {
        "pagination_mode_code": "PAGE_NUMBER",
        "page_size_value": 2,
        "records_jsonpath": "$.items",
        "record_key_jsonpath": "$.id",
        "short_page_is_last": True,
        **pg,
    }
    doc = provenance(unique_code("answers"), base, pagination_cfg=[row])
    if rules is not None:
        doc["endpoint_def"][0]["response_actions_json"] = rules
    return doc


class Api:
    """``GET /items?page=N``: pages of ``ITEMS`` (with their ``total`` when ``total``),
    except the pages ``odd`` answers otherwise (page → (status, body bytes, headers)).
    Every page asked is in ``asked``."""

    def __init__(
        self, odd: dict[int, tuple[int, bytes, dict[str, str]]], total: bool = False
    ) -> None:
        self.odd = odd
        self.total = total
        self.asked: list[int] = []

    async def items(self, request: web.Request) -> web.Response:
        page = int(request.query.get("page", 1))
        self.asked.append(page)
        if page in self.odd:
            status, raw, headers = self.odd[page]
            return web.Response(status=status, body=raw or None, headers=headers)
        size = int(request.query.get("page_size", 2))
        body: dict[str, Any] = {"items": ITEMS[(page - 1) * size : page * size]}
        if self.total:
            body["total"] = len(ITEMS)
        return web.json_response(body)


def answer(status: int, body: Any = b"", **headers: str) -> tuple[int, bytes, dict[str, str]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    kind = {"Content-Type": "application/json"} if not isinstance(body, bytes) else {}
    return status, raw, {**kind, **headers}


async def drain_with(
    reg: Any, key_file: str, api: Api, rules: list[dict[str, Any]] | None, **pg: Any
) -> list[Page]:
    server = await Server({("GET", "/items"): api.items}).start()
    try:
        cc = contract_client(reg, key_file, doc_with(server.url, rules, **pg))
        async with http_client() as client:
            return [p async for p in rest_source(cc, None, {}, None).pages(client, None)]
    finally:
        await server.stop()


def records(pages: list[Page]) -> list[Any]:
    return [r for p in pages for r in p.records]


# -- ignore ------------------------------------------------------------------------------------
async def test_a_404_a_rule_ignores_is_an_empty_page_that_ends_paging(reg, key_file):
    api = Api({2: answer(404, {"message": "Not Found", "token": "s3cr3t-body"})})
    with capture_logs() as logs:
        pages = await drain_with(reg, key_file, api, [{"status": 404, "action": "ignore"}])
    assert records(pages) == ITEMS[:2]
    assert [p.info.ignored for p in pages] == [0, 1]
    last = pages[-1]
    assert last.records == [] and last.checkpoint is None
    assert api.asked == [1, 2]  # nothing asked after the ignored answer
    ignored = [e for e in logs if e["event"] == "response_ignored"]
    assert len(ignored) == 1
    assert ignored[0]["status"] == 404 and ignored[0]["rule"] == 0
    assert "s3cr3t-body" not in repr(ignored[0])  # never the body


async def test_a_204_without_a_body_is_ignored_by_a_rule_and_not_json_without_one(reg, key_file):
    api = Api({1: answer(204)})
    pages = await drain_with(reg, key_file, api, [{"status": [204, 404], "action": "ignore"}])
    assert len(pages) == 1 and pages[0].records == [] and pages[0].checkpoint is None
    assert pages[0].info.ignored == 1

    with pytest.raises(ArtemisError) as e:
        await drain_with(reg, key_file, Api({1: answer(204)}), None)
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "not JSON" in e.value.message


async def test_an_ignored_answer_after_a_stated_total_still_falls_short_of_it(reg, key_file):
    # The total stays the source's word: the run's completeness check sees the shortfall.
    api = Api({2: answer(404, {"message": "gone"})}, total=True)
    pages = await drain_with(
        reg,
        key_file,
        api,
        [{"status": 404, "action": "ignore"}],
        total_count_jsonpath="$.total",
        short_page_is_last=None,
    )
    last = pages[-1].info
    assert (last.expected_total, last.taken, last.ignored) == (len(ITEMS), 2, 1)
    short = shortfall("answers", last.expected_total, last.taken, 0.0, last.request or "")
    assert short is not None and short["records_fetched"] == 2


# -- errors inside a 200 -------------------------------------------------------------------------
RETRY = [{"status": 200, "jsonpath": "$.error", "equals": "rate limited", "action": "retry"}]


async def test_an_error_inside_a_200_is_retried_as_a_503_would_be(reg, key_file):
    api = Api({2: answer(200, RATE_LIMITED, **{"Retry-After": "7"})})
    with pytest.raises(ArtemisError) as e:
        await drain_with(reg, key_file, api, RETRY)
    err = e.value
    assert err.code is ErrorCode.SOURCE_ERROR and err.retryable
    assert err.retry_after_s == 7
    # It names the request (the page asked) and the rule.
    assert "GET " in err.message and "page=2" in err.message
    assert "response_actions_json[0] (status 200, $.error == 'rate limited')" in err.message
    assert "retry" in err.message
    # The fetch reports it as the source's outage, waited out and bounded as a 503's is.
    outage = outage_of(err, "source", "answers")
    assert outage is not None and outage.code == "SOURCE_ERROR"
    assert outage.reason == "200 OK, response_actions_json[0]"
    # A page whose body has no such error is a page.
    assert api.asked == [1, 2]


@pytest.mark.parametrize(
    "code, expected", [("CONFIG_ERROR", "CONFIG_ERROR"), (None, "SOURCE_ERROR")]
)
async def test_a_fail_rule_fails_with_its_code_and_is_not_retried(reg, key_file, code, expected):
    rule: dict[str, Any] = {"jsonpath": "$.error", "action": "fail"}
    if code is not None:
        rule["code"] = code
    api = Api({1: answer(200, RATE_LIMITED)})
    with pytest.raises(ArtemisError) as e:
        await drain_with(reg, key_file, api, [rule])
    err = e.value
    assert err.code.value == expected and not err.retryable
    assert (
        "answered 200" in err.message
        and "response_actions_json[0] ($.error present)" in err.message
    )
    assert "page=1" in err.message
    assert outage_of(err, "source", "answers") is None  # never waited out


async def test_a_substring_rule_matches_a_body_that_is_not_json(reg, key_file):
    # The first rule whose conditions all hold acts: the 503 one does not match a 200.
    rules = [
        {"status": 503, "contains": "quota exceeded", "action": "ignore"},
        {"contains": "quota exceeded", "action": "fail", "code": "SOURCE_UNAVAILABLE"},
    ]
    api = Api({1: answer(200, b"<html>daily quota exceeded</html>")})
    with pytest.raises(ArtemisError) as e:
        await drain_with(reg, key_file, api, rules)
    assert e.value.code is ErrorCode.SOURCE_UNAVAILABLE and not e.value.retryable
    assert "response_actions_json[1] (body contains 'quota exceeded')" in e.value.message

    api = Api({1: answer(503, b"quota exceeded, come back tomorrow")})
    pages = await drain_with(reg, key_file, api, rules)
    assert [p.info.ignored for p in pages] == [1]


async def test_an_error_answer_no_rule_matches_fails_as_without_rules(reg, key_file):
    # Every condition must hold: the 404's body has no $.gone.
    rules = [{"status": 404, "jsonpath": "$.gone", "action": "ignore"}]
    for given in (rules, None):
        api = Api({2: answer(404, {"message": "Not Found"})})
        with pytest.raises(ArtemisError) as e:
            await drain_with(reg, key_file, api, given)
        assert e.value.code is ErrorCode.SOURCE_ERROR and not e.value.retryable
        assert e.value.details["status"] == 404 and "answered 404" in e.value.message


# -- DETAIL --------------------------------------------------------------------------------------
async def test_a_detail_answer_a_rule_ignores_is_a_batch_of_no_records(reg, key_file):
    async def ids(request: web.Request) -> web.Response:
        return web.json_response({"items": [{"id": i["id"]} for i in ITEMS]})

    async def one(request: web.Request) -> web.Response:
        ident = int(request.match_info["ident"])
        if ident == 3:  # deleted between the search and its detail
            return web.json_response({"message": "Not Found"}, status=404)
        return web.json_response({"id": ident, "name": f"item {ident}"})

    server = await Server({("GET", "/items"): ids, ("GET", "/items/{ident}"): one}).start()
    try:
        doc = doc_with(server.url, None, page_size_value=10)
        doc["endpoint_def"].append(
            {
                "endpoint_name": "item",
                "endpoint_usage_code": "DETAIL",
                "path_template": "/items/{id}",
                "response_actions_json": [{"status": 404, "action": "ignore"}],
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
            }
        )
        doc["batching_cfg"] = [
            {
                "detail_batch_size": 1,
                "detail_records_jsonpath": "$",
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
            }
        ]
        cc = contract_client(reg, key_file, doc)
        async with http_client() as client:
            pages = [p async for p in rest_source(cc, None, {}, None).pages(client, None)]
    finally:
        await server.stop()
    assert [r["id"] for r in records(pages)] == [1, 2, 4, 5]
    assert sum(p.info.ignored for p in pages) == 1 and pages[-1].checkpoint is None


# -- what the import and a run refuse ------------------------------------------------------------
def test_the_import_refuses_a_bad_rule_naming_its_index_and_field(reg, key_file):
    code = unique_code("bad_rules")
    doc = doc_with(
        "https://api.example",
        [
            {"status": 404, "action": "ignore"},
            {"status": 404, "action": "skip"},
            {"jsonpath": "$.error", "action": "retry", "code": "CONFIG_ERROR"},
            {"action": "ignore"},
            {"status": 200, "action": "fail", "code": "NO_SUCH_CODE"},
            {"status": 99, "match": "x", "action": "ignore"},
        ],
    )
    doc["provenance"]["provenance_code"] = code
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file)
    text = e.value.message
    assert (
        "response_actions_json[1].action: must be one of ignore, retry, fail (got 'skip')" in text
    )
    assert "response_actions_json[2]: code is for action fail" in text
    assert "response_actions_json[3]: a rule matches on status, jsonpath or contains" in text
    assert "response_actions_json[4].code: must be an error code, one of" in text
    assert "SOURCE_CONTRACT" in text  # the valid codes are named
    assert "response_actions_json[5].status: an HTTP status (100-599)" in text
    assert "response_actions_json[5].match: unknown key" in text
    assert "response_actions_json[0]" not in text
    with pytest.raises(ArtemisError):
        contract_of(reg, code)  # nothing was written


def test_a_rule_s_path_is_in_the_language_of_the_endpoint_s_answers(reg, key_file):
    doc = doc_with("https://api.example", [{"jsonpath": "./error", "action": "retry"}])
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file)
    assert "response_actions_json[0].jsonpath './error': the endpoint answers JSON" in (
        e.value.message
    )


def test_a_run_whose_contract_has_a_bad_rule_stops_before_any_request():
    from artemis.config import load_settings
    from artemis.registry.client import ContractClient

    endpoint = {
        "endpoint_name": "s",
        "endpoint_usage_code": "SEARCH",
        "path_template": "/s",
        "response_actions_json": [{"status": 404, "action": "skip"}],
    }
    contract = Contract(
        provenance={"provenance_code": "own", "base_url_default": "http://127.0.0.1:9"},
        task_type="harvest",
        at="",
        usage="SEARCH",
        endpoint=endpoint,
        endpoints={"SEARCH": endpoint},
        pagination={"pagination_mode_code": "PAGE_NUMBER"},
        window_offset=None,
        http=None,
        batching=None,
        retry=None,
        rate_limit=None,
        record_model=None,
    )
    with pytest.raises(ArtemisError) as e:
        rest_source(ContractClient(contract, load_settings(None)), None, {}, None)
    assert e.value.code is ErrorCode.CONFIG_ERROR and not e.value.retryable
    assert "response_actions_json[0].action: must be one of" in e.value.message


def test_rules_match_in_order_on_every_condition_and_equals_is_strict():
    rules = parse_rules(
        [
            {"status": 200, "jsonpath": "$.ok", "equals": True, "action": "ignore"},
            {"jsonpath": "$.count", "equals": 0, "action": "ignore"},
            {"jsonpath": "$.error", "equals": None, "action": "fail"},
        ]
    )
    body = json.dumps({"ok": 1, "count": False, "error": None}).encode()
    hit = match_rule(rules, 200, body, lambda: json.loads(body))
    assert hit is not None and hit[0] == 2  # 1 is not true, false is not 0; null is null
    unread: list[int] = []

    def parse() -> Any:
        unread.append(1)
        raise ValueError("not JSON")

    assert match_rule(rules, 200, b"<html>", parse) is None
    assert unread == [1]  # parsed once, for every rule with a jsonpath
    assert rule_problems({"status": 404}) == ["response_actions_json: a list of rules (got dict)"]
    assert rule_problems([[]]) == ["response_actions_json[0]: a rule is a mapping (got list)"]


# -- the run's stats -----------------------------------------------------------------------------
def test_ignored_answers_are_counted_on_the_fetch_s_wire_and_in_the_run_s_stats():
    state = FetchState(checkpoint=None, next_seq=0)
    before = state.to_json()
    assert "responses_ignored" not in before  # the wire keeps its shape without any
    state.take({"page": 2}, PageInfo(), 1)
    assert "responses_ignored" not in state.to_json()
    state.take(None, PageInfo(ignored=1), 0)
    assert state.responses_ignored == 1
    beat, cursor = state.to_json(), state.cursor(0)
    assert beat["responses_ignored"] == cursor["responses_ignored"] == 1
    # A retried attempt resumes from its heartbeat (or a staged cursor) with the count.
    again = FetchState(checkpoint=None, next_seq=0)
    again.resume(json.loads(json.dumps(beat)))
    assert again.responses_ignored == 1

    run = RunState()
    result = FetchResult(
        first_seq=0,
        next_seq=2,
        pages=2,
        records=1,
        checkpoint=None,
        done=True,
        units_done=1,
        responses_ignored=again.responses_ignored,
    )
    run.fetched(result)
    run.fetched(result)
    assert stats_view(run.stats)["responses_ignored"] == 2
    # Carried to the next generation (continue-as-new), whole.
    assert run.next_generation().stats["responses_ignored"] == 2
    # A run carried over from a build that counted none shows 0, then counts.
    old = RunState(stats={"pages": 0, "records_fetched": 0, "batches": 0})
    assert stats_view(old.stats)["responses_ignored"] == 0
    old.fetched(result)
    assert old.stats["responses_ignored"] == 1
