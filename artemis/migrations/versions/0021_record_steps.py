"""Records shaped before their model's check: a record model row's steps
(``record_steps_json``: rename, map, add, drop, filter; docs/resources.md "Shaping
records").

Only adds a nullable column: every row already stored has no steps, and its records go
to the check as the source gives them.

Revision ID: 0021_record_steps
Revises: 0020_rate_limit_headers
Create Date: 2026-11-29 06:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0021_record_steps"
down_revision = "0020_rate_limit_headers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: a batch copy of this table cannot insert into its
    # generated column (task_type_key).
    op.add_column("reg_prov_record_model", sa.Column("record_steps_json", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("reg_prov_record_model", "record_steps_json")
