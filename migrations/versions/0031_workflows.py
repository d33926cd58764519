"""workflows: named jobs with dependencies, released by the settle of their last dependency

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-06 13:40:00.000000

Three tables (``workflows``, ``workflow_jobs``, ``workflow_edges``), ``jobs.workflow_id``
with a partial index, a fourth ``held_reason`` ('dependencies': a step whose dependencies
are not settled; pending, no outbox row), and a statement-level trigger on ``jobs``.

The trigger counts readiness in the transaction of the dependency's outcome, whatever
statement wrote it (a worker's outcome, the reaper, a cancel, a retry, the previous
release's processes during a rolling upgrade). It reads the transition tables the
tenant-usage trigger (0027) already captures for every UPDATE of ``jobs``, so it adds a
function call per statement and nothing per row of a job outside a workflow. Its work:

- the workflows of the steps that changed between unfinished and finished are locked first,
  in id order (so two statements never wait for each other's workflows), then
- a step that finished resolves its outgoing edges still ``waiting`` (satisfied or
  unsatisfiable by their policy), counts down its dependents' ``waiting``, publishes those at
  zero (job + outbox row + event), and cancels, naming the dependency, those an unsatisfiable
  edge made unreachable, and transitively their dependents (a loop here, not a recursion of
  the trigger: the cascade's own UPDATE runs with ``jobcore.workflow_cascade`` on, which
  makes the nested firing count only);
- a finished step made pending again (a retry) resets its edges and revives the dependents
  it had made unreachable, transitively;
- the workflow's counters move; at zero unsettled steps its `finally` steps are published,
  at zero open steps it is finished.

An edge's state moves only from ``waiting``, and a job's status only by a fenced statement,
so a replayed settle or a duplicate delivery changes nothing twice.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "('succeeded', 'failed', 'cancelled')"

# The settle of a dependency, applied to its edges: whether an edge of ``policy`` accepts
# an upstream that ended ``status``.
SATISFIES = """
CREATE FUNCTION jobcore_workflow_satisfies(policy text, status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $fn$
    SELECT CASE policy
               WHEN 'on_complete' THEN true
               WHEN 'on_success' THEN status = 'succeeded'
               WHEN 'on_failure' THEN status = 'failed'
               ELSE false
           END
$fn$
"""

# Every condition on a job's status here is written `(...) IS TRUE`: the same test, which no
# index answers, so the job is reached by its key whatever the statistics say (a
# workflow's jobs are mostly inserted between two runs of ANALYZE, and a plan that read
# jobs_held_idx for each of 10,000 steps made one settle take seconds). For the same
# reason the functions run with enable_seqscan off: every row they read is reached by a
# key (a step, an edge, a workflow), and a table the planner believed small (no
# statistics yet) was read whole once per element of an array of 10,000 ids; the
# setting holds while the function runs, and only changes what a plan costs.

# Publish the held steps of ``steps`` that may run now: no edge waiting, none unsatisfiable,
# their workflow not being cancelled. Each gets its attempt's message, as the enqueue
# statement writes it, and its `dependencies_met` event.
RELEASE = r"""
CREATE FUNCTION jobcore_workflow_release(steps uuid[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $fn$
DECLARE
    released integer;
BEGIN
    WITH ready AS (
        -- Each step by its keys (LATERAL ... LIMIT 1: never a join the planner may turn
        -- into a scan on statistics that saw every step waiting).
        SELECT j.id
        FROM (SELECT DISTINCT u.id FROM unnest(steps) AS u(id)) AS s
        CROSS JOIN LATERAL (
            SELECT n.workflow_id FROM workflow_jobs AS n
            WHERE n.job_id = s.id AND n.waiting = 0 AND n.blocked_by IS NULL
            LIMIT 1
        ) AS n
        CROSS JOIN LATERAL (
            SELECT w.id FROM workflows AS w
            WHERE w.id = n.workflow_id AND w.cancel_requested_at IS NULL
            LIMIT 1
        ) AS w
        JOIN jobs AS j ON j.id = s.id
        WHERE (j.status = 'pending') IS TRUE AND (j.held_reason = 'dependencies') IS TRUE
        ORDER BY j.id
        FOR UPDATE OF j
    ), go AS (
        UPDATE jobs
        SET held_reason = NULL, held_since = NULL, updated_at = now()
        FROM ready
        WHERE jobs.id = ready.id AND (jobs.status = 'pending') IS TRUE
          AND (jobs.held_reason = 'dependencies') IS TRUE
        RETURNING jobs.id, jobs.tenant, jobs.type, jobs.attempts, jobs.priority,
                  jobs.traceparent, jobs.tracestate, jobs.workflow_id, jobs.next_attempt_at
    ), message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            available_at, priority
        )
        SELECT gen_random_uuid(), w.exchange, n.routing_key, go.type,
               jsonb_strip_nulls(jsonb_build_object(
                   'traceparent', go.traceparent, 'tracestate', go.tracestate)),
               convert_to('{"v":1,"job_id":"' || go.id || '","attempt":'
                          || (go.attempts + 1) || ',"type":' || to_json(go.type)::text || '}',
                          'UTF8'),
               go.id, go.tenant, greatest(now(), coalesce(go.next_attempt_at, now())),
               go.priority
        FROM go
        JOIN workflow_jobs AS n ON n.job_id = go.id
        JOIN workflows AS w ON w.id = go.workflow_id
        RETURNING job_id
    ), events AS (
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT go.id, 'dependencies_met', go.attempts + 1,
               jsonb_build_object('workflow', go.workflow_id)
        FROM go
        WHERE current_setting('jobcore.job_events', true) IS DISTINCT FROM 'off'
        ORDER BY go.id
    )
    SELECT count(*) INTO released FROM message;
    IF released > 0 THEN
        PERFORM pg_notify('jobcore_outbox', '');
    END IF;
    RETURN released;
END
$fn$
"""

# A step finished ``status``: resolve its waiting edges, count down, cancel what became
# unreachable (transitively), publish what became ready. The caller holds the workflow.
RESOLVE = r"""
CREATE FUNCTION jobcore_workflow_resolve(step uuid, step_status text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $fn$
DECLARE
    frontier uuid[] := ARRAY[step];
    frontier_status text := step_status;
    satisfied uuid[];
    unsatisfied uuid[];
    unsatisfied_by uuid[];
    v_blocked uuid[];
    v_blocked_by uuid[];
    notified bigint;
    candidates uuid[] := '{}';
    doomed uuid[] := '{}';
    doomed_by uuid[] := '{}';
BEGIN
    LOOP
        WITH resolved AS (
            UPDATE workflow_edges AS e
            SET state = CASE WHEN jobcore_workflow_satisfies(e.policy, frontier_status)
                             THEN 'satisfied' ELSE 'unsatisfiable' END
            FROM unnest(frontier) AS f(id)
            WHERE e.upstream = f.id AND e.state = 'waiting'
            RETURNING e.upstream, e.downstream, e.state
        )
        SELECT array_agg(downstream ORDER BY downstream) FILTER (WHERE state = 'satisfied'),
               array_agg(downstream ORDER BY downstream, upstream)
                   FILTER (WHERE state = 'unsatisfiable'),
               array_agg(upstream ORDER BY downstream, upstream)
                   FILTER (WHERE state = 'unsatisfiable')
        INTO satisfied, unsatisfied, unsatisfied_by
        FROM resolved;

        IF satisfied IS NOT NULL THEN
            UPDATE workflow_jobs AS n
            SET waiting = n.waiting - s.k
            FROM (SELECT d, count(*)::int AS k FROM unnest(satisfied) AS d GROUP BY d) AS s
            WHERE n.job_id = s.d;
            candidates := candidates || satisfied;
        END IF;

        v_blocked := NULL;
        IF unsatisfied IS NOT NULL THEN
            -- A held step is unreachable; it is named for the first dependency that made it.
            WITH first_blocker AS (
                SELECT DISTINCT ON (u.d) u.d, u.b
                FROM unnest(unsatisfied, unsatisfied_by) AS u(d, b)
                ORDER BY u.d, u.b
            ), marked AS (
                UPDATE workflow_jobs AS n
                SET blocked_by = first_blocker.b
                FROM first_blocker, jobs AS j
                WHERE n.job_id = first_blocker.d AND j.id = first_blocker.d
                  AND n.blocked_by IS NULL
                  AND (j.status = 'pending') IS TRUE
                  AND (j.held_reason = 'dependencies') IS TRUE
                RETURNING n.job_id, n.blocked_by
            )
            SELECT array_agg(job_id ORDER BY job_id), array_agg(blocked_by ORDER BY job_id)
            INTO v_blocked, v_blocked_by
            FROM marked;
        END IF;
        EXIT WHEN v_blocked IS NULL;
        doomed := doomed || v_blocked;
        doomed_by := doomed_by || v_blocked_by;
        -- The unreachable steps are cancelled below: their own edges resolve as cancelled.
        frontier := v_blocked;
        frontier_status := 'cancelled';
    END LOOP;

    -- A workflow being cancelled has its pending steps cancelled by the cancel itself.
    IF cardinality(doomed) > 0 AND NOT EXISTS (
        SELECT 1 FROM workflow_jobs AS n JOIN workflows AS w ON w.id = n.workflow_id
        WHERE n.job_id = step AND w.cancel_requested_at IS NOT NULL
    ) THEN
        PERFORM set_config('jobcore.workflow_cascade', 'on', true);
        WITH cause AS (
            SELECT c.id, c.by, dn.name,
                   CASE WHEN c.by = step THEN step_status ELSE 'cancelled' END AS outcome
            FROM unnest(doomed, doomed_by) AS c(id, by)
            JOIN workflow_jobs AS dn ON dn.job_id = c.by
        ), done AS (
            UPDATE jobs
            SET status = 'cancelled', finished_at = now(), held_reason = NULL,
                held_since = NULL, updated_at = now(),
                last_error = format(
                    'unreachable: its dependency %s (job %s) %s', quote_literal(cause.name),
                    cause.by,
                    CASE cause.outcome WHEN 'cancelled' THEN 'was cancelled'
                                       ELSE cause.outcome END)
            FROM cause
            WHERE jobs.id = cause.id AND (jobs.status = 'pending') IS TRUE
              AND (jobs.held_reason = 'dependencies') IS TRUE
            RETURNING jobs.id, jobs.attempts, jobs.last_error
        ), events AS (
            INSERT INTO job_events (job_id, kind, attempt, detail)
            SELECT done.id, 'cancelled', done.attempts,
                   jsonb_build_object('status', 'cancelled', 'error', left(done.last_error, 300))
            FROM done
            WHERE current_setting('jobcore.job_events', true) IS DISTINCT FROM 'off'
            ORDER BY done.id
        )
        SELECT count(pg_notify('jobcore_job_done', done.id::text)) INTO notified
        FROM done;
        PERFORM set_config('jobcore.workflow_cascade', 'off', true);
    END IF;

    IF cardinality(candidates) > 0 THEN
        PERFORM jobcore_workflow_release(candidates);
    END IF;
END
$fn$
"""

# A finished step is pending again (retried): its edges wait for its new outcome, and the
# steps it had made unreachable wait again, transitively. The caller holds the workflow.
REOPEN = r"""
CREATE FUNCTION jobcore_workflow_reopen(step uuid) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $fn$
DECLARE
    frontier uuid[] := ARRAY[step];
    ups uuid[];
    downs uuid[];
    states text[];
    revive uuid[];
BEGIN
    LOOP
        -- The edges of the frontier whose downstream has not started: held, or cancelled
        -- as unreachable because of the frontier.
        SELECT array_agg(e.upstream), array_agg(e.downstream), array_agg(e.state)
        INTO ups, downs, states
        FROM unnest(frontier) AS f(id)
        JOIN workflow_edges AS e ON e.upstream = f.id
        JOIN workflow_jobs AS dn ON dn.job_id = e.downstream
        JOIN jobs AS d ON d.id = e.downstream
        WHERE e.state <> 'waiting'
          AND (((d.status = 'pending') IS TRUE AND (d.held_reason = 'dependencies') IS TRUE)
               OR ((d.status = 'cancelled') IS TRUE AND dn.blocked_by = f.id));
        EXIT WHEN ups IS NULL;

        UPDATE workflow_edges AS e
        SET state = 'waiting'
        FROM unnest(ups, downs) AS r(u, d)
        WHERE e.upstream = r.u AND e.downstream = r.d;

        UPDATE workflow_jobs AS n
        SET waiting = n.waiting + s.k
        FROM (
            SELECT d, count(*)::int AS k FROM unnest(downs, states) AS r(d, st)
            WHERE st = 'satisfied' GROUP BY d
        ) AS s
        WHERE n.job_id = s.d;

        -- A cancelled step another dependency also made unreachable stays cancelled,
        -- named for that one now; the others are revived.
        WITH revivable AS (
            SELECT DISTINCT dn.job_id
            FROM (SELECT DISTINCT u.id FROM unnest(downs) AS u(id)) AS r
            JOIN workflow_jobs AS dn ON dn.job_id = r.id
            JOIN jobs AS d ON d.id = dn.job_id
            WHERE (d.status = 'cancelled') IS TRUE
              AND dn.blocked_by IN (SELECT v.id FROM unnest(frontier) AS v(id))
        ), still AS (
            SELECT r.job_id, min(e.upstream::text)::uuid AS other
            FROM revivable AS r
            JOIN workflow_edges AS e ON e.downstream = r.job_id AND e.state = 'unsatisfiable'
            GROUP BY r.job_id
        ), moved AS (
            UPDATE workflow_jobs AS n SET blocked_by = still.other
            FROM still WHERE n.job_id = still.job_id
            RETURNING n.job_id
        ), freed AS (
            UPDATE workflow_jobs AS n SET blocked_by = NULL
            FROM revivable
            WHERE n.job_id = revivable.job_id
              AND NOT EXISTS (SELECT 1 FROM still WHERE still.job_id = revivable.job_id)
            RETURNING n.job_id
        )
        SELECT array_agg(job_id ORDER BY job_id) INTO revive FROM freed;
        EXIT WHEN revive IS NULL;

        PERFORM set_config('jobcore.workflow_cascade', 'on', true);
        WITH back AS (
            UPDATE jobs
            SET status = 'pending', held_reason = 'dependencies', held_since = now(),
                finished_at = NULL, cancel_requested_at = NULL, last_error = NULL,
                updated_at = now()
            FROM unnest(revive) AS r(id)
            WHERE jobs.id = r.id AND (jobs.status = 'cancelled') IS TRUE
            RETURNING jobs.id, jobs.attempts, jobs.workflow_id
        )
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT back.id, 'revived', back.attempts,
               jsonb_build_object('workflow', back.workflow_id, 'dependency', step)
        FROM back
        WHERE current_setting('jobcore.job_events', true) IS DISTINCT FROM 'off'
        ORDER BY back.id;
        PERFORM set_config('jobcore.workflow_cascade', 'off', true);
        frontier := revive;
    END LOOP;
END
$fn$
"""

# The steps of the statement that changed between unfinished and finished, in workflow
# order: lock their workflows, resolve or reopen each, then move the counters.
APPLY = r"""
CREATE FUNCTION jobcore_workflow_apply(
    ids uuid[], workflow_ids uuid[], old_statuses text[], new_statuses text[]
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $fn$
DECLARE
    cascading boolean := coalesce(current_setting('jobcore.workflow_cascade', true) = 'on', false);
    i integer;
    w record;
    finally_steps uuid[];
    cancelling uuid[];
BEGIN
    PERFORM 1 FROM workflows
    WHERE id = ANY(workflow_ids)
    ORDER BY id
    FOR NO KEY UPDATE;
    -- A workflow being cancelled publishes nothing more and is retried no more: its
    -- edges need no resolving (its cancel cancels every job not ended).
    SELECT coalesce(array_agg(id), '{}') INTO cancelling FROM workflows
    WHERE id = ANY(workflow_ids) AND cancel_requested_at IS NOT NULL;

    IF NOT cascading THEN
        FOR i IN 1 .. cardinality(ids) LOOP
            IF workflow_ids[i] = ANY(cancelling) THEN
                CONTINUE;
            END IF;
            IF new_statuses[i] IN ('succeeded', 'failed', 'cancelled') THEN
                PERFORM jobcore_workflow_resolve(ids[i], new_statuses[i]);
            ELSE
                PERFORM jobcore_workflow_reopen(ids[i]);
            END IF;
        END LOOP;
    END IF;

    FOR w IN
        SELECT c.workflow_id,
               sum(CASE WHEN n.is_finally THEN 0 WHEN c.settled THEN -1 ELSE 1 END)::int
                   AS unsettled,
               sum(CASE WHEN c.settled THEN -1 ELSE 1 END)::int AS open_jobs,
               sum(CASE WHEN c.settled AND c.new_status = 'failed' THEN 1
                        WHEN NOT c.settled AND c.old_status = 'failed' THEN -1
                        ELSE 0 END)::int AS failed_jobs
        FROM (
            SELECT u.id, u.workflow_id, u.old_status, u.new_status,
                   u.new_status IN ('succeeded', 'failed', 'cancelled') AS settled
            FROM unnest(ids, workflow_ids, old_statuses, new_statuses)
                AS u(id, workflow_id, old_status, new_status)
        ) AS c
        JOIN workflow_jobs AS n ON n.job_id = c.id
        GROUP BY c.workflow_id
        ORDER BY c.workflow_id
    LOOP
        UPDATE workflows
        SET unsettled = unsettled + w.unsettled,
            open_jobs = open_jobs + w.open_jobs,
            failed_jobs = failed_jobs + w.failed_jobs,
            status = CASE
                WHEN open_jobs + w.open_jobs > 0 THEN 'running'
                WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN failed_jobs + w.failed_jobs > 0 THEN 'failed'
                ELSE 'succeeded'
            END,
            finished_at = CASE WHEN open_jobs + w.open_jobs > 0 THEN NULL
                               ELSE coalesce(finished_at, now()) END
        WHERE id = w.workflow_id;
        IF w.unsettled < 0 THEN
            SELECT array_agg(n.job_id) INTO finally_steps
            FROM workflows AS wf
            JOIN workflow_jobs AS n ON n.workflow_id = wf.id AND n.is_finally
            WHERE wf.id = w.workflow_id AND wf.unsettled = 0;
            IF finally_steps IS NOT NULL THEN
                PERFORM jobcore_workflow_release(finally_steps);
            END IF;
        END IF;
    END LOOP;
END
$fn$
"""

TRIGGER_FUNCTION = r"""
CREATE FUNCTION jobcore_workflow_jobs_changed() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $fn$
DECLARE
    ids uuid[];
    workflow_ids uuid[];
    old_statuses text[];
    new_statuses text[];
    before_status jsonb;
BEGIN
    -- Most statements touch no finished workflow job on either side (claims, heartbeats,
    -- releases): none can have changed between unfinished and finished.
    IF NOT EXISTS (
        SELECT 1 FROM workflow_jobs_after
        WHERE workflow_id IS NOT NULL AND status IN ('succeeded', 'failed', 'cancelled')
    ) AND NOT EXISTS (
        SELECT 1 FROM workflow_jobs_before
        WHERE workflow_id IS NOT NULL AND status IN ('succeeded', 'failed', 'cancelled')
    ) THEN
        RETURN NULL;
    END IF;
    -- Each row's status before, by id: a lookup in one object, not a join of the two
    -- transition tables (which have no statistics, and were joined in a nested loop).
    SELECT jsonb_object_agg(b.id::text, b.status) INTO before_status
    FROM workflow_jobs_before AS b
    WHERE b.workflow_id IS NOT NULL;
    SELECT array_agg(c.id ORDER BY c.workflow_id, c.id),
           array_agg(c.workflow_id ORDER BY c.workflow_id, c.id),
           array_agg(c.old_status ORDER BY c.workflow_id, c.id),
           array_agg(c.status ORDER BY c.workflow_id, c.id)
    INTO ids, workflow_ids, old_statuses, new_statuses
    FROM (
        SELECT a.id, a.workflow_id, a.status, before_status ->> a.id::text AS old_status
        FROM workflow_jobs_after AS a
        WHERE a.workflow_id IS NOT NULL
    ) AS c
    WHERE (c.status IN ('succeeded', 'failed', 'cancelled'))
          IS DISTINCT FROM (c.old_status IN ('succeeded', 'failed', 'cancelled'));
    IF ids IS NOT NULL THEN
        PERFORM jobcore_workflow_apply(ids, workflow_ids, old_statuses, new_statuses);
    END IF;
    RETURN NULL;
END
$fn$
"""

FUNCTIONS = (
    "jobcore_workflow_jobs_changed()",
    "jobcore_workflow_apply(uuid[], uuid[], text[], text[])",
    "jobcore_workflow_reopen(uuid)",
    "jobcore_workflow_resolve(uuid, text)",
    "jobcore_workflow_release(uuid[])",
    "jobcore_workflow_satisfies(text, text)",
)

INDEXES = {"jobs_workflow_idx": "(workflow_id) WHERE workflow_id IS NOT NULL"}


def _verbatim(statement: str) -> sa.TextClause:
    """``statement`` as SQLAlchemy runs it unchanged: its colons are not bind parameters."""
    return sa.text(statement.replace(":", "\\:"))


def upgrade() -> None:
    # New tables and a new column in one transaction: a failure rolls all of it back, so
    # a rerun starts clean (no IF NOT EXISTS needed). The held_reason check is replaced
    # by a wider one (every value the old one admitted still passes), validated apart.
    op.execute("-- squawk-ignore-file prefer-robust-stmts\nSELECT 1")
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_table(
        "workflows",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), server_default=sa.text("'running'"), nullable=False),
        sa.Column("jobs_total", sa.Integer(), nullable=False),
        sa.Column("unsettled", sa.Integer(), nullable=False),
        sa.Column("open_jobs", sa.Integer(), nullable=False),
        sa.Column("failed_jobs", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("exchange", sa.Text(), nullable=False),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("workflows_status_check"),
        ),
        sa.CheckConstraint(
            "unsettled >= 0 AND open_jobs >= 0 AND failed_jobs >= 0",
            name=op.f("workflows_counters_check"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("workflows_pkey")),
    )
    op.create_index(
        "workflows_tenant_created_idx",
        "workflows",
        ["tenant", sa.text("created_at DESC"), sa.text("id DESC")],
    )
    op.create_index(
        "workflows_created_idx", "workflows", [sa.text("created_at DESC"), sa.text("id DESC")]
    )
    op.create_index(
        "workflows_finished_idx",
        "workflows",
        ["finished_at"],
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    )
    op.create_table(
        "workflow_jobs",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("workflow_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("is_finally", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("waiting", sa.Integer(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=False),
        sa.Column("blocked_by", postgresql.UUID(as_uuid=True), nullable=True),
        sa.CheckConstraint("waiting >= 0", name=op.f("workflow_jobs_waiting_check")),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflows.id"],
            name=op.f("workflow_jobs_workflow_id_fkey"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("workflow_jobs_pkey")),
    )
    op.create_index(
        "workflow_jobs_workflow_id_name_idx", "workflow_jobs", ["workflow_id", "name"], unique=True
    )
    op.create_table(
        "workflow_edges",
        sa.Column("workflow_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("upstream", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("downstream", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("policy", sa.Text(), server_default=sa.text("'on_success'"), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'waiting'"), nullable=False),
        sa.CheckConstraint(
            "policy IN ('on_success', 'on_complete', 'on_failure')",
            name=op.f("workflow_edges_policy_check"),
        ),
        sa.CheckConstraint(
            "state IN ('waiting', 'satisfied', 'unsatisfiable')",
            name=op.f("workflow_edges_state_check"),
        ),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflows.id"],
            name=op.f("workflow_edges_workflow_id_fkey"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("upstream", "downstream", name=op.f("workflow_edges_pkey")),
    )
    op.create_index("workflow_edges_downstream_idx", "workflow_edges", ["downstream"])
    op.create_index("workflow_edges_workflow_id_idx", "workflow_edges", ["workflow_id"])

    op.add_column("jobs", sa.Column("workflow_id", postgresql.UUID(as_uuid=True), nullable=True))
    # The held_reason check admits 'dependencies': the new constraint is added NOT VALID
    # (no scan under the lock) and validated (a scan that lets writes through).
    op.execute(
        "-- squawk-ignore ban-drop-constraint\n"
        "ALTER TABLE jobs DROP CONSTRAINT jobs_held_reason_check"
    )
    op.execute(
        "ALTER TABLE jobs ADD CONSTRAINT jobs_held_reason_check CHECK (held_reason IN "
        "('concurrency', 'rate_limit', 'ordering', 'dependencies')) NOT VALID"
    )

    for definition in (SATISFIES, RELEASE, RESOLVE, REOPEN, APPLY, TRIGGER_FUNCTION):
        op.execute(_verbatim(definition))
    op.execute(
        """
        CREATE TRIGGER jobs_workflow_update AFTER UPDATE ON jobs
        REFERENCING OLD TABLE AS workflow_jobs_before NEW TABLE AS workflow_jobs_after
        FOR EACH STATEMENT EXECUTE FUNCTION jobcore_workflow_jobs_changed()
        """
    )
    create_indexes_concurrently(INDEXES, table="jobs")
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_held_reason_check")


def downgrade() -> None:
    drop_indexes_concurrently(INDEXES)
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP TRIGGER jobs_workflow_update ON jobs")
    for signature in FUNCTIONS:
        op.execute(f"DROP FUNCTION {signature}")
    op.execute("ALTER TABLE jobs DROP CONSTRAINT jobs_held_reason_check")
    op.execute(
        "ALTER TABLE jobs ADD CONSTRAINT jobs_held_reason_check CHECK (held_reason IN "
        "('concurrency', 'rate_limit', 'ordering')) NOT VALID"
    )
    op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_held_reason_check")
    op.drop_column("jobs", "workflow_id")
    op.drop_table("workflow_edges")
    op.drop_table("workflow_jobs")
    op.drop_table("workflows")
