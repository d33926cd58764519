"""batches: members counted once per statement, their batches locked in one order; idle
open batches found by the pruner

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-06 17:00:00.000000

Until now a row trigger (``batch_member_settled``, 0032) counted each member that settled,
locking its batch's row as the member's row came: a statement settling members of batches
A and B locked A then B, and another settling members of B and A in that order locked B
then A. Two such statements at once (the worker's batched successes, a cancel of several
batches) deadlocked, and PostgreSQL aborted one of them after a second. The trigger is now
per statement (``batch_members_settled``, over the statement's transition tables):

- it first locks every batch the statement's settled members are in, with their ancestors,
  deepest first and then by id. Every other writer of batch rows locks a batch before its
  parent (a close, a retried member's reopen, a member of a child batch), which is the same
  order, so writers wait for each other instead of deadlocking;
- then counts each batch once, by the sum of its members' changes (``batch_apply``), so a
  statement settling fifty members of one batch writes one version of its row, not fifty.

Callbacks still fire exactly once and after the last member commits: the counting runs in
the statement's transaction under the batch rows' locks, as before, and the fired flags
on the row are unchanged. ``batch_update`` keeps its signature (the close, the reopen and
the previous release's code call it) and is now ``batch_apply`` for one member's change.

The statement trigger runs after every UPDATE of ``jobs`` (PostgreSQL allows no column
list and no WHEN on it with transition tables), as ``jobs_unfinished_update`` (0027)
already does; it leaves at once unless the statement settled a member of a batch, which it
finds with one read of the new rows, never a join. The old trigger is dropped and the new
one created in this transaction, so no outcome is counted twice or not at all. Its
function ``batch_member_settled()`` stays, unused, for the downgrade.

``batches.grown_at`` (nullable, no default: catalogue only) is when a member last joined
an open batch; with ``batches_open_idx`` the pruner finds the open batches idle longer
than ``JOBCORE_BATCH_OPEN_TIMEOUT`` and closes them (jobcore.maintenance.retention). The
previous release's code leaves it NULL, which counts as idle since creation.

The functions carry ``SET search_path FROM CURRENT``: they name jobcore's tables
unqualified and must find them whatever the caller's search_path is.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0037"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "('succeeded', 'failed', 'cancelled')"

# Its predicate names cancelled_at (an open batch is never cancelled: a cancel closes it) so
# that BATCH_GROW's `closed_at IS NULL` does not match it: planned while no batch was open,
# the grow's generic plan took this empty index over the primary key, and would read every
# open batch once there were many.
OPEN_INDEX = {"batches_open_idx": "(created_at) WHERE closed_at IS NULL AND cancelled_at IS NULL"}

# 0032's batch_update, with the member's change as counts: what it did for one member it
# now does for any number of them. A first death is the job given in p_died (NULL: none).
APPLY_FUNCTION = """
CREATE FUNCTION batch_apply(
    p_batch uuid, p_succeeded integer, p_failed integer, p_cancelled integer,
    p_died uuid, p_close boolean
) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    b batches%ROWTYPE;
    v_was text;
    v_now text;
    v_newly_died boolean := false;
    v_outcome jsonb;
BEGIN
    SELECT * INTO b FROM batches WHERE id = p_batch FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- pruned, or deleted by hand: nothing to count
    END IF;
    v_was := batch_state(b.closed_at, b.total, b.succeeded, b.failed, b.cancelled);
    b.succeeded := b.succeeded + p_succeeded;
    b.failed := b.failed + p_failed;
    b.cancelled := b.cancelled + p_cancelled;
    IF p_died IS NOT NULL AND b.first_death_job_id IS NULL THEN
        b.first_death_job_id := p_died;
        v_newly_died := true;
    END IF;
    IF p_close AND b.closed_at IS NULL THEN
        b.closed_at := now();
    END IF;
    IF b.closed_at IS NOT NULL AND b.succeeded + b.failed + b.cancelled = b.total THEN
        b.settled_at := coalesce(b.settled_at, now());
    ELSE
        b.settled_at := NULL;
    END IF;
    IF b.closed_at IS NOT NULL THEN
        v_outcome := jsonb_build_object(
            'total', b.total, 'succeeded', b.succeeded, 'failed', b.failed,
            'cancelled', b.cancelled, 'pending', b.total - b.succeeded - b.failed - b.cancelled,
            'first_death_job_id', b.first_death_job_id);
        IF NOT b.death_fired AND b.first_death_job_id IS NOT NULL THEN
            b.death_fired := true;
            PERFORM batch_fire(b.id, b.tenant, 'death', v_outcome);
        END IF;
        IF NOT b.complete_fired AND b.settled_at IS NOT NULL THEN
            b.complete_fired := true;
            PERFORM batch_fire(b.id, b.tenant, 'complete', v_outcome);
        END IF;
        IF NOT b.success_fired AND b.succeeded = b.total THEN
            b.success_fired := true;
            PERFORM batch_fire(b.id, b.tenant, 'success', v_outcome);
        END IF;
    END IF;
    UPDATE batches
    SET succeeded = b.succeeded, failed = b.failed, cancelled = b.cancelled,
        first_death_job_id = b.first_death_job_id, closed_at = b.closed_at,
        settled_at = b.settled_at, success_fired = b.success_fired,
        complete_fired = b.complete_fired, death_fired = b.death_fired
    WHERE id = b.id;
    v_now := batch_state(b.closed_at, b.total, b.succeeded, b.failed, b.cancelled);
    -- A change of the batch's own state (or its first death) is one member's change for its
    -- parent: the parent is locked after this batch, as everywhere.
    IF b.parent_id IS NOT NULL AND (v_was <> v_now OR v_newly_died) THEN
        PERFORM batch_update(
            b.parent_id, v_was, v_now, b.first_death_job_id, v_newly_died, false);
    END IF;
END
$fn$
"""

# Same signature and meaning as 0032's: one member moved from p_from to p_to ('pending',
# a terminal status; NULL and NULL for a close).
UPDATE_FUNCTION = """
CREATE OR REPLACE FUNCTION batch_update(
    p_batch uuid, p_from text, p_to text, p_job uuid, p_died boolean, p_close boolean
) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    PERFORM batch_apply(
        p_batch,
        CASE WHEN p_from IS DISTINCT FROM p_to
             THEN (p_to IS NOT DISTINCT FROM 'succeeded')::integer
                  - (p_from IS NOT DISTINCT FROM 'succeeded')::integer
             ELSE 0 END,
        CASE WHEN p_from IS DISTINCT FROM p_to
             THEN (p_to IS NOT DISTINCT FROM 'failed')::integer
                  - (p_from IS NOT DISTINCT FROM 'failed')::integer
             ELSE 0 END,
        CASE WHEN p_from IS DISTINCT FROM p_to
             THEN (p_to IS NOT DISTINCT FROM 'cancelled')::integer
                  - (p_from IS NOT DISTINCT FROM 'cancelled')::integer
             ELSE 0 END,
        CASE WHEN p_died THEN p_job END,
        p_close);
END
$fn$
"""

# Batches are locked in one order by everyone: deeper first (a batch before its parent,
# which is what batch_apply's passing-on does), then by id. A batch's depth is the number
# of its ancestors; parent_id never changes, so it needs no lock to read.
LOCK_FUNCTION = """
CREATE FUNCTION batch_lock_in_order(p_batches uuid[]) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    PERFORM 1
    FROM batches AS b
    JOIN (
        WITH RECURSIVE up(id, parent_id, start, steps) AS (
            SELECT s.id, s.parent_id, s.id, 0 FROM batches AS s WHERE s.id = ANY(p_batches)
            UNION ALL
            SELECT p.id, p.parent_id, up.start, up.steps + 1
            FROM batches AS p JOIN up ON p.id = up.parent_id
        )
        SELECT DISTINCT id, max(steps) OVER (PARTITION BY start) - steps AS depth FROM up
    ) AS d ON d.id = b.id
    ORDER BY d.depth DESC, b.id
    FOR UPDATE OF b;
END
$fn$
"""

STATEMENT_FUNCTION = f"""
CREATE FUNCTION batch_members_settled() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_batches uuid[];
    v_succeeded integer[];
    v_failed integer[];
    v_cancelled integer[];
    v_died uuid[];
BEGIN
    -- Most UPDATEs of jobs settle no member of a batch (claims, heartbeats, jobs of no
    -- batch): one read of the new rows, and done.
    IF NOT EXISTS (
        SELECT 1 FROM settled_after WHERE batch_id IS NOT NULL AND status IN {TERMINAL}
    ) THEN
        RETURN NULL;
    END IF;
    -- Each batch's change: its members that became terminal, from whatever they were.
    SELECT array_agg(c.batch_id ORDER BY c.batch_id),
           array_agg(c.succeeded ORDER BY c.batch_id),
           array_agg(c.failed ORDER BY c.batch_id),
           array_agg(c.cancelled ORDER BY c.batch_id),
           array_agg(c.died ORDER BY c.batch_id)
    INTO v_batches, v_succeeded, v_failed, v_cancelled, v_died
    FROM (
        SELECT n.batch_id,
               sum((n.status = 'succeeded')::integer - (o.status = 'succeeded')::integer)
                   ::integer AS succeeded,
               sum((n.status = 'failed')::integer - (o.status = 'failed')::integer)
                   ::integer AS failed,
               sum((n.status = 'cancelled')::integer - (o.status = 'cancelled')::integer)
                   ::integer AS cancelled,
               (array_agg(n.id ORDER BY n.id) FILTER (WHERE n.status = 'failed'))[1] AS died
        FROM settled_after AS n JOIN settled_before AS o ON o.id = n.id
        WHERE n.batch_id IS NOT NULL AND n.status IN {TERMINAL}
          AND o.status IS DISTINCT FROM n.status
        GROUP BY n.batch_id
    ) AS c;
    IF v_batches IS NULL THEN
        RETURN NULL;
    END IF;
    -- All of them, and their ancestors, locked in the one order before any is counted. One
    -- batch (an outcome of one job, most often) needs no look: batch_apply locks it, then
    -- its ancestors, which is that order.
    IF cardinality(v_batches) > 1 THEN
        PERFORM batch_lock_in_order(v_batches);
    END IF;
    FOR i IN 1 .. cardinality(v_batches) LOOP
        PERFORM batch_apply(
            v_batches[i], v_succeeded[i], v_failed[i], v_cancelled[i], v_died[i], false);
    END LOOP;
    RETURN NULL;
END
$fn$
"""

TRIGGER = """
CREATE TRIGGER batch_members_settled AFTER UPDATE ON jobs
REFERENCING OLD TABLE AS settled_before NEW TABLE AS settled_after
FOR EACH STATEMENT EXECUTE FUNCTION batch_members_settled()
"""

# 0032's row trigger, for the downgrade (its function was kept).
ROW_TRIGGER = f"""
CREATE TRIGGER batch_member_settled AFTER UPDATE OF status ON jobs FOR EACH ROW
WHEN (NEW.batch_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
      AND NEW.status IN {TERMINAL})
EXECUTE FUNCTION batch_member_settled()
"""


def _verbatim(statement: str) -> sa.TextClause:
    """``statement`` as SQLAlchemy runs it unchanged: its colons are not bind parameters."""
    return sa.text(statement.replace(":", "\\:"))


def _previous_update_function() -> str:
    """0032's batch_update, which the downgrade puts back."""
    path = Path(__file__).with_name("0032_batches.py")
    spec = importlib.util.spec_from_file_location("jobcore_migration_0032", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    definition: str = module.UPDATE_FUNCTION
    return definition.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column(
        "batches",
        sa.Column("grown_at", sa.DateTime(timezone=True), nullable=True),
        if_not_exists=True,
    )
    for statement in (APPLY_FUNCTION, UPDATE_FUNCTION, LOCK_FUNCTION, STATEMENT_FUNCTION):
        op.execute(_verbatim(statement))
    op.execute("DROP TRIGGER batch_member_settled ON jobs")
    op.execute(_verbatim(TRIGGER))
    create_indexes_concurrently(OPEN_INDEX, table="batches")


def downgrade() -> None:
    drop_indexes_concurrently(OPEN_INDEX)
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP TRIGGER batch_members_settled ON jobs")
    op.execute(_verbatim(ROW_TRIGGER))
    op.execute(_verbatim(_previous_update_function()))
    op.execute("DROP FUNCTION batch_members_settled()")
    op.execute("DROP FUNCTION batch_lock_in_order(uuid[])")
    op.execute("DROP FUNCTION batch_apply(uuid, integer, integer, integer, uuid, boolean)")
    op.drop_column("batches", "grown_at")
