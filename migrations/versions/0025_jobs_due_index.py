"""jobs_due_idx: the overdue gauge reads each queue's longest-waiting job, not every pending one

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06 09:00:00.000000

The sweeper's gauge of how long due jobs have waited
(jobcore.database.sql.jobs.reads.JOB_OVERDUE_BY_QUEUE) grouped every pending row once a minute: its
time and reads grew with the backlog. This
index holds the pending jobs no gate holds by queue and due time (greatest(created_at,
next_attempt_at)), so each queue's first entry answers it. Partial: a job is in it only
while it waits. Built CONCURRENTLY (no lock that stops writes) through
jobcore.database.migration_steps, which drops and rebuilds an INVALID index a failed build left.
Code of the previous revision works unchanged on the new schema.
"""

from collections.abc import Sequence

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "jobs_due_idx": (
        "(queue, (greatest(created_at, next_attempt_at))) "
        "WHERE status = 'pending' AND held_reason IS NULL"
    ),
}


def upgrade() -> None:
    create_indexes_concurrently(INDEXES, table="jobs")


def downgrade() -> None:
    drop_indexes_concurrently(INDEXES)
