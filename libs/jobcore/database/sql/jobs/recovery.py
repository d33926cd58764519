"""Recovery of jobs that nobody will finish otherwise: the reaper (expired leases), the
rescuer (jobs whose message the relay quarantined) and anti-entropy (pending jobs whose
message went missing or was dead-lettered). A job's ``message_note`` is JSON saying what
was last noticed about its message, with an ``event``: ``dead_lettered`` or
``republished``, kept apart from ``last_error``.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.database.sql import (
    CompletionParams,
    OutboxMessagesParams,
    Query,
)
from jobcore.database.sql.job_events import (
    CLAIM_COLUMNS,
    EVENTS_ON,
    carried_claim,
    short_error,
)
from jobcore.database.sql.webhook_deliveries import (
    COMPLETION_WEBHOOKS,
    JOB_DONE_CHANNEL,
    NOTIFY_JOB_DONE,
)
from jobcore.kernel.jobevents import JobEventKind

# --- the reaper -------------------------------------------------------------------------


class JobLockExpiredParams(TypedDict):
    limit: int
    window: float


# Only leases that expired in the last `window` seconds. jobs_lease_expiry_idx holds the
# running rows, but an index entry stays until VACUUM removes it: every job that ran has
# left one, its lease long expired, and behind a pinned xmin horizon no VACUUM removes
# any, so a scan from the start of the index visited every job run since the pin began
# (a heap fetch each, to learn it no longer runs). The reaper passes the seconds back to
# its low-water mark (jobcore.maintenance.reaper): the start of its last round, or the
# oldest lease still expired then (JOB_OLDEST_EXPIRED), and no bound every few minutes.
JOB_LOCK_EXPIRED = Query[JobLockExpiredParams](
    "job_lock_expired",
    "Lock a batch of running jobs whose lease expired in the last `window` seconds (other "
    "reapers skip them).",
    """
    SELECT id, type, queue, attempts, max_attempts, traceparent, tracestate
    FROM jobcore.jobs
    WHERE status = 'running' AND lease_expires_at < now()
      AND lease_expires_at >= now() - make_interval(secs => %(window)s)
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """,
)


class JobOldestExpiredParams(TypedDict):
    window: float


# After a round, with a plain read (rows another reaper or a finishing worker holds
# count): the oldest lease still expired among those of the round's window, which the
# next round's window reaches back to, so a lease the round could not lock is not left
# to the unbounded round. Reads the window's dead entries and stops at the first live one.
JOB_OLDEST_EXPIRED = Query[JobOldestExpiredParams](
    "job_oldest_expired",
    "How many seconds ago the oldest lease of a running job that expired in the last "
    "`window` seconds expired (NULL: none), whoever holds the job.",
    """
    SELECT extract(epoch FROM now() - min(lease_expires_at))::float8 AS seconds
    FROM jobcore.jobs
    WHERE status = 'running' AND lease_expires_at < now()
      AND lease_expires_at >= now() - make_interval(secs => %(window)s)
    """,
)


class JobReapExpiredParams(CompletionParams, OutboxMessagesParams):
    channel: str
    error: str
    ids: list[uuid.UUID]
    job_ids: list[uuid.UUID]


# The caller locked the rows and prepared one message per job that may get another
# attempt (parallel arrays). Jobs whose attempts are used up fail instead; jobs whose
# cancellation was requested end cancelled (their worker died before it could stop
# them); neither gets a job message, but both get their completion webhook.
JOB_REAP_EXPIRED = Query[JobReapExpiredParams](
    "job_reap_expired",
    "Return locked jobs with expired leases to pending (with a new message), or end them.",
    f"""
    WITH reaped AS (
        UPDATE jobcore.jobs
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
        RETURNING id, status, tenant, callback_url, traceparent, tracestate, priority,
                  attempts, last_error, worker_id, {CLAIM_COLUMNS}
    ), done AS (
        SELECT * FROM reaped WHERE status <> 'pending'
    ), {COMPLETION_WEBHOOKS}, reap_events AS (
        -- lease_lost, then (for a job that ends here) cancelled or finished, in that order
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
        SELECT reaped.id, event.kind, reaped.attempts, event.detail
        FROM reaped
        CROSS JOIN LATERAL (
            VALUES
                (1, '{JobEventKind.LEASE_LOST}',
                 jsonb_build_object('worker', reaped.worker_id, 'then', reaped.status)
                 || CASE WHEN reaped.status = 'pending' THEN {carried_claim("reaped")}
                         ELSE '{{}}'::jsonb END),
                (2, CASE WHEN reaped.status = 'cancelled' THEN '{JobEventKind.CANCELLED}'
                         ELSE '{JobEventKind.FINISHED}' END,
                 jsonb_strip_nulls(jsonb_build_object(
                     'status', reaped.status,
                     'error', CASE WHEN reaped.status = 'failed'
                                   THEN {short_error("reaped.last_error")} END)))
        ) AS event(n, kind, detail)
        WHERE (event.n = 1 OR reaped.status <> 'pending') AND {EVENTS_ON}
        ORDER BY reaped.id, event.n
    ), messages AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            priority
        )
        SELECT m.message_id, m.exchange, m.routing_key, m.message_type, m.headers, m.body,
               m.job_id, reaped.tenant, reaped.priority
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
                THEN pg_notify('{JOB_DONE_CHANNEL}', reaped.id::text) END IS NULL AS done_notified
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
# is refused once its job has ended (jobcore.database.sql.outbox.OUTBOX_REQUEUE).
JOB_FAIL_QUARANTINED = Query[JobFailQuarantinedParams](
    "job_fail_quarantined",
    "Fail pending jobs whose message the relay quarantined, with their completion webhooks.",
    f"""
    WITH stuck AS (
        SELECT jobs.id, outbox.last_error
        FROM jobcore.outbox JOIN jobcore.jobs ON jobs.id = outbox.job_id
        WHERE outbox.quarantined_at IS NOT NULL
          AND outbox.message_type = jobs.type
          AND jobs.status = 'pending'
          AND NOT EXISTS (
              SELECT 1 FROM jobcore.outbox AS live
              WHERE live.job_id = jobs.id
                AND live.message_type = jobs.type
                AND live.quarantined_at IS NULL
          )
        ORDER BY outbox.quarantined_at
        LIMIT %(limit)s
        FOR UPDATE OF jobs SKIP LOCKED
    ), done AS (
        UPDATE jobcore.jobs
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
                  jobs.tracestate, jobs.last_error, jobs.attempts
    ), {COMPLETION_WEBHOOKS}
    SELECT done.id, done.last_error, {NOTIFY_JOB_DONE}
    FROM done
    """,
)


# --- anti-entropy (jobcore.maintenance.stranded) ----------------------------------------


class JobLockStaleParams(TypedDict):
    limit: int
    max_doublings: int
    stale_after: float


# A pending job is stale when it has been due, untouched, for its staleness, and no outbox
# row of its own is waiting (a live row is the relay's business, a quarantined one the
# rescuer's). Due: a scheduled first run or a retry's backoff counts from next_attempt_at,
# when its message was written to go out. The staleness doubles with each republish of
# the job (up to 2^max_doublings), so a job whose message is merely slow (a backlog older
# than the staleness) gets a few spare copies, not one per round. created_at <= updated_at,
# so the created_at bound lets jobs_status_created_not_running_idx narrow the scan to old
# pending jobs; outbox_job_idx answers the NOT EXISTS. Other sweepers (and the CLI) skip
# locked rows.
JOB_LOCK_STALE = Query[JobLockStaleParams](
    "job_lock_stale",
    "Lock a batch of due pending jobs that have had no outbox row and no change for their "
    "staleness.",
    """
    SELECT id, type, queue, attempts, traceparent, tracestate,
           CASE WHEN message_note ->> 'event' = 'dead_lettered'
                 AND message_note ->> 'attempt' = (attempts + 1)::text
                THEN 'dead_lettered' ELSE 'stale' END AS reason,
           extract(epoch FROM now() - greatest(updated_at, next_attempt_at))::float8
               AS silent_seconds
    FROM jobcore.jobs
    WHERE status = 'pending'
      AND held_reason IS NULL
      AND created_at < now() - make_interval(secs => %(stale_after)s)
      AND greatest(updated_at, next_attempt_at) < now() - make_interval(
              secs => %(stale_after)s * power(2, least(republish_count, %(max_doublings)s)))
      AND NOT EXISTS (
          SELECT 1 FROM jobcore.outbox
          WHERE outbox.job_id = jobs.id AND outbox.message_type = jobs.type
      )
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """,
)


class JobRepublishStaleParams(OutboxMessagesParams):
    attempts: list[int]
    channel: str
    ids: list[uuid.UUID]
    reasons: list[str]
    silent: list[float]


# The caller locked the jobs (JOB_LOCK_STALE, same transaction) and built one message per
# job for its current attempt (parallel arrays), so the claim's fence (attempts + 1 = the
# envelope's attempt, status pending) lets exactly one copy run it. The job's note says
# why (keeping the dead-letter note it acted on), and updated_at restarts its staleness.
JOB_REPUBLISH_STALE = Query[JobRepublishStaleParams](
    "job_republish_stale",
    "Publish locked stale jobs' current attempt again through the outbox, noting it on each.",
    f"""
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ids)s::uuid[], %(attempts)s::int[], %(reasons)s::text[], %(silent)s::float8[],
            %(message_ids)s::uuid[], %(exchanges)s::text[], %(routing_keys)s::text[],
            %(message_types)s::text[], %(headers)s::jsonb[], %(bodies)s::bytea[]
        ) AS i(id, attempt, reason, silent_seconds, message_id, exchange, routing_key,
               message_type, headers, body)
    ), republished AS (
        UPDATE jobcore.jobs
        SET republish_count = jobs.republish_count + 1,
            message_note = jsonb_build_object(
                'event', 'republished',
                'attempt', input.attempt,
                'reason', input.reason,
                'silent_seconds', round(input.silent_seconds),
                'count', jobs.republish_count + 1,
                'message_id', input.message_id,
                'at', now()
            ) || CASE WHEN input.reason = 'dead_lettered'
                      THEN jsonb_build_object('dead_letter', jobs.message_note)
                      ELSE '{{}}'::jsonb END,
            updated_at = now()
        FROM input
        WHERE jobs.id = input.id
          AND jobs.status = 'pending'
          AND jobs.attempts + 1 = input.attempt
        RETURNING jobs.id, jobs.tenant, input.attempt, input.reason, jobs.republish_count,
                  jobs.priority, input.silent_seconds, input.message_id
    ), republish_events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
        SELECT id, '{JobEventKind.REPUBLISHED}', attempt,
               jsonb_build_object('reason', reason, 'silent_seconds', round(silent_seconds),
                                  'message_id', message_id)
        FROM republished
        WHERE {EVENTS_ON}
        ORDER BY id
    ), messages AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            priority
        )
        SELECT input.message_id, input.exchange, input.routing_key, input.message_type,
               input.headers, input.body, input.id, republished.tenant, republished.priority
        FROM input JOIN republished USING (id)
        RETURNING id
    )
    SELECT republished.id, republished.attempt, republished.reason,
           republished.republish_count,
           (SELECT pg_notify(%(channel)s, '') FROM messages LIMIT 1) IS NULL AS notified
    FROM republished
    """,
)


class JobNoteDeadLetterParams(TypedDict):
    attempt: int
    dead_lettered_at: str | None
    job_id: uuid.UUID
    message_id: str | None
    queue: str | None
    reason: str | None
    type: str


# Only the job's current attempt, of the type the message names, while it is pending: a
# dead letter of an older attempt (the job moved on) or of a finished job says nothing
# about the job. updated_at is left alone: a note is not a change of the job's state, so
# it does not put off the sweeper, which republishes the job once it has been stale.
JOB_NOTE_DEAD_LETTER = Query[JobNoteDeadLetterParams](
    "job_note_dead_letter",
    "Note on a pending job that the broker dead-lettered its current attempt's message.",
    f"""
    WITH noted AS (
        UPDATE jobcore.jobs
        SET message_note = jsonb_build_object(
                'event', 'dead_lettered',
                'attempt', %(attempt)s::int,
                'reason', %(reason)s::text,
                'queue', %(queue)s::text,
                'message_id', %(message_id)s::text,
                'dead_lettered_at', %(dead_lettered_at)s::text,
                'at', now()
            )
        WHERE id = %(job_id)s AND type = %(type)s AND status = 'pending'
          AND attempts + 1 = %(attempt)s
        RETURNING id
    ), dead_letter_event AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
        SELECT id, '{JobEventKind.DEAD_LETTERED}', %(attempt)s::int,
               jsonb_strip_nulls(jsonb_build_object(
                   'by', 'broker', 'reason', %(reason)s::text, 'queue', %(queue)s::text))
        FROM noted
        WHERE {EVENTS_ON}
    )
    SELECT id FROM noted
    """,
)
