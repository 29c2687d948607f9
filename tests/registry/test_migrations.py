"""The Alembic migrations build exactly the SQLModel tables, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect

from artemis.migrate import alembic_config


def test_migrated_schema_matches_the_models(db_engine):
    # `alembic check` fails when autogenerate would produce any operation.
    command.check(alembic_config(str(db_engine.url.render_as_string(hide_password=False))))
    insp = inspect(db_engine)
    tables = set(insp.get_table_names())
    for name in (
        "reg_provenance",
        "reg_prov_endpoint_def",
        "reg_prov_window_offset_cfg",
        "reg_prov_pagination_cfg",
        "reg_prov_http_cfg",
        "reg_prov_batching_cfg",
        "reg_prov_retry_cfg",
        "reg_prov_rate_limit_cfg",
        "reg_prov_credential",
        "reg_prov_watermark",
        "staged_page",
        "run_secret",
    ):
        assert name in tables
    cols = {c["name"]: c for c in insp.get_columns("reg_prov_pagination_cfg")}
    assert "task_type_key" in cols and cols["task_type_key"].get("computed")
    indexes = {i["name"]: i for i in insp.get_indexes("reg_prov_endpoint_def")}
    assert indexes["uq_reg_prov_endpoint_def_interval"]["column_names"] == [
        "provenance_id",
        "scope_code",
        "task_type_key",
        "endpoint_name",
        "effective_from",
    ]
    assert indexes["uq_reg_prov_endpoint_def_interval"]["unique"]


def test_the_own_api_columns_go_down_and_up_again(db_engine):
    # 0012: a provenance's record model and the page-number/offset end markers.
    cfg = alembic_config(str(db_engine.url.render_as_string(hide_password=False)))

    def columns(table: str) -> set[str]:
        return {c["name"] for c in inspect(db_engine).get_columns(table)}

    try:
        command.downgrade(cfg, "0011_outages")
        assert "record_model" not in columns("reg_provenance")
        assert not {"next_page_jsonpath", "has_more_jsonpath"} & columns("reg_prov_pagination_cfg")
    finally:
        command.upgrade(cfg, "head")
    assert "record_model" in columns("reg_provenance")
    command.check(cfg)
