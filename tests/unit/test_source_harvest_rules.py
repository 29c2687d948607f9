"""source_harvest's rules that need no stack: an update over the result cap splits its own
window, a COMPOSITE pointer's id is sent only as an exact keyset, and a table that a model
no longer fits is refused when the run starts."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.sinks.records import declared_spec
from artemis.sinks.sql import check_sql_output
from artemis.tasks.base import TaskContext
from artemis.tasks.source_harvest import SourceHarvest, SourceParams
from artemis.tracing import TraceContext, new_span_id, new_trace_id


def ctx(settings: Settings | None = None, **params: Any) -> TaskContext:
    return TaskContext(
        "source_harvest",
        "t-1",
        SourceParams(provenance="p", **params),
        settings or Settings(),
        TraceContext(new_trace_id(), new_span_id()),
    )


def migrated(tmp_path: Path) -> Settings:
    """Settings on a migrated database of its own."""
    from artemis.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'artemis.db'}"
    upgrade(url)
    return Settings(database={"url": url})


def test_an_update_over_the_cap_splits_its_window_from_the_watermark(tmp_path):
    settings = migrated(tmp_path)
    run = ctx(
        settings,
        task_type="update",
        contract={"provenance": {"provenance_code": "p"}},
        window_start=datetime(2025, 1, 1, tzinfo=UTC),
        window_end=datetime(2025, 1, 20, tzinfo=UTC),
    )
    pieces = SourceHarvest().split(run, {})
    assert pieces is not None
    assert [(c["start"], c["end"]) for c in pieces] == [
        ("2025-01-01", "2025-01-10"),
        ("2025-01-11", "2025-01-20"),
    ]
    # The pieces carry the contract by reference: stored once, read back as it was.
    from artemis.db import get_engine
    from artemis.registry.frozen import load_contract

    assert {c["contract_ref"] for c in pieces} == {pieces[0]["contract_ref"]}
    assert "contract" not in pieces[0]
    with get_engine(settings.database.url).connect() as conn:
        assert load_contract(conn, pieces[0]["contract_ref"]) == run.params.contract  # type: ignore[attr-defined]
    # a single day cannot be split
    one = ctx(start=date(2025, 1, 1), end=date(2025, 1, 1))
    assert SourceHarvest().split(one, {}) is None


def composite(overlap: int | None) -> SourceParams:
    win = {
        "offset_type_code": "COMPOSITE",
        "watermark_field_name": "updated_at",
        "watermark_id_field_name": "id",
        "watermark_id_param_name": "after_id",
        "overlap_value": overlap,
        "overlap_unit_code": "MINUTE" if overlap else None,
    }
    return SourceParams(
        provenance="p",
        task_type="update",
        contract={"window_offset": win},
        pointer=["2025-01-01T00:00:00+00:00", 41],
    )


def test_a_composite_pointers_id_goes_only_as_an_exact_keyset():
    task = SourceHarvest()
    assert task._pointer_query(composite(None)) == {"after_id": 41}
    # moved back by an overlap, the last id would leave out the overlap's earlier ids
    assert task._pointer_query(composite(5)) == {}


MODEL = {"key": ["sku"], "fields": {"sku": "str", "qty": "int", "note": "str | None"}}


def spec_for(tmp_path: Path, fields: dict[str, str]) -> tuple[dict[str, Any], Any]:
    url = f"sqlite:///{tmp_path / 'lake.db'}"
    output = {"sinks": ["sql"], "sql": {"url": url, "table": "stock"}}
    return output, declared_spec({"key": ["sku"], "fields": fields}, "StockRecord")


def make_table(tmp_path: Path) -> None:
    output, spec = spec_for(tmp_path, MODEL["fields"])
    check_sql_output(output, spec)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        # a required field dropped from the model: its NOT NULL column would be unfilled
        ({"sku": "str", "note": "str | None"}, "NOT NULL column 'qty'"),
        # a changed type
        ({"sku": "str", "qty": "str", "note": "str | None"}, "column 'qty'"),
    ],
)
def test_a_table_the_model_no_longer_fits_is_refused_at_start(tmp_path, fields, needle):
    make_table(tmp_path)
    output, spec = spec_for(tmp_path, fields)
    with pytest.raises(ArtemisError) as e:
        check_sql_output(output, spec)
    assert e.value.code is ErrorCode.CONFIG_ERROR and not e.value.retryable
    assert needle in e.value.message


def test_a_field_made_nullable_lets_its_column_take_nulls_keeping_rows_and_key(tmp_path):
    make_table(tmp_path)
    output, _ = spec_for(tmp_path, MODEL["fields"])
    engine = sa.create_engine(output["sql"]["url"])
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO stock (sku, qty, note, _artemis_task_id, _artemis_page_seq, "
                "_artemis_loaded_at) VALUES ('a', 1, NULL, 't', 0, '2026-01-01')"
            )
        )
    output, spec = spec_for(tmp_path, {**MODEL["fields"], "qty": "int | None"})
    check_sql_output(output, spec)
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        columns = {c["name"]: c for c in inspector.get_columns("stock")}
        key = inspector.get_pk_constraint("stock")["constrained_columns"]
        rows = conn.execute(sa.text("SELECT sku, qty FROM stock")).all()
    assert columns["qty"]["nullable"] is True and not columns["sku"]["nullable"]
    assert key == ["sku"] and [tuple(r) for r in rows] == [("a", 1)]


def test_a_model_that_adds_a_nullable_field_adds_its_column(tmp_path):
    make_table(tmp_path)
    output, spec = spec_for(tmp_path, {**MODEL["fields"], "shelf": "str | None"})
    check_sql_output(output, spec)
    with sa.create_engine(output["sql"]["url"]).connect() as conn:
        columns = {c["name"]: c for c in sa.inspect(conn).get_columns("stock")}
    assert columns["shelf"]["nullable"] is True


def test_a_pointer_read_from_the_records_stops_at_the_lag(tmp_path):
    from artemis.migrate import upgrade
    from artemis.registry.watermark import note_seen, read_pointer

    url = f"sqlite:///{tmp_path / 'artemis.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO reg_provenance (id, provenance_code, provenance_name, "
                "timezone_default, lifecycle_status_code, created_at, updated_at) "
                "VALUES (1, 'p', 'p', 'UTC', 'ACTIVE', '2026-01-01', '2026-01-01')"
            )
        )
        # a record newer than the run's window end (now minus the lag)
        note_seen(conn, 1, "t-1", "", "2025-01-10T12:00:00+00:00")
    end = datetime(2025, 1, 10, 11, 40, tzinfo=UTC)
    win = {"offset_type_code": "DATE", "watermark_field_name": "updated_at"}
    run = TaskContext(
        "source_harvest",
        "t-1",
        SourceParams(
            provenance="p",
            task_type="update",
            contract={
                "provenance": {"id": 1, "provenance_code": "p"},
                "task_type": "update",
                "at": "2025-01-10T12:00:00+00:00",
                "usage": "SEARCH",
                "endpoint": None,
                "endpoints": {},
                "pagination": None,
                "window_offset": win,
                "http": None,
                "batching": None,
                "retry": None,
                "rate_limit": None,
            },
            window_end=end,
        ),
        Settings(database={"url": url}),
        TraceContext(new_trace_id(), new_span_id()),
        role="operator",
    )
    # A client's update never moves the shared pointer (the seen value stays for the
    # operator's run below to take).
    client = dataclasses.replace(run, role="client")
    assert SourceHarvest().finalize(client, {})["watermark_moved"] is False
    with engine.connect() as conn:
        assert read_pointer(conn, 1, "update", "") == (None, None)
    stats = SourceHarvest().finalize(run, {})
    assert stats["watermark"] == end.isoformat()
    with engine.connect() as conn:
        value, cursor = read_pointer(conn, 1, "update", "")
    assert value == end and cursor == end.isoformat()


def window_file(row: dict[str, Any], family: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "provenance": {"provenance_code": "p"},
        "window_offset_cfg": [
            {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z", **row}
        ],
    }
    if family:
        doc["record_model"] = [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "record_family_code": family,
            }
        ]
    return doc


@pytest.mark.parametrize(
    ("row", "family", "needle"),
    [
        ({"offset_type_code": "ID"}, None, "watermark_field_name"),
        (
            {"offset_type_code": "ID", "watermark_field_name": "id"},
            None,
            "watermark_id_param_name",
        ),
        (
            {"offset_type_code": "COMPOSITE", "watermark_field_name": "updated_at"},
            None,
            "watermark_id_field_name",
        ),
        ({"watermark_id_param_name": "since_id"}, None, "not DATE"),
        ({"window_start_param_name": "since"}, "PUBMED", "not read by the PUBMED family"),
        ({"offset_type_code": "ID"}, "CROSSREF", "CROSSREF family's pointer is a DATE"),
    ],
)
def test_pointer_settings_that_cannot_act_are_refused_at_import(row, family, needle):
    from artemis.registry.file_models import parse_file

    with pytest.raises(ArtemisError) as e:
        parse_file(window_file(row, family), "p.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT and needle in e.value.message
    assert "window_offset_cfg[0]" in e.value.message


def test_pointer_settings_that_act_are_accepted():
    from artemis.registry.file_models import parse_file

    ok = {"offset_type_code": "ID", "watermark_field_name": "id", "watermark_id_param_name": "s"}
    assert parse_file(window_file(ok), "p.yaml")["window_offset_cfg"][0]["offset_type_code"]


@pytest.mark.parametrize("code", ["../escape", "a/b", "a..b", "-x", "a b"])
def test_a_code_that_could_not_name_a_table_and_folder_is_refused(code):
    from artemis.registry.file_models import parse_file

    with pytest.raises(ArtemisError) as e:
        parse_file({"provenance": {"provenance_code": code}}, "p.yaml")
    assert "provenance.provenance_code" in e.value.message and "folder" in e.value.message


def test_two_codes_of_one_default_table_are_refused(tmp_path):
    import yaml

    from artemis.registry.yaml_io import import_yaml

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'r.db'}")
    from artemis.migrate import upgrade

    upgrade(str(engine.url))
    key = tmp_path / "k"
    key.write_text("0" * 64)
    import_yaml(engine, yaml.safe_dump({"provenance": {"provenance_code": "my-shop"}}), str(key))
    with pytest.raises(ArtemisError) as e:
        import_yaml(
            engine, yaml.safe_dump({"provenance": {"provenance_code": "my_shop"}}), str(key)
        )
    assert "default table 'my_shop' is provenance 'my-shop'" in e.value.message


def test_a_sink_database_down_at_start_defers_the_table_check(tmp_path):
    # a PostgreSQL URL nothing listens on: the run may start, its writes wait the outage out
    from infra.devserver import free_port

    url = f"postgresql+psycopg://u:p@127.0.0.1:{free_port()}/lake"
    output = {"sinks": ["sql"], "sql": {"url": url, "table": "stock"}}
    spec = declared_spec(MODEL, "StockRecord")
    check_sql_output(output, spec)  # no error: deferred to the first write


def test_a_date_pointer_reads_epoch_numbers():
    from artemis.registry.watermark import pointer_of

    win = {"watermark_field_name": "updated"}
    assert pointer_of({"updated": 1735689600}, win) == "2025-01-01T00:00:00+00:00"
    ms = {**win, "window_time_format": "EPOCH_MS"}
    assert pointer_of({"updated": 1735689600500}, ms) == "2025-01-01T00:00:00.500000+00:00"
    with pytest.raises(ArtemisError) as e:
        pointer_of({"updated": "yesterday"}, win)
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and "'updated'" in e.value.message
