"""Your own API in YAML: a provenance's declared record model, and the end markers of
page-number and offset paging.

Revision ID: 0012_own_api
Revises: 0011_outages
Create Date: 2026-12-02 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_own_api"
down_revision = "0011_outages"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reg_provenance") as batch:
        batch.add_column(sa.Column("record_model", sa.JSON(), nullable=True))
    with op.batch_alter_table("reg_prov_pagination_cfg") as batch:
        batch.add_column(sa.Column("next_page_jsonpath", sa.String(200), nullable=True))
        batch.add_column(sa.Column("has_more_jsonpath", sa.String(200), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 has it): batch mode would copy the tables, and a
    # copy cannot insert into their generated column (task_type_key).
    op.drop_column("reg_prov_pagination_cfg", "has_more_jsonpath")
    op.drop_column("reg_prov_pagination_cfg", "next_page_jsonpath")
    op.drop_column("reg_provenance", "record_model")
