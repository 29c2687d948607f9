"""Paginators: requests, state updates, JSON checkpoints that resume exactly, and the
completeness rules (docs/architecture.md): paging ends only on the source's own word, and
every way a page can be malformed is SOURCE_CONTRACT, never an end."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from artemis.errors import ArtemisError, ErrorCode
from artemis.paging import (
    MISSING,
    CursorPaginator,
    LinkHeaderPaginator,
    OffsetPaginator,
    PageNumberPaginator,
    Paginator,
    TokenPaginator,
    json_path_get,
    json_path_lookup,
    paginator_from_checkpoint,
)


def test_json_path():
    data = {"message": {"next-cursor": "abc", "items": [{"id": 1}], "none": None}}
    assert json_path_get(data, "$.message.next-cursor") == "abc"
    assert json_path_get(data, "message.items[0].id") == 1
    assert json_path_get(data, "$.message.missing") is None
    assert json_path_get(data, "$.message.items[3]") is None
    # absent and null are different answers
    assert json_path_lookup(data, "$.message.missing") is MISSING
    assert json_path_lookup(data, "$.message.none") is None
    # RFC 9535 forms a hand-written walker would miss
    assert json_path_get(data, "$['message']['next-cursor']") == "abc"
    assert json_path_get(data, "$.message.items[-1].id") == 1
    many = {"data": [{"a": {"k": 1}}, {"a": {"k": 2}}]}
    assert json_path_lookup(many, "$.data[*].a") == [{"k": 1}, {"k": 2}]
    assert json_path_lookup(many, "$.nothing[*].a") is MISSING


def test_page_number_follows_next_page_and_stops_on_null():
    p = PageNumberPaginator(page_size=2)
    assert p.update_request({"symbol": "A"}) == {"symbol": "A", "page": 1, "page_size": 2}
    p.update_state({"items": [1, 2], "next_page": 2}, [1, 2])
    assert p.has_more and p.page == 2
    p.update_state({"items": [3], "next_page": None}, [3])
    assert not p.has_more


def test_page_number_without_next_field_ends_on_an_empty_page_not_a_short_one():
    p = PageNumberPaginator(page_size=3, next_page_path=None)
    p.update_state({}, [1, 2, 3])
    assert p.has_more and p.page == 2
    p.update_state({}, [4])  # short, but the source never said short means last
    assert p.has_more and p.page == 3
    p.update_state({}, [])
    assert not p.has_more


def test_page_number_short_page_ends_only_where_the_source_documents_it():
    p = PageNumberPaginator(page_size=3, next_page_path=None, short_page_ends=True)
    p.update_state({}, [1, 2, 3])
    assert p.has_more
    p.update_state({}, [4])
    assert not p.has_more


def test_page_number_ends_at_the_stated_total():
    p = PageNumberPaginator(page_size=2, next_page_path=None, total_path="$.total")
    p.take([1, 2])
    p.update_state({"total": 4}, [1, 2])
    assert p.has_more and p.total == 4
    p.take([3, 4])
    p.update_state({"total": 4}, [3, 4])
    assert not p.has_more and p.taken == 4


def test_cursor_repeating_is_normal_and_a_short_page_ends_where_documented():
    # Crossref: one cursor value for the whole session, the end is a short page.
    p = CursorPaginator(
        cursor_path="$.message.next-cursor", initial_cursor="*", page_size=2, short_page_ends=True
    )
    assert p.update_request({"rows": 2}) == {"rows": 2, "cursor": "*"}
    for _ in range(3):
        p.take([1, 2])
        p.update_state({"message": {"next-cursor": "same"}}, [1, 2])
        assert p.has_more and p.update_request({})["cursor"] == "same"
    p.take([3])
    p.update_state({"message": {"next-cursor": "same"}}, [3])
    assert not p.has_more and p.taken == 7


def test_cursor_ends_on_null_cursor_empty_page_or_total():
    p = CursorPaginator(cursor_path="$.next")
    p.update_state({"next": None}, [1])
    assert not p.has_more
    p = CursorPaginator(cursor_path="$.next")
    p.update_state({"next": "a"}, [])
    assert not p.has_more
    p = CursorPaginator(cursor_path="$.next", total_path="$.total")
    p.take([1, 2])
    p.update_state({"next": "a", "total": 2}, [1, 2])
    assert not p.has_more


def test_offset_ends_on_total_and_a_cap_is_never_a_silent_end():
    p = OffsetPaginator(limit=2, total_path="$.total")
    p.take([1, 2])
    p.update_state({"total": 3}, [1, 2])
    assert p.has_more and p.offset == 2
    p.take([3])
    p.update_state({"total": 3}, [3])
    assert not p.has_more
    capped = OffsetPaginator(limit=2, total_path="$.total", max_offset=4)
    with pytest.raises(ArtemisError) as e:
        capped.update_state({"total": 9}, [1, 2])
    assert e.value.code == ErrorCode.RESULT_CAP_EXCEEDED and e.value.details["count"] == 9


def test_token_ends_on_null_and_absent_only_where_documented():
    p = TokenPaginator(token_path="$.next")
    p.update_state({"next": "t1"}, [1])
    assert p.has_more and p.update_request({}) == {"page_token": "t1"}
    p.update_state({"next": None}, [2])
    assert not p.has_more
    google = TokenPaginator(token_path="$.nextPageToken", absent_ends=True)
    google.update_state({}, [1])
    assert not google.has_more


def test_link_header_ends_without_rel_next_and_a_lone_page_is_one_page():
    p = LinkHeaderPaginator()
    p.update_state({}, [1], {"Link": '<https://x/items?page=2>; rel="next"'})
    assert p.has_more and p.request_url("https://x/items") == "https://x/items?page=2"
    p.update_state({}, [2], {"Link": '<https://x/items?page=1>; rel="prev"'})
    assert not p.has_more
    single = LinkHeaderPaginator()
    single.update_state({}, [1], {})
    assert not single.has_more


# Every way a page can be malformed, for every paginator: SOURCE_CONTRACT naming the path.
MALFORMED: list[tuple[str, Paginator, object, dict[str, str] | None, str]] = [
    ("page-next-missing", PageNumberPaginator(), {"items": []}, None, "next_page"),
    ("page-next-renamed", PageNumberPaginator(), {"nextPage": 2}, None, "next_page"),
    ("page-next-wrong-type", PageNumberPaginator(), {"next_page": "soon"}, None, "next_page"),
    ("page-next-true", PageNumberPaginator(), {"next_page": True}, None, "next_page"),
    ("page-body-not-object", PageNumberPaginator(), [1, 2], None, "next_page"),
    (
        "page-total-missing",
        PageNumberPaginator(next_page_path=None, total_path="$.total"),
        {},
        None,
        "$.total",
    ),
    (
        "page-total-null",
        PageNumberPaginator(next_page_path=None, total_path="$.total"),
        {"total": None},
        None,
        "$.total",
    ),
    (
        "page-total-negative",
        PageNumberPaginator(next_page_path=None, total_path="$.total"),
        {"total": -1},
        None,
        "$.total",
    ),
    ("offset-total-missing", OffsetPaginator(total_path="$.meta.total"), {}, None, "$.meta.total"),
    (
        "offset-total-wrong-type",
        OffsetPaginator(total_path="$.meta.total"),
        {"meta": {"total": "many"}},
        None,
        "$.meta.total",
    ),
    ("cursor-missing", CursorPaginator(cursor_path="$.next"), {}, None, "$.next"),
    ("cursor-wrong-type", CursorPaginator(cursor_path="$.next"), {"next": 7}, None, "$.next"),
    ("cursor-list", CursorPaginator(cursor_path="$.next"), {"next": ["a"]}, None, "$.next"),
    (
        "cursor-total-null",
        CursorPaginator(cursor_path="$.next", total_path="$.total"),
        {"next": "a", "total": None},
        None,
        "$.total",
    ),
    ("token-missing", TokenPaginator(token_path="$.t"), {}, None, "$.t"),
    ("token-wrong-type", TokenPaginator(token_path="$.t"), {"t": 12}, None, "$.t"),
    ("token-object", TokenPaginator(token_path="$.t"), {"t": {"v": 1}}, None, "$.t"),
    (
        "link-missing-after-first",
        LinkHeaderPaginator(pages_seen=1, next_url="https://x/?page=2"),
        {},
        {},
        "Link header",
    ),
    ("link-garbage", LinkHeaderPaginator(), {}, {"Link": ""}, "Link header"),
    (
        "link-total-missing",
        LinkHeaderPaginator(total_path="$.total"),
        {},
        {"Link": '<https://x/?page=2>; rel="next"'},
        "$.total",
    ),
]


@pytest.mark.parametrize(
    "paginator,data,headers,path", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_a_malformed_page_is_a_source_contract_error_never_an_end(paginator, data, headers, path):
    with pytest.raises(ArtemisError) as e:
        paginator.update_state(data, [1], headers)
    assert e.value.code == ErrorCode.SOURCE_CONTRACT and not e.value.retryable
    assert repr(path) in e.value.message and "found" in e.value.message
    assert e.value.code.http_status == 502


def test_unknown_checkpoint_kind_is_refused():
    with pytest.raises(ArtemisError, match="unknown paginator kind"):
        paginator_from_checkpoint({"kind": "telepathy"})


def test_a_checkpoint_of_an_earlier_build_still_resumes():
    # Fields the paginator does not have are ignored.
    restored = paginator_from_checkpoint({"kind": "cursor", "cursor": "c", "retired_field": 1})
    assert isinstance(restored, CursorPaginator) and restored.cursor == "c"


@given(page=st.integers(1, 10_000), size=st.integers(1, 1000), seen=st.integers(0, 100))
def test_page_number_checkpoint_roundtrips_through_json(page, size, seen):
    p = PageNumberPaginator(page=page, page_size=size, pages_seen=seen, taken=seen * size)
    restored = paginator_from_checkpoint(json.loads(json.dumps(p.checkpoint())))
    assert restored == p
    assert restored.update_request({}) == p.update_request({})


@given(cursor=st.one_of(st.none(), st.text(min_size=1, max_size=40)), started=st.booleans())
def test_cursor_checkpoint_roundtrips_through_json(cursor, started):
    p = CursorPaginator(
        cursor=cursor, started=started, initial_cursor="*", cursor_path="$.message.next-cursor"
    )
    restored = paginator_from_checkpoint(json.loads(json.dumps(p.checkpoint())))
    assert restored == p and restored.update_request({}) == p.update_request({})


def test_a_checkpoint_without_a_count_derives_it_or_gives_up_reconciling():
    # A checkpoint without the count: no "taken" in it.
    cursor = paginator_from_checkpoint({"kind": "cursor", "cursor": "c", "position": 40})
    assert cursor.taken == 40
    offset = paginator_from_checkpoint({"kind": "offset", "offset": 200, "total_path": "$.t"})
    assert offset.taken == 200 and offset.total_path == "$.t"
    page = paginator_from_checkpoint({"kind": "page_number", "page": 3, "total_path": "$.t"})
    assert page.total_path is None  # delivered count unknown: no reconciliation for it


def test_a_record_without_its_key_is_a_source_contract_error():
    from artemis.paging import page_digest

    assert page_digest([{"DOI": "10.1/a"}], "$.DOI") != page_digest([{"DOI": "10.1/b"}], "$.DOI")
    for bad in ({}, {"DOI": None}, {"DOI": ""}, {"DOI": {"x": 1}}):
        with pytest.raises(ArtemisError) as e:
            page_digest([{"DOI": "10.1/a"}, bad], "$.DOI")
        assert e.value.code == ErrorCode.SOURCE_CONTRACT and "'$.DOI'" in e.value.message
