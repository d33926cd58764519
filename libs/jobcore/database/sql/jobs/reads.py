"""Reads of jobs: one job (with what jobcore.usecases.whereabouts.whereabouts needs to say where it
is), a tenant's pages, the operators' cross-tenant list and counts, the /metrics backlog
gauges, and the long-poll waiters' LISTENs and batched re-read.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypedDict

from jobcore.database.sql import (
    NoParams,
    Query,
)
from jobcore.database.sql.flow_pauses import pause_kind
from jobcore.database.sql.job_events import (
    WHEREABOUTS_COLUMNS,
    WHEREABOUTS_JOINS,
)
from jobcore.database.sql.webhook_deliveries import JOB_DONE_CHANNEL
from jobcore.kernel.channels import JOB_PROGRESS_CHANNEL

# The version of the row a read saw: the id of the transaction that wrote it (`xmin`),
# which every change of the row replaces (a claim, a hold, an edit, a heartbeat), and a
# lock alone does not. The API's ETag, which an edit's If-Match must name
# (jobcore.database.sql.jobs.edit).
VERSION = "jobs.xmin::text AS version"


class JobGetParams(TypedDict):
    id: uuid.UUID
    tenant: str


# The job with what says where it is now (jobcore.database.sql.job_events.WHEREABOUTS_COLUMNS).
JOB_GET = Query[JobGetParams](
    "job_get",
    "Read one job of one tenant (another tenant's job reads as missing), with its whereabouts "
    "and whether its queue or type is paused.",
    f"""
    SELECT jobs.*, {pause_kind("jobs.queue", "jobs.type")} AS paused, {VERSION},
           {WHEREABOUTS_COLUMNS}
    FROM jobcore.jobs {WHEREABOUTS_JOINS}
    WHERE jobs.id = %(id)s AND jobs.tenant = %(tenant)s
    """,
)


class JobGetAnyTenantParams(TypedDict):
    id: uuid.UUID


JOB_GET_ANY_TENANT = Query[JobGetAnyTenantParams](
    "job_get_any_tenant",
    "Read one job by id alone, for workers and operators, with its whereabouts and whether "
    "it is paused.",
    f"""
    SELECT jobs.*, {pause_kind("jobs.queue", "jobs.type")} AS paused, {VERSION},
           {WHEREABOUTS_COLUMNS}
    FROM jobcore.jobs {WHEREABOUTS_JOINS}
    WHERE jobs.id = %(id)s
    """,
)


# --- the API: listing, cancelling, results ---------------------------------------------


class JobListParams(TypedDict):
    after_created_at: datetime | None
    after_id: uuid.UUID | None
    entity_id: str | None  # the entity listing requires it; the other ignores it
    limit: int
    status: str | None
    tenant: str
    type: str | None


# Keyset pagination: the page after the position (created_at, id), newest first, so
# inserts at the head never shift a page (OFFSET would repeat rows). The first page
# starts from (infinity, the largest uuid). The row comparison is an index condition on
# jobs_tenant_created_idx; payload and result stay out of lists (they can be large).
JOB_LIST = Query[JobListParams](
    "job_list",
    "One page of a tenant's jobs, newest first, after a keyset position, optionally filtered.",
    """
    SELECT id, type, status, entity_id, attempts, max_attempts, last_error,
           created_at, updated_at, started_at, finished_at, cancel_requested_at
    FROM jobcore.jobs
    WHERE tenant = %(tenant)s
      AND (created_at, id) < (coalesce(%(after_created_at)s::timestamptz, 'infinity'),
                              coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


# The same page for one entity: a separate statement so jobs_entity_created_idx
# serves it (a generic plan cannot pick that index for an optional filter).
JOB_LIST_FOR_ENTITY = Query[JobListParams](
    "job_list_for_entity",
    "One page of one entity's jobs, newest first, after a keyset position, optionally filtered.",
    """
    SELECT id, type, status, entity_id, attempts, max_attempts, last_error,
           created_at, updated_at, started_at, finished_at, cancel_requested_at
    FROM jobcore.jobs
    WHERE tenant = %(tenant)s AND entity_id = %(entity_id)s
      AND (created_at, id) < (coalesce(%(after_created_at)s::timestamptz, 'infinity'),
                              coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


class JobGetResultParams(TypedDict):
    id: uuid.UUID
    tenant: str


JOB_GET_RESULT = Query[JobGetResultParams](
    "job_get_result",
    "A tenant's job's status and where its result is (inline or in the result store).",
    """
    SELECT id, status, result, result_ref FROM jobcore.jobs
    WHERE id = %(id)s AND tenant = %(tenant)s
    """,
)


JOB_GET_PAYLOAD = Query[JobGetResultParams](
    "job_get_payload",
    "A tenant's job's payload: inline, or where it is in the result store (payload_ref).",
    """
    SELECT id, payload, payload_ref FROM jobcore.jobs WHERE id = %(id)s AND tenant = %(tenant)s
    """,
)


# --- operators (`jobcore jobs ...`, across tenants) and the /metrics backlog gauges ------


class JobListAllTenantsParams(TypedDict):
    limit: int
    status: str | None
    tenant: str | None
    type: str | None


JOB_LIST_ALL_TENANTS = Query[JobListAllTenantsParams](
    "job_list_all_tenants",
    "The newest jobs of every tenant (or one), optionally filtered by status and type.",
    """
    SELECT id, tenant, type, status, attempts, max_attempts, entity_id, last_error,
           created_at, finished_at,
           CASE WHEN status = 'pending' THEN held_reason END AS held_reason
    FROM jobcore.jobs
    WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


# Each status from its own index: the pending jobs from jobs_status_created_not_running_idx,
# the running ones from jobs_lease_expiry_idx (the status index leaves them out, migration
# 0042: `status IN ('pending', 'running')` is implied by neither index's predicate, and was
# a scan of the table).
JOB_COUNT_OPEN_BY_QUEUE = Query[NoParams](
    "job_count_open_by_queue",
    "Pending and running jobs per queue.",
    """
    WITH pending AS (
        SELECT queue, count(*) AS n FROM jobcore.jobs WHERE status = 'pending' GROUP BY queue
    ), running AS (
        SELECT queue, count(*) AS n FROM jobcore.jobs WHERE status = 'running' GROUP BY queue
    )
    SELECT queue, coalesce(pending.n, 0) AS pending, coalesce(running.n, 0) AS running
    FROM pending FULL JOIN running USING (queue)
    """,
)


# Once per sweeper round, by the maintenance leader's sweeper, for the alert on due jobs
# that wait (deploy/prometheus/alerts.yaml): a job is due from greatest(created_at,
# next_attempt_at), as JOB_LOCK_STALE counts it; gated ones wait on purpose. Served by
# jobs_due_idx (migration 0025), which holds the pending jobs no gate holds by queue and
# due time: the queues are found by a loose scan (one descent per queue), and each queue's
# first entry is its longest-waiting job, due if its time has come. A few pages per queue,
# where grouping every pending row read them all once a minute.
JOB_OVERDUE_BY_QUEUE = Query[NoParams](
    "job_overdue_by_queue",
    "Per queue, how long its longest-waiting due pending job (not held by a gate) has been due.",
    """
    WITH RECURSIVE queues AS (
        SELECT min(queue) AS queue FROM jobcore.jobs
        WHERE status = 'pending' AND held_reason IS NULL
        UNION ALL
        SELECT (SELECT min(queue) FROM jobcore.jobs
                WHERE status = 'pending' AND held_reason IS NULL AND queue > queues.queue)
        FROM queues
        WHERE queues.queue IS NOT NULL
    )
    SELECT queues.queue,
           extract(epoch FROM now() - longest.due_at)::float8 AS overdue_seconds
    FROM queues
    CROSS JOIN LATERAL (
        SELECT greatest(created_at, next_attempt_at) AS due_at
        FROM jobcore.jobs
        WHERE status = 'pending' AND held_reason IS NULL AND jobs.queue = queues.queue
        ORDER BY greatest(created_at, next_attempt_at)
        LIMIT 1
    ) AS longest
    WHERE longest.due_at <= now()
    """,
)


# --- long-poll waiters ----------------------------------------------------------------

JOB_DONE_LISTEN = Query[NoParams](
    "job_done_listen",
    "Hear jobs becoming terminal (long-poll waiters).",
    f"LISTEN {JOB_DONE_CHANNEL}",
)


JOB_PROGRESS_LISTEN = Query[NoParams](
    "job_progress_listen",
    "Hear running jobs' progress being written (long-poll waiters that asked for it).",
    f"LISTEN {JOB_PROGRESS_CHANNEL}",
)


class JobGetWaitedParams(TypedDict):
    ids: list[uuid.UUID]
    tenants: list[str]


# Waiters woken together (jobs finishing in a burst) re-read their jobs in one statement:
# one pooled checkout for the burst, not one each. Pairs, so each stays tenant-scoped.
JOB_GET_WAITED = Query[JobGetWaitedParams](
    "job_get_waited",
    "Read many tenants' jobs at once, each only for its own tenant, with their whereabouts "
    "and whether they are paused.",
    f"""
    SELECT jobs.*, {pause_kind("jobs.queue", "jobs.type")} AS paused, {VERSION},
           {WHEREABOUTS_COLUMNS}
    FROM unnest(%(ids)s::uuid[], %(tenants)s::text[]) AS waited(id, tenant)
    JOIN jobcore.jobs ON jobs.id = waited.id AND jobs.tenant = waited.tenant
    {WHEREABOUTS_JOINS}
    """,
)


JOB_HELD_COUNT = Query[NoParams](
    "job_held_count",
    "Held jobs per reason and type (what waits on a gate).",
    """
    SELECT held_reason, type, count(*) AS held
    FROM jobcore.jobs
    WHERE status = 'pending' AND held_reason IS NOT NULL
    GROUP BY held_reason, type
    ORDER BY held_reason, type
    """,
)


# --- `jobcore demo`'s summary ----------------------------------------------------------


class JobTenantParams(TypedDict):
    tenant: str


JOB_COUNT_BY_TYPE_AND_STATUS = Query[JobTenantParams](
    "demo_counts",
    "Jobs of one tenant, counted by type and status.",
    "SELECT type, status, count(*) AS n FROM jobcore.jobs WHERE tenant = %(tenant)s GROUP BY 1, 2",
)


JOB_TIMINGS = Query[JobTenantParams](
    "demo_finished",
    "Every job of one tenant with its timings and attempts.",
    """
    SELECT id, type, status, attempts,
           extract(epoch FROM started_at - created_at) AS to_start,
           extract(epoch FROM finished_at - created_at) AS to_finish
    FROM jobcore.jobs WHERE tenant = %(tenant)s
    """,
)
