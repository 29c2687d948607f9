"""Claim-check storage: fetched and processed pages live in the database, workflow
history carries only (run, sequence range, counts)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, delete, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from artemis import jsonio
from artemis.db import StagedPage, get_engine, run_transaction, transaction, upsert_insert, utcnow
from artemis.errors import ArtemisError, ErrorCode

_table = StagedPage.__table__  # type: ignore[attr-defined]


@contextlib.contextmanager
def store_outage(what: str) -> Iterator[None]:
    """A staging database that cannot be reached is an outage of the run's own store
    (docs/architecture.md): retryable, and named so the run waits it out."""
    try:
        yield
    except DBAPIError as e:
        if not (e.connection_invalidated or isinstance(e, OperationalError)):
            raise
        first = str(e.orig or e).splitlines()[0]
        raise ArtemisError(
            ErrorCode.INTERNAL,
            f"staging store: {what}: database unavailable: {first}",
            retryable=True,
            details={
                "dependency": "store",
                "dependency_name": "staging",
                "reason": "database unreachable",
            },
        ) from None


# The kind of the row holding where a streaming fetch stands (one per run, seq 0).
CURSOR = "cursor"

# A run's per-page statements, built once (building one costs more than running it on
# SQLite); the values are parameters.
_REPEATED = (
    select(_table.c.seq)
    .where(
        _table.c.run_key == bindparam("p_run_key"),
        _table.c.digest == bindparam("p_digest"),
        _table.c.seq != bindparam("p_seq"),
    )
    .limit(1)
)
_CURSOR = select(_table.c.payload).where(
    _table.c.run_key == bindparam("p_run_key"), _table.c.kind == CURSOR, _table.c.seq == 0
)
_DROP_FROM = delete(_table).where(
    _table.c.run_key == bindparam("p_run_key"),
    _table.c.kind == bindparam("p_kind"),
    _table.c.seq >= bindparam("p_first_seq"),
)
_DROP_RUN = delete(_table).where(_table.c.run_key == bindparam("p_run_key"))


class Staging:
    def __init__(self, database_url: str) -> None:
        self.engine = get_engine(database_url)
        self._insert = upsert_insert(self.engine)
        # Built once (``excluded`` is rebuilt on every access); rows come as parameters.
        upsert = self._insert(_table)
        self._upsert = upsert.on_conflict_do_update(
            index_elements=["run_key", "kind", "seq"],
            set_={
                "payload": upsert.excluded.payload,
                "record_count": upsert.excluded.record_count,
                "digest": upsert.excluded.digest,
                # an overwrite is a new write: the clean-up loop's age counts from it (a
                # long run's fetch cursor, rewritten with every page, stays)
                "created_at": upsert.excluded.created_at,
            },
        )

    def put_pages(
        self,
        run_key: str,
        kind: str,
        pages: list[tuple[int, list[dict[str, Any]]]],
        digest: str | None = None,
        cursor: dict[str, Any] | None = None,
    ) -> None:
        """Store pages by sequence number; storing a sequence again overwrites it.

        ``digest`` (one page): its records' fingerprint. Another page of the run with the
        same one means the source served that page again: SOURCE_LOOP, naming both.
        ``cursor``: where the fetch stands after these pages, stored in the same
        transaction (``cursor()``): a page sent on before its fetch's heartbeat reached
        Temporal keeps its sequence number when a retried attempt resumes."""
        if not pages:
            return
        rows = [
            {
                "run_key": run_key,
                "kind": kind,
                "seq": seq,
                "record_count": len(records),
                "payload": jsonio.dumps(records).decode(),
                "created_at": utcnow(),
                "digest": digest,
            }
            for seq, records in pages
        ]

        # (artemis.db: on SQLite, its driver)
        with store_outage("stage pages"), run_transaction(self.engine) as conn:
            if digest is not None:
                (seq, _), *_ = pages
                earlier = conn.execute(
                    _REPEATED, {"p_run_key": run_key, "p_digest": digest, "p_seq": seq}
                ).scalar()
                if earlier is not None:
                    raise ArtemisError(
                        ErrorCode.SOURCE_LOOP,
                        f"page {seq} of the run holds the same records as its page {earlier}: "
                        "the source is serving a page again",
                        details={"seq": seq, "repeats": earlier},
                    )
            if cursor is not None:
                rows.append(
                    {
                        "run_key": run_key,
                        "kind": CURSOR,
                        "seq": 0,
                        "record_count": 0,
                        "payload": jsonio.dumps(cursor).decode(),
                        "created_at": rows[0]["created_at"],
                        "digest": None,
                    }
                )
            conn.execute(self._upsert, rows)

    def start_attempt(
        self, run_key: str, next_seq: int, batch_first_seq: int | None = None
    ) -> dict[str, Any] | None:
        """Where a fetch attempt starts, in one transaction. With ``batch_first_seq`` (a
        streaming fetch of the batch starting there): the cursor an earlier attempt of
        this batch staged, when it stands beyond ``next_seq`` (returned, without its
        ``first_seq``; the attempt goes on from it). Then the raw pages from where the
        attempt starts on go: an earlier attempt's leftovers, not counted."""
        resume: dict[str, Any] | None = None
        with store_outage("start a fetch attempt"), run_transaction(self.engine) as conn:
            if batch_first_seq is not None:
                payload = conn.execute(_CURSOR, {"p_run_key": run_key}).scalar()
                cursor = jsonio.loads(payload) if payload else None
                if (
                    cursor is not None
                    and cursor.pop("first_seq", None) == batch_first_seq
                    and cursor["next_seq"] > next_seq
                ):
                    resume = cursor
                    next_seq = cursor["next_seq"]
            params = {"p_run_key": run_key, "p_kind": "raw", "p_first_seq": next_seq}
            conn.execute(_DROP_FROM, params)
        return resume

    def cursor(self, run_key: str) -> dict[str, Any] | None:
        """The run's last cursor stored with a page (None: none was)."""
        with store_outage("read the fetch cursor"), self.engine.connect() as conn:
            payload = conn.execute(_CURSOR, {"p_run_key": run_key}).scalar()
        return jsonio.loads(payload) if payload else None

    def get_pages(
        self, run_key: str, kind: str, first_seq: int, last_seq: int
    ) -> list[tuple[int, list[dict[str, Any]]]]:
        """Pages with ``first_seq <= seq <= last_seq``, in order."""
        q = (
            select(_table.c.seq, _table.c.payload)
            .where(
                and_(
                    _table.c.run_key == run_key,
                    _table.c.kind == kind,
                    _table.c.seq >= first_seq,
                    _table.c.seq <= last_seq,
                )
            )
            .order_by(_table.c.seq)
        )
        with store_outage("read pages"), self.engine.connect() as conn:
            return [(row.seq, jsonio.loads(row.payload)) for row in conn.execute(q)]

    def prune_below(self, run_key: str, seq: int) -> int:
        """Pages below ``seq`` were delivered: their processed copies go and their raw
        copies keep only their fingerprint (a later page serving the same records is
        still a SOURCE_LOOP), so staging holds only what is not yet delivered."""
        with store_outage("prune delivered pages"), self.engine.begin() as conn:
            conn.execute(
                delete(_table).where(
                    _table.c.run_key == run_key, _table.c.kind == "processed", _table.c.seq < seq
                )
            )
            return conn.execute(
                update(_table)
                .where(
                    _table.c.run_key == run_key,
                    _table.c.kind == "raw",
                    _table.c.seq < seq,
                    _table.c.payload != "",
                )
                .values(payload="")
            ).rowcount

    def undelivered(self, run_key: str) -> int:
        """Staged pages still holding records (raw or processed): what is not delivered."""
        from sqlalchemy import func

        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count())
                    .select_from(_table)
                    .where(
                        _table.c.run_key == run_key,
                        _table.c.kind != CURSOR,
                        _table.c.payload != "",
                    )
                ).scalar_one()
            )

    def drop_older_than(
        self, before: datetime, keep: set[str] | frozenset[str] = frozenset()
    ) -> int:
        """Pages left behind by runs that never finalized (terminated ones), but those of
        the runs in ``keep`` (kept for a retry)."""
        cond = [_table.c.created_at < before]
        if keep:
            cond.append(_table.c.run_key.not_in(sorted(keep)))
        with self.engine.begin() as conn:
            return conn.execute(delete(_table).where(*cond)).rowcount

    def drop_run(self, run_key: str, conn: Connection | None = None) -> int:
        with transaction(self.engine, conn) as c:
            return c.execute(_DROP_RUN, {"p_run_key": run_key}).rowcount
