"""The files sink's record of what a run wrote, for its manifest (artemis/sinks/files.py).

Revision ID: 0010_sink_file
Revises: 0009_rate_gate
Create Date: 2026-11-26 11:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_sink_file"
down_revision = "0009_rate_gate"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sink_file",
        sa.Column("run_key", sa.String(200), nullable=False),
        sa.Column("sink", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("records", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("written_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("run_key", "sink", "seq"),
    )


def downgrade() -> None:
    op.drop_table("sink_file")
