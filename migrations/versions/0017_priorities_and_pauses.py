"""jobs and outbox: priority; flow_pauses: paused queues and job types

Revision ID: 0017
Revises: 0014
Create Date: 2026-12-01 15:00:00.000000

A job's priority (jobcore.kernel.priorities) is copied onto each of its outbox messages; the
relay's fair claim takes (routing key, tenant, priority) lanes, so outbox_fair_due_idx
gains the priority column (dropped and created again: on a large outbox, build the new
index CONCURRENTLY by hand first, see docs/operations.md). The constant defaults add the
columns without rewriting the tables, and keep writers of an older release working during
a rolling upgrade (their rows are normal priority). flow_pauses is a new, empty table.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
    )
    op.create_check_constraint(op.f("jobs_priority_check"), "jobs", "priority BETWEEN 0 AND 2")
    op.add_column(
        "outbox",
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
    )
    op.drop_index(
        "outbox_fair_due_idx",
        table_name="outbox",
        postgresql_where=sa.text("quarantined_at IS NULL"),
    )
    op.create_index(
        "outbox_fair_due_idx",
        "outbox",
        ["routing_key", "tenant", "priority", "available_at", "id"],
        unique=False,
        postgresql_where=sa.text("quarantined_at IS NULL"),
    )
    op.create_table(
        "flow_pauses",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused_by", sa.Text(), nullable=False),
        sa.Column(
            "paused_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint("kind IN ('queue', 'type')", name=op.f("flow_pauses_kind_check")),
        sa.PrimaryKeyConstraint("kind", "name", name=op.f("flow_pauses_pkey")),
    )


def downgrade() -> None:
    op.drop_table("flow_pauses")
    op.drop_index(
        "outbox_fair_due_idx",
        table_name="outbox",
        postgresql_where=sa.text("quarantined_at IS NULL"),
    )
    op.create_index(
        "outbox_fair_due_idx",
        "outbox",
        ["routing_key", "tenant", "available_at", "id"],
        unique=False,
        postgresql_where=sa.text("quarantined_at IS NULL"),
    )
    op.drop_column("outbox", "priority")
    op.drop_constraint(op.f("jobs_priority_check"), "jobs", type_="check")
    op.drop_column("jobs", "priority")
