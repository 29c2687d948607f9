"""One contract suite for TaskStorage, run on SQLite, PostgreSQL and a real Redis."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from artemis.taskstore import (
    ConcurrentModification,
    StatusChange,
    TaskData,
    TaskNotFound,
    TaskValidationError,
)


@pytest.fixture(params=["sqlite", "postgresql", "redis"])
def storage(request, tmp_path_factory):
    from artemis.migrate import upgrade

    if request.param == "redis":
        from artemis.taskstore.redis_store import RedisTaskStorage

        store = RedisTaskStorage(request.getfixturevalue("redis_url"), ttl_hours=24)
        store.client.flushdb()
        return store
    from artemis.taskstore.sql import SqlTaskStorage

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('ts') / 'tasks.db'}"
    else:
        url = request.getfixturevalue("pg_server").url
    upgrade(url)
    store = SqlTaskStorage(url, ttl_hours=24)
    with store.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("DELETE FROM async_tasks"))
    return store


def tid() -> str:
    return str(uuid.uuid4())


def test_save_is_an_upsert_and_load_round_trips(storage):
    t = tid()
    data = TaskData.pending(
        t,
        {"symbols": ["AAPL"]},
        task_code="pull_stock_quotes",
        workflow_id=f"artemis/pull_stock_quotes/{t}",
    )
    storage.save(t, data)
    loaded = storage.load(t)
    assert loaded.status == "pending" and loaded.payload == {"symbols": ["AAPL"]}
    assert loaded.task_code == "pull_stock_quotes" and loaded.created_at.tzinfo is not None
    storage.save(t, data.model_copy(update={"status": "running"}))
    assert storage.load(t).status == "running"


def test_create_inserts_once_and_never_overwrites(storage):
    t = tid()
    first = TaskData.pending(t, {"n": 1}, task_code="pull_stock_quotes", workflow_id=f"wf/{t}")
    assert storage.create(t, first) is True
    storage.update_status(t, "running")
    # A late create (the API's pending record after the run recorded `running`) is a no-op.
    late = TaskData.pending(t, {"n": 2}, task_code="pull_stock_quotes", workflow_id=f"wf/{t}")
    assert storage.create(t, late) is False
    loaded = storage.load(t)
    assert loaded.status == "running" and loaded.payload == {"n": 1}
    assert [x.task_id for x in storage.list(limit=500)[0]].count(t) == 1


def test_create_many_inserts_the_absent_and_never_overwrites(storage):
    ran, new = tid(), tid()
    storage.create(ran, TaskData.pending(ran, {"n": 1}, task_code="pull_stock_quotes"))
    storage.update_status(ran, "running")
    # The API's pending records of a burst, one of them late (its run recorded itself).
    storage.create_many(
        [
            TaskData.pending(ran, {"n": 2}, task_code="pull_stock_quotes"),
            TaskData.pending(new, {"n": 3}, task_code="pull_stock_quotes"),
        ]
    )
    assert storage.load(ran).status == "running" and storage.load(ran).payload == {"n": 1}
    assert storage.load(new).status == "pending" and storage.load(new).payload == {"n": 3}
    storage.create_many([])


def test_load_of_a_missing_task_is_none(storage):
    assert storage.load(tid()) is None


def test_update_status_stamps_started_and_completed(storage):
    t = tid()
    storage.save(t, TaskData.pending(t, {}))
    running = storage.update_status(t, "running")
    assert running.started_at is not None and running.completed_at is None
    assert storage.load(t).version == running.version == 1
    done = storage.update_status(t, StatusChange("completed", result={"records": 3}))
    loaded = storage.load(t)
    assert loaded.status == "completed" and loaded.result == {"records": 3}
    assert loaded.completed_at >= loaded.started_at and loaded.version == done.version == 2


def test_set_status_writes_what_update_status_writes(storage):
    """A run's mirror of itself (``set_status``): the same fields as ``update_status``,
    the run's own times kept, each write a new version; refused as update_status is."""
    t = tid()
    storage.save(t, TaskData.pending(t, {"n": 1}, task_code="c"))
    began = datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)
    storage.set_status(t, StatusChange("running", started_at=began, at=began))
    running = storage.load(t)
    assert running.status == "running" and running.started_at == began
    assert running.updated_at == began and running.completed_at is None
    assert running.version == 1 and running.payload == {"n": 1} and running.task_code == "c"
    ended = began + timedelta(seconds=2)
    storage.set_status(
        t, StatusChange("completed", result={"records": 3}, started_at=began, at=ended)
    )
    done = storage.load(t)
    assert done.status == "completed" and done.result == {"records": 3} and done.error is None
    assert done.started_at == began and done.completed_at == ended and done.version == 2
    # No start given: a running or ended task keeps the one it has, or gets the change's.
    u = tid()
    storage.save(u, TaskData.pending(u, {}))
    storage.set_status(u, StatusChange("failed", error={"code": "X", "message": "y"}, at=ended))
    failed = storage.load(u)
    assert failed.started_at == failed.completed_at == ended and failed.error["code"] == "X"
    storage.set_status(u, StatusChange("running", at=ended + timedelta(seconds=5)))
    assert storage.load(u).started_at == ended
    with pytest.raises(TaskNotFound):
        storage.set_status(tid(), "running")
    with pytest.raises(TaskValidationError):
        storage.set_status(t, "completed")  # no result given
    with pytest.raises(TaskValidationError):
        storage.set_status(t, "paused")
    assert storage.load(t).version == 2


def test_set_status_creates_an_absent_record_it_is_given(storage):
    """A run's first mirror may come before the API's `pending` write: ``absent`` is
    created (insert-if-absent) and updated; a record that is there keeps what it holds."""
    t = tid()
    began = datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)
    mine = TaskData(task_id=t, task_code="c", workflow_id="artemis/c/" + t)
    storage.set_status(t, StatusChange("running", started_at=began, at=began), absent=lambda: mine)
    created = storage.load(t)
    assert created.status == "running" and created.started_at == began
    assert created.task_code == "c" and created.workflow_id == "artemis/c/" + t
    assert created.version == 1
    # The API's write after it finds the record (and leaves it), the run's ending updates it.
    assert storage.create(t, TaskData.pending(t, {"n": 1}, task_code="c")) is False
    ended = began + timedelta(seconds=1)
    storage.set_status(
        t, StatusChange("completed", result={"records": 2}, at=ended), absent=lambda: mine
    )
    done = storage.load(t)
    assert done.status == "completed" and done.result == {"records": 2} and done.version == 2
    assert done.started_at == began and done.completed_at == ended
    u = tid()
    storage.save(u, TaskData.pending(u, {"n": 2}, task_code="d"))
    storage.set_status(
        u, StatusChange("running", at=began), absent=lambda: TaskData(task_id=u, task_code="x")
    )
    kept = storage.load(u)
    assert kept.task_code == "d" and kept.payload == {"n": 2} and kept.status == "running"
    with pytest.raises(TaskValidationError):
        storage.set_status(tid(), "running", absent=lambda: TaskData(task_id="another"))


def test_optimistic_lock_conflict_raises(storage):
    t = tid()
    storage.save(t, TaskData.pending(t, {}))
    storage.update_status(t, "running", expected_version=0)
    with pytest.raises(ConcurrentModification):
        storage.update_status(t, "cancelled", expected_version=0)  # stale version
    assert storage.load(t).status == "running"


def test_concurrent_writers_one_wins_per_version(storage):
    t = tid()
    storage.save(t, TaskData.pending(t, {}))
    outcomes: list[str] = []
    statuses = ("failed", "timeout") * 3
    start = threading.Barrier(len(statuses))  # all six write at once, not one after another

    def writer(status: str) -> None:
        start.wait(30)
        try:
            storage.update_status(
                t, StatusChange(status, error={"code": "X", "message": "y"}), expected_version=0
            )
            outcomes.append("ok")
        except ConcurrentModification:
            outcomes.append("conflict")

    threads = [threading.Thread(target=writer, args=(s,)) for s in statuses]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert outcomes.count("ok") == 1 and outcomes.count("conflict") == 5
    assert storage.load(t).version == 1


def test_update_of_a_missing_task_raises_not_found(storage):
    with pytest.raises(TaskNotFound):
        storage.update_status(tid(), "running")


def test_contract_violations_are_refused(storage):
    t = tid()
    with pytest.raises(TaskValidationError):
        TaskData(task_id=t, status="completed")  # completed without a result
    with pytest.raises(TaskValidationError):
        TaskData(task_id=t, status="paused")
    storage.save(t, TaskData.pending(t, {}))
    with pytest.raises(TaskValidationError):
        storage.update_status(t, "completed")  # still no result
    with pytest.raises(TaskValidationError):
        storage.save("other-id", TaskData.pending(t, {}))


def test_delete_is_idempotent(storage):
    t = tid()
    storage.save(t, TaskData.pending(t, {}))
    storage.delete(t)
    assert storage.load(t) is None
    storage.delete(t)
    storage.delete(tid())


def test_delete_expired_removes_old_terminal_tasks_only_in_batches(storage):
    old = datetime.now(UTC) - timedelta(hours=30)
    ids = {"old_done": [], "old_running": [], "new_done": []}
    for n in range(25):
        t = tid()
        ids["old_done"].append(t)
        storage.save(
            t,
            TaskData(
                task_id=t,
                status="completed",
                result={},
                started_at=old,
                completed_at=old + timedelta(minutes=n),
            ),
        )
    for _ in range(3):
        t = tid()
        ids["old_running"].append(t)
        storage.save(t, TaskData(task_id=t, status="running", started_at=old))
        t = tid()
        ids["new_done"].append(t)
        storage.save(
            t,
            TaskData(
                task_id=t, status="failed", error={"code": "X"}, completed_at=datetime.now(UTC)
            ),
        )
    removed = storage.delete_expired(datetime.now(UTC) - timedelta(hours=24), batch_size=10)
    assert removed == 25
    assert all(storage.load(t) is None for t in ids["old_done"])
    assert all(storage.load(t) is not None for t in ids["old_running"] + ids["new_done"])


def test_feedback_is_stored(storage):
    t = tid()
    storage.save(t, TaskData(task_id=t, status="completed", result={"n": 1}))
    storage.record_feedback(t, "success", "looks right")
    fb = storage.load(t).feedback
    assert fb["status"] == "success" and fb["comment"] == "looks right"
    with pytest.raises(TaskValidationError):
        storage.record_feedback(t, "meh")
    with pytest.raises(TaskNotFound):
        storage.record_feedback(tid(), "failed")


def test_expired_tasks_are_invisible(storage):
    t = tid()
    if hasattr(storage, "client"):  # Redis: the TTL is on every key
        storage.save(t, TaskData.pending(t, {}))
        ttls = [
            storage.client.ttl(f"task:{t}:{p}")
            for p in ("status", "payload", "result", "error", "meta")
        ]
        assert all(23 * 3600 < x <= 24 * 3600 for x in ttls)
        storage.client.pexpire(f"task:{t}:status", 1)
        deadline = time.monotonic() + 10
        while storage.client.exists(f"task:{t}:status"):  # expired by Redis itself
            assert time.monotonic() < deadline, "the status key did not expire"
            time.sleep(0.01)
        # A listing skips it and writes nothing; the clean-up drops its index entry.
        assert t not in [x.task_id for x in storage.list(limit=500)[0]]
        assert storage.client.zscore("tasks:index", t) is not None
        storage.delete_expired(datetime.now(UTC) - timedelta(hours=24))
        assert storage.client.zscore("tasks:index", t) is None
    else:  # SQL: expires_at = last update + ttl
        storage.ttl = timedelta(seconds=-1)
        storage.save(t, TaskData.pending(t, {}))
        storage.ttl = timedelta(hours=24)
    assert storage.load(t) is None
    # An expired task is absent for create too: a run that outlived the TTL records its
    # state again (the SQL row is still there until the clean-up; it is replaced).
    assert storage.create(t, TaskData.pending(t, {"again": True}, task_code="c"))
    storage.set_status(t, "running")
    again = storage.load(t)
    assert again.status == "running" and again.payload == {"again": True}
    assert not storage.create(t, TaskData.pending(t, {"third": True}))  # live: kept
    assert storage.load(t).payload == {"again": True}


def test_list_newest_first_filtered_and_paginated(storage):
    base = datetime.now(UTC) - timedelta(minutes=30)
    made = []
    for n in range(7):
        t = f"list-{n}-{tid()[:8]}"
        status = "completed" if n % 2 == 0 else "running"
        data = TaskData(
            task_id=t,
            task_code="a" if n < 4 else "b",
            status=status,
            result={"n": n} if status == "completed" else None,
            created_at=base + timedelta(seconds=n),
        )
        storage.save(t, data)
        made.append(t)
    newest_first = list(reversed(made))
    seen, cursor = [], None
    while True:
        page, cursor = storage.list(limit=3, cursor=cursor)
        assert len(page) <= 3
        seen += [d.task_id for d in page]
        if cursor is None:
            break
    assert seen == newest_first
    done, _ = storage.list(status="completed", limit=50)
    assert [d.task_id for d in done] == [t for t in newest_first if int(t.split("-")[1]) % 2 == 0]
    b_tasks, _ = storage.list(code="b", limit=50)
    assert [d.task_id for d in b_tasks] == newest_first[:3]
    both, _ = storage.list(code="a", status="running", limit=50)
    assert [d.task_id for d in both] == [made[3], made[1]]
    with pytest.raises(TaskValidationError):
        storage.list(cursor="not-a-cursor")


def test_list_filters_by_owner(storage):
    """A named owner's runs have ids ``owner~id``; the default owner's have none: each
    sees only its own, and an owner name is matched whole (``a_b`` is not ``a%b``)."""
    ids = {
        "default": f"plain-{tid()[:8]}",
        "cron": f"cron~{tid()[:8]}",
        "cron_2": f"cron_2~{tid()[:8]}",
        "cronx2": f"cronx2~{tid()[:8]}",
    }
    for task_id in ids.values():
        storage.save(task_id, TaskData(task_id=task_id, task_code="own", status="running"))
    for owner, task_id in ids.items():
        page, _ = storage.list(owner=owner, code="own", limit=50)
        assert [d.task_id for d in page] == [task_id], owner
    everyone, _ = storage.list(code="own", limit=50)
    assert {d.task_id for d in everyone} == set(ids.values())
