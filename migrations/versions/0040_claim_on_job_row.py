"""the claim is kept on the job row, not in a `claimed` event row

Revision ID: 0040
Revises: 0038
Create Date: 2026-12-06 17:00:00.000000

Every claim wrote a `claimed` event (worker, lease_until): a heap row and an index entry
of job_events_pkey per attempt, about a third of the timeline's bytes on the happy path.
The claim now writes what that event said on the job row it updates anyway:
``claim_lease_until`` (the lease the claim took) and, for every claim but the job's first
(whose time is ``started_at``), ``claimed_at``. The event that moves a job on to another
attempt (retry_scheduled, released, snoozed, lease_lost back to pending) carries the claim
it ends in ``detail.claim`` (at, worker, lease_until), and the timeline's readers list a
`claimed` entry from it and from the job row (jobcore.kernel.jobevents.with_claims),
where they are shown as before. Jobs claimed before, and by workers of the previous
revision during a rolling upgrade, keep their `claimed` rows, which the readers prefer.

Two nullable columns without a default rewrite nothing. The downgrade writes the
`claimed` rows back from both places, so the previous revision's readers lose nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0040"
down_revision: str | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Short: queued behind a long transaction on jobs, the ALTER would queue every enqueue
    # and claim behind itself; failing, `jobcore migrate` is run again.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column("jobs", sa.Column("claimed_at", postgresql.TIMESTAMP(timezone=True)))
    op.add_column("jobs", sa.Column("claim_lease_until", postgresql.TIMESTAMP(timezone=True)))


def downgrade() -> None:
    # The claims carried by the events that ended their attempts.
    op.execute(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) "
        "SELECT job_id, (detail->'claim'->>'at')::timestamptz, 'claimed', attempt, "
        "jsonb_build_object('worker', detail->'claim'->'worker', "
        "'lease_until', detail->'claim'->'lease_until') "
        "FROM job_events WHERE detail ? 'claim'"
    )
    op.execute("UPDATE job_events SET detail = detail - 'claim' WHERE detail ? 'claim'")
    # The claim of each job's current attempt, unless a row already says it.
    op.execute(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) "
        "SELECT id, coalesce(claimed_at, started_at), 'claimed', attempts, "
        "jsonb_build_object('worker', worker_id, 'lease_until', claim_lease_until) "
        "FROM jobs WHERE claim_lease_until IS NOT NULL AND NOT EXISTS ("
        "SELECT 1 FROM job_events WHERE job_events.job_id = jobs.id "
        "AND job_events.kind = 'claimed' AND job_events.attempt = jobs.attempts "
        "AND job_events.at >= coalesce(jobs.claimed_at, jobs.started_at))"
    )
    op.drop_column("jobs", "claim_lease_until")
    op.drop_column("jobs", "claimed_at")
