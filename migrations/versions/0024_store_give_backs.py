"""jobs.store_give_backs: how many times an object-store outage gave the job back

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06 07:30:00.000000

A job given back because the object store was unavailable does not spend an attempt
(jobcore.execution.outcomes.GiveBack); the count bounds that, so a store that stays away costs
attempts in the end (JOBCORE_MAX_STORE_GIVE_BACKS). A NOT NULL column with a constant
default: PostgreSQL records the default in the catalogue, with no table rewrite. The
short lock_timeout makes a migration that queues behind a long transaction on `jobs` fail
(run it again) rather than stall every claim behind ADD COLUMN's ACCESS EXCLUSIVE lock.
Code of the previous revision works unchanged on the new schema (it lists its columns).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column(
        "jobs",
        sa.Column("store_give_backs", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_column("jobs", "store_give_backs")
