"""Record locks, fenced writes, timeout reclaim and idempotent writes on real databases."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from artemis.crawler.claims import Claims, LockLost, idempotency_key
from artemis.crawler.models import Candidate, CrawlExecution, SourceNote

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def seed(claims: Claims, n: int, platform: str = "xhs") -> None:
    notes = [{"note_id": f"n{i:04d}", "note_url": f"https://x/n{i}"} for i in range(n)]
    assert claims.add_candidates(platform, notes, keyword="k") == n
    assert claims.add_candidates(platform, notes[:5]) == 0  # known notes are left alone


def test_concurrent_claimers_never_hold_one_record_twice(crawl_db):
    claims = Claims(crawl_db)
    seed(claims, 300)
    taken: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def claimer(name: str) -> None:
        mine: list[int] = []
        try:
            start.wait()
            while batch := claims.claim(name, "xhs", 7, NOW):
                mine += [c.id for c in batch]
        except BaseException as e:  # surfaced below
            errors.append(e)
        taken[name] = mine

    threads = [threading.Thread(target=claimer, args=(f"exec-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    everything = Counter(i for ids in taken.values() for i in ids)
    assert len(everything) == 300 and set(everything.values()) == {1}
    assert sum(1 for ids in taken.values() if ids) >= 2  # they really raced
    with crawl_db.connect() as conn:
        rows = conn.execute(select(Candidate.processing_lock, Candidate.id)).all()
    owner = {i: name for name, ids in taken.items() for i in ids}
    assert all(lock == owner[i] for lock, i in rows)


def test_fenced_write_once_and_reclaim_takes_the_record_away(crawl_db):
    claims = Claims(crawl_db, max_retry=3)
    seed(claims, 2)
    first = claims.claim("exec-a", "xhs", 1, NOW)[0]
    note = {"note_id": first.note_id, "platform": "xhs", "title": "t", "content": "c"}
    assert claims.write_note("exec-a", first.id, note, NOW, page_seq=4) == "created"
    # A retried emit of the same page: sent on again (same idempotency key downstream).
    assert claims.write_note("exec-a", first.id, note, NOW, page_seq=4) == "replayed"
    with pytest.raises(LockLost):  # another page with the same note: not a second copy
        claims.write_note("exec-a", first.id, note, NOW, page_seq=5)

    second = claims.claim("exec-a", "xhs", 5, NOW)
    assert [c.note_id for c in second] == ["n0001"]
    later = NOW + timedelta(minutes=31)
    reclaimed = claims.reclaim(later, lock_timeout_minutes=30)
    assert (reclaimed.records_pending, reclaimed.records_failed) == (1, 0)
    again = claims.claim("exec-b", "xhs", 5, later)
    assert [(c.note_id, c.retry_count) for c in again] == [("n0001", 1)]
    lost = {"note_id": "n0001", "platform": "xhs"}
    with pytest.raises(LockLost):  # exec-a lost it to the reclaim
        claims.write_note("exec-a", second[0].id, lost, later)
    with pytest.raises(LockLost):
        claims.fail("exec-a", second[0].id, "PLATFORM_ERROR", later)
    assert claims.write_note("exec-b", again[0].id, lost, later) == "created"
    with crawl_db.connect() as conn:
        keys = conn.execute(select(SourceNote.idempotency_key).order_by(SourceNote.id)).all()
    assert [k for (k,) in keys] == [idempotency_key("n0000"), "n0001_v1"]


def test_the_same_note_written_twice_leaves_one_row(crawl_db):
    claims = Claims(crawl_db)
    claims.add_candidates("xhs", [{"note_id": "dup"}])
    claims.add_candidates("other", [{"note_id": "dup"}])
    a = claims.claim("e1", "xhs", 1, NOW)[0]
    b = claims.claim("e2", "other", 1, NOW)[0]
    note = {"note_id": "dup", "platform": "xhs", "title": "once"}
    assert claims.write_note("e1", a.id, note, NOW) == "created"
    assert claims.write_note("e2", b.id, {**note, "title": "twice"}, NOW) == "skipped"
    with crawl_db.connect() as conn:
        rows = conn.execute(select(SourceNote.title)).all()
        statuses = conn.execute(select(Candidate.status)).all()
    assert rows == [("once",)]
    assert {s for (s,) in statuses} == {"collected"}


def test_failures_retry_until_max_then_fail_and_reclaim_counts(crawl_db):
    claims = Claims(crawl_db, max_retry=3)
    seed(claims, 1)
    statuses = []
    for attempt in range(3):
        c = claims.claim(f"e{attempt}", "xhs", 1, NOW)
        assert len(c) == 1 and c[0].retry_count == attempt
        statuses.append(claims.fail(f"e{attempt}", c[0].id, "TIMEOUT_ERROR", NOW))
    assert statuses == ["pending", "pending", "failed"]
    assert claims.claim("e9", "xhs", 1, NOW) == []
    assert claims.counts("xhs") == {"failed": 1}

    seed(claims, 3, platform="p2")
    for c in claims.claim("stale", "p2", 3, NOW):
        with crawl_db.begin() as conn:  # two earlier attempts already failed
            conn.execute(
                Candidate.__table__.update().where(Candidate.id == c.id).values(retry_count=2)
            )
        break
    r = claims.reclaim(NOW + timedelta(minutes=29), 30)
    assert (r.records_pending, r.records_failed) == (0, 0)  # not stale yet
    r = claims.reclaim(NOW + timedelta(minutes=30, seconds=1), 30)
    assert (r.records_pending, r.records_failed) == (2, 1)


def test_one_running_execution_per_workflow_name_and_heartbeat_timeout(crawl_db):
    claims = Claims(crawl_db)
    claims.start_execution("crawl_notes:xhs", "exec-1", NOW)
    with pytest.raises(IntegrityError):  # the database's own guard
        with crawl_db.begin() as conn:
            conn.execute(
                CrawlExecution.__table__.insert().values(
                    workflow_name="crawl_notes:xhs",
                    execution_id="exec-x",
                    status="running",
                    started_at=NOW,
                    heartbeat_at=NOW,
                    items_processed=0,
                    items_failed=0,
                )
            )
    claims.heartbeat("exec-1", NOW + timedelta(minutes=10), processed=3, failed=1)
    assert claims.reclaim(NOW + timedelta(minutes=39), 30).executions_timed_out == 0
    assert claims.reclaim(NOW + timedelta(minutes=41), 30).executions_timed_out == 1
    claims.start_execution("crawl_notes:xhs", "exec-2", NOW + timedelta(minutes=42))
    claims.start_execution("crawl_notes:xhs", "exec-2", NOW + timedelta(minutes=42))  # again
    claims.finish_execution("exec-2", "completed", NOW + timedelta(minutes=43))
    with crawl_db.connect() as conn:
        rows = conn.execute(
            select(
                CrawlExecution.execution_id,
                CrawlExecution.status,
                CrawlExecution.items_processed,
                CrawlExecution.items_failed,
            ).order_by(CrawlExecution.id)
        ).all()
        total = conn.execute(select(func.count()).select_from(CrawlExecution)).scalar_one()
    assert [tuple(r) for r in rows] == [
        ("exec-1", "timeout", 3, 1),
        ("exec-2", "completed", 0, 0),
    ]
    assert total == 2
