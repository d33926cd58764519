"""flow control: concurrency limits, rate limits and per-key ordering (job_gates, held jobs)

Revision ID: 0018
Revises: 0014
Create Date: 2026-12-01 14:40:00.000000

New nullable columns on jobs (a job enqueued before has no gate, as before), a boolean
with a default, three partial indexes, and a new table. Nothing older reads them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0018'
down_revision: str | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('concurrency_key', sa.Text(), nullable=True))
    op.add_column('jobs', sa.Column('concurrency_limit', sa.Integer(), nullable=True))
    op.add_column('jobs', sa.Column('rate_key', sa.Text(), nullable=True))
    op.add_column('jobs', sa.Column('rate_per_second', sa.Float(), nullable=True))
    op.add_column('jobs', sa.Column('rate_burst', sa.Integer(), nullable=True))
    op.add_column('jobs', sa.Column('ordering_key', sa.Text(), nullable=True))
    op.add_column('jobs', sa.Column('ordering_seq', sa.BigInteger(), nullable=True))
    op.add_column(
        'jobs',
        sa.Column('ordering_blocks', sa.Boolean(), server_default=sa.text('true'), nullable=False),
    )
    op.add_column('jobs', sa.Column('held_reason', sa.Text(), nullable=True))
    op.add_column('jobs', sa.Column('held_since', sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f('jobs_held_reason_check'),
        'jobs',
        "held_reason IN ('concurrency', 'rate_limit', 'ordering')",
    )
    op.create_index(
        op.f('jobs_ordering_idx'),
        'jobs',
        ['tenant', 'ordering_key', 'ordering_seq'],
        unique=False,
        postgresql_where=sa.text('ordering_key IS NOT NULL'),
    )
    op.create_index(
        op.f('jobs_concurrency_running_idx'),
        'jobs',
        ['concurrency_key'],
        unique=False,
        postgresql_where=sa.text("status = 'running' AND concurrency_key IS NOT NULL"),
    )
    op.create_index(
        op.f('jobs_held_idx'),
        'jobs',
        ['held_since'],
        unique=False,
        postgresql_where=sa.text("status = 'pending' AND held_reason IS NOT NULL"),
    )
    op.create_table(
        'job_gates',
        sa.Column('key', sa.Text(), nullable=False),
        sa.Column('tat', sa.DateTime(timezone=True), nullable=True),
        sa.Column('counter', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('released_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('key', name=op.f('job_gates_pkey')),
    )


def downgrade() -> None:
    op.drop_table('job_gates')
    op.drop_index(op.f('jobs_held_idx'), table_name='jobs')
    op.drop_index(op.f('jobs_concurrency_running_idx'), table_name='jobs')
    op.drop_index(op.f('jobs_ordering_idx'), table_name='jobs')
    op.drop_constraint(op.f('jobs_held_reason_check'), 'jobs', type_='check')
    for column in (
        'held_since', 'held_reason', 'ordering_blocks', 'ordering_seq', 'ordering_key',
        'rate_burst', 'rate_per_second', 'rate_key', 'concurrency_limit', 'concurrency_key',
    ):
        op.drop_column('jobs', column)
