"""the tenants' job index ascending, so that a tenant's new jobs fill its pages

Revision ID: 0043
Revises: 0042
Create Date: 2026-12-07 06:30:00.000000

``jobs_tenant_created_idx`` was (tenant, created_at DESC, id DESC). A new job has the
tenant's newest created_at, so in descending order its entry goes first among the
tenant's, at the left end of their range. PostgreSQL fills a leaf page to its fill factor
(90 %) only when the page that splits is the rightmost of the whole index, and splits any
other page in half; a range that grows at its left end therefore keeps its pages half
full. Ascending, a tenant's new jobs go to the right end of its range, which for the
tenant last in key order (and for an installation of one tenant) is the index's rightmost
page: its pages fill to 90 %. Measured on 100,000 jobs of one tenant, 88.9 bytes per job
descending against 49.8 ascending; with 50 tenants, 86.8 against 86.7 (each tenant's
right end is inside the index, and splits in half either way).

Every row version of a job enters this index (it is not partial), so the claim's and the
end's versions take their place at the same spot, and bottom-up deletion removes the
older ones there before a split.

Reads are unchanged: ``ORDER BY created_at DESC, id DESC`` with ``tenant = $1`` (and the
keyset ``(created_at, id) < ($2, $3)``) is the same index read backwards.

The ascending index is built CONCURRENTLY under a new name, the descending one dropped
CONCURRENTLY, and the new one renamed to the old name (a rename takes only a SHARE UPDATE
EXCLUSIVE lock on the index: writers go on). A `jobcore migrate` stopped between the
steps runs again from where it was: the build skips an index that is there and valid,
the drop one that is gone; and nothing is dropped unless the new index is valid (an
offline script run again after a failed build would otherwise skip the INVALID index it
left, and drop the good one). Rolling upgrade: the previous revision's statements read the
new index alike.
"""

from collections.abc import Sequence

from alembic import op

from jobcore.database.migration_steps import (
    LOCK_TIMEOUT,
    create_indexes_concurrently,
    drop_indexes_concurrently,
)

revision: str = "0043"
down_revision: str | None = "0042"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "jobs_tenant_created_idx"
ASCENDING = "(tenant, created_at, id)"
DESCENDING = "(tenant, created_at DESC, id DESC)"


def _replace(definition: str, building: str) -> None:
    """Build ``definition`` as ``building``, drop the index named NAME, and give the new
    one its name."""
    # Checked valid before the drop, in the offline SQL too (valid_or_refuse).
    create_indexes_concurrently({building: definition}, table="jobs")
    drop_indexes_concurrently([NAME])
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    # No statement names the index: the planner finds it by its columns.
    op.execute(f"-- squawk-ignore renaming-object\nALTER INDEX {building} RENAME TO {NAME}")


def upgrade() -> None:
    _replace(ASCENDING, "jobs_tenant_created_asc_idx")


def downgrade() -> None:
    _replace(DESCENDING, "jobs_tenant_created_desc_idx")
