"""HTTP and auth of registry sources: proxies, TLS, second secrets, token endpoints.

Revision ID: 0014_http_auth
Revises: 0013_source_harvest
Create Date: 2026-11-28 10:00:00.000000
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0014_http_auth"
down_revision = "0013_source_harvest"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
