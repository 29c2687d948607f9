"""HTTP and auth of registry sources: proxies, TLS, second secrets, token endpoints.

A CA bundle a provenance's TLS is verified against; a credential's second secret (the
user of HTTP Basic, the client id of OAuth2 client credentials), sealed like the first,
and how an OAuth2 client authenticates at the token endpoint.

Revision ID: 0014_http_auth
Revises: 0013_source_harvest
Create Date: 2026-11-28 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_http_auth"
down_revision = "0013_source_harvest"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN: batch mode would copy the tables, and a copy cannot insert into
    # their generated column (task_type_key).
    op.add_column("reg_prov_http_cfg", sa.Column("tls_ca_bundle_path", sa.String(500)))
    op.add_column("reg_prov_credential", sa.Column("principal_env_name", sa.String(100)))
    op.add_column("reg_prov_credential", sa.Column("principal_ciphertext", sa.String(4000)))
    op.add_column("reg_prov_credential", sa.Column("token_auth_method_code", sa.String(32)))


def downgrade() -> None:
    op.drop_column("reg_prov_credential", "token_auth_method_code")
    op.drop_column("reg_prov_credential", "principal_ciphertext")
    op.drop_column("reg_prov_credential", "principal_env_name")
    op.drop_column("reg_prov_http_cfg", "tls_ca_bundle_path")
