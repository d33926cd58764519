"""Statements of anti-entropy (:mod:`jobcore.stranded`): pending jobs whose message vanished
are published again through the outbox, and dead letters are noted on their jobs.

A job's ``message_note`` is JSON saying what was last noticed about its message, with an
``event``: ``dead_lettered`` (the broker dead-lettered the message of ``attempt``, for
``reason``) or ``republished`` (the sweeper published ``attempt`` again). It is kept apart
from ``last_error``, which stays the last failed attempt's error.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.sql import Query


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
# so the created_at bound lets jobs_status_created_idx narrow the scan to old pending jobs;
# outbox_job_idx answers the NOT EXISTS. Other sweepers (and the CLI) skip locked rows.
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
    FROM jobs
    WHERE status = 'pending'
      AND created_at < now() - make_interval(secs => %(stale_after)s)
      AND greatest(updated_at, next_attempt_at) < now() - make_interval(
              secs => %(stale_after)s * power(2, least(republish_count, %(max_doublings)s)))
      AND NOT EXISTS (
          SELECT 1 FROM outbox
          WHERE outbox.job_id = jobs.id AND outbox.message_type = jobs.type
      )
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """,
)


class JobRepublishStaleParams(TypedDict):
    attempts: list[int]
    bodies: list[bytes]
    channel: str
    exchanges: list[str]
    headers: list[Jsonb]
    ids: list[uuid.UUID]
    message_ids: list[uuid.UUID]
    message_types: list[str]
    reasons: list[str]
    routing_keys: list[str]
    silent: list[float]


# The caller locked the jobs (JOB_LOCK_STALE, same transaction) and built one message per
# job for its current attempt (parallel arrays), so the claim's fence (attempts + 1 = the
# envelope's attempt, status pending) lets exactly one copy run it. The job's note says
# why (keeping the dead-letter note it acted on), and updated_at restarts its staleness.
JOB_REPUBLISH_STALE = Query[JobRepublishStaleParams](
    "job_republish_stale",
    "Publish locked stale jobs' current attempt again through the outbox, noting it on each.",
    """
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ids)s::uuid[], %(attempts)s::int[], %(reasons)s::text[], %(silent)s::float8[],
            %(message_ids)s::uuid[], %(exchanges)s::text[], %(routing_keys)s::text[],
            %(message_types)s::text[], %(headers)s::jsonb[], %(bodies)s::bytea[]
        ) AS i(id, attempt, reason, silent_seconds, message_id, exchange, routing_key,
               message_type, headers, body)
    ), republished AS (
        UPDATE jobs
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
                      ELSE '{}'::jsonb END,
            updated_at = now()
        FROM input
        WHERE jobs.id = input.id
          AND jobs.status = 'pending'
          AND jobs.attempts + 1 = input.attempt
        RETURNING jobs.id, input.attempt, input.reason, jobs.republish_count
    ), messages AS (
        INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body, job_id)
        SELECT input.message_id, input.exchange, input.routing_key, input.message_type,
               input.headers, input.body, input.id
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
    """
    UPDATE jobs
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
    """,
)
