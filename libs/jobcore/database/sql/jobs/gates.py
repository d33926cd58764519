"""Flow-control gates after enqueue: the gate releaser's round (lock the held jobs a
gate may let through now, publish them again) and the operators' ordering actions
(unblock a failed job's key, or hand its place to its retry). The claim's own gate checks
are in :mod:`jobcore.database.sql.jobs.run`.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypedDict

from jobcore.database.sql import OutboxMessagesParams, Query


class JobOrderingUnblockParams(TypedDict):
    id: uuid.UUID


# A failed job of an ordering key keeps the later ones waiting when its type blocks; an
# operator's retry (a copy that takes its place) or unblock lets them go.
JOB_ORDERING_UNBLOCK = Query[JobOrderingUnblockParams](
    "job_ordering_unblock",
    "Stop a failed job from holding back the later jobs of its ordering key.",
    """
    UPDATE jobcore.jobs SET ordering_blocks = false, updated_at = now()
    WHERE id = %(id)s AND status = 'failed' AND ordering_key IS NOT NULL
    RETURNING id, tenant, ordering_key
    """,
)


# An operator's retry: the copy takes the failed job's place in its key only while the job
# still blocks it, for then no later job of the key has started since (all were held
# behind it). Otherwise (cancelled, a type with ordering="skip", unblocked by hand) later
# jobs may have run or be running, and the copy goes to the back of the key (no row: the
# enqueue takes the next place). The row lock decides: of two retries at once, one only
# takes the place.
JOB_ORDERING_TAKE_PLACE = Query[JobOrderingUnblockParams](
    "job_ordering_take_place",
    "Hand a failed job's place in its ordering key to its retry, if it still blocks the key.",
    """
    UPDATE jobcore.jobs SET ordering_blocks = false, updated_at = now()
    WHERE id = %(id)s AND status = 'failed' AND ordering_key IS NOT NULL AND ordering_blocks
    RETURNING ordering_seq
    """,
)


# --- the gate releaser (services.worker.gates) --------------------------------------------


class JobLockReleasableParams(TypedDict):
    horizon: float
    limit: int


# Held jobs whose gate may let them through now: for ordering, the key's first held job
# once no earlier job of the key blocks it; for concurrency, the first (limit - running)
# held jobs of the key, oldest first; for a rate limit, those of the key whose start falls
# within `horizon` seconds, each due when its token comes: starts spaced 1/rate from the
# later of the GCRA state and what earlier rounds handed out (released_until, which
# JOB_RELEASE_HELD moves on), so a burst of releases is not a burst of claims that hold
# them again. A key's limit, rate and burst are its oldest held job's.
#
# A round reads what it can release, not all that is held: each kind walks the keys that
# have held jobs (a loose scan of its index, jobs_held_*_idx: one probe per key) and reads
# per key only the jobs it releases (a LIMIT on the same index), so 100,000 jobs held
# behind one key cost what ten do. A release is a hint: the claim checks the gates again
# and may hold the job again, so counting here without locks is safe. The last step locks
# the chosen jobs, skipping any a claim or a cancel is changing.
JOB_LOCK_RELEASABLE = Query[JobLockReleasableParams](
    "job_lock_releasable",
    "Lock a batch of held jobs whose gate may let them start, with when each is due.",
    """
    WITH RECURSIVE ordering_keys AS (
        (SELECT tenant, ordering_key FROM jobcore.jobs
         WHERE status = 'pending' AND held_reason = 'ordering'
         ORDER BY tenant, ordering_key LIMIT 1)
        UNION ALL
        SELECT next.tenant, next.ordering_key
        FROM ordering_keys AS done
        CROSS JOIN LATERAL (
            SELECT tenant, ordering_key FROM jobcore.jobs
            WHERE status = 'pending' AND held_reason = 'ordering'
              AND (tenant, ordering_key) > (done.tenant, done.ordering_key)
            ORDER BY tenant, ordering_key LIMIT 1
        ) AS next
    ), concurrency_keys AS (
        (SELECT concurrency_key AS key FROM jobcore.jobs
         WHERE status = 'pending' AND held_reason = 'concurrency'
         ORDER BY concurrency_key LIMIT 1)
        UNION ALL
        SELECT next.key
        FROM concurrency_keys AS done
        CROSS JOIN LATERAL (
            SELECT concurrency_key AS key FROM jobcore.jobs
            WHERE status = 'pending' AND held_reason = 'concurrency'
              AND concurrency_key > done.key
            ORDER BY concurrency_key LIMIT 1
        ) AS next
    ), rate_keys AS (
        (SELECT rate_key AS key FROM jobcore.jobs
         WHERE status = 'pending' AND held_reason = 'rate_limit'
         ORDER BY rate_key LIMIT 1)
        UNION ALL
        SELECT next.key
        FROM rate_keys AS done
        CROSS JOIN LATERAL (
            SELECT rate_key AS key FROM jobcore.jobs
            WHERE status = 'pending' AND held_reason = 'rate_limit' AND rate_key > done.key
            ORDER BY rate_key LIMIT 1
        ) AS next
    ), ordering_due AS (
        SELECT head.id, now() AS due_at
        FROM ordering_keys AS k
        CROSS JOIN LATERAL (
            SELECT id, ordering_seq FROM jobcore.jobs
            WHERE status = 'pending' AND held_reason = 'ordering'
              AND tenant = k.tenant AND ordering_key = k.ordering_key
            ORDER BY ordering_seq LIMIT 1
        ) AS head
        -- The key's first blocking job before it, if any: one probe of
        -- jobs_ordering_blocking_idx (a NOT EXISTS may be planned as a scan of the key).
        LEFT JOIN LATERAL (
            SELECT true AS blocked FROM jobcore.jobs AS earlier
            WHERE earlier.tenant = k.tenant
              AND earlier.ordering_key = k.ordering_key
              AND earlier.ordering_seq < head.ordering_seq
              AND (earlier.status IN ('pending', 'running')
                   OR (earlier.status = 'failed' AND earlier.ordering_blocks))
            ORDER BY earlier.ordering_seq LIMIT 1
        ) AS earlier ON true
        WHERE earlier.blocked IS NULL
    ), concurrency_due AS (
        SELECT held.id, now() AS due_at
        FROM concurrency_keys AS k
        CROSS JOIN LATERAL (
            SELECT concurrency_limit FROM jobcore.jobs
            WHERE status = 'pending' AND held_reason = 'concurrency' AND concurrency_key = k.key
            ORDER BY created_at, id LIMIT 1
        ) AS head
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM jobcore.jobs AS running
            WHERE running.concurrency_key = k.key AND running.status = 'running'
        ) AS running
        CROSS JOIN LATERAL (
            SELECT id FROM jobcore.jobs
            WHERE status = 'pending' AND held_reason = 'concurrency' AND concurrency_key = k.key
            ORDER BY created_at, id
            LIMIT least(%(limit)s, greatest(head.concurrency_limit - running.n, 0))
        ) AS held
    ), rate_heads AS (
        SELECT k.key, head.rate_per_second AS rate,
               greatest(
                   now(),
                   gate.released_until,
                   gate.tat - make_interval(secs => (head.rate_burst - 1) / head.rate_per_second)
               ) AS first_start
        FROM rate_keys AS k
        CROSS JOIN LATERAL (
            SELECT rate_per_second, rate_burst FROM jobcore.jobs
            WHERE status = 'pending' AND held_reason = 'rate_limit' AND rate_key = k.key
            ORDER BY created_at, id LIMIT 1
        ) AS head
        LEFT JOIN jobcore.job_gates AS gate ON gate.key = k.key
    ), rate_due AS (
        SELECT held.id,
               h.first_start + make_interval(secs => (held.rank - 1) / h.rate) AS due_at
        FROM rate_heads AS h
        CROSS JOIN LATERAL (
            SELECT id, row_number() OVER (ORDER BY created_at, id) AS rank
            FROM (
                SELECT id, created_at FROM jobcore.jobs
                WHERE status = 'pending' AND held_reason = 'rate_limit' AND rate_key = h.key
                ORDER BY created_at, id
                -- The starts that fall within the horizon: 1 + floor(room * rate).
                LIMIT least(%(limit)s, 1 + floor(
                    extract(epoch FROM now() + make_interval(secs => %(horizon)s)
                                       - h.first_start) * h.rate)::bigint)
            ) AS first
        ) AS held
        WHERE h.first_start <= now() + make_interval(secs => %(horizon)s)
    ), releasable AS (
        SELECT id, due_at FROM ordering_due
        UNION ALL SELECT id, due_at FROM concurrency_due
        UNION ALL SELECT id, due_at FROM rate_due
        ORDER BY due_at
        LIMIT %(limit)s
    )
    -- Each chosen job by its primary key (a join may be planned as a scan of jobs).
    SELECT job.*, releasable.due_at
    FROM releasable
    CROSS JOIN LATERAL (
        SELECT jobs.id, jobs.type, jobs.queue, jobs.attempts, jobs.traceparent,
               jobs.tracestate
        FROM jobcore.jobs
        WHERE jobs.id = releasable.id
          AND jobs.status = 'pending' AND jobs.held_reason IS NOT NULL
        FOR UPDATE SKIP LOCKED
    ) AS job
    """,
)


class JobReleaseHeldParams(OutboxMessagesParams):
    attempts: list[int]
    available_at: list[datetime]
    channel: str
    ids: list[uuid.UUID]


# The caller locked the jobs (JOB_LOCK_RELEASABLE, same transaction) and built one message
# per job for its unused attempt (parallel arrays): the job is no longer held, and its
# message is due when the gate is expected to let it through.
JOB_RELEASE_HELD = Query[JobReleaseHeldParams](
    "job_release_held",
    "Release locked held jobs: clear why they waited and publish their attempt again through "
    "the outbox.",
    """
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ids)s::uuid[], %(attempts)s::int[], %(available_at)s::timestamptz[],
            %(message_ids)s::uuid[], %(exchanges)s::text[], %(routing_keys)s::text[],
            %(message_types)s::text[], %(headers)s::jsonb[], %(bodies)s::bytea[]
        ) AS i(id, attempt, available_at, message_id, exchange, routing_key, message_type,
               headers, body)
    ), released AS (
        UPDATE jobcore.jobs
        SET held_reason = NULL, held_since = NULL, updated_at = now()
        FROM input
        WHERE jobs.id = input.id
          AND jobs.status = 'pending'
          AND jobs.held_reason IS NOT NULL
          AND jobs.attempts + 1 = input.attempt
        RETURNING jobs.id, jobs.tenant, jobs.rate_key, jobs.rate_per_second, jobs.priority
    ), handed_out AS (
        -- An upsert: a key's row the pruner took (idle, its state all past) comes back.
        INSERT INTO jobcore.job_gates AS gate (key, released_until)
        SELECT released.rate_key,
               max(input.available_at + make_interval(secs => 1 / released.rate_per_second))
        FROM released JOIN input USING (id)
        WHERE released.rate_key IS NOT NULL
        GROUP BY released.rate_key
        ORDER BY released.rate_key
        ON CONFLICT (key) DO UPDATE
        SET released_until = greatest(gate.released_until, EXCLUDED.released_until),
            updated_at = now()
        RETURNING gate.key
    ), messages AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            available_at, priority
        )
        SELECT input.message_id, input.exchange, input.routing_key, input.message_type,
               input.headers, input.body, input.id, released.tenant, input.available_at,
               released.priority
        FROM input JOIN released USING (id)
        RETURNING id
    )
    SELECT released.id,
           (SELECT pg_notify(%(channel)s, '') FROM messages LIMIT 1) IS NULL AS notified
    FROM released
    """,
)
