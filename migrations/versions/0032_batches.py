"""batches: groups of jobs with callbacks that fire once, counted by a trigger on jobs

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-06 14:00:00.000000

A batch (``batches``, its callbacks in ``batch_callbacks``) groups jobs (``jobs.batch_id``) and child batches
(``batches.parent_id``). Its counters of settled members are kept by one row trigger on
``jobs``, ``batch_member_settled``: it runs only for a member whose status becomes terminal
(WHEN is evaluated without calling the function, so claims, heartbeats and the jobs of no
batch cost nothing here), in the transaction of the member's outcome. Its function,
``batch_update``, locks the batch's row, counts, and when a callback's condition first
holds inserts the callback job and its outbox message as the enqueue statement writes them
(the job row is its own `accepted` event) and records it on the row. The row lock
serialises members that end at the same instant: exactly one of them sees the last count.
A child batch that settles, or whose first death is recorded, is passed on to its parent
by the same function, child row first, then parent: every writer locks a batch before its
parent, so they cannot deadlock on them.

The functions carry ``SET search_path FROM CURRENT``: they name jobcore's tables
unqualified and must find them whatever the caller's search_path is.

``jobs.batch_id`` is a nullable column with no default (catalogue only, no rewrite); the
short lock_timeout makes a migration that queues behind a long transaction on ``jobs``
fail (run it again) rather than stall every claim behind ADD COLUMN's lock. The members'
index is built CONCURRENTLY afterwards. Code of the previous revision works unchanged on
the new schema: it never names the column, and its jobs are in no batch.

The batch's row is updated once per member that settles: it holds only the counters and
what is read with them, so each of those versions is small (about 150 bytes; the
callbacks' specs, written once, are in ``batch_callbacks``), and fillfactor 50 leaves room
on its page for the updates to stay HOT.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "('succeeded', 'failed', 'cancelled')"
# The most failed job ids a callback's payload lists (its counts are exact).
FAILED_IDS_LISTED = 1000

MEMBER_INDEX = {"jobs_batch_idx": "(batch_id, status) WHERE batch_id IS NOT NULL"}

# A batch as a member of its parent: 'pending' until it is closed and every member of its
# own has settled, then 'succeeded' (all of them did), 'failed' (one failed) or
# 'cancelled'.
STATE_FUNCTION = """
CREATE FUNCTION batch_state(
    closed_at timestamptz, total integer, succeeded integer, failed integer,
    cancelled integer
) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $fn$
    SELECT CASE
        WHEN closed_at IS NULL OR succeeded + failed + cancelled < total THEN 'pending'
        WHEN succeeded = total THEN 'succeeded'
        WHEN failed > 0 THEN 'failed'
        ELSE 'cancelled'
    END
$fn$
"""

# The callback job of one event, if the batch has one, with its outbox message, as
# JOB_INSERT writes them (jobcore.database.sql.jobs.enqueue): the columns prepared at the
# batch's creation (batch_callbacks.spec, jobcore.usecases.batches), the payload given then
# with the batch's outcome under "batch". No quota is checked: the callback was admitted
# with its batch.
FIRE_FUNCTION = f"""
CREATE FUNCTION batch_fire(p_batch uuid, p_tenant text, p_event text, p_outcome jsonb)
RETURNS uuid
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_callback jsonb;
    v_id uuid := gen_random_uuid();
    v_type text;
    v_priority smallint;
    v_failed jsonb;
BEGIN
    SELECT c.spec INTO v_callback FROM batch_callbacks AS c
    WHERE c.batch_id = p_batch AND c.event = p_event;
    IF NOT FOUND THEN
        RETURN NULL;  -- no callback for this event
    END IF;
    v_type := v_callback ->> 'type';
    v_priority := (v_callback ->> 'priority')::smallint;
    WITH RECURSIVE tree AS (
        SELECT p_batch AS id
        UNION ALL
        SELECT c.id FROM batches AS c JOIN tree ON c.parent_id = tree.id
    )
    SELECT coalesce(jsonb_agg(f.id), '[]'::jsonb) INTO v_failed
    FROM (
        SELECT j.id FROM tree JOIN jobs AS j ON j.batch_id = tree.id AND j.status = 'failed'
        LIMIT {FAILED_IDS_LISTED}
    ) AS f;
    INSERT INTO jobs (
        id, tenant, type, queue, payload, max_attempts, priority,
        concurrency_key, concurrency_limit, rate_key, rate_per_second, rate_burst,
        ordering_blocks, callback_url, accepted_detail
    )
    SELECT v_id, p_tenant, v_type, v_callback ->> 'queue',
           coalesce(v_callback -> 'payload', '{{}}'::jsonb) || jsonb_build_object(
               'batch', p_outcome || jsonb_build_object(
                   'id', p_batch, 'event', p_event, 'failed_job_ids', v_failed)),
           (v_callback ->> 'max_attempts')::integer, v_priority,
           v_callback ->> 'concurrency_key', (v_callback ->> 'concurrency_limit')::integer,
           v_callback ->> 'rate_key', (v_callback ->> 'rate_per_second')::double precision,
           (v_callback ->> 'rate_burst')::integer,
           coalesce((v_callback ->> 'ordering_blocks')::boolean, true),
           (
               SELECT w.url FROM webhook_endpoints AS w
               WHERE w.tenant = p_tenant AND w.job_type IN (v_type, '*')
               ORDER BY w.job_type = '*'
               LIMIT 1
           ),
           jsonb_build_object('batch_id', p_batch, 'callback', p_event);
    INSERT INTO outbox (
        message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
        available_at, priority
    )
    VALUES (
        gen_random_uuid(), v_callback ->> 'exchange', v_callback ->> 'routing_key', v_type,
        '{{}}'::jsonb,
        convert_to('{{"v":1,"job_id":"' || v_id || '","attempt":1,"type":'
                   || to_json(v_type)::text || '}}', 'UTF8'),
        v_id, p_tenant, now(), v_priority
    );
    UPDATE batch_callbacks SET job_id = v_id, fired_at = now()
    WHERE batch_id = p_batch AND event = p_event;
    PERFORM pg_notify('jobcore_outbox', '');
    RETURN v_id;
END
$fn$
"""

# Move one member of a batch from one state to another ('pending' for unsettled, or a
# terminal status; NULL for neither: a close), record a first death, close it if asked;
# fire what now holds, once; pass a change of the batch's own state (or its first death)
# on to its parent.
UPDATE_FUNCTION = """
CREATE FUNCTION batch_update(
    p_batch uuid, p_from text, p_to text, p_job uuid, p_died boolean, p_close boolean
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
    IF p_from IS DISTINCT FROM p_to THEN
        b.succeeded := b.succeeded - (p_from = 'succeeded')::integer
                                   + (p_to = 'succeeded')::integer;
        b.failed := b.failed - (p_from = 'failed')::integer + (p_to = 'failed')::integer;
        b.cancelled := b.cancelled - (p_from = 'cancelled')::integer
                                   + (p_to = 'cancelled')::integer;
    END IF;
    IF p_died AND b.first_death_job_id IS NULL THEN
        b.first_death_job_id := p_job;
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
    IF b.parent_id IS NOT NULL AND (v_was <> v_now OR v_newly_died) THEN
        PERFORM batch_update(b.parent_id, v_was, v_now, p_job, v_newly_died, false);
    END IF;
END
$fn$
"""

TRIGGER_FUNCTION = f"""
CREATE FUNCTION batch_member_settled() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    PERFORM batch_update(
        NEW.batch_id,
        CASE WHEN OLD.status IN {TERMINAL} THEN OLD.status ELSE 'pending' END,
        NEW.status, NEW.id, NEW.status = 'failed', false);
    RETURN NULL;
END
$fn$
"""

TRIGGER = f"""
CREATE TRIGGER batch_member_settled AFTER UPDATE OF status ON jobs FOR EACH ROW
WHEN (NEW.batch_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
      AND NEW.status IN {TERMINAL})
EXECUTE FUNCTION batch_member_settled()
"""


def _verbatim(statement: str) -> sa.TextClause:
    """``statement`` as SQLAlchemy runs it unchanged: its colons are not bind parameters."""
    return sa.text(statement.replace(":", "\\:"))


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_table(
        "batches",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("parent_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("total", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("succeeded", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("failed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("cancelled", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("first_death_job_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("success_fired", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("complete_fired", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("death_fired", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "total >= 0 AND succeeded >= 0 AND failed >= 0 AND cancelled >= 0 "
            "AND succeeded + failed + cancelled <= total",
            name=op.f("batches_counts_check"),
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"],
            ["batches.id"],
            name=op.f("batches_parent_id_fkey"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("batches_pkey")),
        postgresql_with={"fillfactor": "50"},
        if_not_exists=True,
    )
    op.create_table(
        "batch_callbacks",
        sa.Column("batch_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "event IN ('success', 'complete', 'death')", name=op.f("batch_callbacks_event_check")
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.id"],
            name=op.f("batch_callbacks_batch_id_fkey"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("batch_id", "event", name=op.f("batch_callbacks_pkey")),
        if_not_exists=True,
    )
    op.create_index(
        "batches_tenant_created_idx",
        "batches",
        ["tenant", sa.text("created_at DESC"), sa.text("id DESC")],
        if_not_exists=True,
    )
    op.create_index(
        "batches_created_idx",
        "batches",
        [sa.text("created_at DESC"), sa.text("id DESC")],
        if_not_exists=True,
    )
    op.create_index(
        "batches_parent_idx",
        "batches",
        ["parent_id"],
        postgresql_where=sa.text("parent_id IS NOT NULL"),
        if_not_exists=True,
    )
    op.create_index(
        "batches_settled_idx",
        "batches",
        ["settled_at"],
        postgresql_where=sa.text("settled_at IS NOT NULL AND parent_id IS NULL"),
        if_not_exists=True,
    )
    op.add_column(
        "jobs",
        sa.Column("batch_id", postgresql.UUID(as_uuid=True), nullable=True),
        if_not_exists=True,
    )
    for statement in (STATE_FUNCTION, FIRE_FUNCTION, UPDATE_FUNCTION, TRIGGER_FUNCTION, TRIGGER):
        op.execute(_verbatim(statement))
    create_indexes_concurrently(MEMBER_INDEX, table="jobs")


def downgrade() -> None:
    drop_indexes_concurrently(MEMBER_INDEX)
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP TRIGGER batch_member_settled ON jobs")
    op.execute("DROP FUNCTION batch_member_settled()")
    op.execute("DROP FUNCTION batch_update(uuid, text, text, uuid, boolean, boolean)")
    op.execute("DROP FUNCTION batch_fire(uuid, text, text, jsonb)")
    op.execute("DROP FUNCTION batch_state(timestamptz, integer, integer, integer, integer)")
    op.drop_column("jobs", "batch_id")
    op.drop_table("batch_callbacks")
    op.drop_table("batches")
