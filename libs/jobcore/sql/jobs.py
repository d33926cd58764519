"""Statements on ``jobs`` (and the outbox row written with a job)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.sql import CompletionParams, OutboxMessageParams, Query
from jobcore.sql.api_keys import ACTIVE_KEY
from jobcore.sql.webhooks import COMPLETION_WEBHOOKS, NOTIFY_JOB_DONE

# One statement writes the job, its outbox message and wakes the relays: a round trip
# per statement is the cost that matters on the enqueue path. With an idempotency key
# that is already taken, ON CONFLICT makes the job insert (and so the outbox insert)
# write nothing and return no row; the caller then reads the existing job. Without a
# callback URL the job takes the tenant's default endpoint for its type, if any (a
# primary-key probe of webhook_endpoints).


def _insert_job_with_outbox(*, by_key: bool) -> str:
    """The enqueue statement; ``by_key``: the tenant is the owner of an unrevoked API key,
    looked up in the same statement (one round trip for the API's enqueue, not two). It
    then always returns one row when the key is valid (``id`` NULL: the idempotency key
    is taken) and none when it is not."""
    if by_key:
        key = f"key AS ({ACTIVE_KEY}),"
        tenant, from_key, answer_from = "key.tenant", "FROM key", "key LEFT JOIN job ON true"
    else:
        key, tenant, from_key, answer_from = "", "%(tenant)s", "", "job"
    return f"""
    WITH {key} job AS (
        INSERT INTO jobs (
            id, tenant, type, queue, status, idempotency_key, payload_fingerprint,
            payload, entity_id, max_attempts, next_attempt_at, traceparent, tracestate,
            callback_url
        )
        SELECT
            %(id)s, {tenant}, %(type)s, %(queue)s, 'pending', %(idempotency_key)s,
            %(payload_fingerprint)s, %(payload)s, %(entity_id)s, %(max_attempts)s,
            %(run_at)s, %(traceparent)s, %(tracestate)s,
            coalesce(%(callback_url)s, (
                SELECT url FROM webhook_endpoints
                WHERE tenant = {tenant} AND job_type IN (%(type)s, '*')
                ORDER BY job_type = '*'
                LIMIT 1
            ))
        {from_key}
        ON CONFLICT (tenant, type, idempotency_key) WHERE idempotency_key IS NOT NULL
        DO NOTHING
        RETURNING id, tenant, status, created_at
    ), message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            available_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, job.id, coalesce(%(run_at)s, now())
        FROM job
        RETURNING id
    )
    SELECT {tenant} AS tenant, job.id, job.status, job.created_at,
           (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified
    FROM {answer_from}
    """


class JobInsertCommonParams(OutboxMessageParams):
    """What both enqueue statements take: the job, and its first message."""

    callback_url: str | None
    channel: str
    entity_id: str | None
    id: uuid.UUID
    idempotency_key: str | None
    max_attempts: int
    payload: Jsonb
    payload_fingerprint: str | None
    queue: str
    run_at: datetime | None
    traceparent: str | None
    tracestate: str | None
    type: str


class JobInsertParams(JobInsertCommonParams):
    tenant: str


INSERT_JOB_WITH_OUTBOX = Query[JobInsertParams](
    "insert_job_with_outbox",
    "Insert a pending job and its outbox message, and NOTIFY the relays, in one statement.",
    _insert_job_with_outbox(by_key=False),
)


class JobInsertForKeyParams(JobInsertCommonParams):
    key_hash: str


INSERT_JOB_WITH_OUTBOX_FOR_KEY = Query[JobInsertForKeyParams](
    "insert_job_with_outbox_for_key",
    "The same for the tenant of an unrevoked API key, found in the same statement.",
    _insert_job_with_outbox(by_key=True),
)


class JobGetParams(TypedDict):
    id: uuid.UUID
    tenant: str


GET_JOB = Query[JobGetParams](
    "get_job",
    "Read one job of one tenant (another tenant's job reads as missing).",
    """
    SELECT * FROM jobs WHERE id = %(id)s AND tenant = %(tenant)s
    """,
)


class JobGetAnyTenantParams(TypedDict):
    id: uuid.UUID


GET_JOB_ANY_TENANT = Query[JobGetAnyTenantParams](
    "get_job_any_tenant",
    "Read one job by id alone, for workers and operators.",
    """
    SELECT * FROM jobs WHERE id = %(id)s
    """,
)


class JobGetByIdempotencyKeyParams(TypedDict):
    idempotency_key: str | None
    tenant: str
    type: str


GET_JOB_BY_IDEMPOTENCY_KEY = Query[JobGetByIdempotencyKeyParams](
    "get_job_by_idempotency_key",
    "Find the job that already holds an idempotency key (tenant and type scoped).",
    """
    SELECT * FROM jobs
    WHERE tenant = %(tenant)s AND type = %(type)s AND idempotency_key = %(idempotency_key)s
    """,
)

# --- The API: listing, cancelling, results -------------------------------------------


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
LIST_JOBS = Query[JobListParams](
    "list_jobs",
    "One page of a tenant's jobs, newest first, after a keyset position, optionally filtered.",
    """
    SELECT id, type, status, entity_id, attempts, max_attempts, last_error,
           created_at, updated_at, started_at, finished_at, cancel_requested_at
    FROM jobs
    WHERE tenant = %(tenant)s
      AND (created_at, id) < (coalesce(%(after_created_at)s::timestamptz, 'infinity'),
                              coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


# The same page for one entity: a separate statement so jobs_tenant_entity_created_idx
# serves it (a generic plan cannot pick that index for an optional filter).
LIST_ENTITY_JOBS = Query[JobListParams](
    "list_entity_jobs",
    "One page of one entity's jobs, newest first, after a keyset position, optionally filtered.",
    """
    SELECT id, type, status, entity_id, attempts, max_attempts, last_error,
           created_at, updated_at, started_at, finished_at, cancel_requested_at
    FROM jobs
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


GET_JOB_RESULT = Query[JobGetResultParams](
    "get_job_result",
    "A tenant's job's status and where its result is (inline or in the result store).",
    """
    SELECT id, status, result, result_ref FROM jobs WHERE id = %(id)s AND tenant = %(tenant)s
    """,
)


class JobLockForCancelParams(TypedDict):
    id: uuid.UUID
    tenant: str


# Cancelling: lock the row so the status read here is the status changed below (a worker's
# claim or outcome waits for us), then change it with a fenced UPDATE.
LOCK_JOB_FOR_CANCEL = Query[JobLockForCancelParams](
    "lock_job_for_cancel",
    "Lock a tenant's job and read its status, before cancelling it.",
    """
    SELECT id, status FROM jobs WHERE id = %(id)s AND tenant = %(tenant)s FOR UPDATE
    """,
)


class JobCancelPendingParams(CompletionParams):
    id: uuid.UUID


# Ends the job, so it records the completion webhook and wakes waiters (jobcore.sql.webhooks).
CANCEL_PENDING_JOB = Query[JobCancelPendingParams](
    "cancel_pending_job",
    "Cancel a job that no worker runs yet (fenced on status = 'pending').",
    """
    WITH done AS (
        UPDATE jobs
        SET status = 'cancelled', cancel_requested_at = now(), finished_at = now(),
            updated_at = now()
        WHERE id = %(id)s AND status = 'pending'
        RETURNING id, tenant, status, callback_url, traceparent, tracestate,
                  cancel_requested_at
    ), """
    + COMPLETION_WEBHOOKS
    + """
    SELECT done.id, done.status, done.cancel_requested_at, """
    + NOTIFY_JOB_DONE
    + """
    FROM done
    """,
)

# Workers LISTEN on this channel; the payload is the job id. The worker running the job
# stops its handler and ends the job `cancelled` (fenced by its lease).
CANCEL_CHANNEL = "jobcore_cancel"


class JobRequestCancelParams(TypedDict):
    channel: str
    id: uuid.UUID


REQUEST_JOB_CANCEL = Query[JobRequestCancelParams](
    "request_job_cancel",
    "Ask the worker running a job to stop it (fenced on status = 'running') and NOTIFY it.",
    """
    WITH job AS (
        UPDATE jobs
        SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
        WHERE id = %(id)s AND status = 'running'
        RETURNING id, status, cancel_requested_at
    )
    SELECT id, status, cancel_requested_at,
           pg_notify(%(channel)s, id::text) IS NULL AS notified
    FROM job
    """,
)
