"""jobs_entity_created_idx: the entity index holds only the jobs that name an entity

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06 11:00:00.000000

jobs_tenant_entity_created_idx (tenant, entity_id, created_at DESC) held every job, most of
them with no entity_id, and every update of a job that is not HOT (each change of status:
status is in the predicates of partial indexes) wrote it a new entry: several index
entries per job that no query reads. Its only readers name an entity (`entity_id = ...`,
which implies `entity_id IS NOT NULL`, so the planner uses a partial index for them,
generic plans included): the same index restricted to `entity_id IS NOT NULL` serves them.
Built CONCURRENTLY under a new name before the old one is dropped CONCURRENTLY (no lock
that stops writes, through jobcore.migration_steps). Code of the previous revision works
unchanged on the new schema.
"""

from collections.abc import Sequence

from jobcore.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = '0028'
down_revision: str | None = '0027'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW = {
    'jobs_entity_created_idx': (
        "(tenant, entity_id, created_at DESC) WHERE entity_id IS NOT NULL"
    ),
}
OLD = {
    'jobs_tenant_entity_created_idx': "(tenant, entity_id, created_at DESC)",
}


def upgrade() -> None:
    create_indexes_concurrently(NEW, table="jobs")
    drop_indexes_concurrently(OLD)


def downgrade() -> None:
    create_indexes_concurrently(OLD, table="jobs")
    drop_indexes_concurrently(NEW)
