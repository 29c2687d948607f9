"""The delivery ledger (artemis/ledger.py): one type for the streaming and the batch path,
counting a page once it and every page below it are finished, on one JSON shape, and the
run's counts taken from it (RunState.count, RunState.stand_after) by the workflow and by
the event stream's reading of a run alike."""

from __future__ import annotations

import json

from artemis.events import _ledger
from artemis.ledger import Ledger, PageDone
from artemis.run_state import RunState


def _judged(n_in: int, out: int, bad: int = 0, sinks: dict[str, int] | None = None) -> PageDone:
    return PageDone(
        records_in=n_in,
        records_out=out,
        quarantined=bad,
        sent=out if sinks is not None else 0,
        sinks=dict(sinks or {}),
    )


def test_a_page_above_a_gap_waits_until_the_pages_below_it_are_finished() -> None:
    ledger = Ledger.starting(4, judges=True, delivers=True)
    above = {5: _judged(10, 9, bad=1, sinks={"http": 9}), 6: _judged(0, 0, sinks={})}
    assert ledger.count(above) == []  # page 4 is not finished: nothing counts
    assert (ledger.next_seq, ledger.records_emitted, set(above)) == (4, 0, {5, 6})
    above[4] = _judged(3, 3, sinks={"http": 3})
    counted = ledger.count(above)
    assert [seq for seq, _ in counted] == [4, 5, 6] and above == {}
    assert (ledger.next_seq, ledger.records_in, ledger.records_out) == (7, 13, 12)
    assert (ledger.records_quarantined, ledger.records_emitted, ledger.batches) == (1, 12, 2)
    assert ledger.sinks == {"http": 12}


def test_a_path_counts_only_what_it_does() -> None:
    judged = Ledger.starting(0, judges=True, delivers=False)  # process_batch
    judged.count({0: _judged(5, 4, bad=1, sinks={"http": 4})})
    assert (judged.records_out, judged.records_quarantined) == (4, 1)
    assert (judged.records_emitted, judged.batches, judged.sinks) == (0, 0, {})
    sent = Ledger.starting(0, judges=False, delivers=True)  # emit_batch
    sent.count({0: PageDone(sent=4, sinks={"http": 4}), 1: PageDone(sent=0)})
    assert (sent.records_out, sent.records_in, sent.records_emitted) == (0, 0, 4)
    assert (sent.next_seq, sent.batches, sent.sinks) == (2, 1, {"http": 4})


def test_a_halted_path_counts_what_it_delivered_above_its_gap_once() -> None:
    ledger = Ledger.starting(0, judges=False, delivers=True)
    above = {0: PageDone(sent=2, sinks={"http": 2}), 2: PageDone(sent=5, sinks={"http": 5})}
    ledger.count(above)
    halted = ledger.with_above(above)
    assert (halted.next_seq, halted.records_emitted, halted.sinks) == (1, 7, {"http": 7})
    assert ledger.records_emitted == 2  # the running ledger is not changed


def test_both_paths_heartbeat_one_shape_that_reads_back() -> None:
    stream = Ledger.starting(3, judges=True, delivers=True)
    stream.count({3: _judged(2, 2, sinks={"log": 2})})
    stream.stopped = "SINK_ERROR"
    emit = Ledger.starting(3, judges=False, delivers=True)
    assert list(stream.to_json()) == list(emit.to_json())
    for ledger in (stream, emit):
        wire = json.loads(json.dumps(ledger.to_json()))
        assert Ledger.from_json(wire) == ledger


def test_the_run_counts_a_ledger_and_stands_after_it() -> None:
    run = RunState()
    stream = Ledger.starting(0, judges=True, delivers=True)
    stream.count({0: _judged(3, 2, bad=1, sinks={"http": 2}), 1: _judged(1, 1, sinks={"http": 1})})
    run.count(stream)
    run.stand_after(stream)
    assert (run.stats["records_processed"], run.stats["records_emitted"]) == (3, 3)
    assert run.stats["records_quarantined"] == 1
    assert (run.processed_through, run.delivered_below) == (1, 2)
    judged = Ledger.starting(2, judges=True, delivers=False)
    judged.count({2: _judged(4, 4)})
    run.count(judged)
    run.stand_after(judged)
    assert (run.processed_through, run.delivered_below) == (2, 2)  # judged, not delivered
    assert (run.stats["records_processed"], run.stats["records_emitted"]) == (7, 3)
    nothing = Ledger.starting(3, judges=False, delivers=True)
    run.stand_after(nothing)
    assert run.delivered_below == 2


def test_the_event_stream_reads_a_batch_s_ledger_and_an_event_without_one() -> None:
    sent = Ledger.starting(4, judges=False, delivers=True)
    sent.count({4: PageDone(sent=3, sinks={"http": 3})})
    assert _ledger({**sent.to_json(), "last_seq": 9}, judges=False) == sent  # halted at 5
    older = _ledger({"records_emitted": 3, "sinks": {"http": 3}, "last_seq": 4}, judges=False)
    assert (older.next_seq, older.records_emitted, older.delivers) == (5, 3, True)
