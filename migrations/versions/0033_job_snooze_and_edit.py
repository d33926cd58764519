"""jobs.snoozes and jobs.not_before: snoozed jobs, and jobs changed in place

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-06 14:00:00.000000

`snoozes` counts the times a handler asked to run its job again later without spending
an attempt (jobcore.execution.outcomes.Snooze), so a job type's cap on them can end a job
that would snooze for ever. `not_before` is when the job's next claim may happen at the
earliest, set by a snooze and by an edit of `run_at` (PATCH /jobs/{id}): a message of the
job's attempt published before it (a copy the sweeper published, the message an edit
superseded) that arrives earlier claims nothing; the claim clears it. A NOT NULL column
with a constant default and a nullable one: no table rewrite. The short lock_timeout makes
a migration that queues behind a long transaction on `jobs` fail (run it again) rather
than stall every claim behind ADD COLUMN's ACCESS EXCLUSIVE lock. Code of the previous
revision works unchanged on the new schema (it lists its columns, and a NULL `not_before`
is what it never wrote).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column(
        "jobs", sa.Column("snoozes", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column("jobs", sa.Column("not_before", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_column("jobs", "not_before")
    op.drop_column("jobs", "snoozes")
