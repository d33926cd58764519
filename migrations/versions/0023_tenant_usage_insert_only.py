"""tenant usage: a job added appends to tenant_usage_deltas instead of updating its
tenant's row; the maintenance leader folds the deltas in

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 08:00:00.000000

Until now (0010) every job added updated its tenant's ``tenant_usage`` row (count + 1),
and folded the tenant's deltas into it when there were any (an ``EXISTS`` on
``tenant_usage_deltas`` per job, a second update when it found some). Behind a pinned
xmin horizon (a long transaction, a forgotten psql session) none of those versions can be
pruned: one tenant's row gathered tens of thousands of dead versions in minutes, and every
enqueue of the tenant walked them. Now a job added appends a +1, as a job that ends
appends a -1: the trigger writes no shared row and reads nothing. The maintenance
leader's usage folder (jobcore.maintenance.usage_folder) folds the deltas into the rows
every few seconds: one row version per tenant per round, whatever the job rate.

An admission that checks a cap reads the count through ``jobcore_tenant_unfinished`` (or
``jobcore_tenant_at_cap``), VOLATILE PL/pgSQL functions: called once the admission holds the tenant's row, its query
takes a snapshot of its own (READ COMMITTED), so it sees the +1 of the admission it
queued behind, committed after the enqueue statement's own snapshot was taken. The rows'
counts stay exact.

Functions only: CREATE OR REPLACE takes no lock that traffic waits for. The previous
release's code works on this schema and counts the deltas it finds; during a rolling
upgrade, its single-statement enqueue (which read the deltas with the statement's own
snapshot) may let a tenant at its cap go past it by as many jobs as that tenant's
old-release enqueues race, until the rollout ends. Its batch enqueue stays exact.

The previous release has no usage folder: from this migration until a worker of the new
release leads maintenance, the deltas are not folded. They grow by one per job added or
ended, every capped enqueue sums its tenant's, and the previous release's enqueue locks
them all. Replace the workers first, right after migrating (docs/how-to/upgrade.md); the
new leader folds the backlog in its first rounds.
"""

from collections.abc import Sequence

from alembic import op

revision: str = '0023'
down_revision: str | None = '0022'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "('succeeded', 'failed', 'cancelled')"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        """
        CREATE OR REPLACE FUNCTION jobcore_count_added_jobs() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO tenant_usage_deltas (tenant, delta) VALUES (NEW.tenant, 1);
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION jobcore_count_changed_job() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' OR NEW.status IN {TERMINAL} THEN
                INSERT INTO tenant_usage_deltas (tenant, delta)
                VALUES (CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant ELSE NEW.tenant END, -1);
            ELSE
                INSERT INTO tenant_usage_deltas (tenant, delta) VALUES (NEW.tenant, 1);
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE OR REPLACE FUNCTION jobcore_tenant_unfinished(of_tenant text) RETURNS bigint
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            RETURN coalesce((SELECT unfinished FROM tenant_usage WHERE tenant = of_tenant), 0)
                   + coalesce((SELECT sum(delta) FROM tenant_usage_deltas
                               WHERE tenant = of_tenant), 0);
        END
        $$
        """
    )
    op.execute(
        """
        CREATE OR REPLACE FUNCTION jobcore_tenant_at_cap(of_tenant text, cap bigint)
        RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            RETURN cap > 0 AND jobcore_tenant_unfinished(of_tenant) >= cap;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP FUNCTION jobcore_tenant_at_cap(text, bigint)")
    op.execute("DROP FUNCTION jobcore_tenant_unfinished(text)")
    op.execute(
        """
        CREATE OR REPLACE FUNCTION jobcore_count_added_jobs() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE tenant_usage SET unfinished = unfinished + 1 WHERE tenant = NEW.tenant;
            IF NOT FOUND THEN
                INSERT INTO tenant_usage AS u (tenant, unfinished) VALUES (NEW.tenant, 1)
                ON CONFLICT (tenant) DO UPDATE SET unfinished = u.unfinished + 1;
            END IF;
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
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION jobcore_count_changed_job() RETURNS trigger
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
