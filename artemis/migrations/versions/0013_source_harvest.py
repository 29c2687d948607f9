"""A source without code: the record model as a dated registry dimension, windows and
incremental pointers of sources of no paper family.

The record model moves from a column of ``reg_provenance`` to ``reg_prov_record_model``
(one SOURCE row in force from the epoch per provenance that had one). A provenance
without one whose SEARCH endpoint is PubMed's esearch or Crossref's /works gets the
family it was read as until now, declared once here so nothing is guessed at run time.

Revision ID: 0013_source_harvest
Revises: 0012_own_api
Create Date: 2026-11-28 09:40:00.000000
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0013_source_harvest"
down_revision = "0012_own_api"
branch_labels = None
depends_on = None

EPOCH = datetime(1970, 1, 1, tzinfo=UTC).replace(tzinfo=None)


def upgrade() -> None:
    op.create_table(
        "reg_prov_record_model",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("provenance_id", sa.Integer(), nullable=False),
        sa.Column("scope_code", sa.String(length=16), nullable=False),
        sa.Column("task_type", sa.String(length=16), nullable=True),
        sa.Column("effective_from", sa.DateTime(), nullable=False),
        sa.Column("effective_to", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column(
            "task_type_key",
            sa.String(length=16),
            sa.Computed("COALESCE(task_type, 'ALL')", persisted=True),
            nullable=True,
        ),
        sa.Column("record_family_code", sa.String(length=16), nullable=True),
        sa.Column("key_json", sa.JSON(), nullable=True),
        sa.Column("fields_json", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["provenance_id"], ["reg_provenance.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "uq_reg_prov_record_model_interval",
        "reg_prov_record_model",
        ["provenance_id", "scope_code", "task_type_key", "effective_from"],
        unique=True,
    )
    op.create_index(
        "ix_reg_prov_record_model_lookup",
        "reg_prov_record_model",
        ["provenance_id", "scope_code", "task_type", "effective_to"],
    )
    op.create_table(
        "reg_prov_watermark_seen",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("provenance_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("watermark_key", sa.String(length=200), nullable=False),
        sa.Column("seen_value", sa.String(length=500), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["provenance_id"], ["reg_provenance.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_reg_prov_watermark_seen_run",
        "reg_prov_watermark_seen",
        ["provenance_id", "run_id"],
    )
    with op.batch_alter_table("reg_prov_watermark") as batch:
        batch.add_column(sa.Column("watermark_cursor", sa.String(500), nullable=True))
    for name in (
        "window_start_param_name",
        "window_end_param_name",
        "window_time_format",
        "watermark_field_name",
        "watermark_id_field_name",
        "watermark_id_param_name",
    ):
        op.add_column("reg_prov_window_offset_cfg", sa.Column(name, sa.String(64), nullable=True))
    _move_record_models()
    op.drop_column("reg_provenance", "record_model")


def _move_record_models() -> None:
    conn = op.get_bind()
    prov = sa.table("reg_provenance", sa.column("id"), sa.column("record_model", sa.JSON))
    ep = sa.table(
        "reg_prov_endpoint_def",
        sa.column("provenance_id"),
        sa.column("endpoint_usage_code"),
        sa.column("path_template"),
    )
    rm = sa.table(
        "reg_prov_record_model",
        sa.column("provenance_id"),
        sa.column("scope_code"),
        sa.column("effective_from"),
        sa.column("created_at"),
        sa.column("updated_at"),
        sa.column("record_family_code"),
        sa.column("key_json", sa.JSON),
        sa.column("fields_json", sa.JSON),
    )
    now = datetime.now(UTC).replace(tzinfo=None)
    for pid, model in conn.execute(sa.select(prov.c.id, prov.c.record_model)).fetchall():
        family = None
        if not model:
            paths = conn.execute(
                sa.select(ep.c.path_template).where(
                    ep.c.provenance_id == pid, ep.c.endpoint_usage_code == "SEARCH"
                )
            ).scalars()
            for path in paths:
                if "esearch" in (path or ""):
                    family = "PUBMED"
                elif (path or "").rstrip("/").endswith("/works"):
                    family = "CROSSREF"
            if family is None:
                continue
        conn.execute(
            rm.insert().values(
                provenance_id=pid,
                scope_code="SOURCE",
                effective_from=EPOCH,
                created_at=now,
                updated_at=now,
                record_family_code=family,
                key_json=(model or {}).get("key"),
                fields_json=(model or {}).get("fields"),
            )
        )


def downgrade() -> None:
    op.add_column("reg_provenance", sa.Column("record_model", sa.JSON(), nullable=True))
    for name in (
        "watermark_id_param_name",
        "watermark_id_field_name",
        "watermark_field_name",
        "window_time_format",
        "window_end_param_name",
        "window_start_param_name",
    ):
        op.drop_column("reg_prov_window_offset_cfg", name)
    op.drop_column("reg_prov_watermark", "watermark_cursor")
    op.drop_index("ix_reg_prov_watermark_seen_run", "reg_prov_watermark_seen")
    op.drop_table("reg_prov_watermark_seen")
    op.drop_index("ix_reg_prov_record_model_lookup", "reg_prov_record_model")
    op.drop_index("uq_reg_prov_record_model_interval", "reg_prov_record_model")
    op.drop_table("reg_prov_record_model")
