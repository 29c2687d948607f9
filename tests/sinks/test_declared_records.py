"""A record model declared as data (a registry provenance's ``record_model``) types the sql
and files sinks exactly as a TaskUnit's own model does, on SQLite and the local disk."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from artemis.errors import ArtemisError, ErrorCode
from artemis.literature.harvest import LiteratureHarvest, LiteratureRecord
from artemis.migrate import upgrade
from artemis.sinks import EmitContext
from artemis.sinks.files import FileSink
from artemis.sinks.records import declared_spec
from artemis.sinks.sql import SqlSink
from artemis.tasks.source_harvest import SourceHarvest, SourceParams
from artemis.tracing import TraceContext, new_span_id, new_trace_id

STOCK = {
    "key": ["sku"],
    "fields": {
        "sku": "str",
        "quantity": "int",
        "counted_at": "datetime",
        "note": "str | None",
        "tags": "list[str] | None",
    },
}


def page(seq: int) -> EmitContext:
    return EmitContext(
        run_key="literature_harvest/t-1",
        seq=seq,
        trace=TraceContext(new_trace_id(), new_span_id()),
        request_id=None,
        task_code="literature_harvest",
        task_id="t-1",
    )


def items(n: int) -> list[dict[str, Any]]:
    return [
        {"sku": f"S{i}", "quantity": i, "counted_at": f"2025-03-01T0{i}:00:00Z", "note": None}
        for i in range(n)
    ]


def test_a_declared_model_makes_a_typed_table_and_a_typed_parquet_file(tmp_path: Path):
    spec = declared_spec(STOCK, "StockRecord")
    url = f"sqlite:///{tmp_path / 'lake.db'}"
    assert SqlSink(url, "stock", spec).write(items(3), page(1)) is True
    with sa.create_engine(url).connect() as conn:
        table = sa.Table("stock", sa.MetaData(), autoload_with=conn)
        got = [dict(r._mapping) for r in conn.execute(sa.select(table))]
    assert [c.name for c in table.primary_key.columns] == ["sku"]
    assert isinstance(table.c.quantity.type, sa.BigInteger)
    assert got[1]["counted_at"].replace(tzinfo=UTC) == datetime(2025, 3, 1, 1, tzinfo=UTC)

    db = f"sqlite:///{tmp_path / 'artemis.db'}"
    upgrade(db)
    sink = FileSink(str(tmp_path / "lake"), "parquet", spec, db)
    written = sink.write(items(3), page(1))
    schema = pq.read_table(written.path).schema
    assert schema.field("quantity").type == pa.int64()
    assert schema.field("counted_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("tags").type == pa.list_(pa.string())
    assert not schema.field("sku").nullable and schema.field("note").nullable


@pytest.mark.parametrize(
    "record, needle",
    [
        ({"sku": "S1", "quantity": "3", "counted_at": "2025-03-01T00:00:00Z"}, "'quantity'"),
        ({"sku": "S1", "counted_at": "2025-03-01T00:00:00Z"}, "'quantity': Field required"),
        ({"sku": "S1", "quantity": 1, "counted_at": "yesterday"}, "'counted_at'"),
        (
            {"sku": "S1", "quantity": 1, "counted_at": "2025-03-01T00:00:00Z", "shelf": "B"},
            "a field 'shelf' that StockRecord has no column for",
        ),
    ],
)
def test_a_record_the_declared_model_does_not_fit_is_a_sink_error_naming_it(
    tmp_path: Path, record, needle
):
    spec = declared_spec(STOCK, "StockRecord")
    sink = SqlSink(f"sqlite:///{tmp_path / 'lake.db'}", "stock", spec)
    with pytest.raises(ArtemisError) as e:
        sink.write([record], page(1))
    assert e.value.code is ErrorCode.SINK_ERROR and not e.value.retryable
    assert needle in e.value.message


def params(record_model: dict[str, Any] | None) -> SourceParams:
    row = (
        {"key_json": record_model["key"], "fields_json": record_model["fields"]}
        if record_model
        else None
    )
    contract = {"provenance": {"provenance_code": "my-shop"}, "record_model": row}
    return SourceParams(provenance="my-shop", contract=contract)


def old_params(record_model: dict[str, Any]) -> SourceParams:
    # A run started before the record model was a dimension froze it in its provenance.
    provenance = {"provenance_code": "my-shop", "record_model": record_model}
    return SourceParams(provenance="my-shop", contract={"provenance": provenance})


def test_the_harvest_takes_its_record_model_from_the_runs_contract():
    task = SourceHarvest()
    assert task.record_spec() is None and task.record_spec(params(None)) is None
    own = task.record_spec(params(STOCK))
    assert own is not None and own.key == ("sku",) and own.model.__name__ == "MyShopRecord"
    # the same declaration is the same model (a sink prepares its table once per model)
    assert task.record_spec(params(STOCK)).model is own.model  # type: ignore[union-attr]
    assert task.record_spec(old_params(STOCK)).model is own.model  # type: ignore[union-attr]
    # the papers task's records are papers, whatever the contract
    paper = LiteratureHarvest().record_spec(params(STOCK))
    assert paper is not None and paper.model is LiteratureRecord


def test_the_harvest_keeps_the_fields_its_record_model_names():
    from artemis.config import Settings
    from artemis.quarantine.judging import Rules, judge
    from artemis.tasks.base import TaskContext

    ctx = TaskContext(
        "source_harvest", "t-1", params(STOCK), Settings(), TraceContext(new_trace_id(), "")
    )
    raw = [{"sku": "S1", "quantity": 2, "counted_at": "2025-03-01T00:00:00Z", "shelf": "B4"}]
    task = SourceHarvest()
    judged = judge(task, ctx, 0, raw, Rules(task.record_policy(ctx), task.record_spec(ctx.params)))
    # not named: dropped (and reported as drift); named: kept as the source gave them
    assert judged.records == [{"sku": "S1", "quantity": 2, "counted_at": "2025-03-01T00:00:00Z"}]
    assert [(d.field, d.kind) for d in judged.drift][0] == ("shelf", "added")
    # a required field absent: the record is set aside, naming it
    judged = judge(
        task, ctx, 0, [{"sku": "S2"}], Rules(task.record_policy(ctx), task.record_spec(ctx.params))
    )
    assert judged.records == [] and judged.bad[0].field == "quantity"


def test_a_record_model_edited_by_hand_into_nonsense_is_a_config_error():
    bad = {"key": ["id"], "fields": {"id": "integer"}}
    with pytest.raises(ArtemisError) as e:
        SourceHarvest().record_spec(params(bad))
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert "provenance 'my-shop': record_model.fields" in e.value.message


def test_a_declared_struct_is_a_parquet_struct_and_a_dict_json_text(tmp_path: Path):
    decl = {
        "key": ["id"],
        "fields": {
            "id": "int",
            "size": {"width": "int", "unit": "str | None", "measured": "datetime | None"},
            "meta": "dict | None",
            "raw": "json | None",
        },
    }
    spec = declared_spec(decl, "ShapedRecord")
    sink = FileSink(str(tmp_path / "lake"), "parquet", spec, _ledger_db(tmp_path))
    records = [
        {
            "id": 1,
            "size": {"width": 3, "unit": "cm", "measured": "2025-03-01T08:00:00Z"},
            "meta": {"color": "red"},
            "raw": {"a": [1, 2]},
        },
        {"id": 2, "size": None, "meta": {}, "raw": [1, "x"]},
    ]
    sink.write(records, page(1))
    # pages where the struct is null or absent, and a dict empty, still write
    sink.write([{"id": 3}, {"id": 4, "size": None, "meta": None}], page(2))
    table = pq.read_table(tmp_path / "lake" / "literature_harvest" / "t-1")
    size = table.schema.field("size").type
    assert pa.types.is_struct(size)
    assert [size.field(i).name for i in range(size.num_fields)] == ["width", "unit", "measured"]
    assert size.field(2).type == pa.timestamp("us", tz="UTC")
    by_id = {r["id"]: r for r in table.to_pylist()}
    assert by_id[1]["size"]["width"] == 3 and by_id[1]["size"]["unit"] == "cm"
    assert by_id[2]["size"] is None and by_id[3]["size"] is None
    # every file of the folder has the one declared schema
    assert table.schema.field("meta").type == pa.string()
    assert by_id[1]["meta"] == '{"color":"red"}' and by_id[2]["meta"] == "{}"
    assert by_id[1]["raw"] == '{"a":[1,2]}' and by_id[2]["raw"] == '[1,"x"]'
    # a struct's sub-field of the wrong type is refused naming it
    with pytest.raises(ArtemisError) as e:
        sink.write([{"id": 5, "size": {"width": "wide"}}], page(3))
    assert "size.width" in e.value.message
    # the SQL table holds the struct as JSON, its date as ISO text
    url = f"sqlite:///{tmp_path / 'lake.db'}"
    assert SqlSink(url, "shaped", spec).write(records, page(1)) is True
    with sa.create_engine(url).connect() as conn:
        stored = conn.execute(sa.text("SELECT size FROM shaped WHERE id = 1")).scalar_one()
    assert '"measured": "2025-03-01T08:00:00' in stored or '"measured":"2025-03-01T08:00:00' in (
        stored
    )


def test_a_struct_is_declared_with_fields_and_never_as_a_key():
    from artemis.sinks.records import RecordModelDecl

    with pytest.raises(ValueError, match="declares no field"):
        RecordModelDecl.model_validate({"key": ["id"], "fields": {"id": "int", "s": {}}})
    with pytest.raises(ValueError, match="a key is a plain field"):
        RecordModelDecl.model_validate({"key": ["s"], "fields": {"s": {"a": "int"}}})
    with pytest.raises(ValueError, match="field 's.a'"):
        RecordModelDecl.model_validate({"key": ["id"], "fields": {"id": "int", "s": {"a": "x"}}})


def _ledger_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'artemis.db'}"
    upgrade(url)
    return url
