"""tenant usage: one delta per tenant per statement that adds or ends jobs, not one per job

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06 10:30:00.000000

Since 0023 a row-level trigger appended a +1 to ``tenant_usage_deltas`` for every job
added and a -1 for every job that ended: two rows per job, each deleted again by the usage
folder, so two dead tuples per job on that table, which a pinned xmin horizon keeps (and
every capped admission's sum walked). The triggers are now statement-level, with
transition tables: an INSERT, UPDATE or DELETE on ``jobs`` appends one row per tenant
whose count of unfinished jobs it changed, holding the change (the unfinished rows after
the statement minus those before it). A batch enqueue of 100 jobs appends one +100; the
worker's batch of successes one negative delta per tenant. The folder and the admissions
already sum ``delta``, whatever its size, so they are unchanged.

The UPDATE trigger fires for every UPDATE of ``jobs`` (PostgreSQL allows no column list
with transition tables), and appends nothing unless a row changed between unfinished and
finished: it counts the rows of the two transition tables, never joins them.

The new triggers replace the old ones under their names, in this one transaction (CREATE
OR REPLACE TRIGGER waits for the writes in flight and holds back new ones for the moment
it takes; reads go on): no statement is counted twice or not at all. The previous
release's code works unchanged on this schema: it never writes the deltas itself.
"""

from collections.abc import Sequence

from alembic import op

revision: str = '0027'
down_revision: str | None = '0026'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "('succeeded', 'failed', 'cancelled')"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"""
        CREATE FUNCTION jobcore_count_jobs_added() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO tenant_usage_deltas (tenant, delta)
            SELECT tenant, count(*) FROM added_jobs WHERE status NOT IN {TERMINAL}
            GROUP BY tenant ORDER BY tenant;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION jobcore_count_jobs_changed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO tenant_usage_deltas (tenant, delta)
            SELECT tenant, sum(delta) FROM (
                SELECT tenant, 1 AS delta FROM jobs_after WHERE status NOT IN {TERMINAL}
                UNION ALL
                SELECT tenant, -1 FROM jobs_before WHERE status NOT IN {TERMINAL}
            ) AS changes
            GROUP BY tenant HAVING sum(delta) <> 0 ORDER BY tenant;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION jobcore_count_jobs_removed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO tenant_usage_deltas (tenant, delta)
            SELECT tenant, -count(*) FROM removed_jobs WHERE status NOT IN {TERMINAL}
            GROUP BY tenant ORDER BY tenant;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE OR REPLACE TRIGGER jobs_unfinished_insert AFTER INSERT ON jobs
        REFERENCING NEW TABLE AS added_jobs FOR EACH STATEMENT
        EXECUTE FUNCTION jobcore_count_jobs_added()
        """
    )
    op.execute(
        """
        CREATE OR REPLACE TRIGGER jobs_unfinished_update AFTER UPDATE ON jobs
        REFERENCING OLD TABLE AS jobs_before NEW TABLE AS jobs_after FOR EACH STATEMENT
        EXECUTE FUNCTION jobcore_count_jobs_changed()
        """
    )
    op.execute(
        """
        CREATE OR REPLACE TRIGGER jobs_unfinished_delete AFTER DELETE ON jobs
        REFERENCING OLD TABLE AS removed_jobs FOR EACH STATEMENT
        EXECUTE FUNCTION jobcore_count_jobs_removed()
        """
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # The row-level triggers of 0010, calling 0023's functions.
    op.execute(
        f"""
        CREATE OR REPLACE TRIGGER jobs_unfinished_insert AFTER INSERT ON jobs FOR EACH ROW
        WHEN (NEW.status NOT IN {TERMINAL}) EXECUTE FUNCTION jobcore_count_added_jobs()
        """
    )
    op.execute(
        f"""
        CREATE OR REPLACE TRIGGER jobs_unfinished_update AFTER UPDATE OF status ON jobs
        FOR EACH ROW
        WHEN ((OLD.status IN {TERMINAL}) IS DISTINCT FROM (NEW.status IN {TERMINAL}))
        EXECUTE FUNCTION jobcore_count_changed_job()
        """
    )
    op.execute(
        f"""
        CREATE OR REPLACE TRIGGER jobs_unfinished_delete AFTER DELETE ON jobs FOR EACH ROW
        WHEN (OLD.status NOT IN {TERMINAL}) EXECUTE FUNCTION jobcore_count_changed_job()
        """
    )
    op.execute("DROP FUNCTION jobcore_count_jobs_removed()")
    op.execute("DROP FUNCTION jobcore_count_jobs_changed()")
    op.execute("DROP FUNCTION jobcore_count_jobs_added()")
