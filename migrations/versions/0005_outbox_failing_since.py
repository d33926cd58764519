"""outbox: failing_since, when the broker first refused a row's message

Revision ID: 0005_relayq
Revises: 0004
Create Date: 2026-12-01 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable with no default: adding it rewrites nothing, even on a large outbox.
    op.add_column('outbox', sa.Column('failing_since', sa.DateTime(timezone=True), nullable=True))
    # Rows already failing: when they first failed is unknown; their creation is the
    # earliest it can have been.
    op.execute(
        'UPDATE outbox SET failing_since = created_at WHERE attempts > 0 AND quarantined_at IS NULL'
    )


def downgrade() -> None:
    op.drop_column('outbox', 'failing_since')
