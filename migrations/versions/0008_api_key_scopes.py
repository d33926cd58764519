"""api_keys: scopes, expiry, last use and rotation lineage

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 11:00:00.000000

Existing keys keep working as before: they get the scopes every key had implicitly
(enqueue, read, cancel; never admin), no expiry, and a lineage of their own (``lineage``
is filled from ``id``: api_keys holds one row per key ever issued, a small table). The
previous release keeps working against this schema during a rollout: every new column has
a default or is nullable, so its ``keys create`` still inserts (a NULL lineage reads as
the key's own id).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCOPES_CHECK = (
    "cardinality(scopes) >= 1 AND scopes <@ ARRAY['enqueue', 'read', 'cancel', 'admin']::text[]"
)


def upgrade() -> None:
    op.add_column(
        'api_keys',
        sa.Column(
            'scopes',
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{enqueue,read,cancel}'::text[]"),
            nullable=False,
        ),
    )
    op.add_column('api_keys', sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('api_keys', sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('api_keys', sa.Column('lineage', sa.UUID(), nullable=True))
    op.add_column('api_keys', sa.Column('rotated_from', sa.UUID(), nullable=True))
    op.execute('UPDATE api_keys SET lineage = id')
    op.create_check_constraint(op.f('api_keys_scopes_check'), 'api_keys', SCOPES_CHECK)
    op.create_foreign_key(
        'api_keys_rotated_from_fkey', 'api_keys', 'api_keys', ['rotated_from'], ['id']
    )


def downgrade() -> None:
    op.drop_constraint('api_keys_rotated_from_fkey', 'api_keys', type_='foreignkey')
    op.drop_constraint('api_keys_scopes_check', 'api_keys', type_='check')
    op.drop_column('api_keys', 'rotated_from')
    op.drop_column('api_keys', 'lineage')
    op.drop_column('api_keys', 'last_used_at')
    op.drop_column('api_keys', 'expires_at')
    op.drop_column('api_keys', 'scopes')
