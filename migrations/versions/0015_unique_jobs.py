"""unique jobs: jobs.unique_key and the partial unique index over live jobs

Revision ID: 0015
Revises: 0011
Create Date: 2026-12-01 14:00:00.000000

At most one job per (tenant, type, unique key) is pending or running. The index covers
only live jobs with a key, so a job that ends (any statement that writes a terminal
status) leaves it in the same write, and jobs without a key never enter it. The enqueue
statement inserts with ON CONFLICT DO NOTHING, which waits for a racing insert of the
same key to commit or roll back: the rule holds across API processes without a lock of
ours. Existing jobs have no key, so the index is built empty of entries; the column is
nullable without a default (no rewrite of the table).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("unique_key", sa.Text(), nullable=True))
    op.create_index(
        "jobs_unique_uidx",
        "jobs",
        ["tenant", "type", "unique_key"],
        unique=True,
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND status IN ('pending', 'running')"
        ),
    )


def downgrade() -> None:
    op.drop_index("jobs_unique_uidx", table_name="jobs")
    op.drop_column("jobs", "unique_key")
