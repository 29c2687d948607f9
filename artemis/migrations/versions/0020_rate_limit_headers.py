"""A source's own rate-limit headers (artemis/registry/limit_headers.py): how a provenance's
answers say its budget is spent, and the instant a rate gate stays closed until.

Only adds nullable columns: every row already stored reads no headers (``NONE``) and
every gate is open.

Revision ID: 0020_rate_limit_headers
Revises: 0019_resources
Create Date: 2026-11-30 09:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0020_rate_limit_headers"
down_revision = "0019_resources"
branch_labels = None
depends_on = None

RATE_LIMIT = (
    sa.Column("ratelimit_headers_code", sa.String(16), nullable=True),
    sa.Column("remaining_header_name", sa.String(64), nullable=True),
    sa.Column("reset_header_name", sa.String(64), nullable=True),
    sa.Column("policy_header_name", sa.String(64), nullable=True),
    sa.Column("reset_format_code", sa.String(16), nullable=True),
    sa.Column("remaining_reserve_value", sa.Integer(), nullable=True),
)


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: a batch copy of the table cannot insert into its
    # generated column (task_type_key).
    for column in RATE_LIMIT:
        op.add_column("reg_prov_rate_limit_cfg", column)
    op.add_column("rate_gate", sa.Column("closed_until", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("rate_gate", "closed_until")
    for column in reversed(RATE_LIMIT):
        op.drop_column("reg_prov_rate_limit_cfg", column.name)
