"""gates: the releaser finds held jobs by key, and ordering keys' blocking jobs by key

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03 16:30:00.000000

The gate releaser read every held job each round (jobcore.sql.jobs.JOB_LOCK_RELEASABLE);
it now walks the keys that have held jobs and reads, per key, only the jobs it can
release: held jobs per concurrency key, per rate key and per ordering key, oldest first,
and the jobs that block an ordering key (pending, running, failed and blocking), whose
first entry says whether the key's next job may go. Indexes only, built CONCURRENTLY
(no lock that stops writes), with a short lock_timeout so a busy table makes the
migration fail and be retried rather than queue behind a long transaction. A failed
build leaves an INVALID index: it is dropped and built again. Code of the previous
revision works unchanged on the new schema.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0022'
down_revision: str | None = '0021'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    'jobs_held_concurrency_idx': (
        "(concurrency_key, created_at, id) WHERE status = 'pending' AND held_reason = 'concurrency'"
    ),
    'jobs_held_rate_idx': (
        "(rate_key, created_at, id) WHERE status = 'pending' AND held_reason = 'rate_limit'"
    ),
    'jobs_held_ordering_idx': (
        "(tenant, ordering_key, ordering_seq) "
        "WHERE status = 'pending' AND held_reason = 'ordering'"
    ),
    'jobs_ordering_blocking_idx': (
        "(tenant, ordering_key, ordering_seq) WHERE ordering_key IS NOT NULL "
        "AND (status IN ('pending', 'running') OR (status = 'failed' AND ordering_blocks))"
    ),
}


def _invalid(name: str) -> bool:
    """Whether an earlier, interrupted CREATE INDEX CONCURRENTLY left ``name`` INVALID
    (never, when writing SQL offline: there is no database to ask)."""
    if op.get_context().as_sql:
        return False
    return bool(
        op.get_bind()
        .execute(
            sa.text(
                "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = :name AND NOT i.indisvalid"
            ),
            {"name": name},
        )
        .first()
    )


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("SET lock_timeout = '5s'")
        for name, definition in INDEXES.items():
            if _invalid(name):
                op.execute(f"DROP INDEX CONCURRENTLY {name}")
            op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON jobs {definition}")
        op.execute("RESET lock_timeout")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("SET lock_timeout = '5s'")
        for name in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        op.execute("RESET lock_timeout")
