"""More ways to log in (artemis/registry/auth.py): OAuth2 refresh tokens and session
logins.

A credential gains a third sealed secret (``client_secret_*``: the client secret of an
``OAUTH2_REFRESH_TOKEN`` credential, whose refresh token is its secret) and the path of a
``SESSION_TOKEN`` login's token in the answer (``token_jsonpath``). A refresh token that
the authorization server rotates lives with its credential, sealed, in
``reg_prov_token_state``, and one refresh at a time is held across every worker by a
``named_lock`` row (artemis/dblock.py).

Only adds nullable columns and new tables: every row already stored acts as before.

Revision ID: 0022_token_logins
Revises: 0021_record_steps
Create Date: 2026-12-01 09:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0022_token_logins"
down_revision = "0021_record_steps"
branch_labels = None
depends_on = None

CREDENTIAL = (
    sa.Column("client_secret_env_name", sa.String(100), nullable=True),
    sa.Column("client_secret_ciphertext", sa.String(4000), nullable=True),
    sa.Column("token_jsonpath", sa.String(200), nullable=True),
)


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: a batch copy of the table cannot insert into its
    # generated column (task_type_key).
    for column in CREDENTIAL:
        op.add_column("reg_prov_credential", column)
    op.create_table(
        "reg_prov_token_state",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "credential_id",
            sa.Integer(),
            sa.ForeignKey("reg_prov_credential.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("refresh_token_ciphertext", sa.Text(), nullable=False),
        sa.Column("access_token_ciphertext", sa.Text(), nullable=True),
        sa.Column("encryption_key_id", sa.String(64), nullable=True),
        sa.Column("access_shape", sa.String(64), nullable=True),
        sa.Column("access_renew_at", sa.Float(), nullable=True),
        sa.Column("access_expires_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_index(
        "uq_reg_prov_token_state_credential", "reg_prov_token_state", ["credential_id"], unique=True
    )
    op.create_table(
        "named_lock",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("lease_until", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("named_lock")
    op.drop_index("uq_reg_prov_token_state_credential", table_name="reg_prov_token_state")
    op.drop_table("reg_prov_token_state")
    for column in reversed(CREDENTIAL):
        op.drop_column("reg_prov_credential", column.name)
