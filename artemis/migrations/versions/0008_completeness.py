"""Completeness (docs/architecture.md): a provenance's pagination settings, and a fingerprint per
staged page so that a source serving an earlier page again is caught by content.

Revision ID: 0008_completeness
Revises: 0007_event_roots
Create Date: 2026-11-26 06:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_completeness"
down_revision = "0007_event_roots"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reg_prov_pagination_cfg", schema=None) as batch_op:
        batch_op.add_column(sa.Column("short_page_is_last", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("absent_token_is_last", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("record_key_jsonpath", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("completeness_tolerance_pct", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("stateful_cursor", sa.Boolean(), nullable=True))
    with op.batch_alter_table("staged_page", schema=None) as batch_op:
        batch_op.add_column(sa.Column("digest", sa.String(length=40), nullable=True))
        batch_op.create_index("ix_staged_page_run_digest", ["run_key", "digest"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("staged_page", schema=None) as batch_op:
        batch_op.drop_index("ix_staged_page_run_digest")
        batch_op.drop_column("digest")
    with op.batch_alter_table("reg_prov_pagination_cfg", schema=None) as batch_op:
        batch_op.drop_column("stateful_cursor")
        batch_op.drop_column("completeness_tolerance_pct")
        batch_op.drop_column("record_key_jsonpath")
        batch_op.drop_column("absent_token_is_last")
        batch_op.drop_column("short_page_is_last")
