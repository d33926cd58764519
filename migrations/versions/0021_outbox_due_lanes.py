"""outbox: the indexes that tell the fair claim which lanes have due rows

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03 16:30:00.000000

The relay's fair claim shared a queue's room between every (routing key, tenant,
priority) lane with an unquarantined row, rows for later included, and found them with
one index probe per lane: 10,000 tenants with one delayed job each left a 50,000-row
backlog one row per claim, at 60,000 buffers a claim. It now finds the lanes of rows that
were due when written (outbox_ready_lanes_idx, a skip scan) and those of the oldest rows
written for later that are due now (outbox_later_due_idx), so lanes holding only rows
for later are not read at all (jobcore.database.sql.outbox.OUTBOX_CLAIM_FAIR).

Both indexes are built CONCURRENTLY, outside a transaction, with a short lock_timeout:
no table lock beyond the brief ones CREATE INDEX CONCURRENTLY takes, and the previous
release's claim (which uses outbox_fair_due_idx alone) keeps working during a rolling
upgrade. A build that fails leaves an INVALID index, which the next `jobcore migrate`
drops and builds again (jobcore.database.migration_steps).
"""

from collections.abc import Sequence

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "outbox_ready_lanes_idx": (
        "(routing_key, tenant, priority) "
        "WHERE quarantined_at IS NULL AND available_at <= created_at"
    ),
    "outbox_later_due_idx": (
        "(available_at, id) INCLUDE (routing_key, tenant, priority) "
        "WHERE quarantined_at IS NULL AND available_at > created_at"
    ),
}


def upgrade() -> None:
    create_indexes_concurrently(INDEXES, table="outbox")


def downgrade() -> None:
    drop_indexes_concurrently(INDEXES)
