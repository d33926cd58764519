"""Statements the worker runs: receive + claim, heartbeat, fenced outcomes, the reaper, the
rescuer and the maintenance lease.

Each hot-path statement is one round trip and one transaction (a single statement in
autocommit mode is atomic): the inbox insert and the claim, or an outcome and the outbox
row of a retry, commit together or not at all. Every write after the claim is fenced by
``status = 'running' AND lease_token = <the token the claim handed out>``.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.sql import CompletionParams, NoParams, OutboxMessageParams, Query
from jobcore.sql.webhooks import COMPLETION_WEBHOOKS, JOB_DONE_CHANNEL, NOTIFY_JOB_DONE

# The API sends the job id here when a running job's cancellation is requested (after
# setting cancel_requested_at, which heartbeats also check: a NOTIFY can be missed).
CANCEL_CHANNEL = "jobcore_cancel"

JOBS_CONSUMER = "jobs"

LISTEN_CANCEL = Query[NoParams](
    "listen_cancel", "Hear cancel requests for running jobs.", f"LISTEN {CANCEL_CHANNEL}"
)
UNLISTEN_CANCEL = Query[NoParams](
    "unlisten_cancel",
    "Stop hearing cancel requests before a connection returns to the pool.",
    f"UNLISTEN {CANCEL_CHANNEL}",
)


class JobClaimManyParams(TypedDict):
    attempts: list[int]
    consumer: str
    job_ids: list[uuid.UUID]
    lease_tokens: list[uuid.UUID]
    leases: list[float]
    message_ids: list[uuid.UUID]
    types: list[str]
    worker_id: str


# Claims arrive in batches (the deliveries that came in while the previous batch was
# committing): one statement and one commit for all of them; the caller passes parallel
# arrays with distinct message ids. Per message: the inbox insert decides whether it was
# seen before (a conflict: a redelivery or a re-published outbox row), and only a fresh
# message claims its job. The fence `attempts + 1 = <the envelope's attempt>` lets
# exactly one message run each attempt: every transition to pending writes one message
# numbered attempts + 1, so a stale message for an older attempt (whose inbox row was
# pruned, or a copy of a message the job has moved past) finds the job further along and
# does nothing. `status_before` is what the job was when the statement began.
RECEIVE_AND_CLAIM = Query[JobClaimManyParams](
    "receive_and_claim",
    "Record messages in the inbox and, for the new ones, claim their pending jobs under leases.",
    """
    WITH input AS (
        SELECT *
        FROM unnest(
            %(message_ids)s::uuid[], %(job_ids)s::uuid[], %(types)s::text[],
            %(attempts)s::int[], %(lease_tokens)s::uuid[], %(leases)s::float8[]
        ) AS i(message_id, job_id, type, attempt, lease_token, lease)
    ), received AS (
        INSERT INTO inbox (consumer, message_id)
        SELECT %(consumer)s, message_id FROM input
        ON CONFLICT DO NOTHING
        RETURNING message_id
    ), claimed AS (
        UPDATE jobs
        SET status = 'running',
            attempts = jobs.attempts + 1,
            lease_token = input.lease_token,
            lease_expires_at = now() + make_interval(secs => input.lease),
            worker_id = %(worker_id)s,
            started_at = coalesce(jobs.started_at, now()),
            updated_at = now()
        FROM input JOIN received USING (message_id)
        WHERE jobs.id = input.job_id
          AND jobs.status = 'pending'
          AND jobs.type = input.type
          AND jobs.attempts + 1 = input.attempt
        RETURNING input.message_id, input.lease_token, jobs.id, jobs.payload, jobs.attempts,
                  jobs.max_attempts, jobs.cancel_requested_at, jobs.traceparent,
                  jobs.tracestate, jobs.created_at,
                  greatest(jobs.created_at, jobs.next_attempt_at) AS due_at
    )
    SELECT input.message_id,
           received.message_id IS NOT NULL AS fresh,
           before.status AS status_before,
           claimed.id, claimed.lease_token, claimed.payload, claimed.attempts,
           claimed.max_attempts, claimed.cancel_requested_at, claimed.traceparent,
           claimed.tracestate, claimed.created_at, claimed.due_at
    FROM input
    LEFT JOIN received USING (message_id)
    LEFT JOIN jobs AS before ON before.id = input.job_id
    LEFT JOIN claimed ON claimed.message_id = input.message_id
    """,
)


class JobNoteUndeliverableParams(TypedDict):
    attempt: int
    error: str
    job_id: uuid.UUID
    type: str


# A message no worker here can run (its job type is unknown to this deployment, as during
# a rolling deploy) goes to the dead-letter queue, where `jobcore dlq replay` recovers it;
# meanwhile its job stays pending, and this says why to whoever polls it. Only the job's
# current attempt, of the type the message names, and only while it is still pending.
NOTE_UNDELIVERABLE = Query[JobNoteUndeliverableParams](
    "note_undeliverable",
    "Record on a pending job why its message went to the dead-letter queue.",
    """
    UPDATE jobs SET last_error = %(error)s, updated_at = now()
    WHERE id = %(job_id)s AND type = %(type)s AND status = 'pending'
      AND attempts + 1 = %(attempt)s
    """,
)


class JobHeartbeatParams(TypedDict):
    id: uuid.UUID
    lease: float
    lease_token: uuid.UUID


HEARTBEAT = Query[JobHeartbeatParams](
    "heartbeat",
    "Extend a running job's lease if this worker still holds it; report a cancel request.",
    """
    UPDATE jobs
    SET lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
    WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
    RETURNING cancel_requested_at
    """,
)


class JobSucceedManyParams(CompletionParams):
    effects: str
    ids: list[uuid.UUID]
    lease_tokens: list[uuid.UUID]
    result_refs: list[str | None]
    results: list[str | None]


# Successes are batched like claims. Effects travel as one JSON array
# ([{"job_id": .., "kind": .., "detail": {..}}]) so that any number of them is still one
# statement; a job's effects are written only if its fenced update won. Returns the jobs
# whose update won. Like every statement that ends a job, it records the job's completion
# webhook (if it has a callback) and wakes long-poll waiters (jobcore.sql.webhooks).
SUCCEED = Query[JobSucceedManyParams](
    "succeed",
    "Record successes with their results and effects, each fenced by its lease token.",
    """
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ids)s::uuid[], %(lease_tokens)s::uuid[], %(results)s::text[],
            %(result_refs)s::text[]
        ) AS i(id, lease_token, result, result_ref)
    ), done AS (
        UPDATE jobs
        SET status = 'succeeded',
            result = input.result::jsonb,
            result_ref = input.result_ref,
            lease_expires_at = NULL,
            finished_at = now(),
            updated_at = now()
        FROM input
        WHERE jobs.id = input.id
          AND jobs.status = 'running'
          AND jobs.lease_token = input.lease_token
        RETURNING jobs.id, jobs.attempts, jobs.tenant, jobs.status, jobs.callback_url,
                  jobs.traceparent, jobs.tracestate
    ), effects AS (
        INSERT INTO job_effects (job_id, attempt, kind, detail)
        SELECT done.id, done.attempts, effect.item ->> 'kind', effect.item -> 'detail'
        FROM jsonb_array_elements(%(effects)s::jsonb) WITH ORDINALITY AS effect(item, n)
        JOIN done ON done.id = (effect.item ->> 'job_id')::uuid
        ORDER BY effect.n
        RETURNING id
    ), """
    + COMPLETION_WEBHOOKS
    + """
    SELECT done.id, """
    + NOTIFY_JOB_DONE
    + """
    FROM done
    """,
)

# A retry and a shutdown's release put the job back to pending with a new message, unless
# its cancellation was requested while it ran: the handler failed, or was interrupted,
# before the worker heard of the request (a NOTIFY can be missed, heartbeats are
# periodic), and the job ends `cancelled` with its completion webhook instead. These
# fragments are shared by both statements; the statement's first CTE is `back`, and only
# its `pending` rows get the job message.
_PENDING_UNLESS_CANCEL_REQUESTED = """
            status = CASE WHEN cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,"""
_BACK_RETURNING = "RETURNING id, status, tenant, callback_url, traceparent, tracestate"
_CANCELLED_ARE_DONE = (
    """done AS (
        SELECT * FROM back WHERE status = 'cancelled'
    ), """
    + COMPLETION_WEBHOOKS
)
_NOTIFY_BACK = (
    """
    (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified, """
    + NOTIFY_JOB_DONE
    + """
    FROM back LEFT JOIN done ON done.id = back.id
    """
)


class JobFencedParams(CompletionParams):
    """What every fenced outcome takes: the job, the lease token of its claim, and what a
    job that ends needs for its completion webhook."""

    id: uuid.UUID
    lease_token: uuid.UUID


class JobRetryParams(JobFencedParams, OutboxMessageParams):
    channel: str
    delay: float
    error: str


# The retry's message goes through the outbox like any other, due when the backoff ends,
# so it survives a broker outage and shows in the database while it waits.
RETRY = Query[JobRetryParams](
    "retry",
    "Put a failed attempt back to pending with a delay and its next message (or end it "
    "cancelled if that was requested).",
    """
    WITH back AS (
        UPDATE jobs
        SET"""
    + _PENDING_UNLESS_CANCEL_REQUESTED
    + """
            last_error = %(error)s,
            next_attempt_at = CASE
                WHEN cancel_requested_at IS NULL THEN now() + make_interval(secs => %(delay)s)
                ELSE next_attempt_at
            END,
            lease_token = NULL,
            lease_expires_at = NULL,
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        """
    + _BACK_RETURNING
    + """, next_attempt_at
    ), """
    + _CANCELLED_ARE_DONE
    + """, message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            available_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, back.id, back.next_attempt_at
        FROM back
        WHERE back.status = 'pending'
        RETURNING id
    )
    SELECT back.id, back.status, back.next_attempt_at,"""
    + _NOTIFY_BACK,
)


class JobFailParams(JobFencedParams):
    error: str


FAIL = Query[JobFailParams](
    "fail",
    "Record that a job failed for good, fenced by the lease token.",
    """
    WITH done AS (
        UPDATE jobs
        SET status = 'failed',
            last_error = %(error)s,
            lease_expires_at = NULL,
            finished_at = now(),
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        RETURNING id, tenant, status, callback_url, traceparent, tracestate
    ), """
    + COMPLETION_WEBHOOKS
    + """
    SELECT done.id, """
    + NOTIFY_JOB_DONE
    + """
    FROM done
    """,
)


class JobCancelRunningParams(JobFencedParams):
    error: str


CANCEL_RUNNING = Query[JobCancelRunningParams](
    "cancel_running",
    "Record that a running job stopped because its cancellation was requested (fenced).",
    """
    WITH done AS (
        UPDATE jobs
        SET status = 'cancelled',
            last_error = %(error)s,
            lease_expires_at = NULL,
            finished_at = now(),
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        RETURNING id, tenant, status, callback_url, traceparent, tracestate
    ), """
    + COMPLETION_WEBHOOKS
    + """
    SELECT done.id, """
    + NOTIFY_JOB_DONE
    + """
    FROM done
    """,
)


class JobReleaseParams(JobFencedParams, OutboxMessageParams):
    channel: str


# A shutdown interrupted the attempt through no fault of the job: it does not count, and
# the new message carries the same attempt number, due at once.
RELEASE = Query[JobReleaseParams](
    "release",
    "Give back a running job's lease on shutdown: pending again, with a new message due now "
    "(or end it cancelled if that was requested).",
    """
    WITH back AS (
        UPDATE jobs
        SET"""
    + _PENDING_UNLESS_CANCEL_REQUESTED
    + """
            attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END,
            lease_token = NULL,
            lease_expires_at = NULL,
            next_attempt_at = NULL,
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        """
    + _BACK_RETURNING
    + """
    ), """
    + _CANCELLED_ARE_DONE
    + """, message AS (
        INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body, job_id)
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, back.id
        FROM back
        WHERE back.status = 'pending'
        RETURNING id
    )
    SELECT back.id, back.status,"""
    + _NOTIFY_BACK,
)

# --- the reaper -------------------------------------------------------------------------


class JobLockExpiredParams(TypedDict):
    limit: int


LOCK_EXPIRED_LEASES = Query[JobLockExpiredParams](
    "lock_expired_leases",
    "Lock a batch of running jobs whose lease has expired (other reapers skip them).",
    """
    SELECT id, type, queue, attempts, max_attempts, traceparent, tracestate
    FROM jobs
    WHERE status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """,
)


class JobReapExpiredParams(CompletionParams):
    bodies: list[bytes]
    channel: str
    error: str
    exchanges: list[str]
    headers: list[Jsonb]
    ids: list[uuid.UUID]
    job_ids: list[uuid.UUID]
    message_ids: list[uuid.UUID]
    message_types: list[str]
    routing_keys: list[str]


# The caller locked the rows and prepared one message per job that may get another
# attempt (parallel arrays). Jobs whose attempts are used up fail instead; jobs whose
# cancellation was requested end cancelled (their worker died before it could stop
# them); neither gets a job message, but both get their completion webhook.
REAP = Query[JobReapExpiredParams](
    "reap",
    "Return locked jobs with expired leases to pending (with a new message), or end them.",
    """
    WITH reaped AS (
        UPDATE jobs
        SET status = CASE
                WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN attempts >= max_attempts THEN 'failed'
                ELSE 'pending'
            END,
            last_error = %(error)s,
            lease_token = NULL,
            lease_expires_at = NULL,
            next_attempt_at = NULL,
            finished_at = CASE
                WHEN cancel_requested_at IS NOT NULL OR attempts >= max_attempts THEN now()
            END,
            updated_at = now()
        WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running' AND lease_expires_at < now()
        RETURNING id, status, tenant, callback_url, traceparent, tracestate
    ), done AS (
        SELECT * FROM reaped WHERE status <> 'pending'
    ), """
    + COMPLETION_WEBHOOKS
    + """, messages AS (
        INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body, job_id)
        SELECT m.message_id, m.exchange, m.routing_key, m.message_type, m.headers, m.body,
               m.job_id
        FROM unnest(
            %(message_ids)s::uuid[], %(exchanges)s::text[], %(routing_keys)s::text[],
            %(message_types)s::text[], %(headers)s::jsonb[], %(bodies)s::bytea[],
            %(job_ids)s::uuid[]
        ) AS m(message_id, exchange, routing_key, message_type, headers, body, job_id)
        JOIN reaped ON reaped.id = m.job_id AND reaped.status = 'pending'
        RETURNING id
    )
    SELECT reaped.id, reaped.status,
           (SELECT pg_notify(%(channel)s, '') FROM messages LIMIT 1) IS NULL AS notified,
           (SELECT pg_notify(%(webhook_outbox_channel)s, '') FROM hook_messages LIMIT 1)
               IS NULL AS webhook_notified,
           CASE WHEN reaped.status <> 'pending'
                THEN pg_notify('"""
    + JOB_DONE_CHANNEL
    + """', reaped.id::text) END IS NULL AS done_notified
    FROM reaped
    """,
)

# --- the rescuer ------------------------------------------------------------------------


class JobFailQuarantinedParams(CompletionParams):
    limit: int


# A pending job waits for its message; once the relay quarantined that message (it can
# never be published: malformed, too large; a refusal for now is retried, never
# quarantined), nothing would ever run the job, so it fails, with its completion webhook
# and a wake-up for long-poll waiters like any terminal status. Only a job whose every
# message is quarantined is stuck: another live one (after an operator's requeue,
# say) will still run it. The quarantined row stays for operators to see; requeueing it
# is refused once its job has ended (jobcore.sql.outbox.REQUEUE).
RESCUE_QUARANTINED = Query[JobFailQuarantinedParams](
    "rescue_quarantined",
    "Fail pending jobs whose message the relay quarantined, with their completion webhooks.",
    """
    WITH stuck AS (
        SELECT jobs.id, outbox.last_error
        FROM outbox JOIN jobs ON jobs.id = outbox.job_id
        WHERE outbox.quarantined_at IS NOT NULL
          AND outbox.message_type = jobs.type
          AND jobs.status = 'pending'
          AND NOT EXISTS (
              SELECT 1 FROM outbox AS live
              WHERE live.job_id = jobs.id
                AND live.message_type = jobs.type
                AND live.quarantined_at IS NULL
          )
        ORDER BY outbox.quarantined_at
        LIMIT %(limit)s
        FOR UPDATE OF jobs SKIP LOCKED
    ), done AS (
        UPDATE jobs
        SET status = 'failed',
            last_error = left(
                'outbox row quarantined: ' || coalesce(stuck.last_error, 'no error recorded'),
                2000
            ),
            next_attempt_at = NULL,
            finished_at = now(),
            updated_at = now()
        FROM stuck
        WHERE jobs.id = stuck.id AND jobs.status = 'pending'
        RETURNING jobs.id, jobs.tenant, jobs.status, jobs.callback_url, jobs.traceparent,
                  jobs.tracestate, jobs.last_error
    ), """
    + COMPLETION_WEBHOOKS
    + """
    SELECT done.id, done.last_error, """
    + NOTIFY_JOB_DONE
    + """
    FROM done
    """,
)

# --- maintenance leases (one reaper at a time, without advisory locks) -----------------


class MaintenanceLeaseParams(TypedDict):
    name: str
    owner: str
    token: uuid.UUID
    ttl: float


ACQUIRE_MAINTENANCE_LEASE = Query[MaintenanceLeaseParams](
    "acquire_maintenance_lease",
    "Take a maintenance lease if it is free or expired; return it only if we got it.",
    """
    INSERT INTO maintenance_leases (name, owner, token, expires_at)
    VALUES (%(name)s, %(owner)s, %(token)s, now() + make_interval(secs => %(ttl)s))
    ON CONFLICT (name) DO UPDATE
    SET owner = excluded.owner,
        token = excluded.token,
        expires_at = excluded.expires_at,
        acquired_at = now()
    WHERE maintenance_leases.expires_at < now()
    RETURNING token, expires_at
    """,
)


class MaintenanceLeaseRenewParams(TypedDict):
    name: str
    token: uuid.UUID
    ttl: float


RENEW_MAINTENANCE_LEASE = Query[MaintenanceLeaseRenewParams](
    "renew_maintenance_lease",
    "Extend a maintenance lease we still hold (fenced by its token); no row: it was lost.",
    """
    UPDATE maintenance_leases
    SET expires_at = now() + make_interval(secs => %(ttl)s)
    WHERE name = %(name)s AND token = %(token)s
    RETURNING expires_at
    """,
)


class MaintenanceLeaseReleaseParams(TypedDict):
    name: str
    token: uuid.UUID


RELEASE_MAINTENANCE_LEASE = Query[MaintenanceLeaseReleaseParams](
    "release_maintenance_lease",
    "Give up a maintenance lease so another process takes it at once.",
    """
    DELETE FROM maintenance_leases WHERE name = %(name)s AND token = %(token)s
    """,
)
