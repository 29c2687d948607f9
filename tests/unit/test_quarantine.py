"""Judging a page (artemis/quarantine/): what the task's process and the record model
reject, what a source that changed looks like, drift, the bound, and the policy's
layers. A task of the test's own (the TaskUnit API as a task author writes it)."""

from __future__ import annotations

from typing import Any

import pytest

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.quarantine.judging import Rules, infer_type, judge
from artemis.quarantine.policy import (
    RecordPolicy,
    RecordPolicyParams,
    Stage,
    check_bound,
    parse_max_bad,
)
from artemis.sinks.records import declared_spec
from artemis.tasks.base import TaskContext, TaskUnit
from artemis.tracing import TraceContext

SPEC = declared_spec(
    {"key": ["id"], "fields": {"id": "int", "name": "str", "price": "float | None"}}, "ItemRecord"
)


class Params(RecordPolicyParams):
    pass


class Items(TaskUnit):
    """Turns down items marked ``"hidden"``; an item without ``sku`` is a KeyError."""

    code = "items"
    Params = Params

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        out = []
        for r in records:
            if r.get("hidden"):
                ctx.reject(r, "hidden items are not published", field="hidden")
                continue
            out.append({"id": r["id"], "name": r["sku"], "price": r.get("price")})
        return out


class Doubling(TaskUnit):
    """Two records out for each one in (its process does not map one to one)."""

    code = "doubling"
    Params = Params

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        return [dict(r) for r in records for _ in range(2)]


def ctx(task: TaskUnit) -> TaskContext:
    return TaskContext(
        task_code=task.code,
        task_id="t-1",
        params=Params(),
        settings=Settings(),
        trace=TraceContext("0" * 31 + "1", "0" * 15 + "1"),
    )


QUARANTINE = RecordPolicy(max_bad_records=1000)


def item(i: int, **over: Any) -> dict[str, Any]:
    return {"id": i, "sku": f"s{i}", "price": i * 1.5, **over}


def test_a_rejected_record_and_one_that_does_not_fit_are_set_aside_and_the_rest_goes_on():
    task = Items()
    raw = [item(1), item(2, hidden=True), item(3, price="1.5"), item(4)]
    judged = judge(task, ctx(task), 7, raw, Rules(QUARANTINE, SPEC))
    assert [r["id"] for r in judged.records] == [1, 4]
    bad = {b.position: b for b in judged.bad}
    assert set(bad) == {1, 2}
    assert bad[1].field == "hidden" and bad[1].stage is Stage.PROCESS
    assert bad[1].code == ErrorCode.SOURCE_CONTRACT.value and bad[1].record is raw[1]
    # the model's fault names the field; the record kept is the raw one (replayable)
    assert bad[2].field == "price" and bad[2].code == ErrorCode.RECORD_MODEL.value
    assert bad[2].record is raw[2] and bad[2].stage is Stage.PROCESS
    assert bad[2].key == {"id": 3} and "valid number" in bad[2].message


def test_a_process_that_fails_on_the_page_is_run_record_by_record():
    task = Items()
    raw = [item(1), {"id": 2}, item(3)]
    judged = judge(task, ctx(task), 0, raw, Rules(QUARANTINE, SPEC))
    assert [r["id"] for r in judged.records] == [1, 3]
    [bad] = judged.bad
    assert (bad.position, bad.field, bad.stage) == (1, "sku", Stage.PROCESS)
    assert bad.message == "KeyError: 'sku'"


def test_every_record_breaking_one_rule_is_a_changed_source_not_bad_records():
    task = Items()
    renamed = [{"id": i, "SKU": "x"} for i in range(5)]
    with pytest.raises(ArtemisError) as e:
        judge(task, ctx(task), 3, renamed, Rules(QUARANTINE, SPEC))
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "every one of its 5 records" in str(
        e.value
    )
    typed = [item(i, price="cheap") for i in range(4)]
    with pytest.raises(ArtemisError) as e:
        judge(task, ctx(task), 3, typed, Rules(QUARANTINE, SPEC))
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "'price'" in str(e.value)
    # one record alone is a bad record, whatever it breaks
    judged = judge(task, ctx(task), 3, typed[:1], Rules(QUARANTINE, SPEC))
    assert len(judged.bad) == 1 and judged.records == []


def test_fail_keeps_the_errors_of_a_page_that_does_not_fit():
    task = Items()
    fail = RecordPolicy(on_bad_record="fail")
    with pytest.raises(ArtemisError) as e:
        judge(task, ctx(task), 4, [item(1), item(2, price="x")], Rules(fail, SPEC))
    assert e.value.code is ErrorCode.RECORD_MODEL and not e.value.retryable
    assert "page 4: record 1 column 'price'" in e.value.message
    with pytest.raises(ArtemisError) as e:
        judge(task, ctx(task), 4, [item(1), item(2, hidden=True)], Rules(fail, SPEC))
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "hidden items" in e.value.message
    with pytest.raises(ArtemisError) as e:
        judge(task, ctx(task), 4, [item(1), {"id": 2}], Rules(fail, SPEC))
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "KeyError" in e.value.message


def test_a_process_that_does_not_map_one_to_one_still_finds_the_raw_record():
    task = Doubling()
    raw = [{"id": 1, "name": "a"}, {"id": 2, "name": 5}, {"id": 3, "name": "c"}]
    judged = judge(task, ctx(task), 0, raw, Rules(QUARANTINE, SPEC))
    assert [r["id"] for r in judged.records] == [1, 1, 3, 3]
    # one row for the raw record both of whose records do not fit
    [bad] = judged.bad
    assert (bad.position, bad.stage) == (1, Stage.PROCESS) and bad.record is raw[1]


class Splitting(TaskUnit):
    """One good and one bad record out of each record marked ``split``; it turns down a
    copy of a record marked ``copy`` (not the page's own)."""

    code = "splitting"
    Params = Params

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        out = []
        for r in records:
            if r.get("copy"):
                ctx.reject(dict(r, copied=True), "a copy", field="copy")
                continue
            out.append({"id": r["id"], "name": r["name"]})
            if r.get("split"):
                out.append({"id": r["id"] + 100, "name": 7})
        return out


def test_a_raw_record_is_set_aside_whole_and_every_row_has_a_place_of_its_own():
    task = Splitting()
    raw = [
        {"id": 1, "name": "a"},
        {"id": 2, "name": "b", "split": True},
        {"id": 3, "name": "c", "copy": True},
        {"id": 4, "name": "d"},
    ]
    judged = judge(task, ctx(task), 0, raw, Rules(QUARANTINE, SPEC))
    # the split record's good sibling goes with it: a replay processes it again
    assert [r["id"] for r in judged.records] == [1, 4]
    places = sorted((b.position, b.stage) for b in judged.bad)
    assert places == [(1, Stage.PROCESS), (len(raw) + 0, Stage.MODEL)]
    assert len({b.position for b in judged.bad}) == len(judged.bad)


class Whole(TaskUnit):
    """Fails on a page of more than one record, never on a record alone."""

    code = "whole"
    Params = Params

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        if len(records) > 1:
            raise ValueError("records must come one at a time")
        return records


def test_a_process_that_fails_on_the_page_and_on_no_record_is_the_pages_shape():
    task = Whole()
    with pytest.raises(ArtemisError) as e:
        judge(task, ctx(task), 2, [item(1), item(2)], Rules(QUARANTINE, None))
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "one at a time" in e.value.message


def test_unnamed_fields_are_dropped_counted_and_reported_and_freeze_refuses_them():
    task = TaskUnit()
    raw = [{"id": 1, "name": "a", "colour": "red"}, {"id": 2, "name": "b", "colour": None}]
    judged = judge(task, ctx(Items()), 2, raw, Rules(QUARANTINE, SPEC))
    assert judged.records == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert judged.fields_dropped == 2
    assert [(d.field, d.kind, d.example, d.type_name) for d in judged.drift] == [
        ("colour", "added", "red", "str | None"),
        ("price", "missing", None, None),
    ]
    freeze = RecordPolicy(schema_contract="freeze")
    with pytest.raises(ArtemisError) as e:
        judge(task, ctx(Items()), 2, raw, Rules(freeze, SPEC))
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "'colour'" in e.value.message


def test_lax_types_convert_what_can_be_read():
    task = TaskUnit()
    raw = [{"id": "1", "name": "a", "price": "2.5"}, {"id": "x", "name": "b"}]
    judged = judge(task, ctx(Items()), 0, raw, Rules(RecordPolicy(coerce_types=True), SPEC))
    assert judged.records == [{"id": 1, "name": "a", "price": 2.5}]
    assert [(b.position, b.field) for b in judged.bad] == [(1, "id")]


def test_the_type_a_new_field_gets():
    assert infer_type([1, 2]) == "int | None"
    assert infer_type([1, 2.5, None]) == "float | None"
    assert infer_type(["a"]) == "str | None"
    assert infer_type([None, None]) == "json | None"
    assert infer_type([1, "a"]) == "json | None"
    assert infer_type([{"a": 1}]) == "dict | None"
    assert infer_type([["a", "b"]]) == "list[str] | None"


def test_max_bad_records_is_a_count_or_a_percentage():
    assert parse_max_bad(10) == 10 and parse_max_bad("10") == 10
    assert parse_max_bad("1%") == 1.0 and parse_max_bad("0.5 %") == 0.5
    for bad in ("-1", "x", "101%", True, "%"):
        with pytest.raises(ValueError):
            parse_max_bad(bad)
    with pytest.raises(ValueError):
        Params(max_bad_records="ten")
    count = RecordPolicy(max_bad_records=10)
    assert count.bound(10**6, None) == 10
    pct = RecordPolicy(max_bad_records="1%")
    assert pct.bound(50, None) == 10  # of 1,000 records at least
    assert pct.bound(5_000, None) == 50 and pct.bound(5_000, 20_000) == 200
    check_bound(10, count, 0, None)  # at the bound: fine
    with pytest.raises(ArtemisError) as e:
        check_bound(11, count, 0, None)
    assert e.value.code is ErrorCode.BAD_RECORDS and not e.value.retryable
    assert "11 records quarantined" in e.value.message and "(10:" in e.value.message


def test_the_policy_takes_the_first_layer_that_says():
    p = RecordPolicy.of({"on_bad_record": None, "max_bad_records": 5}, {"on_bad_record": "fail"})
    assert (p.on_bad_record, p.max_bad_records, p.schema_contract) == ("fail", 5, "discard")
    assert RecordPolicy.of() == RecordPolicy()


def test_evolve_is_refused_for_a_model_in_code():
    with pytest.raises(ArtemisError) as e:
        Items().prepare_params({"schema_contract": "evolve"}, Settings())
    assert e.value.code is ErrorCode.INVALID_INPUT and "params.schema_contract" in e.value.message


def test_rows_are_kept_once_per_place_counted_and_dropped_after_their_days(db_engine):
    from datetime import timedelta

    import sqlalchemy as sa

    from artemis.db import utcnow
    from artemis.quarantine import judging, store

    url = db_engine.url.render_as_string(hide_password=False)
    task_id = f"t-keep-{utcnow().timestamp()}"
    place = store.RunPlace(f"items/{task_id}", "items", task_id, None, {"a": 1}, {})
    bad = [judging.BadRecord(0, {"id": "x"}, "SINK_ERROR", "id", "not an int", Stage.PROCESS)]
    assert store.store_bad(url, place, [(3, bad)], 1 << 20) == (1, 1)
    assert store.store_bad(url, place, [(3, bad)], 1 << 20) == (1, 0)  # the page judged again
    big = [judging.BadRecord(1, {"x": "y" * 2000}, "SINK_ERROR", "x", "too big", Stage.PROCESS)]
    assert store.store_bad(url, place, [(3, big)], 1024) == (2, 1)
    rows = store.list_rows(url, store.RowPage(task_id=task_id), with_record=True)
    assert [r["record"] for r in rows] == [{"id": "x"}, None]
    assert "not kept" in rows[1]["message"]
    assert store.run_of(url, task_id)["params"] == {"a": 1}
    assert store.discard(url, task_id, [rows[1]["id"]]) == 1
    assert store.counts(url, task_id) == {"quarantined": 1, "discarded": 1}
    table = store.QuarantinedRecord.__table__  # type: ignore[attr-defined]
    with db_engine.begin() as conn:
        conn.execute(
            sa.update(table)
            .where(table.c.task_id == task_id, table.c.position == 0)
            .values(created_at=utcnow() - timedelta(days=31))
        )
    assert store.drop_older_than(url, 30) == 1
    assert store.counts(url, task_id) == {"discarded": 1}
