"""A key a source echoes in its records is redacted in the quarantine and the drift table
as it is in logs (artemis/quarantine/, artemis/redact.py): the reason, the record key,
the record as the API shows it, the drift example. The record itself stays replayable:
kept sealed under the master key, opened by the replay alone. On a real database (SQLite
and PostgreSQL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from artemis.config import Settings
from artemis.quarantine import judging, pages, policy, store
from artemis.redact import REDACTED, forget_secret, redact_json, register_secret
from artemis.tasks.base import TaskContext, TaskUnit
from artemis.tracing import TraceContext, new_span_id, new_trace_id
from tests.unit.test_quarantine import Params


class Item(BaseModel):
    id: int
    name: str
    price: float | None = None


class Items(TaskUnit):
    """A task whose records are its source's as they come (the model checks them)."""

    code = "items"
    Params = Params
    Record: ClassVar[type[BaseModel] | None] = Item
    record_key = ("id",)

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        return records


@pytest.fixture
def secret() -> Iterator[str]:
    """A registry key as the worker holds it: redacted in every log line."""
    value = f"sk_live_{uuid.uuid4().hex}"
    register_secret(value)
    yield value
    forget_secret(value)


def judge_for(db_engine, tmp_path: Path) -> pages.PageJudge:
    key_file = tmp_path / "master.key"
    key_file.write_text(uuid.uuid4().hex * 2)
    settings = Settings(
        database={"url": db_engine.url.render_as_string(hide_password=False)},
        vault={"master_key_file": str(key_file)},
    )
    task_id = f"t-{uuid.uuid4().hex}"
    ctx = TaskContext(
        "items", task_id, Params(), settings, TraceContext(new_trace_id(), new_span_id())
    )
    place = store.RunPlace(f"items/{task_id}", "items", task_id, None, {}, {})
    return pages.PageJudge(Items(), ctx, place, pages.Tally(counts_pages=True))


def stored_text(db_engine, task_id: str) -> str:
    """Every column of the run's quarantine and drift rows, as the database holds them."""
    with db_engine.connect() as conn:
        rows = [
            *conn.execute(sa.select(store._Q).where(store._Q.c.task_id == task_id)).all(),
            *conn.execute(sa.select(store._DRIFT).where(store._DRIFT.c.task_id == task_id)).all(),
        ]
    return " ".join(str(v) for r in rows for v in r)


def test_a_record_that_echoes_a_key_is_shown_redacted_and_replayed_as_it_was(
    db_engine, tmp_path, secret
):
    judge = judge_for(db_engine, tmp_path)
    echoed = {"id": 2, "name": "a", "price": secret}  # the key where a number belongs
    raw = [{"id": 1, "name": "a"}, echoed, {"id": 3, "name": f"token={secret}", "price": "x"}]
    out = judge.page(0, raw)
    judge.keep([out])
    assert out.quarantined == 2 and out.records == [{"id": 1, "name": "a"}]
    url, task_id = judge.database_url, judge.place.task_id
    assert secret not in stored_text(db_engine, task_id)
    shown = store.list_rows(url, store.RowPage(task_id=task_id))
    assert shown[0]["message"] == (
        f"record column 'price': Input should be a valid number (got \"{REDACTED}\")"
    )
    one = store.get_row(url, shown[0]["id"])
    assert one is not None and "record_sealed" not in one
    assert one["record"] == {"id": 2, "name": "a", "price": REDACTED}
    assert store.get_row(url, shown[1]["id"])["record"]["name"] == f"token={REDACTED}"  # type: ignore[index]
    # The replay (in a worker, with the master key) gets each record as it came.
    opened = store.list_rows(
        url, store.RowPage(task_id=task_id), with_record=True, key_file=judge.seal.key_file
    )
    assert [r["record"] for r in opened] == raw[1:]
    # Without the key (the API's reading) the record is the one shown.
    assert (
        store.list_rows(url, store.RowPage(task_id=task_id), with_record=True)[0]["record"]
        == one["record"]
    )


def test_a_record_that_holds_a_secret_and_cannot_be_sealed_is_not_kept(db_engine, secret):
    url = db_engine.url.render_as_string(hide_password=False)
    task_id = f"t-{uuid.uuid4().hex}"
    place = store.RunPlace(f"items/{task_id}", "items", task_id, None, {}, {})
    bad = judging.BadRecord(
        0, {"id": secret}, "SINK_ERROR", "id", "not an int", policy.Stage.PROCESS
    )
    store.store_bad(url, place, [(0, [bad])], 1 << 20)
    (row,) = store.list_rows(url, store.RowPage(task_id=task_id), with_record=True)
    assert row["record"] is None and "holds a secret value" in row["message"]
    assert secret not in stored_text(db_engine, task_id)


def test_a_drift_example_is_redacted_before_it_is_cut(db_engine, tmp_path, secret):
    judge = judge_for(db_engine, tmp_path)
    # The key past the example's 80 characters: cut first, its head would show.
    out = judge.page(0, [{"id": 1, "name": "a", "note": "n" * 70 + secret}])
    judge.keep([out])
    (drift,) = out.new_drift
    assert judging.example_text(drift.example) == '"' + "n" * 70 + REDACTED[:6] + "..."
    assert secret[:8] not in stored_text(db_engine, judge.place.task_id)


def test_a_record_redacted_stays_json_of_its_shape(secret):
    number = 987654321987
    register_secret(str(number))
    try:
        deep: Any = secret
        for _ in range(100):
            deep = {"d": deep}
        record = {
            "id": 1,
            "n": number,
            "tags": ["ok", f"x{secret}y"],
            secret: "its key",
            "authorization": "Bearer abc.def",
            "deep": deep,
            "ok": 1.5,
        }
        shown = redact_json(record)
    finally:
        forget_secret(str(number))
    assert shown["id"] == 1 and shown["ok"] == 1.5
    assert shown["n"] == REDACTED and shown["tags"] == ["ok", f"x{REDACTED}y"]
    assert shown[REDACTED] == "its key" and shown["authorization"] == REDACTED
    level = shown["deep"]  # walked while it is shallow, then redacted whole
    for _ in range(62):
        level = level["d"]
    assert level == {"d": REDACTED}
    assert secret not in str(shown)
