"""A run's task-store record has one writer (``artemis.run_record.write_runs``): the API's
`pending` record, a retry's reopen and restore, the run's mirror and the reconciler all
go through it, on a real SQLite store. A scan of the product's code keeps it the only
place outside the store that writes or builds a record."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from artemis.migrate import upgrade
from artemis.run_record import RunSnapshot, Write, write_runs
from artemis.run_state import RunStatus
from artemis.taskstore import ConcurrentModification, TaskNotFound
from artemis.taskstore.sql import SqlTaskStorage

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("artemis", "workflows", "activities", "starter", "workers")


@pytest.fixture
def store(tmp_path) -> SqlTaskStorage:  # noqa: ANN001
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    upgrade(url)
    return SqlTaskStorage(url)


def _snap(status: str = RunStatus.PENDING.value, **kw) -> RunSnapshot:  # noqa: ANN003
    return RunSnapshot("t1", "quotes", "wf-t1", status, **kw)


def _recent() -> datetime:
    """A time a few minutes ago: the store forgets a finished run after its time to live
    (a fixed date would age past it)."""
    return datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)


def test_new_creates_a_pending_record_and_never_overwrites(store: SqlTaskStorage) -> None:
    write_runs(store, [_snap(params={"symbols": ["A"]})], Write.NEW)
    rec = store.load("t1")
    assert rec is not None and rec.status == "pending"
    assert rec.payload == {"params": {"symbols": ["A"]}} and rec.workflow_id == "wf-t1"
    write_runs(store, [_snap(RunStatus.RUNNING.value)], Write.STATUS)
    # the API's pending record arriving after the run recorded itself changes nothing
    write_runs(store, [_snap(params={"other": 1})], Write.NEW)
    rec = store.load("t1")
    assert rec is not None and rec.status == "running"
    assert rec.payload == {"params": {"symbols": ["A"]}}


def test_status_creates_the_record_when_absent(store: SqlTaskStorage) -> None:
    at = _recent()
    done = _snap(
        RunStatus.COMPLETED.value, params={"p": 1}, stats={"records": 3}, started_at=at, at=at
    )
    write_runs(store, [done], Write.STATUS)
    rec = store.load("t1")
    assert rec is not None and rec.status == "completed" and rec.result == {"records": 3}
    assert rec.payload == {"params": {"p": 1}}
    assert rec.started_at == at and rec.completed_at == at


def test_repair_holds_the_optimistic_lock(store: SqlTaskStorage) -> None:
    write_runs(store, [_snap()], Write.NEW)
    rec = store.load("t1")
    assert rec is not None
    failed = {"code": "INTERNAL", "message": "gone"}
    write_runs(store, [_snap(RunStatus.RUNNING.value)], Write.STATUS)  # the run wrote first
    with pytest.raises(ConcurrentModification):
        ending = _snap(RunStatus.FAILED.value, error=failed, version=rec.version)
        write_runs(store, [ending], Write.REPAIR)
    now = store.load("t1")
    assert now is not None and now.status == "running"
    write_runs(
        store, [_snap(RunStatus.FAILED.value, error=failed, version=now.version)], Write.REPAIR
    )
    assert store.load("t1").status == "failed"  # type: ignore[union-attr]
    with pytest.raises(TaskNotFound):
        gone = RunSnapshot("nope", "quotes", None, RunStatus.FAILED.value, error=failed)
        write_runs(store, [gone], Write.REPAIR)


def test_exact_reopens_a_failed_run_and_puts_it_back(store: SqlTaskStorage) -> None:
    at = _recent()
    error = {"code": "SOURCE_UNAVAILABLE", "message": "503"}
    write_runs(store, [_snap(params={"p": 1})], Write.NEW)
    write_runs(
        store,
        [_snap(RunStatus.FAILED.value, stats={"pages": 2}, error=error, started_at=at, at=at)],
        Write.STATUS,
    )
    (before,) = write_runs(store, [_snap(stats={"pages": 2})], Write.EXACT)
    assert before is not None and before.status == "failed" and before.error == error
    opened = store.load("t1")
    assert opened is not None and opened.status == "pending"
    assert opened.error is None and opened.completed_at is None
    assert opened.started_at == at and opened.payload == {"params": {"p": 1}}
    write_runs(store, [RunSnapshot.of(before)], Write.EXACT)  # the retry did not start
    back = store.load("t1")
    assert back is not None and back.status == "failed" and back.error == error
    assert back.completed_at == at and back.result == {"pages": 2}


def test_exact_of_an_unknown_run_creates_it(store: SqlTaskStorage) -> None:
    (before,) = write_runs(store, [_snap(stats={})], Write.EXACT)
    assert before is None
    assert store.load("t1").status == "pending"  # type: ignore[union-attr]


# What writes a record: the store's writing methods, or a record built by hand.
_WRITES = re.compile(
    r"\b(TaskData\(|TaskData\.pending\(|\.set_status\(|\.update_status\(|\.create_many\("
    r"|\bstore\.save\(|task_store\.save\(|\bstore\.create\(|task_store\.create\()"
)


def test_one_place_outside_the_store_writes_a_run_record() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("artemis/taskstore/") or "migrations" in rel:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _WRITES.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found and all(f.startswith("artemis/run_record.py:") for f in found), found
