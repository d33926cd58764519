"""job_keys and jobcore_job_key_join(): debounce and throttle by key

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06 13:50:00.000000

``job_keys`` holds one row per debounce or throttle key (jobcore.kernel.keyed): the row
each enqueue of the key locks first, the job open to the key's enqueues and until when
the row is needed (the pruner deletes it after). ``jobs`` gains ``debounce_key``,
``debounce_count`` and ``debounce_payloads`` (nullable, no default: no rewrite).
``job_key_joins`` records the idempotency key of each request that joined a job, so a
retry of it is answered with that job again instead of joining twice; its rows go with
their job (ON DELETE CASCADE, as ``job_effects``).

``jobcore_job_key_join(...)`` is what an enqueue of a keyed job type runs first, inside
its one statement (jobcore.database.sql.jobs.enqueue.JOB_INSERT_KEYED): it locks the key's
row (inserting it for a new key) and then, with a snapshot taken after that lock (each
statement of a volatile function takes its own under READ COMMITTED), so it sees the job
the previous holder of the lock committed, either joins that job or names the new job the
key's open one. A single SQL statement cannot do this: its one snapshot is taken before
the lock is granted, and a job committed meanwhile stays invisible to it.

- debounce: joins the open trailing job while it is pending and was never claimed, and
  holds fewer than ``max_payloads`` payloads (payloads "all"): the payload joins it, and
  while its first message is still in the outbox and not being published (``FOR UPDATE
  SKIP LOCKED``: a relay holding it is publishing it), the job's and the message's due
  time move to ``least(now + period, first + max_wait)``. A claim racing the join waits
  for the job's row and runs the merged payload. Otherwise the new job is the key's open
  one, due ``period`` from now, and the job it replaced is named when it is running (the
  caller may cancel it).
- throttle: answers the job of the key's current period while it exists; otherwise the
  new job opens a period.

Its search_path is the one current when it is created (SET search_path FROM CURRENT), so it
reaches jobcore's tables whatever the caller's search_path is.

Additive: code of the previous revision neither reads nor writes these objects.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = (
    "jobcore_job_key_join(text, text, text, text, uuid, uuid, jsonb, double precision, "
    "double precision, text, integer, text, text)"
)

JOINED_SIGNATURE = "jobcore_job_key_joined(text, text, text, uuid, text)"

# A joining request's idempotency key, recorded with the job it joined (none: nothing).
JOINED = r"""
CREATE FUNCTION jobcore_job_key_joined(
    p_tenant text, p_type text, p_idempotency_key text, p_job_id uuid, p_fingerprint text
) RETURNS void
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $fn$
    INSERT INTO job_key_joins (tenant, type, idempotency_key, job_id, payload_fingerprint)
    SELECT p_tenant, p_type, p_idempotency_key, p_job_id, p_fingerprint
    WHERE p_idempotency_key IS NOT NULL
    ON CONFLICT DO NOTHING
$fn$
"""

JOIN = r"""
CREATE FUNCTION jobcore_job_key_join(
    p_kind text,
    p_key text,
    p_tenant text,
    p_type text,
    p_job_id uuid,
    p_message_id uuid,
    p_payload jsonb,
    p_period double precision,
    p_max_wait double precision,
    p_keep text,
    p_max_payloads integer,
    p_idempotency_key text,
    p_fingerprint text
) RETURNS TABLE (job_id uuid, joined boolean, status text, created_at timestamptz,
                 due_at timestamptz, running_job_id uuid, count integer,
                 replayed_fingerprint text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_period interval := make_interval(secs => p_period);
    v_key job_keys%ROWTYPE;
    v_due timestamptz;
    v_outbox bigint;
    v_status text;
    v_count integer;
    v_created timestamptz;
    v_running uuid;
BEGIN
    -- The lock every enqueue of the key takes first: a new key's row is written here,
    -- naming the new job; an existing one is locked (by an update that changes nothing
    -- it is read for) until the caller's transaction ends.
    INSERT INTO job_keys AS k (
        key, kind, tenant, job_id, message_id, first_at, last_at, expires_at, enqueues
    )
    VALUES (p_key, p_kind, p_tenant, p_job_id, p_message_id, v_now, v_now,
            v_now + v_period, 1)
    ON CONFLICT (key) DO UPDATE SET last_at = excluded.last_at
    RETURNING k.* INTO v_key;

    IF v_key.job_id = p_job_id THEN
        RETURN QUERY SELECT p_job_id, false, 'pending'::text, NULL::timestamptz,
            CASE WHEN p_kind = 'debounce' THEN v_now + v_period END, NULL::uuid,
            CASE WHEN p_kind = 'debounce' THEN 1 END, NULL::text;
        RETURN;
    END IF;

    -- A retry of a request that joined a job (its idempotency key recorded with it, under
    -- this same lock): answered with that job again, nothing joined twice.
    IF p_idempotency_key IS NOT NULL THEN
        RETURN QUERY
            SELECT j.job_id, true, jobs.status, jobs.created_at, NULL::timestamptz,
                   NULL::uuid, NULL::integer, j.payload_fingerprint
            FROM job_key_joins AS j JOIN jobs ON jobs.id = j.job_id
            WHERE j.tenant = p_tenant AND j.type = p_type
              AND j.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;

    IF p_kind = 'throttle' THEN
        IF v_key.first_at + v_period > v_now THEN
            SELECT jobs.status, jobs.created_at INTO v_status, v_created
            FROM jobs WHERE jobs.id = v_key.job_id;
            IF FOUND THEN
                UPDATE job_keys SET enqueues = job_keys.enqueues + 1 WHERE key = p_key;
                PERFORM jobcore_job_key_joined(
                    p_tenant, p_type, p_idempotency_key, v_key.job_id, p_fingerprint);
                RETURN QUERY SELECT v_key.job_id, true, v_status, v_created,
                    NULL::timestamptz, NULL::uuid, NULL::integer, NULL::text;
                RETURN;
            END IF;
        END IF;
        UPDATE job_keys
        SET job_id = p_job_id, message_id = p_message_id, first_at = v_now,
            expires_at = v_now + v_period, enqueues = 1
        WHERE key = p_key;
        RETURN QUERY SELECT p_job_id, false, 'pending'::text, NULL::timestamptz,
            NULL::timestamptz, NULL::uuid, NULL::integer, NULL::text;
        RETURN;
    END IF;

    -- Debounce. The open job is joined while it was never claimed: a claim that comes
    -- while this enqueue holds the job's row waits for it and runs the merged payload,
    -- and one that came first left the job running, which this update then misses. Its
    -- due time moves only while its first message still waits in the outbox and no relay
    -- holds it (SKIP LOCKED: one that does is publishing it); a message published already
    -- runs the job when delivered, or the job is held by its gates until its turn.
    SELECT outbox.id INTO v_outbox FROM outbox
    WHERE outbox.message_id = v_key.message_id
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        v_due := least(v_now + v_period, v_key.first_at + make_interval(secs => p_max_wait));
    END IF;
    UPDATE jobs
    SET next_attempt_at = coalesce(v_due, jobs.next_attempt_at),
        payload = p_payload,
        debounce_count = coalesce(jobs.debounce_count, 1) + 1,
        debounce_payloads = CASE WHEN p_keep = 'all'
            THEN coalesce(jobs.debounce_payloads, '[]'::jsonb) || jsonb_build_array(p_payload)
        END,
        updated_at = now()
    WHERE jobs.id = v_key.job_id
      AND (jobs.status = 'pending') IS TRUE
      AND jobs.attempts = 0
      AND (p_keep = 'last' OR coalesce(jobs.debounce_count, 1) < p_max_payloads)
    RETURNING jobs.debounce_count, jobs.created_at, jobs.next_attempt_at
    INTO v_count, v_created, v_due;
    IF FOUND THEN
        IF v_outbox IS NOT NULL THEN
            UPDATE outbox SET available_at = v_due WHERE outbox.id = v_outbox;
        END IF;
        UPDATE job_keys
        SET expires_at = greatest(v_due, v_key.expires_at),
            enqueues = job_keys.enqueues + 1
        WHERE key = p_key;
        PERFORM jobcore_job_key_joined(
            p_tenant, p_type, p_idempotency_key, v_key.job_id, p_fingerprint);
        RETURN QUERY SELECT v_key.job_id, true, 'pending'::text, v_created, v_due,
            NULL::uuid, v_count, NULL::text;
        RETURN;
    END IF;

    -- The open job was claimed (it runs, or ran), is full, or is gone: the new job is the
    -- next.
    SELECT jobs.id INTO v_running FROM jobs
    WHERE jobs.id = v_key.job_id AND (jobs.status = 'running') IS TRUE;
    UPDATE job_keys
    SET job_id = p_job_id, message_id = p_message_id, first_at = v_now,
        expires_at = v_now + v_period, enqueues = 1
    WHERE key = p_key;
    RETURN QUERY SELECT p_job_id, false, 'pending'::text, NULL::timestamptz,
        v_now + v_period, v_running, 1, NULL::text;
END
$fn$
"""


def _verbatim(statement: str) -> sa.TextClause:
    """``statement`` as SQLAlchemy runs it unchanged: its colons are not bind parameters."""
    return sa.text(statement.replace(":", "\\:"))


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column("jobs", sa.Column("debounce_key", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("debounce_count", sa.Integer(), nullable=True))
    op.add_column(
        "jobs", sa.Column("debounce_payloads", postgresql.JSONB(), nullable=True)
    )
    op.create_table(
        "job_keys",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("message_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("enqueues", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.CheckConstraint("kind IN ('debounce', 'throttle')", name="job_keys_kind_check"),
        sa.PrimaryKeyConstraint("key", name="job_keys_pkey"),
    )
    op.create_table(
        "job_key_joins",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("payload_fingerprint", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="job_key_joins_job_id_fkey", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "tenant", "type", "idempotency_key", name="job_key_joins_pkey"
        ),
    )
    # New, empty tables: nothing waits for these indexes' builds.
    op.create_index("job_keys_expires_at_idx", "job_keys", ["expires_at"])
    op.create_index("job_key_joins_job_id_idx", "job_key_joins", ["job_id"])
    op.execute(_verbatim(JOINED))
    op.execute(_verbatim(JOIN))


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute(f"DROP FUNCTION {JOINED_SIGNATURE}")
    op.drop_table("job_key_joins")
    op.drop_table("job_keys")
    op.drop_column("jobs", "debounce_payloads")
    op.drop_column("jobs", "debounce_count")
    op.drop_column("jobs", "debounce_key")
