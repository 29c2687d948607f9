"""Foundation tables: staged pages (claim check) and per-run secrets.

Revision ID: 0001_foundation
Revises:
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_foundation"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "staged_page",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_key", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("record_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("run_key", "kind", "seq", name="uq_staged_page_run_kind_seq"),
    )
    op.create_index("ix_staged_page_run_key", "staged_page", ["run_key"])
    op.create_table(
        "run_secret",
        sa.Column("run_key", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_run_secret_created", "run_secret", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_run_secret_created", "run_secret")
    op.drop_table("run_secret")
    op.drop_index("ix_staged_page_run_key", "staged_page")
    op.drop_table("staged_page")
