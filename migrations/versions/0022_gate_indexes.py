"""gates: the releaser finds held jobs by key, and ordering keys' blocking jobs by key

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03 16:30:00.000000

The gate releaser read every held job each round (jobcore.database.sql.jobs.JOB_LOCK_RELEASABLE);
it now walks the keys that have held jobs and reads, per key, only the jobs it can
release: held jobs per concurrency key, per rate key and per ordering key, oldest first,
and the jobs that block an ordering key (pending, running, failed and blocking), whose
first entry says whether the key's next job may go. Indexes only, built CONCURRENTLY
(no lock that stops writes), with a short lock_timeout so a busy table makes the
migration fail and be retried rather than queue behind a long transaction. A failed
build leaves an INVALID index: the next `jobcore migrate` drops it and builds it again
(jobcore.database.migration_steps). Code of the previous revision works unchanged on the new schema.
"""

from collections.abc import Sequence

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "jobs_held_concurrency_idx": (
        "(concurrency_key, created_at, id) WHERE status = 'pending' AND held_reason = 'concurrency'"
    ),
    "jobs_held_rate_idx": (
        "(rate_key, created_at, id) WHERE status = 'pending' AND held_reason = 'rate_limit'"
    ),
    "jobs_held_ordering_idx": (
        "(tenant, ordering_key, ordering_seq) WHERE status = 'pending' AND held_reason = 'ordering'"
    ),
    "jobs_ordering_blocking_idx": (
        "(tenant, ordering_key, ordering_seq) WHERE ordering_key IS NOT NULL "
        "AND (status IN ('pending', 'running') OR (status = 'failed' AND ordering_blocks))"
    ),
}


def upgrade() -> None:
    create_indexes_concurrently(INDEXES, table="jobs")


def downgrade() -> None:
    drop_indexes_concurrently(INDEXES)
