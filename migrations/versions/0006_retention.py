"""jobs: a partial index on finished jobs (status, type, finished_at), for the pruner

Revision ID: 0005_prune
Revises: 0004
Create Date: 2026-12-01 10:00:00.000000

Built inside the migration's transaction, which blocks writes to ``jobs`` while it runs
(about a second per million finished jobs). On a large table, create it beforehand with
``CREATE INDEX CONCURRENTLY`` (docs/operations.md, "Retention"); this then does nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        'jobs_finished_idx',
        'jobs',
        ['status', 'type', 'finished_at'],
        unique=False,
        postgresql_where=sa.text("status IN ('succeeded', 'failed', 'cancelled')"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index(
        'jobs_finished_idx',
        table_name='jobs',
        postgresql_where=sa.text("status IN ('succeeded', 'failed', 'cancelled')"),
    )
