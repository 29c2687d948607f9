"""A fetch attempt's resume state (artemis/fetch_state.py) on its two wires: the heartbeat's
details and the cursor a streaming fetch stages with each page. Their JSON keeps the
shape (keys, their order, their values) every attempt writes, so a heartbeat or a cursor
of an earlier attempt reads back (the stream's ledger: tests/unit/test_ledger.py); a
heartbeat held back for the throttle interval goes as the state stands then."""

from __future__ import annotations

import asyncio
import json
import time

from temporalio.testing import ActivityEnvironment

from activities.run_base import Heartbeat
from artemis.fetch_state import FetchState
from artemis.ledger import Ledger
from artemis.sources import Page, PageInfo

STREAM_START = {
    "first_seq": 10,
    "next_seq": 10,
    "judges": True,
    "delivers": True,
    "records_in": 0,
    "records_out": 0,
    "records_quarantined": 0,
    "fields_dropped": 0,
    "records_filtered": 0,
    "records_emitted": 0,
    "batches": 0,
    "sinks": {},
    "stopped": None,
    "error": None,
}


def _start(stream: bool) -> FetchState:
    return FetchState(
        checkpoint={"page": 3},
        next_seq=10,
        units_done=1,
        stream=Ledger.starting(10, judges=True, delivers=True) if stream else None,
    )


def _wire(value: object) -> str:
    """The JSON as written (key order included)."""
    return json.dumps(value)


def test_an_attempt_s_first_heartbeat_has_the_shape_it_always_had() -> None:
    start = {"checkpoint": {"page": 3}, "next_seq": 10, "pages": 0, "records": 0, "units_done": 1}
    assert _wire(_start(False).to_json()) == _wire(start)
    assert _wire(_start(True).to_json()) == _wire({**start, "stream": STREAM_START})


def test_a_page_moves_the_state_and_its_cursor_and_heartbeat_name_what_it_said() -> None:
    state = _start(True)
    page = Page(
        [{"n": 1}, {"n": 2}],
        {"page": 4},
        PageInfo(expected_total=40, units_done=2, incomplete=None),
    )
    after = state.after(page.checkpoint, page.info, len(page.records))
    assert state.next_seq == 10 and after.stream is state.stream  # nothing moved yet
    assert _wire(after.cursor(8)) == _wire(
        {
            "checkpoint": {"page": 4},
            "next_seq": 11,
            "pages": 1,
            "records": 2,
            "units_done": 2,
            "done": False,
            "expected_total": 40,
            "incomplete": None,
            "first_seq": 8,
        }
    )
    state.take(page.checkpoint, page.info, len(page.records))
    assert _wire(state.to_json()) == _wire(
        {
            "checkpoint": {"page": 4},
            "next_seq": 11,
            "pages": 1,
            "records": 2,
            "units_done": 2,
            "stream": STREAM_START,
            "done": False,
            "expected_total": 40,
            "incomplete": None,
        }
    )
    last = Page([], None, PageInfo())  # a source's last page; units_done not told
    state.take(last.checkpoint, last.info, len(last.records))
    assert state.done and state.checkpoint is None and state.units_done == 2


def test_a_heartbeat_and_a_staged_cursor_read_back_as_written() -> None:
    streamed = {
        **STREAM_START,
        "next_seq": 12,
        "records_in": 5,
        "records_out": 4,
        "records_emitted": 4,
        "sinks": {"http": 4},
        "stopped": "SINK_ERROR",
    }
    beat = {
        "checkpoint": {"page": 5},
        "next_seq": 13,
        "pages": 3,
        "records": 6,
        "units_done": 1,
        "stream": streamed,
        "done": False,
        "expected_total": None,
        "incomplete": None,
    }
    state = _start(True)
    state.resume(json.loads(_wire(beat)))
    assert _wire(state.to_json()) == _wire(beat)
    assert state.stream is not None and state.stream.stopped == "SINK_ERROR"

    # A heartbeat made before the attempt's first page names none of its fields.
    early = {"checkpoint": None, "next_seq": 10, "pages": 0, "records": 0, "units_done": 0}
    fresh = _start(False)
    fresh.resume(early)
    assert _wire(fresh.to_json()) == _wire(early)

    # The cursor staged with a page (Staging.start_attempt gives it without first_seq).
    cursor = _start(True).after({"page": 9}, PageInfo(), 1).cursor(10)
    del cursor["first_seq"]
    resumed = _start(True)
    resumed.resume(cursor)
    assert resumed.next_seq == 11 and resumed.page_taken
    assert resumed.stream == Ledger(10, 10)  # the cursor leaves the stream's


def test_a_held_heartbeat_goes_as_the_state_stands_at_the_interval_s_end() -> None:
    sent: list[tuple] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: sent.append(details)

    async def attempt() -> None:
        state = _start(True)
        beat = Heartbeat(0.2, FetchState.to_json)
        beat(state)
        assert state.stream is not None
        state.stream.stopped = "SINK_ERROR"  # (the stream stops without a heartbeat)
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        beat(state)  # after the interval: at once

    asyncio.run(env.run(attempt))
    assert len(sent) == 2
    assert all(isinstance(d[0], dict) for d in sent)
    assert sent[0][0]["stream"]["stopped"] == "SINK_ERROR"
