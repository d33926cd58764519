"""outbox: a partial index on the quarantined rows' job ids, for the rescuer

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 11:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        'outbox_quarantined_job_idx',
        'outbox',
        ['job_id'],
        unique=False,
        postgresql_where=sa.text('quarantined_at IS NOT NULL'),
    )


def downgrade() -> None:
    op.drop_index(
        'outbox_quarantined_job_idx',
        table_name='outbox',
        postgresql_where=sa.text('quarantined_at IS NOT NULL'),
    )
