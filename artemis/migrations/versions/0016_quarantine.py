"""Bad records and schema drift: the quarantine, what a replay needs of a run, the drift a
run saw, and the record model's policy columns (artemis/quarantine/store.py).

Revision ID: 0016_quarantine
Revises: 0015_request_modes
Create Date: 2026-11-28 12:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_quarantine"
down_revision = "0015_request_modes"
branch_labels = None
depends_on = None

POLICY = (("on_bad_record_code", 16), ("max_bad_records_value", 16), ("schema_contract_code", 16))


def upgrade() -> None:
    op.create_table(
        "quarantined_record",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_key", sa.String(200), nullable=False),
        sa.Column("task_code", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("provenance", sa.String(64), nullable=True),
        sa.Column("page_seq", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("record_key", sa.Text(), nullable=True),
        sa.Column("record", sa.Text(), nullable=True),
        sa.Column("record_bytes", sa.Integer(), nullable=False),
        sa.Column("error_code", sa.String(40), nullable=False),
        sa.Column("field_path", sa.String(300), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("replays", sa.Integer(), nullable=False),
        sa.Column("replayed_by", sa.String(300), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("run_key", "page_seq", "position", name="uq_quarantined_record_place"),
    )
    op.create_index("ix_quarantined_record_run_status", "quarantined_record", ["run_key", "status"])
    op.create_index("ix_quarantined_record_created", "quarantined_record", ["created_at"])
    op.create_index("ix_quarantined_record_task_id", "quarantined_record", ["task_id"])
    op.create_table(
        "quarantine_run",
        sa.Column("run_key", sa.String(200), primary_key=True),
        sa.Column("task_code", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("provenance", sa.String(64), nullable=True),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_quarantine_run_task_id", "quarantine_run", ["task_id"])
    op.create_table(
        "schema_drift",
        sa.Column("run_key", sa.String(200), nullable=False),
        sa.Column("field_name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("task_code", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("provenance", sa.String(64), nullable=True),
        sa.Column("page_seq", sa.Integer(), nullable=False),
        sa.Column("example", sa.Text(), nullable=True),
        sa.Column("type_name", sa.String(40), nullable=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("run_key", "field_name"),
    )
    for name, size in POLICY:
        op.add_column("reg_prov_record_model", sa.Column(name, sa.String(size), nullable=True))
    op.add_column(
        "reg_prov_record_model", sa.Column("coerce_types_enabled", sa.Boolean(), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("reg_prov_record_model", "coerce_types_enabled")
    for name, _ in reversed(POLICY):
        op.drop_column("reg_prov_record_model", name)
    op.drop_table("schema_drift")
    op.drop_index("ix_quarantine_run_task_id", "quarantine_run")
    op.drop_table("quarantine_run")
    op.drop_index("ix_quarantined_record_task_id", "quarantined_record")
    op.drop_index("ix_quarantined_record_created", "quarantined_record")
    op.drop_index("ix_quarantined_record_run_status", "quarantined_record")
    op.drop_table("quarantined_record")
