"""Rate limits across processes: one GCRA row per key (artemis/ratelimit.py).

Revision ID: 0009_rate_gate
Revises: 0008_completeness
Create Date: 2026-11-26 09:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_rate_gate"
down_revision = "0008_completeness"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_gate",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("rate_gate")
