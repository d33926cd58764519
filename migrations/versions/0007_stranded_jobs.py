"""anti-entropy: jobs.message_note and jobs.republish_count, and an index on outbox.job_id

Revision ID: 0005_sweep
Revises: 0004
Create Date: 2026-12-01 10:00:00.000000

Both columns are added without rewriting ``jobs`` (a constant default is stored in the
catalogue). The index is built with a plain CREATE INDEX: the outbox holds only due,
scheduled and quarantined rows, so in steady state it is built in milliseconds.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('message_note', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column(
        'jobs',
        sa.Column('republish_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    )
    op.create_index('outbox_job_idx', 'outbox', ['job_id'], unique=False)


def downgrade() -> None:
    op.drop_index('outbox_job_idx', table_name='outbox')
    op.drop_column('jobs', 'republish_count')
    op.drop_column('jobs', 'message_note')
