"""outbox: the tenant of each row, and an index for the relay's fair claim

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 11:00:00.000000

The relay claims due rows round-robin across (routing key, tenant) so that one tenant's
backlog does not delay another tenant's new job (jobcore.database.sql.outbox.OUTBOX_CLAIM_FAIR).
Existing rows take their job's tenant; a row without a job (none are written today) and
any row written by a release that predates this column fall in the '' tenant: the server
default keeps such writers working during a rolling upgrade instead of failing them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: added to the catalogue, no rewrite of the table.
    op.add_column(
        "outbox", sa.Column("tenant", sa.Text(), server_default=sa.text("''"), nullable=False)
    )
    op.execute(
        """
        UPDATE outbox SET tenant = jobs.tenant
        FROM jobs
        WHERE jobs.id = outbox.job_id AND outbox.tenant = ''
        """
    )
    op.create_index(
        "outbox_fair_due_idx",
        "outbox",
        ["routing_key", "tenant", "available_at", "id"],
        unique=False,
        postgresql_where=sa.text("quarantined_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "outbox_fair_due_idx",
        table_name="outbox",
        postgresql_where=sa.text("quarantined_at IS NULL"),
    )
    op.drop_column("outbox", "tenant")
