"""Outages (docs/architecture.md): a provenance's outage tolerance, and the state a failed run keeps
for POST /tasks/{id}/retry.

Revision ID: 0011_outages
Revises: 0010_sink_file
Create Date: 2026-11-26 17:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_outages"
down_revision = "0010_sink_file"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reg_prov_retry_cfg") as batch:
        batch.add_column(sa.Column("outage_tolerance_millis", sa.Integer(), nullable=True))
    with op.batch_alter_table("reg_prov_http_cfg") as batch:
        batch.add_column(sa.Column("max_body_bytes", sa.Integer(), nullable=True))
    op.create_table(
        "retained_run",
        sa.Column("run_key", sa.String(200), nullable=False),
        sa.Column("task_code", sa.String(128), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("workflow_id", sa.String(300), nullable=False),
        sa.Column("error_code", sa.String(64), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("retained_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("taken_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("run_key"),
    )
    op.create_index("ix_retained_run_expires_at", "retained_run", ["expires_at"])
    op.create_index("ix_retained_run_task_id", "retained_run", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_retained_run_task_id", table_name="retained_run")
    op.drop_index("ix_retained_run_expires_at", table_name="retained_run")
    op.drop_table("retained_run")
    with op.batch_alter_table("reg_prov_http_cfg") as batch:
        batch.drop_column("max_body_bytes")
    with op.batch_alter_table("reg_prov_retry_cfg") as batch:
        batch.drop_column("outage_tolerance_millis")
