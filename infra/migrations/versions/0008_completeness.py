"""Completeness settings of a provenance's pagination (SPEC §4 "Completeness").

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


def downgrade() -> None:
    with op.batch_alter_table("reg_prov_pagination_cfg", schema=None) as batch_op:
        batch_op.drop_column("completeness_tolerance_pct")
        batch_op.drop_column("record_key_jsonpath")
        batch_op.drop_column("absent_token_is_last")
        batch_op.drop_column("short_page_is_last")
