"""job events: a job's timeline, one row per state change or hop

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-01 14:30:00.000000

``job_events`` is append-only, written by the statements that change a job (enqueue,
publish, claim, outcomes, reaper, quarantine, dead-letter notes, webhook attempts) in
the same statement. Rows go with their job (ON DELETE CASCADE, backed by the primary key
(job_id, id), the table's only index, which also serves reading a timeline). A new, empty table:
code of the previous revision never reads or writes it, and jobs already in flight just
have a shorter timeline.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'job_events',
        sa.Column('job_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            'at',
            sa.DateTime(timezone=True),
            server_default=sa.text('clock_timestamp()'),
            nullable=False,
        ),
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=True),
        sa.Column(
            'detail',
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ['job_id'], ['jobs.id'], name=op.f('job_events_job_id_fkey'), ondelete='CASCADE'
        ),
        sa.PrimaryKeyConstraint('job_id', 'id', name=op.f('job_events_pkey')),
    )


def downgrade() -> None:
    op.drop_table('job_events')
