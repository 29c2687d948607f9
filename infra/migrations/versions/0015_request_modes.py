"""Request modes of registry sources: POST searches, XML records, scroll paging, detail templates.

Revision ID: 0015_request_modes
Revises: 0014_http_auth
Create Date: 2026-11-28 10:00:00.000000
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0015_request_modes"
down_revision = "0014_http_auth"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
