"""Frozen contracts stored once by digest (a backfill's window runs carry the digest, not
the contract): artemis/registry/frozen.py.

Revision ID: 0017_frozen_contracts
Revises: 0016_quarantine
Create Date: 2026-11-29 02:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_frozen_contracts"
down_revision = "0016_quarantine"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reg_frozen_contract",
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("body_json", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("touched_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reg_frozen_contract")
