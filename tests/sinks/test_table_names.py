"""What a table's name and columns may be, on real SQLite and PostgreSQL
(artemis/sinks/sql.py, artemis/sinks/factory.py): a table named like another but for its
case, or past the 63 bytes PostgreSQL keeps, is a CONFIG_ERROR when a run starts (never a
500); a column the database refuses (one spelt another way is there, the table is full)
is a schema error naming the column and what to do, never an outage waited out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import create_model

from artemis.errors import ArtemisError, ErrorCode
from artemis.sinks.factory import resolve_output
from artemis.sinks.records import RecordSpec, declared_spec
from artemis.sinks.sql import SqlSink, check_sql_output
from tests.sinks.test_sinks import page

ITEM = declared_spec({"key": ["id"], "fields": {"id": "int", "name": "str | None"}}, "ItemRecord")
# The same model grown by a nullable field (schema_contract: evolve's next run).
GROWN = declared_spec(
    {"key": ["id"], "fields": {"id": "int", "name": "str | None", "extra": "str | None"}},
    "ItemRecord",
)
# The most columns a table may have: SQLite's default build, PostgreSQL's.
LIMIT = {"sqlite": 2000, "postgresql": 1600}


@pytest.fixture(params=["sqlite", "postgresql"])
def lake(request, tmp_path: Path) -> tuple[str, str]:
    """(the database URL, its dialect): a database of the test's own."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lake.db'}", "sqlite"
    pg = request.getfixturevalue("pg_server")
    name = f"names_{os.urandom(4).hex()}"
    with sa.create_engine(pg.url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return pg.url.rsplit("/", 1)[0] + f"/{name}", "postgresql"


def output(url: str, table: str) -> dict:
    return {"sinks": ["sql"], "sql": {"url": url, "table": table}}


def refused(call, *args) -> ArtemisError:
    with pytest.raises(ArtemisError) as e:
        call(*args)
    return e.value


def test_a_table_named_like_another_but_for_its_case_is_refused_when_a_run_starts(lake):
    url, _ = lake
    check_sql_output(output(url, "Shop"), ITEM)
    err = refused(check_sql_output, output(url, "shop"), ITEM)
    assert err.code is ErrorCode.CONFIG_ERROR and not err.retryable
    assert "sql sink (table 'shop'): the database has a table 'Shop'" in err.message
    assert "differs only in case" in err.message
    # A write (a run whose output was not checked when it started) says the same.
    err = refused(SqlSink(url, "shop", ITEM).write, [{"id": 1, "name": "a"}], page(0))
    assert err.code is ErrorCode.SINK_ERROR and not err.retryable


def test_a_table_name_postgresql_would_cut_is_refused_naming_its_length(lake):
    url, _ = lake
    name = "orders_" + "x" * 57  # 64 bytes
    err = refused(check_sql_output, output(url, name), ITEM)
    assert err.code is ErrorCode.CONFIG_ERROR
    assert f"output.sql.table: table name {name!r} is 64 bytes: PostgreSQL keeps 63" in err.message
    assert sa.inspect(sa.create_engine(url)).get_table_names() == []  # nothing created
    check_sql_output(output(url, name[:-1]), ITEM)  # 63 bytes: one name in both


def test_a_provenances_mapped_table_is_its_own_and_short_enough():
    config = {"sinks": ["sql"], "sql": {"url": "sqlite://", "tables": {"a": "Items", "b": "x"}}}
    err = refused(resolve_output, "source_harvest", config, None, ITEM, "", "items")
    assert err.code is ErrorCode.CONFIG_ERROR
    assert err.message == (
        "provenance 'items''s default table: table 'items' is provenance 'a''s too "
        "(output_defaults.source_harvest.sql.tables maps it to 'Items'; a table's name is "
        "one whatever its case): give each provenance a table of its own"
    )
    long = {"sinks": ["sql"], "sql": {"url": "sqlite://", "tables": {"a": "t" * 70}}}
    err = refused(resolve_output, "source_harvest", long, None, ITEM, "", "a")
    assert err.code is ErrorCode.CONFIG_ERROR
    assert err.message.startswith(
        f"output_defaults.source_harvest.sql.tables.a: table name {'t' * 70!r} is 70 bytes"
    )
    # A request's output on top changes none of it: the tables are the operator's.
    err = refused(resolve_output, "source_harvest", long, {"sinks": ["sql"]}, ITEM, "", "a")
    assert err.code is ErrorCode.CONFIG_ERROR


def test_a_column_spelt_like_one_there_but_for_its_case_is_a_schema_error_naming_it(lake):
    url, _ = lake
    check_sql_output(output(url, "items"), ITEM)
    # A model in code (a declared one with both is refused at import): `NAME` to add.
    twin = RecordSpec(
        create_model("ItemRecord", id=(int, ...), name=(str | None, None), NAME=(str | None, None)),
        ("id",),
    )
    err = refused(check_sql_output, output(url, "items"), twin)
    assert err.code is ErrorCode.CONFIG_ERROR and not err.retryable
    assert "column 'NAME' differs only in case from column 'name'" in err.message
    assert "rename the field in the record model" in err.message


def test_a_duplicate_column_the_database_refuses_is_a_schema_error_not_an_outage(lake):
    url, dialect = lake
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text('CREATE TABLE dup ("id" INTEGER)'))
    sink = SqlSink(url, "dup", ITEM)
    with pytest.raises(sa.exc.DBAPIError) as e, engine.begin() as conn:
        conn.execute(sa.text('ALTER TABLE dup ADD COLUMN "id" INTEGER'))
    # The sink's reading of what the database answered (a worker's ALTER raced by
    # another's is looked at again first: a duplicate seen twice is the schema's).
    err = sink._db_error(e.value, "sql sink (table 'dup')")
    assert err.code is ErrorCode.SINK_ERROR and not err.retryable
    said = {
        "sqlite": "duplicate column name: id",
        "postgresql": 'column "id" of relation "dup" already exists',
    }[dialect]
    assert err.message.startswith(f"sql sink (table 'dup'): {said} (a column of that name")
    assert "rename the field in the record model, or map the source to a new table" in err.message


def test_a_column_past_what_the_table_may_hold_is_a_schema_error_naming_it(lake):
    url, dialect = lake
    pad = LIMIT[dialect] - 5  # besides id, name and the three load columns: full
    cols = ", ".join(f"pad_{i} TEXT" for i in range(pad))
    with sa.create_engine(url).begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE full_items (id BIGINT PRIMARY KEY, name TEXT, {cols}, "
                "_artemis_task_id TEXT, _artemis_page_seq INTEGER, "
                "_artemis_loaded_at TIMESTAMP)"
            )
        )
    check_sql_output(output(url, "full_items"), ITEM)  # it fits the model as it was
    err = refused(check_sql_output, output(url, "full_items"), GROWN)
    assert err.code is ErrorCode.CONFIG_ERROR and not err.retryable
    assert f"adding column 'extra' (the table has {LIMIT[dialect]})" in err.message
    assert "more columns than the database allows" in err.message
    assert "declare fewer fields, or map the source to a new table" in err.message
    # The run's first write says it too, at once: a SINK_ERROR no wait heals.
    write = SqlSink(url, "full_items", GROWN).write
    err = refused(write, [{"id": 1, "name": "a", "extra": "b"}], page(0))
    assert err.code is ErrorCode.SINK_ERROR and not err.retryable
    assert "adding column 'extra'" in err.message
