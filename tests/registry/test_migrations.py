"""The Alembic migrations build exactly the SQLModel tables, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

from alembic import command
from sqlalchemy import inspect, text

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
    assert "record_model" not in columns("reg_provenance")  # a dimension since 0013
    command.check(cfg)


def test_record_models_and_the_paper_families_move_into_their_dimension(db_engine):
    # 0013: a provenance's record model becomes a SOURCE row of reg_prov_record_model; a
    # provenance without one whose SEARCH is esearch or /works gets its family declared.
    cfg = alembic_config(str(db_engine.url.render_as_string(hide_password=False)))
    model = {"key": ["id"], "fields": {"id": "int", "name": "str | None"}}
    try:
        command.downgrade(cfg, "0012_own_api")
        with db_engine.begin() as conn:
            for pid, code, path, rm in (
                (901, "mig-shop", "/products", model),
                (902, "mig-pubmed", "/entrez/eutils/esearch.fcgi", None),
                (903, "mig-crossref", "/works/", None),
                (904, "mig-raw", "/things", None),
            ):
                conn.execute(
                    text(
                        "INSERT INTO reg_provenance (id, provenance_code, provenance_name, "
                        "timezone_default, lifecycle_status_code, record_model, created_at, "
                        "updated_at) VALUES (:id, :c, :c, 'UTC', 'ACTIVE', :rm, "
                        "'2026-01-01', '2026-01-01')"
                    ),
                    {"id": pid, "c": code, "rm": json.dumps(rm) if rm else None},
                )
                conn.execute(
                    text(
                        "INSERT INTO reg_prov_endpoint_def (provenance_id, scope_code, "
                        "effective_from, created_at, updated_at, endpoint_name, "
                        "endpoint_usage_code, http_method_code, path_template, "
                        "is_auth_required) VALUES (:id, 'SOURCE', '2026-01-01', '2026-01-01', "
                        "'2026-01-01', 'search', 'SEARCH', 'GET', :p, false)"
                    ),
                    {"id": pid, "p": path},
                )
    finally:
        command.upgrade(cfg, "head")
    try:
        with db_engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT provenance_id, scope_code, record_family_code, key_json, "
                    "fields_json FROM reg_prov_record_model WHERE provenance_id > 900 "
                    "ORDER BY provenance_id"
                )
            ).fetchall()
        got = [(r[0], r[1], r[2], _json(r[3]), _json(r[4])) for r in rows]
        assert got == [
            (901, "SOURCE", None, ["id"], model["fields"]),
            (902, "SOURCE", "PUBMED", None, None),
            (903, "SOURCE", "CROSSREF", None, None),
        ]
    finally:
        with db_engine.begin() as conn:
            for table in ("reg_prov_record_model", "reg_prov_endpoint_def", "reg_provenance"):
                col = "id" if table == "reg_provenance" else "provenance_id"
                conn.execute(text(f"DELETE FROM {table} WHERE {col} > 900"))


def _json(value):
    return json.loads(value) if isinstance(value, str) else value
