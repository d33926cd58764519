"""tenant quotas: per-tenant overrides (tenant_quotas) and the state they are checked
against (tenant_usage: the enqueue rate limit's tat and the count of unfinished jobs)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 11:00:00.000000

``tenant_usage.unfinished`` is kept by triggers on ``jobs`` (a row that is inserted,
deleted, or changes between a terminal and a non-terminal status), so every statement
that makes or ends a job keeps it exact, including operators' retries and replays, and
the enqueue checks a cap by reading one row instead of counting the tenant's jobs. The
triggers are created before the counts are filled in, in the same transaction: creating
them locks ``jobs`` against writes until the commit, so no job changes between the count
and the triggers taking over.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "('succeeded', 'failed', 'cancelled')"


def upgrade() -> None:
    op.create_table(
        "tenant_quotas",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("enqueue_rate", sa.Float(), nullable=True),
        sa.Column("enqueue_burst", sa.Integer(), nullable=True),
        sa.Column("max_unfinished", sa.BigInteger(), nullable=True),
        sa.Column("max_long_polls", sa.Integer(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("enqueue_rate >= 0", name=op.f("tenant_quotas_enqueue_rate_check")),
        sa.CheckConstraint("enqueue_burst >= 1", name=op.f("tenant_quotas_enqueue_burst_check")),
        sa.CheckConstraint("max_unfinished >= 0", name=op.f("tenant_quotas_max_unfinished_check")),
        sa.CheckConstraint("max_long_polls >= 0", name=op.f("tenant_quotas_max_long_polls_check")),
        sa.PrimaryKeyConstraint("tenant", name=op.f("tenant_quotas_pkey")),
    )
    op.create_table(
        "tenant_usage",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("unfinished", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("rate_tat", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_refusal", sa.Text(), nullable=True),
        sa.Column("last_refused_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("tenant", name=op.f("tenant_usage_pkey")),
    )
    op.execute(
        f"""
        CREATE FUNCTION jobcore_count_unfinished() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            tenant_name text;
            delta integer;
        BEGIN
            IF TG_OP = 'INSERT' THEN
                tenant_name := NEW.tenant; delta := 1;
            ELSIF TG_OP = 'DELETE' THEN
                tenant_name := OLD.tenant; delta := -1;
            ELSIF NEW.status IN {TERMINAL} THEN
                tenant_name := NEW.tenant; delta := -1;
            ELSE
                tenant_name := NEW.tenant; delta := 1;
            END IF;
            INSERT INTO tenant_usage AS u (tenant, unfinished) VALUES (tenant_name, greatest(delta, 0))
            ON CONFLICT (tenant) DO UPDATE SET unfinished = greatest(u.unfinished + delta, 0);
            RETURN NULL;
        END
        $$
        """
    )
    # WHEN is evaluated without calling the function: claims, heartbeats and retries
    # (non-terminal to non-terminal) cost nothing here.
    op.execute(
        f"""
        CREATE TRIGGER jobs_unfinished_insert AFTER INSERT ON jobs FOR EACH ROW
        WHEN (NEW.status NOT IN {TERMINAL}) EXECUTE FUNCTION jobcore_count_unfinished()
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER jobs_unfinished_update AFTER UPDATE OF status ON jobs FOR EACH ROW
        WHEN ((OLD.status IN {TERMINAL}) IS DISTINCT FROM (NEW.status IN {TERMINAL}))
        EXECUTE FUNCTION jobcore_count_unfinished()
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER jobs_unfinished_delete AFTER DELETE ON jobs FOR EACH ROW
        WHEN (OLD.status NOT IN {TERMINAL}) EXECUTE FUNCTION jobcore_count_unfinished()
        """
    )
    op.execute(
        f"""
        INSERT INTO tenant_usage (tenant, unfinished)
        SELECT tenant, count(*) FROM jobs WHERE status NOT IN {TERMINAL} GROUP BY tenant
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_unfinished_delete ON jobs")
    op.execute("DROP TRIGGER jobs_unfinished_update ON jobs")
    op.execute("DROP TRIGGER jobs_unfinished_insert ON jobs")
    op.execute("DROP FUNCTION jobcore_count_unfinished()")
    op.drop_table("tenant_usage")
    op.drop_table("tenant_quotas")
