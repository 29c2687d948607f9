"""Record locks, timeout reclaim and idempotent writes (docs/operations.md).

- :meth:`Claims.claim` takes up to ``n`` pending candidates for one execution in a single
  statement: PostgreSQL ``FOR UPDATE SKIP LOCKED`` (racing claimers skip each other's
  rows), SQLite ``UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING`` (SQLite runs one
  writer at a time, so the statement is atomic).
- Every final write is fenced by ``processing_lock = :execution_id``: once a record was
  reclaimed, the execution that lost it can no longer write it (:class:`LockLost`).
- :meth:`Claims.write_note` stores a collected note under ``{note_id}_v1`` and marks its
  candidate collected in one transaction; a second write of the same note is ``skipped``.
- :meth:`Claims.reclaim` returns records locked longer than the lock timeout to pending
  (``retry_count + 1``) or to failed at ``max_retry``, and marks executions whose
  heartbeat is older than the timeout ``timeout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, select, update
from sqlalchemy.engine import Engine

from artemis.crawler.models import Candidate, CrawlExecution, SourceNote
from artemis.db import upsert_insert
from artemis.errors import ErrorCode
from artemis.run_state import CandidateStatus, RunStatus

_c = Candidate.__table__  # type: ignore[attr-defined]
_x = CrawlExecution.__table__  # type: ignore[attr-defined]
_s = SourceNote.__table__  # type: ignore[attr-defined]

IDEMPOTENCY_VERSION = "v1"

_TIMEOUT = ErrorCode.TIMEOUT_ERROR.value  # a lock or an execution that outlived its time


def idempotency_key(note_id: str) -> str:
    return f"{note_id}_{IDEMPOTENCY_VERSION}"


class LockLost(Exception):
    """The record is no longer locked by this execution (it was reclaimed)."""


@dataclass(frozen=True)
class Claimed:
    id: int
    note_id: str
    platform: str
    note_url: str | None
    retry_count: int


@dataclass(frozen=True)
class Reclaimed:
    records_pending: int
    records_failed: int
    executions_timed_out: int


class Claims:
    def __init__(self, engine: Engine, max_retry: int = 3) -> None:
        self.engine = engine
        self.max_retry = max_retry
        self._pg = engine.dialect.name == "postgresql"
        self._insert = upsert_insert(engine)

    # -- candidates ----------------------------------------------------------------------
    def add_candidates(
        self, platform: str, notes: list[dict[str, Any]], keyword: str | None = None
    ) -> int:
        """Insert new candidates (``note_id``, ``note_url``); known notes are left alone."""
        if not notes:
            return 0
        rows = [
            {
                "note_id": str(n["note_id"]),
                "platform": platform,
                "note_url": n.get("note_url"),
                "status": CandidateStatus.PENDING,
                "retry_count": 0,
                "source_keyword": keyword,
            }
            for n in notes
        ]
        stmt = (
            self._insert(_c)
            .values(rows)
            .on_conflict_do_nothing(index_elements=["platform", "note_id"])
            .returning(_c.c.id)
        )
        with self.engine.begin() as conn:
            return len(conn.execute(stmt).all())

    def claim(self, execution_id: str, platform: str, n: int, now: datetime) -> list[Claimed]:
        pick = (
            select(_c.c.id)
            .where(_c.c.platform == platform, _c.c.status == CandidateStatus.PENDING)
            .order_by(_c.c.id)
            .limit(n)
        )
        if self._pg:
            pick = pick.with_for_update(skip_locked=True)
        stmt = (
            update(_c)
            .where(_c.c.id.in_(pick.scalar_subquery()))
            .values(
                status=CandidateStatus.PROCESSING,
                processing_lock=execution_id,
                locked_at=now,
                updated_at=now,
            )
            .returning(_c.c.id, _c.c.note_id, _c.c.platform, _c.c.note_url, _c.c.retry_count)
        )
        with self.engine.begin() as conn:
            rows = conn.execute(stmt).all()
        return sorted(
            (Claimed(r.id, r.note_id, r.platform, r.note_url, r.retry_count) for r in rows),
            key=lambda c: c.id,
        )

    def _fenced(self, candidate_id: int, execution_id: str) -> Any:
        return and_(
            _c.c.id == candidate_id,
            _c.c.processing_lock == execution_id,
            _c.c.status == CandidateStatus.PROCESSING,
        )

    def write_note(
        self,
        execution_id: str,
        candidate_id: int,
        note: dict[str, Any],
        now: datetime,
        page_seq: int | None = None,
    ) -> str:
        """Store a fetched note once and mark its candidate collected, in one transaction:

        - ``created``: stored now;
        - ``skipped``: the note was already stored (under ``{note_id}_v1``);
        - ``replayed``: this execution stored it from this very page before (a retried
          emit): the caller sends it on again under the same idempotency key.

        Raises :class:`LockLost` when the candidate is no longer this execution's."""
        key = idempotency_key(str(note["note_id"]))
        meta = {"execution_id": execution_id, "page_seq": page_seq}
        with self.engine.begin() as conn:
            fenced = conn.execute(
                update(_c)
                .where(self._fenced(candidate_id, execution_id))
                .values(
                    status=CandidateStatus.COLLECTED,
                    processing_lock=None,
                    last_error_code=None,
                    updated_at=now,
                )
            ).rowcount
            if not fenced:
                stored = conn.execute(
                    select(_s.c.exec_meta).where(_s.c.idempotency_key == key)
                ).first()
                if stored is not None and stored.exec_meta == meta:
                    return "replayed"
                raise LockLost(f"candidate {candidate_id} is not locked by {execution_id}")
            stmt = (
                self._insert(_s)
                .values(
                    idempotency_key=key,
                    note_id=str(note["note_id"]),
                    platform=str(note.get("platform") or ""),
                    title=note.get("title"),
                    content=note.get("content"),
                    author=note.get("author"),
                    data=note,
                    exec_meta=meta,
                    retry_count=0,
                    created_at=now,
                )
                .on_conflict_do_nothing(index_elements=["idempotency_key"])
                .returning(_s.c.id)
            )
            created = conn.execute(stmt).first() is not None
        return "created" if created else "skipped"

    def fail(
        self, execution_id: str, candidate_id: int, code: str, now: datetime, final: bool = False
    ) -> str:
        """A failed fetch: back to pending with ``retry_count + 1``, or failed at max_retry
        (at once when ``final``: no retry can fix it). Returns the new status; raises
        :class:`LockLost` when not this execution's."""
        new_count = _c.c.retry_count + 1
        limit = 1 if final else self.max_retry
        with self.engine.begin() as conn:
            row = conn.execute(
                update(_c)
                .where(self._fenced(candidate_id, execution_id))
                .values(**_given_back(new_count, limit, code, now))
                .returning(_c.c.status)
            ).first()
        if row is None:
            raise LockLost(f"candidate {candidate_id} is not locked by {execution_id}")
        return str(row.status)

    def release(self, execution_id: str, candidate_id: int, now: datetime) -> None:
        """Give a claimed record back untouched (e.g. the run was cancelled before it)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(_c)
                .where(self._fenced(candidate_id, execution_id))
                .values(
                    status=CandidateStatus.PENDING,
                    processing_lock=None,
                    locked_at=None,
                    updated_at=now,
                )
            )

    # -- reclaim ----------------------------------------------------------------------------
    def reclaim(self, now: datetime, lock_timeout_minutes: float) -> Reclaimed:
        threshold = now - timedelta(minutes=lock_timeout_minutes)
        new_count = _c.c.retry_count + 1
        with self.engine.begin() as conn:
            statuses = conn.execute(
                update(_c)
                .where(_c.c.status == CandidateStatus.PROCESSING, _c.c.locked_at < threshold)
                .values(**_given_back(new_count, self.max_retry, _TIMEOUT, now))
                .returning(_c.c.status)
            ).all()
            timed_out = conn.execute(
                update(_x)
                .where(_x.c.status == RunStatus.RUNNING, _x.c.heartbeat_at < threshold)
                .values(status=RunStatus.TIMEOUT, completed_at=now, error_code=_TIMEOUT)
            ).rowcount
        failed = sum(1 for r in statuses if r.status == CandidateStatus.FAILED)
        return Reclaimed(len(statuses) - failed, failed, timed_out or 0)

    # -- executions -------------------------------------------------------------------------
    def start_execution(self, workflow_name: str, execution_id: str, now: datetime) -> None:
        """Record a running execution (idempotent for the same execution id)."""
        stmt = (
            self._insert(_x)
            .values(
                workflow_name=workflow_name,
                execution_id=execution_id,
                status=RunStatus.RUNNING,
                started_at=now,
                heartbeat_at=now,
            )
            .on_conflict_do_nothing(index_elements=["execution_id"])
        )
        with self.engine.begin() as conn:
            # A stale `running` row of a crashed earlier execution must not block this
            # one: Temporal's workflow-id lock already guarantees there is no live twin.
            conn.execute(
                update(_x)
                .where(
                    _x.c.workflow_name == workflow_name,
                    _x.c.status == RunStatus.RUNNING,
                    _x.c.execution_id != execution_id,
                )
                .values(status=RunStatus.TIMEOUT, completed_at=now, error_code=_TIMEOUT)
            )
            conn.execute(stmt)

    def heartbeat(
        self, execution_id: str, now: datetime, processed: int = 0, failed: int = 0
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(_x)
                .where(_x.c.execution_id == execution_id)
                .values(
                    heartbeat_at=now,
                    items_processed=_x.c.items_processed + processed,
                    items_failed=_x.c.items_failed + failed,
                )
            )

    def finish_execution(
        self, execution_id: str, status: str, now: datetime, error_code: str | None = None
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(_x)
                .where(_x.c.execution_id == execution_id)
                .values(status=status, completed_at=now, heartbeat_at=now, error_code=error_code)
            )

    def counts(self, platform: str | None = None) -> dict[str, int]:
        with self.engine.connect() as conn:
            q = select(_c.c.status)
            if platform:
                q = q.where(_c.c.platform == platform)
            out: dict[str, int] = {}
            for (status,) in conn.execute(q):
                out[status] = out.get(status, 0) + 1
            return out


def _given_back(new_count: Any, limit: int, code: str, now: datetime) -> dict[str, Any]:
    """A claimed record handed back after a failure: pending again, or failed once its
    retries (``limit``) are spent; unlocked, with the failure's code."""
    return {
        "status": case(
            (new_count >= limit, CandidateStatus.FAILED.value),
            else_=CandidateStatus.PENDING.value,
        ),
        "retry_count": new_count,
        "processing_lock": None,
        "locked_at": None,
        "last_error_code": code,
        "updated_at": now,
    }
