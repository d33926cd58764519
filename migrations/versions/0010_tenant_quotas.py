"""tenant quotas: per-tenant overrides (tenant_quotas) and the state they are checked
against (tenant_usage: the enqueue rate limit's tat and the count of unfinished jobs)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 11:00:00.000000

A tenant's count of unfinished jobs is ``tenant_usage.unfinished`` plus the sum of its
rows in ``tenant_usage_deltas``, kept by triggers on ``jobs`` (a row that is inserted,
deleted, or changes between a terminal and a non-terminal status), so every statement
that makes or ends a job keeps it exact, including operators' retries and replays, and
the enqueue checks a cap by reading one row (and the few deltas not yet folded into it)
instead of counting the tenant's jobs.

A job that ends appends a -1 to ``tenant_usage_deltas`` and locks nothing shared.
Counted on the tenants' rows, a statement that ends jobs of several tenants (a worker's
success batch, the reaper, the rescuer) took those rows in whatever order it met the
jobs, so two such statements deadlocked (X then Y against Y then X), and every worker
ending a tenant's jobs queued on that tenant's row until it committed, with the
tenant's enqueues behind them. Adding a job is counted on the row itself, under the
lock the enqueue's admission already holds, so the next admission (which waits for that
lock) sees it; the tenant's deltas are folded into the row there. The admission reads
the deltas not folded yet ``FOR UPDATE``: a delta folded (deleted) by the admission it
queued behind is then skipped rather than counted twice. A delta committed after the
admission's statement began is not seen until the next one: a job that has just ended
may count as unfinished a moment longer, never the reverse.

The only statements that still take several tenants' rows, in no set order, insert
jobs of several tenants at once or revive finished jobs (status back from terminal,
counted on the row so that the next admission sees it). jobcore does neither (an
enqueue inserts one job, a retry makes a new one); an operator's UPDATE might.

The triggers are created before the counts are filled in, in the same transaction:
creating them locks ``jobs`` against writes until the commit, so no job changes between
the count and the triggers taking over.
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
    op.create_table(
        "tenant_usage_deltas",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("delta", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "id", name=op.f("tenant_usage_deltas_pkey")),
    )
    # A job added counts on its tenant's row, which the enqueue's admission already
    # holds, so the admission after it (waiting for the lock) sees it. With the row
    # locked, the tenant's deltas are folded into it: deltas are deleted only under the
    # row's lock, which is what lets the admission skip those folded before its turn.
    # Per row, not per statement with a transition table: the enqueue adds one job a
    # statement, and the statement-level trigger (sorting the tenants of a multi-row
    # insert) cost about a fifth of one tenant's enqueue rate.
    op.execute(
        f"""
        CREATE FUNCTION jobcore_count_added_jobs() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE tenant_usage SET unfinished = unfinished + 1 WHERE tenant = NEW.tenant;
            IF NOT FOUND THEN
                INSERT INTO tenant_usage AS u (tenant, unfinished) VALUES (NEW.tenant, 1)
                ON CONFLICT (tenant) DO UPDATE SET unfinished = u.unfinished + 1;
            END IF;
            -- The row is locked now: fold the tenant's deltas, if it has any.
            IF EXISTS (SELECT 1 FROM tenant_usage_deltas WHERE tenant = NEW.tenant) THEN
                WITH folded AS (
                    DELETE FROM tenant_usage_deltas WHERE tenant = NEW.tenant RETURNING delta
                )
                UPDATE tenant_usage
                SET unfinished = greatest(
                    unfinished + coalesce((SELECT sum(delta) FROM folded), 0), 0)
                WHERE tenant = NEW.tenant;
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    # A job that ends (or an unfinished job that is deleted) appends a -1 and waits for
    # nobody. One that comes back from a terminal status counts on its row at once, so
    # an admission queued behind it sees it; no jobcore statement does that.
    op.execute(
        f"""
        CREATE FUNCTION jobcore_count_changed_job() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                INSERT INTO tenant_usage_deltas (tenant, delta) VALUES (OLD.tenant, -1);
            ELSIF NEW.status IN {TERMINAL} THEN
                INSERT INTO tenant_usage_deltas (tenant, delta) VALUES (NEW.tenant, -1);
            ELSE
                INSERT INTO tenant_usage AS u (tenant, unfinished) VALUES (NEW.tenant, 1)
                ON CONFLICT (tenant) DO UPDATE SET unfinished = u.unfinished + 1;
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER jobs_unfinished_insert AFTER INSERT ON jobs FOR EACH ROW
        WHEN (NEW.status NOT IN {TERMINAL}) EXECUTE FUNCTION jobcore_count_added_jobs()
        """
    )
    # WHEN is evaluated without calling the function: claims, heartbeats and retries
    # (non-terminal to non-terminal) cost nothing here.
    op.execute(
        f"""
        CREATE TRIGGER jobs_unfinished_update AFTER UPDATE OF status ON jobs FOR EACH ROW
        WHEN ((OLD.status IN {TERMINAL}) IS DISTINCT FROM (NEW.status IN {TERMINAL}))
        EXECUTE FUNCTION jobcore_count_changed_job()
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER jobs_unfinished_delete AFTER DELETE ON jobs FOR EACH ROW
        WHEN (OLD.status NOT IN {TERMINAL}) EXECUTE FUNCTION jobcore_count_changed_job()
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
    op.execute("DROP FUNCTION jobcore_count_changed_job()")
    op.execute("DROP FUNCTION jobcore_count_added_jobs()")
    op.drop_table("tenant_usage_deltas")
    op.drop_table("tenant_usage")
    op.drop_table("tenant_quotas")
