"""cheaper job events: no foreign key to jobs, and `accepted` kept on the job row

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 17:00:00.000000

Every event insert checked its foreign key: a lookup of the job and a FOR KEY SHARE lock
on its row (WAL, and a MultiXact when a worker updates the job meanwhile), on each of
the four or more events of every job. Events now go with their job by the pruner's own
DELETE (jobcore.database.sql.jobs.JOB_PRUNE_BATCH, on the primary key (job_id, id)), and the
statements that write them only do so for a job they have just written or locked, or
(the relay's `published`) one they saw. Dropping a constraint takes a short ACCESS
EXCLUSIVE lock on both tables and rewrites nothing; code of the previous revision works
unchanged on the new schema (its events simply are no longer checked).

jobs.accepted_detail (nullable JSONB, NULL for most jobs: no run_at, no schedule) is what
the `accepted` event said: enqueue writes it with the job instead of an event row, one
index entry and one heap row fewer per job. Jobs enqueued before keep their `accepted`
row, which the timeline lists instead; a nullable column without default rewrites
nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint(op.f("job_events_job_id_fkey"), "job_events", type_="foreignkey")
    op.add_column(
        "jobs",
        sa.Column("accepted_detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    # The previous revision's timeline reads `accepted` from job_events only.
    op.execute(
        "INSERT INTO job_events (job_id, at, kind, detail) "
        "SELECT id, created_at, 'accepted', coalesce(accepted_detail, '{}'::jsonb) FROM jobs "
        "WHERE NOT EXISTS (SELECT 1 FROM job_events "
        "WHERE job_events.job_id = jobs.id AND job_events.kind = 'accepted')"
    )
    op.drop_column("jobs", "accepted_detail")
    # Events of jobs that are gone (none, unless written as a job was being pruned) would
    # refuse the constraint: they go first.
    op.execute(
        "DELETE FROM job_events WHERE NOT EXISTS "
        "(SELECT 1 FROM jobs WHERE jobs.id = job_events.job_id)"
    )
    op.create_foreign_key(
        op.f("job_events_job_id_fkey"),
        "job_events",
        "jobs",
        ["job_id"],
        ["id"],
        ondelete="CASCADE",
    )
