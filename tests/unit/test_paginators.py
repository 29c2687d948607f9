"""Paginators: requests, state updates and JSON checkpoints that resume exactly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from artemis.errors import ArtemisError
from artemis.sources.paginators import (
    CursorPaginator,
    PageNumberPaginator,
    json_path_get,
    paginator_from_checkpoint,
)


def test_json_path():
    data = {"message": {"next-cursor": "abc", "items": [{"id": 1}]}}
    assert json_path_get(data, "$.message.next-cursor") == "abc"
    assert json_path_get(data, "message.items[0].id") == 1
    assert json_path_get(data, "$.message.missing") is None
    assert json_path_get(data, "$.message.items[3]") is None


def test_page_number_follows_next_page_and_stops_on_null():
    p = PageNumberPaginator(page_size=2)
    assert p.update_request({"symbol": "A"}) == {"symbol": "A", "page": 1, "page_size": 2}
    p.update_state({"items": [1, 2], "next_page": 2}, [1, 2])
    assert p.has_more and p.page == 2
    p.update_state({"items": [3], "next_page": None}, [3])
    assert not p.has_more


def test_page_number_without_next_field_stops_on_short_page():
    p = PageNumberPaginator(page_size=3, next_page_path=None)
    p.update_state({}, [1, 2, 3])
    assert p.has_more and p.page == 2
    p.update_state({}, [4])
    assert not p.has_more


def test_page_number_bad_next_page_names_the_field():
    p = PageNumberPaginator()
    with pytest.raises(ArtemisError, match="next_page"):
        p.update_state({"next_page": "soon"}, [])


def test_cursor_first_request_then_cursor_then_end():
    p = CursorPaginator(cursor_path="$.message.next-cursor", initial_cursor="*", page_size=2)
    assert p.update_request({"rows": 2}) == {"rows": 2, "cursor": "*"}
    p.update_state({"message": {"next-cursor": "c1"}}, [1, 2])
    assert p.update_request({})["cursor"] == "c1" and p.has_more
    p.update_state({"message": {"next-cursor": "c2"}}, [3])  # short page: the end
    assert not p.has_more


def test_cursor_stops_when_cursor_repeats():
    p = CursorPaginator(cursor_path="$.next")
    p.update_state({"next": "a"}, [1])
    p.update_state({"next": "a"}, [1])
    assert not p.has_more


def test_unknown_checkpoint_kind_is_refused():
    with pytest.raises(ArtemisError, match="unknown paginator kind"):
        paginator_from_checkpoint({"kind": "telepathy"})


@given(page=st.integers(1, 10_000), size=st.integers(1, 1000), seen=st.integers(0, 100))
def test_page_number_checkpoint_roundtrips_through_json(page, size, seen):
    p = PageNumberPaginator(page=page, page_size=size, pages_seen=seen)
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
