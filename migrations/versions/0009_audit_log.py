"""audit_log: an append-only record of every admin action (who, when, what, outcome)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 11:00:00.000000

Rows are only inserted (jobcore.access.audit) and deleted by the pruner past
JOBCORE_AUDIT_RETENTION. A trigger refuses every UPDATE, so not even a hand-written
statement rewrites history; with separate database roles, also REVOKE UPDATE, DELETE on
it from the role the services use (docs/operations.md, "Audit log").
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target_type", sa.Text(), nullable=False),
        sa.Column("target_id", sa.Text(), nullable=True),
        sa.Column("tenant", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "outcome IN ('succeeded', 'refused')", name=op.f("audit_log_outcome_check")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("audit_log_pkey")),
    )
    op.create_index("audit_log_at_idx", "audit_log", ["at"], unique=False)
    op.execute(
        """
        CREATE FUNCTION audit_log_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'audit_log is append-only: rows are never updated';
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
        FOR EACH STATEMENT EXECUTE FUNCTION audit_log_refuse_update()
        """
    )


def downgrade() -> None:
    op.drop_table("audit_log")
    op.execute("DROP FUNCTION audit_log_refuse_update()")
