"""Statements the worker runs: receive + claim, heartbeat, fenced outcomes, the reaper and
the maintenance lease.

Each hot-path statement is one round trip and one transaction (a single statement in
autocommit mode is atomic): the inbox insert and the claim, or an outcome and the outbox
row of a retry, commit together or not at all. Every write after the claim is fenced by
``status = 'running' AND lease_token = <the token the claim handed out>``.
"""

from __future__ import annotations

from jobcore.sql import Query

# The API sends the job id here when a running job's cancellation is requested (after
# setting cancel_requested_at, which heartbeats also check: a NOTIFY can be missed).
CANCEL_CHANNEL = "jobcore_cancel"

JOBS_CONSUMER = "jobs"

LISTEN_CANCEL = Query(
    "listen_cancel", "Hear cancel requests for running jobs.", f"LISTEN {CANCEL_CHANNEL}"
)
UNLISTEN_CANCEL = Query(
    "unlisten_cancel",
    "Stop hearing cancel requests before a connection returns to the pool.",
    f"UNLISTEN {CANCEL_CHANNEL}",
)

# The inbox insert decides whether this message was seen before (a conflict: a
# redelivery or a re-published outbox row), and the claim runs only for a fresh message.
# The fence `attempts + 1 = <the envelope's attempt>` lets exactly one message run each
# attempt: every transition to pending writes one message numbered attempts + 1, so a
# stale message for an older attempt (whose inbox row was pruned, or a copy of a message
# the job has moved past) finds the job already further along and does nothing.
RECEIVE_AND_CLAIM = Query(
    "receive_and_claim",
    "Record a message in the inbox and, if it is new, claim its pending job under a lease.",
    """
    WITH received AS (
        INSERT INTO inbox (consumer, message_id)
        VALUES (%(consumer)s, %(message_id)s)
        ON CONFLICT DO NOTHING
        RETURNING message_id
    ), claimed AS (
        UPDATE jobs
        SET status = 'running',
            attempts = attempts + 1,
            lease_token = %(lease_token)s,
            lease_expires_at = now() + make_interval(secs => %(lease)s),
            worker_id = %(worker_id)s,
            started_at = coalesce(started_at, now()),
            updated_at = now()
        WHERE id = %(job_id)s
          AND status = 'pending'
          AND type = %(type)s
          AND attempts + 1 = %(attempt)s
          AND EXISTS (SELECT FROM received)
        RETURNING id, type, queue, payload, attempts, max_attempts, cancel_requested_at,
                  traceparent, tracestate
    )
    SELECT EXISTS (SELECT FROM received) AS fresh,
           (SELECT status FROM jobs WHERE id = %(job_id)s) AS status_before,
           claimed.*
    FROM (SELECT) AS one
    LEFT JOIN claimed ON true
    """,
)

HEARTBEAT = Query(
    "heartbeat",
    "Extend a running job's lease if this worker still holds it; report a cancel request.",
    """
    UPDATE jobs
    SET lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
    WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
    RETURNING cancel_requested_at
    """,
)

# Effects travel as one JSON array ([{"kind": .., "detail": {..}}]) so that any number
# of them is still one statement; they are written only if the fenced update won.
SUCCEED = Query(
    "succeed",
    "Record success with its result and the attempt's effects, fenced by the lease token.",
    """
    WITH done AS (
        UPDATE jobs
        SET status = 'succeeded',
            result = %(result)s::jsonb,
            result_ref = %(result_ref)s,
            lease_expires_at = NULL,
            finished_at = now(),
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        RETURNING id, attempts
    ), effects AS (
        INSERT INTO job_effects (job_id, attempt, kind, detail)
        SELECT done.id, done.attempts, effect.kind, effect.detail
        FROM done, jsonb_to_recordset(%(effects)s::jsonb) AS effect(kind text, detail jsonb)
        RETURNING id
    )
    SELECT done.id, (SELECT count(*) FROM effects) AS effects FROM done
    """,
)

# The retry's message goes through the outbox like any other, due when the backoff ends,
# so it survives a broker outage and shows in the database while it waits.
RETRY = Query(
    "retry",
    "Put a failed attempt back to pending with a delay, and write its next message.",
    """
    WITH retried AS (
        UPDATE jobs
        SET status = 'pending',
            last_error = %(error)s,
            next_attempt_at = now() + make_interval(secs => %(delay)s),
            lease_token = NULL,
            lease_expires_at = NULL,
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        RETURNING id, next_attempt_at
    ), message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            available_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, retried.id, retried.next_attempt_at
        FROM retried
        RETURNING id
    )
    SELECT retried.id, retried.next_attempt_at,
           (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified
    FROM retried
    """,
)

FAIL = Query(
    "fail",
    "Record that a job failed for good, fenced by the lease token.",
    """
    UPDATE jobs
    SET status = 'failed',
        last_error = %(error)s,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
    RETURNING id
    """,
)

CANCEL_RUNNING = Query(
    "cancel_running",
    "Record that a running job stopped because its cancellation was requested (fenced).",
    """
    UPDATE jobs
    SET status = 'cancelled',
        last_error = %(error)s,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
    RETURNING id
    """,
)

# A shutdown interrupted the attempt through no fault of the job: it does not count, and
# the new message carries the same attempt number, due at once.
RELEASE = Query(
    "release",
    "Give back a running job's lease on shutdown: pending again, with a new message due now.",
    """
    WITH released AS (
        UPDATE jobs
        SET status = 'pending',
            attempts = attempts - 1,
            lease_token = NULL,
            lease_expires_at = NULL,
            next_attempt_at = NULL,
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        RETURNING id
    ), message AS (
        INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body, job_id)
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, released.id
        FROM released
        RETURNING id
    )
    SELECT released.id, (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified
    FROM released
    """,
)

# --- the reaper -------------------------------------------------------------------------

LOCK_EXPIRED_LEASES = Query(
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

# The caller locked the rows and prepared one message per job that may get another
# attempt (parallel arrays). Jobs whose attempts are used up fail instead; jobs whose
# cancellation was requested end cancelled (their worker died before it could stop
# them); neither gets a message.
REAP = Query(
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
        RETURNING id, status
    ), messages AS (
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
           (SELECT pg_notify(%(channel)s, '') FROM messages LIMIT 1) IS NULL AS notified
    FROM reaped
    """,
)

# --- maintenance leases (one reaper at a time, without advisory locks) -----------------

ACQUIRE_MAINTENANCE_LEASE = Query(
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

RENEW_MAINTENANCE_LEASE = Query(
    "renew_maintenance_lease",
    "Extend a maintenance lease we still hold (fenced by its token); no row: it was lost.",
    """
    UPDATE maintenance_leases
    SET expires_at = now() + make_interval(secs => %(ttl)s)
    WHERE name = %(name)s AND token = %(token)s
    RETURNING expires_at
    """,
)

RELEASE_MAINTENANCE_LEASE = Query(
    "release_maintenance_lease",
    "Give up a maintenance lease so another process takes it at once.",
    """
    DELETE FROM maintenance_leases WHERE name = %(name)s AND token = %(token)s
    """,
)
