"""schedules: the state of each periodic job schedule (last tick enqueued, paused)

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-01 14:00:00.000000

The schedules themselves are declared in configuration (JOBCORE_SCHEDULES, or periodic()
in a job module); this table keeps what must survive restarts and clock steps: the latest
tick enqueued (never moved back) and whether an operator paused the schedule. A new,
empty table: nothing older reads or writes it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'schedules',
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('last_tick', sa.DateTime(timezone=True), nullable=False),
        sa.Column('paused', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.Column('paused_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_job_id', postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column('last_enqueued_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('schedules_pkey')),
    )


def downgrade() -> None:
    op.drop_table('schedules')
