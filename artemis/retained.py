"""Runs kept for a retry (``POST /tasks/{task_id}/retry``; docs/api.md, docs/architecture.md).

A run that fails with a retryable code (SOURCE_UNAVAILABLE, SINK_UNAVAILABLE, INTERNAL,
TIMEOUT_ERROR) keeps its request and its carry — checkpoint, next page, the pages staged
and not delivered, stats — in ``retained_run``, and with them its staged pages, its run
secret and its files-sink records, for ``runs.retain_failed_s``. A retry takes the state
once (``taken_at``); the clean-up loop drops what expired.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, delete, or_, select, update
from sqlalchemy.engine import Connection

from artemis import jsonio
from artemis.db import RetainedRun, get_engine, transaction, upsert_insert, utcnow
from artemis.run_models import RunRef

_t = RetainedRun.__table__  # type: ignore[attr-defined]
_DROP = delete(_t).where(_t.c.run_key == bindparam("p_run_key"))  # every run's clean-up
# The format of a kept state ({"request", "carry"}: RunRequest and RunState as dicts).
# Raise it when either changes so that a state kept by another build no longer reads as
# this one's: a retry of such a state answers 410 naming the build that kept it. A
# state without one was kept in format 1.
KEPT_FORMAT = 2
# A retried run may last this long (meta.timeout_s is at most 30 days).
TAKEN_BACKSTOP = timedelta(days=30, hours=1)


class Retained:
    def __init__(self, database_url: str) -> None:
        self.engine = get_engine(database_url)

    def keep(
        self,
        run: RunRef,
        error_code: str,
        error_message: str,
        state: dict[str, Any],
        retain_s: float,
    ) -> None:
        """Keep ``state`` (what a retry needs) of ``run``, which failed with
        ``error_code``, for ``retain_s``; a run that fails again is kept afresh."""
        now = utcnow()
        row = {
            "run_key": f"{run.task_code}/{run.task_id}",
            "task_code": run.task_code,
            "task_id": run.task_id,
            "workflow_id": run.workflow_id,
            "error_code": error_code,
            "error_message": error_message[:2000],
            "state": jsonio.dumps(state).decode(),
            "retained_at": now,
            "expires_at": now + timedelta(seconds=retain_s),
            "taken_at": None,
        }
        stmt = upsert_insert(self.engine)(_t).values(row)
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_key"], set_={k: stmt.excluded[k] for k in row if k != "run_key"}
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def load(self, run_key: str, now: datetime | None = None) -> dict[str, Any] | None:
        """The kept state (with ``error_code``, ``taken_at``), None when absent or expired."""
        now = now or utcnow()
        with self.engine.connect() as conn:
            row = conn.execute(select(_t).where(_t.c.run_key == run_key)).mappings().first()
        if row is None or RetainedRun.model_validate(dict(row)).expires_at <= now:
            return None
        rec = RetainedRun.model_validate(dict(row))
        return {
            "error_code": rec.error_code,
            "error_message": rec.error_message,
            "taken_at": rec.taken_at,
            "expires_at": rec.expires_at,
            "state": jsonio.loads(rec.state),
        }

    def key_of(self, task_id: str) -> str | None:
        """The run key kept for ``task_id`` (any task code), or None."""
        with self.engine.connect() as conn:
            return conn.execute(
                select(_t.c.run_key).where(_t.c.task_id == task_id).limit(1)
            ).scalar()

    def take(self, run_key: str) -> bool:
        """Mark the state taken by a retry; False when another retry took it first."""
        with self.engine.begin() as conn:
            return (
                conn.execute(
                    update(_t)
                    .where(_t.c.run_key == run_key, _t.c.taken_at.is_(None))
                    .values(taken_at=utcnow())
                ).rowcount
                == 1
            )

    def release(self, run_key: str) -> None:
        """A retry that could not start gives the state back."""
        with self.engine.begin() as conn:
            conn.execute(update(_t).where(_t.c.run_key == run_key).values(taken_at=None))

    def drop(self, run_key: str, conn: Connection | None = None) -> None:
        with transaction(self.engine, conn) as c:
            c.execute(_DROP, {"p_run_key": run_key})

    def _expired(self, now: datetime) -> Any:
        """Kept state past its time — unless a retry took it (the retried run drops it
        when it ends, or keeps it again when it fails again); a taken state is forgotten
        only after the longest a run may last (30 days) besides."""
        return or_(
            and_(_t.c.taken_at.is_(None), _t.c.expires_at <= now),
            _t.c.taken_at < now - TAKEN_BACKSTOP,
        )

    def live_keys(self, now: datetime | None = None) -> set[str]:
        """Run keys whose state is still kept (their staged pages must stay)."""
        now = now or utcnow()
        with self.engine.connect() as conn:
            return set(conn.execute(select(_t.c.run_key).where(~self._expired(now))).scalars())

    def expired(self, now: datetime | None = None) -> list[str]:
        now = now or utcnow()
        with self.engine.connect() as conn:
            return list(conn.execute(select(_t.c.run_key).where(self._expired(now))).scalars())
