"""A source is a tree of resources (docs/registry.md "Resources"): a resource column on the
dimensions a resource has rows of its own in, a sub-resource's parent, the parent fields
it copies and where it lands, answers that are not errors, and NEXT_URL paging.

Only adds: new columns (``resource_name`` defaults to "", the provenance's own resource,
so every row already stored stays the provenance's), and the unique interval index of
the pagination, record model and window tables widened by ``resource_name`` (dropped and
made again with the column added: every pair of rows it allowed, it still allows).

Revision ID: 0019_resources
Revises: 0018_quarantine_sealed
Create Date: 2026-11-29 05:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_resources"
down_revision = "0018_quarantine_sealed"
branch_labels = None
depends_on = None

RESOURCE_TABLES = (
    "reg_prov_endpoint_def",
    "reg_prov_pagination_cfg",
    "reg_prov_record_model",
    "reg_prov_window_offset_cfg",
)
# Tables whose unique interval index gains the resource (an endpoint keeps its name's).
WIDENED = RESOURCE_TABLES[1:]
ENDPOINT = (
    sa.Column("parent_resource_name", sa.String(64), nullable=True),
    sa.Column("include_from_parent_json", sa.JSON(), nullable=True),
    sa.Column("output_name", sa.String(63), nullable=True),
    sa.Column("response_actions_json", sa.JSON(), nullable=True),
)


def _interval(table: str, with_resource: bool) -> list[str]:
    cols = ["provenance_id", "scope_code", "task_type_key"]
    return cols + (["resource_name"] if with_resource else []) + ["effective_from"]


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: a batch copy of these tables cannot insert into
    # their generated column (task_type_key).
    for table in RESOURCE_TABLES:
        op.add_column(
            table, sa.Column("resource_name", sa.String(64), nullable=False, server_default="")
        )
    for column in ENDPOINT:
        op.add_column("reg_prov_endpoint_def", column)
    op.add_column(
        "reg_prov_pagination_cfg", sa.Column("next_url_jsonpath", sa.String(200), nullable=True)
    )
    for table in WIDENED:
        op.drop_index(f"uq_{table}_interval", table_name=table)
        op.create_index(f"uq_{table}_interval", table, _interval(table, True), unique=True)


def downgrade() -> None:
    for table in WIDENED:
        op.drop_index(f"uq_{table}_interval", table_name=table)
        op.create_index(f"uq_{table}_interval", table, _interval(table, False), unique=True)
    op.drop_column("reg_prov_pagination_cfg", "next_url_jsonpath")
    for column in reversed(ENDPOINT):
        op.drop_column("reg_prov_endpoint_def", column.name)
    for table in RESOURCE_TABLES:
        op.drop_column(table, "resource_name")
