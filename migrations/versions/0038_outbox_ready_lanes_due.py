"""outbox: the fair claim's lanes index carries available_at

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-06 17:00:00.000000

The relay's fair claim (jobcore.database.sql.outbox.OUTBOX_CLAIM_FAIR) starts every range
at the relay's low-water mark, so that the index entries a pinned xmin horizon keeps for
the rows already published cost it no heap fetch. Its skip scan over the lanes of ready
rows needs ``available_at`` in the index for that: outbox_ready_lanes_due_idx is
outbox_ready_lanes_idx with ``available_at`` after the lane, and replaces it. It is built
CONCURRENTLY first, then the old one is dropped CONCURRENTLY: the previous release's claim
(a skip scan on the lane's three columns) uses the new index while relays are rolled. A
build that fails leaves an INVALID index, which the next `jobcore migrate` drops and builds
again (jobcore.database.migration_steps).
"""

from collections.abc import Sequence

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0038"
down_revision: str | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

READY = "WHERE quarantined_at IS NULL AND available_at <= created_at"
NEW = {"outbox_ready_lanes_due_idx": f"(routing_key, tenant, priority, available_at) {READY}"}
OLD = {"outbox_ready_lanes_idx": f"(routing_key, tenant, priority) {READY}"}


def upgrade() -> None:
    create_indexes_concurrently(NEW, table="outbox")
    drop_indexes_concurrently(OLD)


def downgrade() -> None:
    create_indexes_concurrently(OLD, table="outbox")
    drop_indexes_concurrently(NEW)
