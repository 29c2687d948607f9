"""The sql and files sinks on real parts: SQLite and PostgreSQL, the local file system and
an S3-compatible server (moto in server mode) on loopback."""

from __future__ import annotations

import datetime as dt
import io
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode
from artemis.migrate import upgrade
from artemis.sinks import EmitContext, RunEnd
from artemis.sinks.files import FileSink
from artemis.sinks.sql import LEDGER, SqlSink
from artemis.tasks.registry import get_task
from artemis.tracing import TraceContext, new_span_id, new_trace_id

QUOTES = get_task("pull_stock_quotes").record_spec()
assert QUOTES is not None


def quotes(symbol: str, days: int, close: float = 10.0, first: int = 1) -> list[dict[str, Any]]:
    return [
        {
            "symbol": symbol,
            "date": f"2025-11-{first + d:02d}",
            "open": 1.0,
            "high": 2.0,
            "low": 0.5,
            "close": close + d,
            "volume": 1000 + d,
        }
        for d in range(days)
    ]


def page(seq: int, task_id: str = "t-1") -> EmitContext:
    return EmitContext(
        run_key=f"pull_stock_quotes/{task_id}",
        seq=seq,
        trace=TraceContext(new_trace_id(), new_span_id()),
        request_id=None,
        task_code="pull_stock_quotes",
        task_id=task_id,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def target_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lake.db'}"
    pg = request.getfixturevalue("pg_server")
    name = f"sink_{os.urandom(4).hex()}"
    with sa.create_engine(pg.url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return pg.url.rsplit("/", 1)[0] + f"/{name}"


def rows(url: str, table: str) -> list[dict[str, Any]]:
    """A table's rows as its reflected column types read them."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        t = sa.Table(table, sa.MetaData(), autoload_with=conn)
        return [dict(r._mapping) for r in conn.execute(sa.select(t))]


def quotes_table(url: str, name: str, volume: str | None = "BIGINT", keyed: bool = True) -> None:
    """A quotes table made by hand, as a user might: ``volume`` its type (None: no column),
    ``keyed`` a primary key on (symbol, date)."""
    cols = "symbol TEXT, date DATE, open FLOAT, high FLOAT, low FLOAT, close FLOAT, "
    cols += f"volume {volume}, " if volume else ""
    cols += "_artemis_task_id TEXT, _artemis_page_seq INTEGER, _artemis_loaded_at TIMESTAMP"
    cols += ", PRIMARY KEY (symbol, date)" if keyed else ""
    with sa.create_engine(url).begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{name}" ({cols})'))


def test_sql_sink_creates_a_typed_table_and_upserts_by_the_record_key(target_url: str) -> None:
    sink = SqlSink(target_url, "quotes", QUOTES)
    assert sink.write(quotes("AAPL", 5), page(1)) is True
    # the same records again under another page (a re-run): updated in place, not added
    assert sink.write(quotes("AAPL", 5, close=50.0), page(2)) is True
    assert sink.write(quotes("MSFT", 3), page(3)) is True
    got = rows(target_url, "quotes")
    assert len(got) == 8 == len({(r["symbol"], r["date"]) for r in got})
    aapl = sorted((r for r in got if r["symbol"] == "AAPL"), key=lambda r: r["date"])
    assert [r["close"] for r in aapl] == [50.0, 51.0, 52.0, 53.0, 54.0]
    assert {r["_artemis_page_seq"] for r in aapl} == {2}
    assert all(r["_artemis_task_id"] == "t-1" and r["_artemis_loaded_at"] for r in got)
    insp = sa.inspect(sa.create_engine(target_url))
    types = {c["name"]: c["type"] for c in insp.get_columns("quotes")}
    assert isinstance(types["date"], sa.Date)
    assert isinstance(types["volume"], sa.Integer)
    assert isinstance(types["close"], sa.Float)
    assert set(insp.get_pk_constraint("quotes")["constrained_columns"]) == {"symbol", "date"}
    assert isinstance(aapl[0]["date"], dt.date)


def test_a_page_written_again_under_its_key_changes_nothing(target_url: str) -> None:
    sink = SqlSink(target_url, "quotes", QUOTES)
    assert sink.write(quotes("AAPL", 4), page(7)) is True
    before = rows(target_url, "quotes")
    # the retry of page 7 (its worker died after the commit): not written again
    assert sink.write(quotes("AAPL", 4), page(7)) is False
    assert rows(target_url, "quotes") == before  # _artemis_loaded_at included
    ledger = rows(target_url, LEDGER)
    assert [(r["idempotency_key"], r["records"]) for r in ledger] == [
        ("pull_stock_quotes/t-1:sql:7", 4)
    ]
    # the same page key with other records (a later run under a task id used before) is
    # not a retry: written, never skipped in silence
    assert sink.write(quotes("AAPL", 5, close=99.0), page(7)) is True
    got = sorted(rows(target_url, "quotes"), key=lambda r: r["date"])
    assert [r["close"] for r in got] == [99.0, 100.0, 101.0, 102.0, 103.0]
    assert [r["records"] for r in rows(target_url, LEDGER)] == [5]


def test_a_task_id_used_again_overwrites_rows_of_a_later_page_of_the_earlier_run(
    target_url: str,
) -> None:
    sink = SqlSink(target_url, "quotes", QUOTES)
    sink.write(quotes("AAPL", 1, close=1.0), page(3))  # the earlier run's page 3 ...
    sink.write(quotes("AAPL", 1, close=2.0), page(40))  # ... and its page 40, same key
    # a later run under the same task id starts again at low pages, with other values
    assert sink.write(quotes("AAPL", 1, close=9.0), page(3)) is True
    assert [r["close"] for r in rows(target_url, "quotes")] == [9.0]


def test_an_earlier_page_retried_after_a_later_one_does_not_undo_it(target_url: str) -> None:
    sink = SqlSink(target_url, "quotes", QUOTES)
    sink.write(quotes("AAPL", 2, close=50.0), page(9))  # the later page lands first
    sink.write(quotes("AAPL", 2, close=10.0), page(3))  # then the earlier one's retry
    got = sorted(rows(target_url, "quotes"), key=lambda r: r["date"])
    assert [(r["close"], r["_artemis_page_seq"]) for r in got] == [(50.0, 9), (51.0, 9)]
    # another run's page replaces the values, whatever its sequence number
    sink.write(quotes("AAPL", 2, close=70.0), page(1, task_id="t-2"))
    got = sorted(rows(target_url, "quotes"), key=lambda r: r["date"])
    assert [(r["close"], r["_artemis_task_id"]) for r in got] == [(70.0, "t-2"), (71.0, "t-2")]


def test_a_table_without_a_column_of_the_model_is_a_sink_error_naming_it(target_url: str) -> None:
    quotes_table(target_url, "q2", volume=None)
    with pytest.raises(ArtemisError) as e:
        SqlSink(target_url, "q2", QUOTES).write(quotes("AAPL", 2), page(1))
    assert e.value.code is ErrorCode.SINK_ERROR and not e.value.retryable
    assert "no column 'volume'" in e.value.message
    assert rows(target_url, "q2") == []


def test_a_column_of_the_wrong_type_is_a_sink_error_naming_it(target_url: str) -> None:
    quotes_table(target_url, "q3", volume="DATE")
    with pytest.raises(ArtemisError) as e:
        SqlSink(target_url, "q3", QUOTES).write(quotes("AAPL", 2), page(1))
    assert e.value.code is ErrorCode.SINK_ERROR
    assert "column 'volume'" in e.value.message and "int" in e.value.message


def test_a_record_of_the_wrong_shape_is_a_sink_error_naming_the_field(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lake.db'}"
    SqlSink(url, "quotes", QUOTES).write(quotes("IBM", 1), page(1))
    bad = quotes("AAPL", 3)
    bad[1]["volume"] = "many"
    with pytest.raises(ArtemisError) as e:
        SqlSink(url, "quotes", QUOTES).write(bad, page(2))
    assert e.value.code is ErrorCode.SINK_ERROR and not e.value.retryable
    assert "record 1" in e.value.message and "'volume'" in e.value.message
    # types as JSON has them, never cast: a string is not a float, 3.5 not an int
    for field, value in (("close", "1.5"), ("volume", 3.5), ("symbol", 7)):
        typed = quotes("AAPL", 1)
        typed[0][field] = value
        with pytest.raises(ArtemisError) as e:
            SqlSink(url, "quotes", QUOTES).write(typed, page(4))
        assert f"column {field!r}" in e.value.message
    # one page holding two different records under one key contradicts itself
    twice = quotes("AAPL", 1) + quotes("AAPL", 1, close=3.0)
    with pytest.raises(ArtemisError) as e:
        SqlSink(url, "quotes", QUOTES).write(twice, page(5))
    assert "two different records with the key" in e.value.message
    extra = quotes("AAPL", 2)
    extra[0]["currency"] = "USD"
    with pytest.raises(ArtemisError) as e:
        SqlSink(url, "quotes", QUOTES).write(extra, page(3))
    assert "'currency'" in e.value.message
    # nothing of either page landed
    assert [r["symbol"] for r in rows(url, "quotes")] == ["IBM"]
    assert [r["idempotency_key"] for r in rows(url, LEDGER)] == ["pull_stock_quotes/t-1:sql:1"]


def test_no_sql_sink_without_a_unique_key_on_an_existing_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lake.db'}"
    quotes_table(url, "q4", keyed=False)
    with pytest.raises(ArtemisError) as e:
        SqlSink(url, "q4", QUOTES).write(quotes("AAPL", 2), page(1))
    assert "no primary key or unique constraint on the record key" in e.value.message


# -- files -----------------------------------------------------------------------------------


@pytest.fixture
def ledger_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'artemis.db'}"
    upgrade(url)
    return url


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_file_sink_writes_one_whole_file_per_page_and_a_manifest(
    tmp_path: Path, ledger_db: str, fmt: str
) -> None:
    root = tmp_path / "lake"
    sink = FileSink(str(root), fmt, QUOTES, ledger_db)
    sink.write(quotes("AAPL", 5), page(1))
    sink.write(quotes("MSFT", 3), page(2))
    # a retried page overwrites its own file
    sink.write(quotes("MSFT", 3, close=77.0), page(2))
    run_dir = root / "pull_stock_quotes" / "t-1"
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == [f"files-000001.{fmt}", f"files-000002.{fmt}"]
    second = run_dir / f"files-000002.{fmt}"
    if fmt == "parquet":
        table = pq.read_table(second)
        assert table.schema.field("date").type == pa.date32()
        assert table.schema.field("volume").type == pa.int64()
        assert table.schema.field("close").type == pa.float64()
        assert table.column("close").to_pylist() == [77.0, 78.0, 79.0]
        assert pq.read_table(run_dir / "files-000001.parquet").num_rows == 5
    else:
        lines = second.read_bytes().splitlines()
        assert [jsonio.loads(x)["close"] for x in lines] == [77.0, 78.0, 79.0]
    # what a write cut short by a kill leaves: its temporary file, gone at finalize
    (run_dir / f".files-000003.{fmt}.0123.tmp").write_bytes(b"half")
    result = sink.write_manifest(
        RunEnd("pull_stock_quotes/t-1", "pull_stock_quotes", "t-1", "completed")
    )
    manifest = jsonio.loads((run_dir / "_manifest.json").read_bytes())
    assert manifest["status"] == "completed" and manifest["format"] == fmt
    assert [(f["page_seq"], f["records"]) for f in manifest["files"]] == [(1, 5), (2, 3)]
    assert manifest["records"] == 8 and result["files"] == 2
    assert all(Path(f["path"]).exists() for f in manifest["files"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["_manifest.json", *names]


def test_file_sink_parquet_refuses_a_record_the_model_does_not_hold(
    tmp_path: Path, ledger_db: str
) -> None:
    sink = FileSink(str(tmp_path / "lake"), "parquet", QUOTES, ledger_db)
    bad = quotes("AAPL", 2)
    bad[0]["currency"] = "USD"
    with pytest.raises(ArtemisError) as e:
        sink.write(bad, page(1))
    assert e.value.code is ErrorCode.SINK_ERROR and "'currency'" in e.value.message
    assert not (tmp_path / "lake" / "pull_stock_quotes" / "t-1" / "files-000001.parquet").exists()


def test_file_sink_on_s3_writes_whole_objects_and_overwrites_them(
    s3_server: str, ledger_db: str
) -> None:
    import s3fs

    sink = FileSink("s3://lake/harvest", "parquet", QUOTES, ledger_db, endpoint_url=s3_server)
    sink.write(quotes("AAPL", 4), page(1))
    sink.write(quotes("AAPL", 4, close=5.0), page(1))
    sink.write_manifest(RunEnd("pull_stock_quotes/t-1", "pull_stock_quotes", "t-1", "completed"))
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server})
    fs.invalidate_cache()
    listed = sorted(fs.ls("lake/harvest/pull_stock_quotes/t-1"))
    assert listed == [
        "lake/harvest/pull_stock_quotes/t-1/_manifest.json",
        "lake/harvest/pull_stock_quotes/t-1/files-000001.parquet",
    ]
    table = pq.read_table(io.BytesIO(fs.cat_file(listed[1])))
    assert table.column("close").to_pylist() == [5.0, 6.0, 7.0, 8.0]
    manifest = jsonio.loads(fs.cat_file(listed[0]))
    assert (
        manifest["files"][0]["path"]
        == "s3://lake/harvest/pull_stock_quotes/t-1/files-000001.parquet"
    )
    assert manifest["records"] == 4


def test_a_request_may_not_say_where_records_land() -> None:
    from artemis.sinks.factory import check_request_output

    for output, field in (
        ({"sql": {"url": "sqlite:////etc/x.db"}}, "output.sql.url"),
        ({"files": {"url": "/etc"}}, "output.files.url"),
        ({"files": {"endpoint_url": "http://169.254.169.254"}}, "output.files.endpoint_url"),
        ({"sql": {"table": "users"}}, "output.sql.table"),
        ({"sql": {"key": ["symbol"]}}, "output.sql.key"),
    ):
        with pytest.raises(ArtemisError) as e:
            check_request_output(output)
        assert e.value.code is ErrorCode.INVALID_INPUT and e.value.message.startswith(field)
    check_request_output({"sinks": ["sql", "files"], "files": {"format": "jsonl"}})


def test_an_sql_key_narrower_than_the_record_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtemisError) as e:
        SqlSink(f"sqlite:///{tmp_path / 'lake.db'}", "quotes", QUOTES, ("symbol",))
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert "must hold the record key (symbol, date)" in e.value.message


def test_a_runs_output_is_checked_without_building_anything(tmp_path):
    """The API checks a run's output before it starts: no engine, no folder, no file
    system touched on the API's host (the worker builds the sinks); a bad one is still
    refused naming the field."""
    import pytest

    from artemis.errors import ArtemisError
    from artemis.sinks.factory import resolve_output
    from artemis.tasks.registry import get_task

    record = get_task("pull_stock_quotes").record_spec()
    where = tmp_path / "not-here"
    config = {
        "sinks": ["sql", "files"],
        "sql": {"url": f"sqlite:///{where / 'lake.db'}", "table": "quotes"},
        "files": {"url": str(where / "lake"), "format": "parquet"},
    }
    resolved = resolve_output("pull_stock_quotes", config, None, record, "")
    assert resolved["resolved"] is True and not where.exists()
    for bad, field in (
        (
            {"sql": {**config["sql"], "url": "mysql://db/x"}},
            "output_defaults.pull_stock_quotes.sql.url",
        ),
        (
            {"files": {**config["files"], "format": "csv"}},
            "output_defaults.pull_stock_quotes.files.format",
        ),
    ):
        with pytest.raises(ArtemisError) as e:
            resolve_output("pull_stock_quotes", {**config, **bad}, None, record, "")
        assert e.value.code.value == "CONFIG_ERROR" and field in e.value.message, e.value
