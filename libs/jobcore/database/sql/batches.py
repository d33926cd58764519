"""Statements on ``batches`` (jobcore.usecases.batches): create, lock, grow, close, read,
cancel and prune a batch, and detach a retried member.

What a member's outcome does to its batch is not here: the ``batch_members_settled``
trigger on ``jobs`` counts it in the outcome's own transaction, through ``batch_apply``
(migrations 0032 and 0037), which a close also calls (as ``batch_update``) so that counting
and firing have one author.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.database.sql import CompletionParams, Query, status_is
from jobcore.database.sql.job_events import EVENTS_ON
from jobcore.database.sql.webhook_deliveries import COMPLETION_WEBHOOKS, NOTIFY_JOB_DONE
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.states import JobStatus

BATCH_COLUMNS = """
    id, tenant, parent_id, description, total, succeeded, failed, cancelled,
    total - succeeded - failed - cancelled AS pending, first_death_job_id, success_fired,
    complete_fired, death_fired, created_at, closed_at, cancelled_at, settled_at
"""
# Its callbacks, by event: their type and the job each fired (null until it fires).
CALLBACKS_COLUMN = """
    coalesce((
        SELECT jsonb_object_agg(c.event, jsonb_build_object(
                   'type', c.spec ->> 'type', 'job_id', c.job_id))
        FROM jobcore.batch_callbacks AS c WHERE c.batch_id = batches.id
    ), '{}'::jsonb) AS callbacks
"""


class BatchInsertParams(TypedDict):
    id: uuid.UUID
    tenant: str
    parent_id: uuid.UUID | None
    description: str | None
    # Each callback's event, and its job as the trigger writes it (jobcore.usecases.batches).
    events: list[str]
    specs: list[Jsonb]


BATCH_INSERT = Query[BatchInsertParams](
    "batch_insert",
    "Create an open, empty batch with its callbacks (nothing if its id is taken: a retry).",
    """
    WITH batch AS (
        INSERT INTO jobcore.batches (id, tenant, parent_id, description)
        VALUES (%(id)s, %(tenant)s, %(parent_id)s, %(description)s)
        ON CONFLICT (id) DO NOTHING
        RETURNING id
    )
    , callbacks AS (
        INSERT INTO jobcore.batch_callbacks (batch_id, event, spec)
        SELECT batch.id, c.event, c.spec
        FROM batch, unnest(%(events)s::text[], %(specs)s::jsonb[]) AS c(event, spec)
    )
    SELECT count(*) AS created FROM batch
    """,
)


class BatchLockParams(TypedDict):
    id: uuid.UUID
    # None: whatever its tenant (operators).
    tenant: str | None


# Before a batch grows (members, a child batch), is closed or cancelled: the row lock is
# the one the members' outcomes take (batch_apply), so nothing is counted against a
# total that is still changing.
BATCH_LOCK = Query[BatchLockParams](
    "batch_lock",
    "Lock a batch (of a tenant, or any) and read it.",
    f"""
    SELECT {BATCH_COLUMNS} FROM jobcore.batches
    WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
    FOR UPDATE
    """,
)


BATCH_GET = Query[BatchLockParams](
    "batch_get",
    "Read a batch (of a tenant, or any) with its counts.",
    f"""
    SELECT {BATCH_COLUMNS}, {CALLBACKS_COLUMN} FROM jobcore.batches
    WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
    """,
)


class BatchJobIdsParams(TypedDict):
    ids: list[uuid.UUID]


BATCH_JOBS_OF = Query[BatchJobIdsParams](
    "batch_jobs_of",
    "The batch each of these jobs is in (an enqueue replayed them).",
    """
    SELECT id, batch_id FROM jobcore.jobs WHERE id = ANY(%(ids)s::uuid[])
    """,
)


class BatchGrowParams(TypedDict):
    id: uuid.UUID
    members: int


BATCH_GROW = Query[BatchGrowParams](
    "batch_grow",
    "Count new members into a locked, open batch.",
    """
    UPDATE jobcore.batches SET total = total + %(members)s, grown_at = now()
    WHERE id = %(id)s AND closed_at IS NULL
    RETURNING total
    """,
)


class BatchIdParams(TypedDict):
    id: uuid.UUID


# Through the trigger's own function: a batch closed with its members settled fires its
# callbacks in the closing transaction, and one whose last member settles later, in that
# member's.
BATCH_CLOSE = Query[BatchIdParams](
    "batch_close",
    "Close a batch (no member may join it) and fire the callbacks that now hold.",
    """
    SELECT jobcore.batch_update(%(id)s, NULL, NULL, NULL, false, true)
    """,
)


class BatchFailedJobsParams(TypedDict):
    id: uuid.UUID
    limit: int


BATCH_FAILED_JOBS = Query[BatchFailedJobsParams](
    "batch_failed_jobs",
    "The failed jobs of a batch (its own members), by id.",
    """
    SELECT id FROM jobcore.jobs WHERE batch_id = %(id)s AND status = 'failed'
    ORDER BY id LIMIT %(limit)s
    """,
)


class BatchListParams(TypedDict):
    tenant: str
    limit: int


BATCH_LIST = Query[BatchListParams](
    "batch_list",
    "The newest batches of a tenant, newest first.",
    f"""
    SELECT {BATCH_COLUMNS}, {CALLBACKS_COLUMN} FROM jobcore.batches
    WHERE tenant = %(tenant)s
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


class BatchListAllParams(TypedDict):
    limit: int


BATCH_LIST_ALL = Query[BatchListAllParams](
    "batch_list_all",
    "The newest batches of every tenant, newest first (operators).",
    f"""
    SELECT {BATCH_COLUMNS}, {CALLBACKS_COLUMN} FROM jobcore.batches
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


# Deepest first: a cancel locks each batch before its parent, as the members' outcomes do.
BATCH_TREE = Query[BatchIdParams](
    "batch_tree",
    "A batch and its descendants, deepest first.",
    """
    WITH RECURSIVE tree AS (
        SELECT id, 0 AS depth FROM jobcore.batches WHERE id = %(id)s
        UNION ALL
        SELECT c.id, tree.depth + 1 FROM jobcore.batches AS c JOIN tree ON c.parent_id = tree.id
    )
    SELECT id, depth FROM tree ORDER BY depth DESC, id
    """,
)


class BatchMarkCancelledParams(TypedDict):
    ids: list[uuid.UUID]


BATCH_MARK_CANCELLED = Query[BatchMarkCancelledParams](
    "batch_mark_cancelled",
    "Record that batches are cancelled.",
    """
    UPDATE jobcore.batches SET cancelled_at = coalesce(cancelled_at, now())
    WHERE id = ANY(%(ids)s::uuid[])
    """,
)


class BatchCancelPendingParams(CompletionParams):
    ids: list[uuid.UUID]
    limit: int


# As JOB_CANCEL_PENDING (jobcore.database.sql.jobs.cancel), for up to ``limit`` pending
# members at a time: each is counted into its batch by the trigger, and a batch row
# updated many times in one transaction keeps every version until the commit.
BATCH_CANCEL_PENDING = Query[BatchCancelPendingParams](
    "batch_cancel_pending",
    "Cancel up to `limit` pending members of batches (with their events and webhooks).",
    f"""
    WITH chosen AS (
        SELECT id FROM jobcore.jobs
        WHERE batch_id = ANY(%(ids)s::uuid[]) AND {status_is("status", JobStatus.PENDING)}
        ORDER BY batch_id, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE jobcore.jobs
        SET status = 'cancelled', cancel_requested_at = now(), finished_at = now(),
            held_reason = NULL, held_since = NULL, updated_at = now()
        WHERE id IN (SELECT id FROM chosen) AND status = 'pending'
        RETURNING id, tenant, status, callback_url, traceparent, tracestate,
                  cancel_requested_at, attempts, last_error
    ), {COMPLETION_WEBHOOKS}
    SELECT count(*) AS cancelled FROM (SELECT {NOTIFY_JOB_DONE} FROM done) AS notified
    """,
)


class BatchRequestCancelParams(TypedDict):
    channel: str
    ids: list[uuid.UUID]


BATCH_REQUEST_CANCEL = Query[BatchRequestCancelParams](
    "batch_request_cancel",
    "Ask the workers running members of batches to stop them, and NOTIFY them.",
    f"""
    WITH job AS (
        UPDATE jobcore.jobs
        SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
        WHERE batch_id = ANY(%(ids)s::uuid[]) AND {status_is("status", JobStatus.RUNNING)}
          AND cancel_requested_at IS NULL
        RETURNING id, attempts
    ), requested AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt)
        SELECT job.id, '{JobEventKind.CANCEL_REQUESTED}', job.attempts FROM job
        WHERE {EVENTS_ON}
    )
    SELECT count(pg_notify(%(channel)s, id::text)) AS requested FROM job
    """,
)


class BatchMemberDetachParams(TypedDict):
    id: uuid.UUID


# An operator's retry enqueues a copy in the failed member's place (jobcore.usecases.jobs):
# the original leaves the batch, and batch_update (BATCH_MEMBER_REOPEN) counts its slot
# unsettled again.
BATCH_MEMBER_DETACH = Query[BatchMemberDetachParams](
    "batch_member_detach",
    "Take a finished job out of its batch; its batch and former status.",
    """
    UPDATE jobcore.jobs AS j SET batch_id = NULL
    FROM jobcore.jobs AS before
    WHERE j.id = %(id)s AND before.id = j.id AND j.batch_id IS NOT NULL
      AND j.status IN ('succeeded', 'failed', 'cancelled')
    RETURNING before.batch_id, before.status
    """,
)


class BatchMemberReopenParams(TypedDict):
    batch_id: uuid.UUID
    status: str


BATCH_MEMBER_REOPEN = Query[BatchMemberReopenParams](
    "batch_member_reopen",
    "Count a settled member of a batch unsettled again (its retry runs in its place).",
    """
    SELECT jobcore.batch_update(%(batch_id)s, %(status)s, 'pending', NULL, false, false)
    """,
)


class BatchPruneParams(TypedDict):
    # Seconds a settled top-level batch is kept.
    keep: float
    limit: int


class BatchPruneCountParams(TypedDict):
    keep: float


BATCH_PRUNE_COUNT = Query[BatchPruneCountParams](
    "batch_prune_count",
    "How many top-level batches settled longer ago than `keep` seconds the pruner would delete.",
    """
    SELECT count(*) AS batches FROM jobcore.batches
    WHERE settled_at < now() - make_interval(secs => %(keep)s) AND parent_id IS NULL
    """,
)


# Whole trees, from their settled top-level batch: the members of every batch in them
# (their events, effects and deliveries go by the jobs' own cascades), then the batches
# (children by the parent key's ON DELETE CASCADE). A tree whose batch took a retried
# member back is not settled and waits.
BATCH_PRUNE = Query[BatchPruneParams](
    "batch_prune",
    "Delete up to `limit` top-level batches settled longer ago than `keep` seconds, with their "
    "descendants and every member job.",
    """
    WITH RECURSIVE roots AS (
        SELECT id FROM jobcore.batches
        WHERE settled_at < now() - make_interval(secs => %(keep)s) AND parent_id IS NULL
        ORDER BY settled_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), tree AS (
        SELECT id FROM roots
        UNION ALL
        SELECT c.id FROM jobcore.batches AS c JOIN tree ON c.parent_id = tree.id
    ), members AS (
        DELETE FROM jobcore.jobs WHERE batch_id = ANY(ARRAY(SELECT id FROM tree))
        RETURNING id
    ), gone AS (
        DELETE FROM jobcore.batches WHERE id = ANY(ARRAY(SELECT id FROM roots))
        RETURNING id
    )
    SELECT (SELECT count(*) FROM gone) AS batches, (SELECT count(*) FROM members) AS jobs
    """,
)


class BatchIdleParams(TypedDict):
    # Seconds an open batch has taken no member (since its creation, or its last member).
    idle: float


# Open and idle: no member joined for `idle` seconds. batches_open_idx reads the open ones
# created before then (grown_at, when set, is later than created_at), the rest is a filter.
# An open batch is never cancelled (a cancel closes it); saying so matches the index.
_IDLE_OPEN = """
    closed_at IS NULL AND cancelled_at IS NULL
    AND created_at < now() - make_interval(secs => %(idle)s)
    AND coalesce(grown_at, created_at) < now() - make_interval(secs => %(idle)s)
"""

BATCH_IDLE_COUNT = Query[BatchIdleParams](
    "batch_idle_count",
    "How many open batches took no member for `idle` seconds (the pruner would close them).",
    f"""
    SELECT count(*) AS batches FROM jobcore.batches WHERE {_IDLE_OPEN}
    """,
)


# One batch per statement, the oldest idle one (a batch another transaction holds is left for
# the next round): closing it locks its ancestors after it, as every writer of batches
# does, and one batch at a time is that order whatever the depths of the idle ones.
# Through the close's own function, so its callbacks fire as POST /batches/{id}/close
# would fire them: once, in this transaction, if its members have all settled, else in the
# transaction of its last member.
BATCH_CLOSE_IDLE = Query[BatchIdleParams](
    "batch_close_idle",
    "Close the oldest open batch that took no member for `idle` seconds.",
    f"""
    WITH idle AS (
        SELECT id FROM jobcore.batches
        WHERE {_IDLE_OPEN}
        ORDER BY created_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ), closed AS (
        SELECT id, jobcore.batch_update(id, NULL, NULL, NULL, false, true)::text AS done
        FROM idle
    )
    SELECT id FROM closed WHERE done IS NOT NULL
    """,
)
