"""Statements on ``jobs`` (and the outbox row written with a job)."""

from __future__ import annotations

from jobcore.sql import Query

# One statement writes the job, its outbox message and wakes the relays: a round trip
# per statement is the cost that matters on the enqueue path. With an idempotency key
# that is already taken, ON CONFLICT makes the job insert (and so the outbox insert)
# write nothing and return no row; the caller then reads the existing job.
INSERT_JOB_WITH_OUTBOX = Query(
    "insert_job_with_outbox",
    "Insert a pending job and its outbox message, and NOTIFY the relays, in one statement.",
    """
    WITH job AS (
        INSERT INTO jobs (
            id, tenant, type, queue, status, idempotency_key, payload_fingerprint,
            payload, entity_id, max_attempts, next_attempt_at, traceparent, tracestate
        ) VALUES (
            %(id)s, %(tenant)s, %(type)s, %(queue)s, 'pending', %(idempotency_key)s,
            %(payload_fingerprint)s, %(payload)s, %(entity_id)s, %(max_attempts)s,
            %(run_at)s, %(traceparent)s, %(tracestate)s
        )
        ON CONFLICT (tenant, type, idempotency_key) WHERE idempotency_key IS NOT NULL
        DO NOTHING
        RETURNING id, status, created_at
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
    SELECT job.id, job.status, job.created_at,
           (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified
    FROM job
    """,
)

GET_JOB = Query(
    "get_job",
    "Read one job of one tenant (another tenant's job reads as missing).",
    """
    SELECT * FROM jobs WHERE id = %(id)s AND tenant = %(tenant)s
    """,
)

GET_JOB_ANY_TENANT = Query(
    "get_job_any_tenant",
    "Read one job by id alone, for workers and operators.",
    """
    SELECT * FROM jobs WHERE id = %(id)s
    """,
)

GET_JOB_BY_IDEMPOTENCY_KEY = Query(
    "get_job_by_idempotency_key",
    "Find the job that already holds an idempotency key (tenant and type scoped).",
    """
    SELECT * FROM jobs
    WHERE tenant = %(tenant)s AND type = %(type)s AND idempotency_key = %(idempotency_key)s
    """,
)
