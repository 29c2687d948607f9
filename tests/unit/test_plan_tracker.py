"""The event converter: raw run events in, front-end events out (docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from artemis.events import PlanTracker, RawEvent, cursor_of, plan_id_for
from artemis.run_state import STAT_KEYS


class Raw:
    def __init__(self) -> None:
        self.seq = 0
        self.ids = 0

    def ev(self, kind: str, step: str | None = None, **data: Any) -> RawEvent:
        self.seq += 1
        return RawEvent(self.seq, kind, step, data, 1_000 + self.seq)

    def start(self, activity: str, step: str, aid: str, attempt: int = 1, **extra: Any):
        return self.ev(
            "activity_start",
            step,
            activity=activity,
            activity_id=aid,
            run_id="r1",
            attempt=attempt,
            **extra,
        )

    def ok(self, activity: str, step: str, aid: str, **result: Any) -> RawEvent:
        return self.ev(
            "activity_result",
            step,
            activity=activity,
            activity_id=aid,
            run_id="r1",
            ok=True,
            result=result,
        )

    def fail(self, activity: str, step: str, aid: str, code: str = "SOURCE_ERROR") -> RawEvent:
        return self.ev(
            "activity_result",
            step,
            activity=activity,
            activity_id=aid,
            run_id="r1",
            ok=False,
            error={"code": code, "message": "boom"},
        )


def run(tracker: PlanTracker, raws: list[RawEvent]) -> list[dict[str, Any]]:
    out = []
    for raw in raws:
        out += [{"sse": e.sse_id, **e.payload} for e in tracker.feed(raw)]
    return out


def plans(events: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {t["id"]: t["status"] for t in e["todos"]} for e in events if e["event"] == "plan_update"
    ]


def happy_path(r: Raw) -> list[RawEvent]:
    return [
        r.start("prepare_params", "step_prepare", "1"),
        r.ok("prepare_params", "step_prepare", "1", total=2),
        r.start("fetch_pages", "step_fetch", "2"),
        r.ev("progress", "step_fetch", pages=1, records=10, units_done=0, total=2),
        r.ok(
            "fetch_pages",
            "step_fetch",
            "2",
            pages=2,
            records=20,
            next_seq=2,
            done=True,
            units_done=2,
        ),
        r.start("process_batch", "step_process", "3"),
        r.ok("process_batch", "step_process", "3", records_in=20, records_out=20, last_seq=1),
        r.start("emit_batch", "step_emit", "4"),
        r.ok("emit_batch", "step_emit", "4", records_emitted=20, last_seq=1),
        r.start("finalize_run", "step_finalize", "5", status="completed"),
        r.ok("finalize_run", "step_finalize", "5", callback="skipped"),
        r.ev("run_status", status="completed", stats={"records_emitted": 20}),
    ]


def test_plan_update_first_then_steps_in_order_and_one_terminal_event():
    tracker = PlanTracker("t1")
    events = run(tracker, happy_path(Raw()))
    assert events[0]["event"] == "plan_update"
    assert events[0]["id"] == plan_id_for("t1") and events[0]["planId"] is None
    first = plans(events)[0]
    assert first == {
        "step_prepare": "IN_PROGRESS",
        "step_fetch": "PENDING",
        "step_process": "PENDING",
        "step_emit": "PENDING",
        "step_finalize": "PENDING",
    }
    assert plans(events)[-1] == dict.fromkeys(first, "COMPLETED")
    assert events[-1]["event"] == "complete" and events[-1]["stats"] == {"records_emitted": 20}
    # Activities and progress carry their step as planId.
    for e in events:
        if e["event"] in ("activity_start", "activity_result", "progress"):
            assert e["planId"] in first
        if e["event"] == "activity_start" and e["activity"] == "emit_batch":
            assert e["planId"] == "step_emit"
    progress = [e for e in events if e["event"] == "progress"]
    # The counters are GET /tasks/{id}'s (a batch counts once its activity returned); the
    # fetch in flight shows apart.
    assert [p["records_fetched"] for p in progress] == [0, 20, 20, 20]
    assert [p["in_flight"]["records"] for p in progress] == [10, 0, 0, 0]
    assert [p["records_processed"] for p in progress] == [0, 0, 20, 20]
    assert progress[-1]["batches"] == 1 and progress[-1]["pages"] == 2
    assert progress[-1]["records_emitted"] == 20 and progress[-1]["progress"] == 1.0
    assert set(progress[-1]) >= {*STAT_KEYS, "expected_total", "current", "total"}
    # SSE ids unique and increasing; payload ids unique except the plan's stable one.
    cursors = [cursor_of(e["sse"]) for e in events]
    assert cursors == sorted(set(cursors))
    other = [e["id"] for e in events if e["event"] != "plan_update"]
    assert len(other) == len(set(other))
    # Once finished, nothing more comes out.
    assert tracker.feed(RawEvent(99, "activity_start", "step_fetch", {}, 0)) == []


def test_failed_attempt_then_success_shows_error_then_completed():
    r = Raw()
    raws = [
        r.start("prepare_params", "step_prepare", "1"),
        r.ok("prepare_params", "step_prepare", "1", total=1),
        r.start("fetch_pages", "step_fetch", "2"),
        r.ok("fetch_pages", "step_fetch", "2", pages=1, records=5, next_seq=1, done=True),
        r.start("process_batch", "step_process", "3"),
        r.ok("process_batch", "step_process", "3", last_seq=0),
        r.start("emit_batch", "step_emit", "4", attempt=1),
        r.fail("emit_batch", "step_emit", "4", code="SINK_ERROR"),
        r.start("emit_batch", "step_emit", "4", attempt=2),
        r.ok("emit_batch", "step_emit", "4", records_emitted=5, last_seq=0),
    ]
    events = run(PlanTracker("t2"), raws)
    emit_states = [p["step_emit"] for p in plans(events)]
    assert "ERROR" in emit_states
    assert emit_states.index("ERROR") < len(emit_states) - 1
    assert emit_states[-1] == "COMPLETED"  # recovered, before finalize even starts
    failed = [e for e in events if e["event"] == "activity_result" and e["error"]]
    assert failed and failed[0]["data"]["code"] == "SINK_ERROR"


def test_failed_run_marks_the_broken_step_and_ends_with_error():
    r = Raw()
    raws = [
        r.start("prepare_params", "step_prepare", "1"),
        r.ok("prepare_params", "step_prepare", "1", total=1),
        r.start("fetch_pages", "step_fetch", "2"),
        r.fail("fetch_pages", "step_fetch", "2", code="SOURCE_ERROR"),
        r.start("finalize_run", "step_finalize", "3", status="failed"),
        r.ok("finalize_run", "step_finalize", "3"),
        r.ev("run_status", status="failed", error={"code": "SOURCE_ERROR", "message": "x"}),
    ]
    events = run(PlanTracker("t3"), raws)
    last = plans(events)[-1]
    assert last["step_fetch"] == "ERROR" and last["step_prepare"] == "COMPLETED"
    assert last["step_process"] == "PENDING" and last["step_finalize"] == "COMPLETED"
    assert events[-1]["event"] == "error" and events[-1]["error"]["code"] == "SOURCE_ERROR"


def test_resume_after_any_event_id_gives_exactly_the_rest():
    full = run(PlanTracker("t4"), happy_path(Raw()))
    for i, seen in enumerate(full):
        after = cursor_of(seen["sse"])
        rest = [e for e in run(PlanTracker("t4"), happy_path(Raw())) if cursor_of(e["sse"]) > after]
        assert rest == full[i + 1 :]


def test_a_run_closed_without_its_end_recorded_gets_a_synthetic_terminal_event():
    r = Raw()
    tracker = PlanTracker("t5")
    run(tracker, [r.start("prepare_params", "step_prepare", "1")])
    end = tracker.synthetic_end("cancelled", {"error": {"message": "terminated"}}, 5_000)
    assert [e.type for e in end] == ["plan_update", "cancelled"]
    assert end[-1].payload["reason"] == "terminated"
    assert cursor_of(end[0].sse_id) > (1, 0)
    assert tracker.synthetic_end("cancelled", {}, 6_000) == []


def test_a_backfill_stream_counts_its_windows_but_ends_only_with_itself():
    r = Raw()

    def child(raw: RawEvent, task: str) -> RawEvent:
        return RawEvent(raw.seq, raw.kind, raw.step, raw.data, raw.ts_ms, task)

    raws = [
        r.start("prepare_params", "step_prepare", "1"),
        r.ok("prepare_params", "step_prepare", "1", total=2, children=2),
        child(r.start("prepare_params", "step_prepare", "1"), "t6.w0"),
        child(r.ok("prepare_params", "step_prepare", "1", total=1), "t6.w0"),
        child(r.start("fetch_pages", "step_fetch", "2"), "t6.w0"),
        child(r.ev("progress", "step_fetch", pages=1, records=7, units_done=0, total=1), "t6.w0"),
        child(r.start("fetch_pages", "step_fetch", "2"), "t6.w1"),
        child(r.ev("progress", "step_fetch", pages=1, records=5, units_done=0, total=1), "t6.w1"),
        child(r.ok("fetch_pages", "step_fetch", "2", pages=2, records=14, done=True), "t6.w0"),
        child(r.ok("emit_batch", "step_emit", "4", records_emitted=14, last_seq=1), "t6.w0"),
        child(r.start("finalize_run", "step_finalize", "5", status="completed"), "t6.w0"),
        child(r.ev("run_status", status="completed", stats={}), "t6.w0"),
    ]
    events = run(PlanTracker("t6"), raws)
    assert [e["event"] for e in events].count("complete") == 0  # a window's end is not ours
    progress = [e for e in events if e["event"] == "progress"]
    assert progress[-1]["current"] == 1 and progress[-1]["total"] == 2
    assert progress[-1]["records_fetched"] == 14  # w0's batch returned
    assert progress[-1]["in_flight"]["records"] == 5  # w1's in flight
    assert progress[-1]["records_emitted"] == 14
    last = plans(events)[-1]
    assert last["step_fetch"] == "IN_PROGRESS" and last["step_finalize"] == "PENDING"
    assert not [e for e in events if e.get("activity") in ("prepare_params", "finalize_run")][2:]


def test_the_last_plan_is_the_runs_own_snapshot_and_a_retry_counts_pages_once():
    """The run's end carries the workflow's steps (RunState's snapshot): the stream's last
    plan is those, whatever the activity events suggested; a retried run processes its
    failed attempt's pages again, counted once (as the workflow counts them)."""
    r = Raw()
    raws = [
        r.start("prepare_params", "step_prepare", "1"),
        r.ok("prepare_params", "step_prepare", "1", total=1),
        r.start("fetch_pages", "step_fetch", "2"),
        r.ok("fetch_pages", "step_fetch", "2", pages=2, records=20, next_seq=2, done=True),
        r.start("process_batch", "step_process", "3"),
        r.ok("process_batch", "step_process", "3", records_out=20, last_seq=1),
        # the retry: the same pages processed again, then emitted
        r.start("process_batch", "step_process", "4"),
        r.ok("process_batch", "step_process", "4", records_out=20, last_seq=1),
        r.start("emit_batch", "step_emit", "5"),
        r.ok("emit_batch", "step_emit", "5", records_emitted=20, last_seq=1),
        r.ev(
            "run_status",
            status="failed",
            stats={"records_processed": 20},
            error={"code": "SINK_UNAVAILABLE", "message": "down"},
            steps={
                "step_prepare": "COMPLETED",
                "step_fetch": "COMPLETED",
                "step_process": "COMPLETED",
                "step_emit": "ERROR",
                "step_finalize": "COMPLETED",
            },
        ),
    ]
    events = run(PlanTracker("t9"), raws)
    assert plans(events)[-1] == {
        "step_prepare": "COMPLETED",
        "step_fetch": "COMPLETED",
        "step_process": "COMPLETED",
        "step_emit": "ERROR",
        "step_finalize": "COMPLETED",
    }
    progress = [e for e in events if e["event"] == "progress"]
    assert progress[-1]["records_processed"] == 20
    assert events[-1]["event"] == "error"
