"""initial schema: jobs, outbox, inbox, maintenance leases, api keys

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 07:39:43.050095
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('api_keys',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant', sa.Text(), nullable=False),
    sa.Column('key_hash', sa.Text(), nullable=False),
    sa.Column('prefix', sa.Text(), nullable=False),
    sa.Column('label', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('api_keys_pkey')),
    sa.UniqueConstraint('key_hash', name=op.f('api_keys_key_hash_key'))
    )
    op.create_index('api_keys_tenant_idx', 'api_keys', ['tenant'], unique=False)
    op.create_table('inbox',
    sa.Column('consumer', sa.Text(), nullable=False),
    sa.Column('message_id', sa.UUID(), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('consumer', 'message_id', name=op.f('inbox_pkey'))
    )
    op.create_index('inbox_received_idx', 'inbox', ['received_at'], unique=False)
    op.create_table('jobs',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant', sa.Text(), nullable=False),
    sa.Column('type', sa.Text(), nullable=False),
    sa.Column('queue', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), server_default='pending', nullable=False),
    sa.Column('idempotency_key', sa.Text(), nullable=True),
    sa.Column('payload_fingerprint', sa.Text(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('payload_ref', sa.Text(), nullable=True),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('result_ref', sa.Text(), nullable=True),
    sa.Column('entity_id', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_attempts', sa.Integer(), server_default=sa.text('5'), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('lease_token', sa.UUID(), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('worker_id', sa.Text(), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('traceparent', sa.Text(), nullable=True),
    sa.Column('tracestate', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')", name=op.f('jobs_status_check')),
    sa.CheckConstraint('attempts >= 0 AND max_attempts >= 1', name=op.f('jobs_attempts_check')),
    sa.PrimaryKeyConstraint('id', name=op.f('jobs_pkey'))
    )
    op.create_index('jobs_idempotency_uidx', 'jobs', ['tenant', 'type', 'idempotency_key'], unique=True, postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.create_index('jobs_lease_expiry_idx', 'jobs', ['lease_expires_at'], unique=False, postgresql_where=sa.text("status = 'running'"))
    op.create_index('jobs_status_created_idx', 'jobs', ['status', 'created_at'], unique=False)
    op.create_index('jobs_tenant_created_idx', 'jobs', ['tenant', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')], unique=False)
    op.create_index('jobs_tenant_entity_created_idx', 'jobs', ['tenant', 'entity_id', sa.literal_column('created_at DESC')], unique=False)
    op.create_table('maintenance_leases',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('owner', sa.Text(), nullable=False),
    sa.Column('token', sa.UUID(), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('acquired_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('maintenance_leases_pkey'))
    )
    op.create_table('outbox',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('message_id', sa.UUID(), nullable=False),
    sa.Column('exchange', sa.Text(), nullable=False),
    sa.Column('routing_key', sa.Text(), nullable=False),
    sa.Column('message_type', sa.Text(), nullable=False),
    sa.Column('headers', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('body', sa.LargeBinary(), nullable=False),
    sa.Column('ordering_key', sa.Text(), nullable=True),
    sa.Column('job_id', sa.UUID(), nullable=True),
    sa.Column('available_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('quarantined_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('outbox_pkey')),
    sa.UniqueConstraint('message_id', name=op.f('outbox_message_id_key'))
    )
    op.create_index('outbox_due_idx', 'outbox', ['available_at', 'id'], unique=False, postgresql_where=sa.text('quarantined_at IS NULL'))


def downgrade() -> None:
    op.drop_index('outbox_due_idx', table_name='outbox', postgresql_where=sa.text('quarantined_at IS NULL'))
    op.drop_table('outbox')
    op.drop_table('maintenance_leases')
    op.drop_index('jobs_tenant_entity_created_idx', table_name='jobs')
    op.drop_index('jobs_tenant_created_idx', table_name='jobs')
    op.drop_index('jobs_status_created_idx', table_name='jobs')
    op.drop_index('jobs_lease_expiry_idx', table_name='jobs', postgresql_where=sa.text("status = 'running'"))
    op.drop_index('jobs_idempotency_uidx', table_name='jobs', postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.drop_table('jobs')
    op.drop_index('inbox_received_idx', table_name='inbox')
    op.drop_table('inbox')
    op.drop_index('api_keys_tenant_idx', table_name='api_keys')
    op.drop_table('api_keys')
