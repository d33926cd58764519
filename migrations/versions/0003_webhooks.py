"""webhooks: jobs.callback_url, delivery records, signing secrets, default endpoints

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 12:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('tenant_webhook_secrets',
    sa.Column('tenant', sa.Text(), nullable=False),
    sa.Column('secret', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('rotated_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('tenant', name=op.f('tenant_webhook_secrets_pkey'))
    )
    op.create_table('webhook_endpoints',
    sa.Column('tenant', sa.Text(), nullable=False),
    sa.Column('job_type', sa.Text(), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('tenant', 'job_type', name=op.f('webhook_endpoints_pkey'))
    )
    op.create_table('webhook_deliveries',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('tenant', sa.Text(), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('event', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), server_default='pending', nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_attempts', sa.Integer(), server_default=sa.text('8'), nullable=False),
    sa.Column('last_status_code', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')", name=op.f('webhook_deliveries_status_check')),
    sa.CheckConstraint('attempts >= 0 AND max_attempts >= 1', name=op.f('webhook_deliveries_attempts_check')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('webhook_deliveries_job_id_fkey'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('webhook_deliveries_pkey'))
    )
    op.create_index('webhook_deliveries_job_created_idx', 'webhook_deliveries', ['job_id', 'created_at'], unique=False)
    op.create_index('webhook_deliveries_status_created_idx', 'webhook_deliveries', ['status', 'created_at'], unique=False)
    op.add_column('jobs', sa.Column('callback_url', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'callback_url')
    op.drop_index('webhook_deliveries_status_created_idx', table_name='webhook_deliveries')
    op.drop_index('webhook_deliveries_job_created_idx', table_name='webhook_deliveries')
    op.drop_table('webhook_deliveries')
    op.drop_table('webhook_endpoints')
    op.drop_table('tenant_webhook_secrets')
