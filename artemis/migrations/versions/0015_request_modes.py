"""Request modes of registry sources: POST searches, XML records, scroll paging, detail templates.

Revision ID: 0015_request_modes
Revises: 0014_http_auth
Create Date: 2026-11-28 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_request_modes"
down_revision = "0014_http_auth"
branch_labels = None
depends_on = None


PAGINATION = (
    ("paging_params_in_code", 16),
    ("scroll_path_template", 500),
    ("scroll_keep_alive_value", 32),
    ("scroll_keep_alive_param_name", 64),
    ("scroll_id_jsonpath", 200),
    ("scroll_id_param_name", 64),
    ("scroll_release_path_template", 500),
)
BATCHING = (("detail_id_jsonpath", 200), ("detail_records_jsonpath", 200))


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: a batch copy of these tables cannot insert into
    # their generated column (task_type_key).
    for name, size in PAGINATION:
        op.add_column("reg_prov_pagination_cfg", sa.Column(name, sa.String(size), nullable=True))
    for name, size in BATCHING:
        op.add_column("reg_prov_batching_cfg", sa.Column(name, sa.String(size), nullable=True))


def downgrade() -> None:
    for name, _ in reversed(BATCHING):
        op.drop_column("reg_prov_batching_cfg", name)
    for name, _ in reversed(PAGINATION):
        op.drop_column("reg_prov_pagination_cfg", name)
