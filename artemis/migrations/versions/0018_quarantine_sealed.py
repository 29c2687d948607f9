"""A quarantined record that holds a secret value: shown redacted (``record``), kept
sealed for its replay (``record_sealed``): artemis/quarantine/store.py.

Revision ID: 0018_quarantine_sealed
Revises: 0017_frozen_contracts
Create Date: 2026-11-29 03:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_quarantine_sealed"
down_revision = "0017_frozen_contracts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quarantined_record") as batch:
        batch.add_column(sa.Column("record_sealed", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quarantined_record") as batch:
        batch.drop_column("record_sealed")
