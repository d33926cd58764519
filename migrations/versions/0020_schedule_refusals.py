"""schedule refusals: the latest tick a schedule's enqueue was refused, and why

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03 16:30:00.000000

A tick the enqueue refuses (a live job holds the type's unique key, the tenant's quota)
is recorded on its schedule and the schedule moves past it (jobcore.scheduling), instead
of the whole round rolling back and trying again every round. Three nullable columns
without default: no table rewrite, and `schedules` has one row per schedule. The short
lock_timeout makes a migration that queues behind a long transaction on `schedules`
fail (run it again) rather than stall the scheduler behind its ACCESS EXCLUSIVE lock.
Code of the previous revision works unchanged on the new schema (it lists its columns).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0020'
down_revision: str | None = '0019'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ('last_refusal_at', 'last_refused_tick', 'last_refusal_reason')


def upgrade() -> None:
    # Fail fast (run it again) rather than queue behind a long transaction on `schedules`
    # and stall every reader of it behind ADD COLUMN's ACCESS EXCLUSIVE lock. SET LOCAL
    # lasts to the transaction's end: the migrations after this one keep the bound too.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column('schedules', sa.Column('last_refusal_at', sa.DateTime(timezone=True)))
    op.add_column('schedules', sa.Column('last_refused_tick', sa.DateTime(timezone=True)))
    op.add_column('schedules', sa.Column('last_refusal_reason', sa.Text()))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    for name in COLUMNS:
        op.drop_column('schedules', name)
