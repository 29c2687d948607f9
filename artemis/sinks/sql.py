"""SQL sink: each page's records upserted into a table, exactly once per page.

``output_defaults.<code>.sql: {url, table, key}`` (``key`` defaults to the task's record
key). The table is created from the task's record model when absent — typed columns, the
key as primary key, and ``_artemis_task_id``, ``_artemis_page_seq``, ``_artemis_loaded_at``
— and checked against it when present. A page is written in one transaction together
with a row of the ``_artemis_sink_ledger`` table keyed by the page's idempotency key: a
retried page (a worker killed after the commit, before Temporal heard of it) finds its
ledger row and changes nothing; a record seen before under another page is updated in
place by its key, so the table holds each key once.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from artemis import jsonio
from artemis.calls import work
from artemis.db import get_engine, upsert_insert, utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import HttpClient
from artemis.logsetup import get_logger
from artemis.sinks.base import EmitContext, Sink
from artemis.sinks.records import (
    LOAD_COLUMNS,
    MAX_COLUMNS,
    RecordSpec,
    same_but_case,
    schema_error,
)

log = get_logger(__name__)

LEDGER = "_artemis_sink_ledger"
# PostgreSQL keeps the first 63 bytes of a name (a longer one is cut, and two cut names
# may be one table): one rule for both databases.
MAX_NAME_BYTES = 63
# PostgreSQL's SQLSTATEs of a statement the schema refuses: a duplicate column, and a
# program limit (class 54: too many columns, a statement too complex).
_DUPLICATE_COLUMN = "42701"
_PROGRAM_LIMIT = "54"


def table_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a sql sink's table, or None: at most MAX_NAME_BYTES bytes
    (UTF-8), and not the sinks' own ledger whatever its case."""
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        return (
            f"table name {name!r} is {size} bytes: PostgreSQL keeps {MAX_NAME_BYTES} (a "
            "longer name is cut, and two cut names can be one table)"
        )
    if name.lower() == LEDGER:
        return f"table name {name!r} is the sql sinks' own ledger"
    return None


# Tables known to fit, per (url, table, model, key): created or checked once per process.
_ready: dict[tuple[Any, ...], tuple[sa.Table, sa.Table]] = {}
_ready_lock = threading.Lock()


def _ledger_table(metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        LEDGER,
        metadata,
        sa.Column("idempotency_key", sa.String(400), primary_key=True),
        sa.Column("table_name", sa.String(200), nullable=False),
        sa.Column("records", sa.Integer, nullable=False),
        # What the page held: the same key with other records is not a retry (a task id
        # used again by a later run) and is written, never skipped.
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=False),
    )


def sql_key(cfg: dict[str, Any], record: RecordSpec) -> tuple[str, ...]:
    """The sql sink's upsert key (``output.sql.key``, else the record key), checked
    against the record model."""
    key = cfg.get("key") or ()
    key = tuple([key] if isinstance(key, str) else key) or record.key
    unknown = [k for k in key if k not in record.model.model_fields]
    if unknown:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output.sql.key: {unknown[0]!r} is not a field of {record.model.__name__}",
        )
    if not set(record.key) <= set(key):
        # A narrower key would fold distinct records into one row.
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output.sql.key: must hold the record key ({', '.join(record.key)})",
        )
    return key


class SqlSink(Sink):
    name = "sql"

    def __init__(self, url: str, table: str, record: RecordSpec, key: tuple[str, ...] = ()) -> None:
        self.url = url
        self.table_name = table
        self.record = record
        self.key = sql_key({"key": key}, record)
        self.engine = get_engine(url)
        try:
            self._insert = upsert_insert(self.engine)
        except ValueError as e:
            raise ArtemisError(ErrorCode.INVALID_INPUT, f"output.sql.url: {e}") from None
        self._built: tuple[sa.Table, Any, Any, Any] | None = None

    def _where(self) -> str:
        return f"sql sink (table {self.table_name!r})"

    def _tables(self) -> tuple[sa.Table, sa.Table]:
        """The target table and the ledger, created when absent, checked when present."""
        slot = (self.url, self.table_name, self.record.model, self.key)
        with _ready_lock:
            known = _ready.get(slot)
        if known is not None:
            return known
        try:
            tables = self._prepare()
        except DBAPIError:
            # Another worker created the table between our look and our create: look again.
            tables = self._prepare()
        with _ready_lock:
            _ready[slot] = tables
        return tables

    def _prepare(self) -> tuple[sa.Table, sa.Table]:
        why = table_name_problem(self.table_name)
        if why is not None:
            raise schema_error(f"{self._where()}: {why}: map the source to another table")
        metadata = sa.MetaData()
        ledger = _ledger_table(metadata)
        with self.engine.begin() as conn:
            inspector = sa.inspect(conn)
            self._refuse_twin(inspector.get_table_names())
            if inspector.has_table(self.table_name):
                table, ledger = self._existing(conn, inspector, metadata, ledger)
            else:
                table = self._create(conn, metadata)
            ledger.create(conn, checkfirst=True)
        return table, ledger

    def _existing(
        self, conn: sa.Connection, inspector: Any, metadata: sa.MetaData, ledger: sa.Table
    ) -> tuple[sa.Table, sa.Table]:
        """The table there, checked against the model (a grown model's columns added)."""
        table = sa.Table(self.table_name, metadata, autoload_with=conn)
        added, relaxed = self.record.check_table(table, self._where())
        for col in added:
            # A model that grew a nullable field: its column joins the table.
            self._add_column(conn, table, col)
        if relaxed:
            # A field turned optional: its column takes nulls.
            self._allow_nulls(conn, [c.name for c in relaxed])
        if added or relaxed:
            metadata = sa.MetaData()
            ledger = _ledger_table(metadata)
            table = sa.Table(self.table_name, metadata, autoload_with=conn)
        keyed = set(self.key)
        name = self.table_name
        unique = (
            [set(table.primary_key.columns.keys())]
            + [set(u["column_names"]) for u in inspector.get_unique_constraints(name)]
            + [set(i["column_names"]) for i in inspector.get_indexes(name) if i.get("unique")]
        )
        if keyed not in unique:
            pk = ", ".join(table.primary_key.columns.keys()) or "none"
            raise schema_error(
                f"{self._where()}: the table has no primary key or unique constraint "
                f"on the record key ({', '.join(self.key)}; its primary key: {pk}): "
                "upserts need one (a changed key needs a table of its own)"
            )
        return table, ledger

    def _create(self, conn: sa.Connection, metadata: sa.MetaData) -> sa.Table:
        """The table made from the model: typed columns, the key, the load columns."""
        columns = self.record.sql_columns()
        seen: dict[str, str] = {}
        for col in columns:
            twin = seen.setdefault(col.name.lower(), col.name)
            self._refuse_column_twin(col.name, [twin])
        if set(self.key) != set(self.record.key):
            for col in columns:
                col.primary_key = col.name in self.key
                col.nullable = col.nullable and col.name not in self.key
        table = sa.Table(
            self.table_name,
            metadata,
            *columns,
            sa.Column("_artemis_task_id", sa.String(200), nullable=False),
            sa.Column("_artemis_page_seq", sa.Integer, nullable=False),
            sa.Column("_artemis_loaded_at", sa.DateTime(timezone=True), nullable=False),
        )
        try:
            table.create(conn, checkfirst=True)
        except DBAPIError as e:
            refused = _refusal(e)
            if refused is None:
                raise  # (another worker created it meanwhile: looked at again)
            raise schema_error(
                f"{self._where()}: creating the table with {len(table.columns)} columns: {refused}"
            ) from None
        log.info("sql_sink_table_created", table=self.table_name)
        return table

    def _refuse_twin(self, tables: list[str]) -> None:
        """A table whose name differs from this one's only in case is the same table to
        SQLite (and a trap in PostgreSQL, where unquoted SQL folds names): refused."""
        twin = same_but_case(self.table_name, tables)
        if twin is not None:
            raise schema_error(
                f"{self._where()}: the database has a table {twin!r}, whose name differs "
                "only in case (SQLite takes them for one table): map the source to a "
                "table of another name"
            )

    def _refuse_column_twin(self, name: str, columns: list[str]) -> None:
        twin = same_but_case(name, columns)
        if twin is not None:
            raise schema_error(
                f"{self._where()}: column {name!r} differs only in case from column "
                f"{twin!r} (SQLite takes them for one column): rename the field in the "
                "record model, or map the source to a new table"
            )

    def _add_column(self, conn: sa.Connection, table: sa.Table, col: sa.Column) -> None:
        """A grown model's column added to the table; a column the database refuses (one
        spelt another way is there, or the table is full) is a schema error naming it."""
        self._refuse_column_twin(col.name, list(table.columns.keys()))
        try:
            conn.execute(
                sa.text(
                    f"ALTER TABLE {_quoted(conn, self.table_name)} ADD COLUMN "
                    f"{sa.schema.CreateColumn(col).compile(dialect=conn.dialect)}"
                )
            )
        except DBAPIError as e:
            refused = _refusal(e)
            if refused is None or _duplicate_column(e):
                # Another worker added it meanwhile (looked at again: a column there by
                # another spelling is refused then, and one refused again is final).
                raise
            raise schema_error(
                f"{self._where()}: adding column {col.name!r} (the table has "
                f"{len(table.columns)}): {refused}"
            ) from None
        log.info("sql_sink_column_added", table=self.table_name, column=col.name)

    def _allow_nulls(self, conn: sa.Connection, names: list[str]) -> None:
        """NOT NULL dropped from columns ``names``, in the sink's transaction: on
        PostgreSQL ``ALTER COLUMN … DROP NOT NULL`` (the catalog only); SQLite cannot
        alter a column, so the table is rebuilt with its rows, keys and indexes by
        Alembic's batch mode (a new table, the rows copied, the old one dropped, the new
        one renamed), which another writer waits for."""
        # lazy: Alembic's operations are needed for this change only
        from alembic.migration import MigrationContext
        from alembic.operations import Operations

        ops = Operations(MigrationContext.configure(conn))
        try:
            if conn.dialect.name == "sqlite":
                with ops.batch_alter_table(self.table_name, recreate="always") as batch:
                    for name in names:
                        batch.alter_column(name, nullable=True)
            else:
                for name in names:
                    ops.alter_column(self.table_name, name, nullable=True)
        except DBAPIError as e:
            refused = _refusal(e)
            if refused is None:
                raise
            raise schema_error(
                f"{self._where()}: allowing nulls in column(s) {', '.join(names)}: {refused}"
            ) from None
        log.info("sql_sink_nulls_allowed", table=self.table_name, columns=names)

    async def emit(
        self, client: HttpClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        await work(self.write, records, ctx)

    def write(self, records: list[dict[str, Any]], ctx: EmitContext) -> bool:
        """Write one page; False when its ledger row says this page was written before."""
        where = f"{self._where()}, page {ctx.seq}"
        rows = self._rows_by_key(records, where)
        digest = hashlib.sha256(jsonio.dumps(rows)).hexdigest()
        now = utcnow()
        for row in rows:
            row["_artemis_task_id"] = ctx.task_id
            row["_artemis_page_seq"] = ctx.seq
            row["_artemis_loaded_at"] = now
        try:
            table, ledger = self._tables()
            upsert, mark = self._statements(table, ledger)
            page_key = ctx.idempotency_key(self.name)
            with self.engine.begin() as conn:
                claimed = conn.execute(
                    mark,
                    {
                        "idempotency_key": page_key,
                        "table_name": self.table_name,
                        "records": len(rows),
                        "digest": digest,
                        "loaded_at": now,
                    },
                ).first()
                if claimed is None:
                    before = conn.execute(
                        sa.select(ledger.c.digest).where(ledger.c.idempotency_key == page_key)
                    ).scalar_one()
                    if before == digest:
                        log.info("sql_sink_page_already_loaded", seq=ctx.seq, table=self.table_name)
                        return False
                    # The same page key with other records: a later run under a task id
                    # used before. Written (by key, over whatever page of the earlier run
                    # the rows came from), and the ledger says so.
                    conn.execute(
                        ledger.update()
                        .where(ledger.c.idempotency_key == page_key)
                        .values(digest=digest, records=len(rows), loaded_at=now)
                    )
                    upsert = self._statements(table, ledger, ordered=False)[0]
                if rows:
                    conn.execute(upsert, rows)
        except ArtemisError:
            raise
        except DBAPIError as e:
            raise self._db_error(e, where) from None
        except SQLAlchemyError as e:
            raise ArtemisError(
                ErrorCode.SINK_ERROR, f"{where}: {type(e).__name__}: {str(e).splitlines()[0]}"
            ) from None
        return True

    def _rows_by_key(self, records: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
        """The page's SQL rows, one per key, in key order."""
        # One row per key, in key order: a multi-row upsert may not touch a row twice, and
        # concurrent pages lock rows in one order. The same key twice in a page is the
        # same record twice, or the page contradicts itself (an error, never a choice).
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in map(self.record.sql_row, self.record.rows(records, where)):
            key = tuple(row[k] for k in self.key)
            if key in by_key and by_key[key] != row:
                raise schema_error(
                    f"{where}: two different records with the key "
                    f"({', '.join(f'{k}={v!r}' for k, v in zip(self.key, key, strict=True))})"
                )
            by_key[key] = row
        return [by_key[k] for k in sorted(by_key, key=_sortable)]

    def _statements(
        self, table: sa.Table, ledger: sa.Table, ordered: bool = True
    ) -> tuple[Any, Any]:
        """The page's two statements, built once per table (rows come as parameters).
        ``ordered``: within a run a later page wins even when an earlier one is retried
        after it; a row from another run (or without a page) is replaced. Unordered: the
        page's rows replace what is there."""
        built = self._built
        if built is not None and built[0] is table:
            return (built[1] if ordered else built[3]), built[2]
        stmt = self._insert(table)
        update = [c for c in (*self.record.kinds, *LOAD_COLUMNS) if c not in self.key]
        values = {c: stmt.excluded[c] for c in update}
        upsert = stmt.on_conflict_do_update(
            index_elements=list(self.key),
            set_=values,
            where=sa.or_(
                table.c._artemis_task_id.is_(None),
                table.c._artemis_page_seq.is_(None),
                table.c._artemis_task_id != stmt.excluded._artemis_task_id,
                table.c._artemis_page_seq <= stmt.excluded._artemis_page_seq,
            ),
        )
        replace = stmt.on_conflict_do_update(index_elements=list(self.key), set_=values)
        # RETURNING tells whether this transaction claimed the page (rowcount is not
        # reliable for ON CONFLICT DO NOTHING across drivers: psycopg reports -1).
        mark = (
            self._insert(ledger)
            .on_conflict_do_nothing(index_elements=["idempotency_key"])
            .returning(ledger.c.idempotency_key)
        )
        self._built = (table, upsert, mark, replace)
        return (upsert if ordered else replace), mark

    def _db_error(self, e: DBAPIError, where: str) -> ArtemisError:
        """A statement the database refused (a type it cannot take, a constraint) is
        final; a lost connection is retried."""
        first = str(e.orig).splitlines()[0] if e.orig is not None else str(e).splitlines()[0]
        refused = _refusal(e)
        if refused is not None:
            return schema_error(f"{where}: {refused}")
        if any(m in first for m in ("no such table", "has no column", "datatype mismatch")):
            # SQLite says these as OperationalError; they are the schema, not the server.
            return schema_error(f"{where}: the database refused the page: {first}")
        if e.connection_invalidated or isinstance(e, sa.exc.OperationalError):
            return ArtemisError(
                ErrorCode.SINK_ERROR,
                f"{where}: database unavailable: {first}",
                details={"reason": "database unreachable"},
            )
        return schema_error(f"{where}: the database refused the page: {first}")


def _refusal(e: DBAPIError) -> str | None:
    """What a statement refused for the table's shape says, with the remedy, or None
    (another error). A duplicate column and a table past the columns the database
    allows are the schema's, never an outage: no wait heals them."""
    first = str(e.orig if e.orig is not None else e).splitlines()[0]
    state = str(getattr(e.orig, "sqlstate", "") or "")
    if _duplicate_column(e):
        return (
            f"{first} (a column of that name, perhaps spelt in another case, is there): "
            "rename the field in the record model, or map the source to a new table"
        )
    if state.startswith(_PROGRAM_LIMIT) or "too many columns" in first.lower():
        return (
            f"{first} (more columns than the database allows: PostgreSQL {MAX_COLUMNS}, "
            "SQLite 2000 by default): declare fewer fields, or map the source to a new table"
        )
    return None


def _duplicate_column(e: DBAPIError) -> bool:
    state = str(getattr(e.orig, "sqlstate", "") or "")
    return state == _DUPLICATE_COLUMN or "duplicate column" in str(e.orig or e).lower()


def _quoted(conn: sa.Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote(name)


def check_sql_output(spec: dict[str, Any], record: RecordSpec | None) -> None:
    """When a run starts: its sql table fits its records (created when absent, a grown
    model's nullable columns added); a misfit is CONFIG_ERROR naming the column, found
    before anything is fetched. Tables already checked by this process are not read
    again."""
    names = spec.get("sinks") or []
    if "sql" not in ([names] if isinstance(names, str) else names) or record is None:
        return
    cfg = spec["sql"]
    why = table_name_problem(str(cfg["table"]))
    if why is not None:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"output.sql.table: {why}: name a shorter table in output_defaults.<code>.sql.tables",
            retryable=False,
        )
    sink = SqlSink(str(cfg["url"]), str(cfg["table"]), record, sql_key(cfg, record))
    try:
        sink._tables()
    except ArtemisError as e:
        if e.code is ErrorCode.SINK_ERROR and not e.retryable:
            raise ArtemisError(ErrorCode.CONFIG_ERROR, e.message, retryable=False) from None
        raise
    except DBAPIError as e:
        err = sink._db_error(e, sink._where())
        if err.retryable:
            # The sink's database is down now: the run starts, and its first write checks
            # the table again once the database is back (waiting the outage out).
            log.warning("sql_sink_check_deferred", table=sink.table_name, reason=err.message)
            return
        raise ArtemisError(ErrorCode.CONFIG_ERROR, err.message, retryable=False) from None


def _sortable(key: tuple[Any, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, str(v)) for v in key)
