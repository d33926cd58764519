"""The worker's hot path: the claim (with the inbox insert, gates and parking, after
JOB_GATES_LOCK in the same round trip for jobs with a concurrency or rate key), heartbeat,
progress, and the fenced outcomes.

Each statement is one round trip and one transaction: the inbox insert and the claim, or
an outcome and the outbox row of a retry, commit together or not at all. Every write after
the claim is fenced by ``status = 'running' AND lease_token = <the token the claim handed
out>``. Each change of a job writes its event (jobcore.kernel.jobevents) in a CTE of the
statement that makes it, but for the claim, which keeps its own on the job row
(jobcore.database.sql.job_events).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal, TypedDict

from jobcore.database.sql import (
    CompletionParams,
    OutboxMessageParams,
    Query,
    status_is,
)
from jobcore.database.sql.flow_pauses import paused
from jobcore.database.sql.job_events import (
    CLAIM_COLUMNS,
    EVENTS_ON,
    carried_claim,
    short_error,
)
from jobcore.database.sql.webhook_deliveries import COMPLETION_WEBHOOKS, NOTIFY_JOB_DONE
from jobcore.kernel.channels import JOB_PROGRESS_CHANNEL
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.states import JobStatus

# Every write after the claim: the job is still running under the lease this worker holds.
LEASE_FENCE = (
    f"id = %(id)s AND {status_is('status', JobStatus.RUNNING)} AND lease_token = %(lease_token)s"
)


class JobClaimManyParams(TypedDict):
    attempts: list[int]
    consumer: str
    exchange: str
    job_ids: list[uuid.UUID]
    lease_tokens: list[uuid.UUID]
    leases: list[float]
    message_ids: list[uuid.UUID]
    # What each message's headers say of its publish (None: nothing), which the claim of
    # a job's first attempt keeps on the job row (jobcore.kernel.envelope.PUBLISHED_HEADER).
    published_ats: list[datetime | None]
    published_bys: list[str | None]
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
#
# A claim is retried after its connection broke, and the first try may have committed
# unanswered (docs/operations.md, "Statements whose commit is unknown"): its message is
# then in the inbox, and the retry would read it as a duplicate and leave the job running
# with no handler until the reaper took it back, an attempt burnt. So a message already
# received whose job is `running` under the request's own lease token is *resumed*:
# answered fresh and claimed (`resumed` true), its lease renewed, no second event.
#
# A job whose queue or type is paused is not claimed: its message is *parked*, a copy (a
# new message id, the same attempt) written to the outbox, where the relays leave it until
# the pause ends, and the delivery is acknowledged. Nothing is burnt: not an attempt (the
# job stays pending, attempts unchanged), not a delivery count (an ack, never a requeue).
# Claimed and parked read flow_pauses in the same snapshot, so one message is never both;
# a parked job meets no gate (it takes no slot and spends no rate token).
#
# Gates (jobcore.kernel.gates), checked in this order, each only among the jobs the previous
# ones let through: ordering (an earlier job of the tenant's ordering key is pending,
# running, or failed and blocking), concurrency (the key's running jobs plus this one's
# rank among the batch's would pass the limit), rate (GCRA on the key's job_gates row:
# admitted while the tat stays within `burst` intervals of now). A job a gate stops is
# *held*: it stays pending with `held_reason` set, its attempt unused; its message is done
# with (the inbox has it), and the gate releaser publishes a new one later. Every batch
# with a job of a concurrency or rate key runs JOB_GATES_LOCK first in the same transaction
# (pipelined: one round trip), whatever the worker's registry declares: the counts here
# then come from a snapshot taken after every other claim of those keys committed (the
# jobs with neither key are claimed apart, by JOB_CLAIM_UNGATED, with no lock). Times are
# statement_timestamp(), so a job's started_at is later than the finished_at of whatever it
# waited for.
#
# A job may claim no earlier than its `not_before` (a snooze's end, an edited run_at): a
# message of the right attempt that arrives before it (one an edit superseded, a copy the
# sweeper published before a snooze) is recorded and claims nothing; the message written
# with the change, due at that time, claims it. Checked again in the updates, so an edit
# that committed while this statement waited for the row is seen (READ COMMITTED re-reads
# the row it waited for).
_DUE = "(jobs.not_before IS NULL OR jobs.not_before <= statement_timestamp())"


# The job's `published` event, kept on the row the claim (or the hold) writes anyway
# instead of an event row (migration 0041): the first publish of its first attempt whose
# message says it, once (a later publish is the relay's `published` row:
# jobcore.database.sql.outbox.OUTBOX_DELETE_PUBLISHED decides from these columns). Kept
# only while events are recorded, as the row it stands for would have been. A message
# whose id is the job's (an enqueue's first: jobcore.execution.job_messages) leaves
# published_message_id NULL, 16 bytes less in each version of the row from the claim on;
# the timeline's reader says the job's id (jobcore.kernel.jobevents.with_job_row).
_PUBLISH_KEPT = f"""jobs.published_at IS NULL AND rate.attempt = 1
                     AND rate.published_at IS NOT NULL AND {EVENTS_ON}"""
_KEEP_PUBLISH = f"""published_at = CASE WHEN {_PUBLISH_KEPT} THEN rate.published_at
                                    ELSE jobs.published_at END,
            published_by = CASE WHEN {_PUBLISH_KEPT} THEN rate.published_by
                                ELSE jobs.published_by END,
            published_message_id = CASE WHEN {_PUBLISH_KEPT}
                                        THEN nullif(rate.message_id, jobs.id)
                                        ELSE jobs.published_message_id END,"""


def _claim_sql(only: str, *, from_outbox: bool = False) -> str:
    """The claim statement over the batch's messages that pass ``only`` (a condition on
    ``i``, a message of the batch): the others are left out, neither recorded nor answered.

    ``from_outbox``: the messages are the fresh outbox rows of the worker's queues and
    types that it locks now (JOB_CLAIM_FROM_OUTBOX), not parameters: their rows are deleted
    in the same statement."""
    messages = """FROM unnest(
            %(message_ids)s::uuid[], %(job_ids)s::uuid[], %(types)s::text[],
            %(attempts)s::int[], %(lease_tokens)s::uuid[], %(leases)s::float8[],
            %(published_ats)s::timestamptz[], %(published_bys)s::text[]
        ) AS i(message_id, job_id, type, attempt, lease_token, lease, published_at,
               published_by)"""
    outbox = dequeue = ""
    if from_outbox:
        outbox = f"""outbox_rows AS (
        SELECT id, message_id, job_id, message_type AS type,
               (convert_from(body, 'UTF8')::jsonb ->> 'attempt')::int AS attempt
        FROM jobcore.outbox
        WHERE available_at <= now() AND quarantined_at IS NULL
          AND available_at >= now() - make_interval(secs => %(window)s)
          AND exchange = %(exchange)s
          AND routing_key = ANY(%(queues)s::text[])
          AND message_type = ANY(%(types)s::text[])
          AND ordering_key IS NULL
          AND NOT {paused("outbox.routing_key", "outbox.message_type")}
        ORDER BY available_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), """
        # Each row its own lease token, drawn by the caller before the statement: a retry
        # after an unanswered commit finds the jobs it claimed by them (JOB_RESUME_TOKENS).
        messages = """FROM (
            SELECT o.message_id, o.job_id, o.type, o.attempt,
                   (%(lease_tokens)s::uuid[])[row_number() OVER (ORDER BY o.id)]
                       AS lease_token,
                   kind.lease, NULL::timestamptz AS published_at, NULL::text AS published_by
            FROM outbox_rows AS o
            JOIN unnest(%(types)s::text[], %(leases)s::float8[]) AS kind(type, lease)
                USING (type)
        ) AS i"""
        dequeue = """dequeued AS (
        DELETE FROM jobcore.outbox
        WHERE id IN (SELECT outbox_rows.id FROM outbox_rows JOIN input USING (message_id))
    ), """
    return f"""
    WITH {outbox}input AS (
        SELECT *
        {messages}
        WHERE {only}
    ), {dequeue}received AS (
        INSERT INTO jobcore.inbox (consumer, message_id)
        SELECT %(consumer)s, message_id FROM input
        ON CONFLICT DO NOTHING
        RETURNING message_id
    ), live AS (
        -- Fresh messages whose job waits for exactly their attempt, and whether its queue
        -- or type is paused (read once: a job's queue and type never change).
        SELECT input.*, jobs.created_at, jobs.concurrency_key, jobs.concurrency_limit,
               jobs.rate_key, jobs.rate_per_second, jobs.rate_burst,
               {paused("jobs.queue", "jobs.type")} AS paused,
               CASE WHEN jobs.ordering_key IS NOT NULL AND EXISTS (
                   SELECT 1 FROM jobcore.jobs AS earlier
                   WHERE earlier.tenant = jobs.tenant
                     AND earlier.ordering_key = jobs.ordering_key
                     AND earlier.ordering_seq < jobs.ordering_seq
                     AND (earlier.status IN ('pending', 'running')
                          OR (earlier.status = 'failed' AND earlier.ordering_blocks))
               ) THEN 'ordering' END AS held
        FROM input
        JOIN received USING (message_id)
        JOIN jobcore.jobs ON jobs.id = input.job_id
        WHERE {status_is("jobs.status", JobStatus.PENDING)}
          AND jobs.type = input.type
          AND jobs.attempts + 1 = input.attempt
          AND {_DUE}
    ), concurrency AS (
        SELECT live.*,
               CASE WHEN held IS NULL AND concurrency_key IS NOT NULL
                         AND (SELECT count(*) FROM jobcore.jobs AS running
                              WHERE running.concurrency_key = live.concurrency_key
                                AND running.status = 'running')
                             + row_number() OVER (
                                 PARTITION BY concurrency_key, held IS NULL
                                 ORDER BY created_at, job_id)
                             > concurrency_limit
                    THEN 'concurrency' ELSE held END AS held_after
        FROM live
        WHERE NOT paused
    ), rate AS (
        SELECT concurrency.*,
               CASE WHEN held_after IS NULL AND rate_key IS NOT NULL
                         AND extract(epoch FROM greatest(gate.tat, statement_timestamp())
                                                - statement_timestamp())
                             + row_number() OVER (
                                 PARTITION BY rate_key, held_after IS NULL
                                 ORDER BY created_at, job_id) / rate_per_second
                             > rate_burst / rate_per_second
                    THEN 'rate_limit' ELSE held_after END AS verdict
        FROM concurrency LEFT JOIN jobcore.job_gates AS gate ON gate.key = concurrency.rate_key
    ), spent AS (
        UPDATE jobcore.job_gates
        SET tat = greatest(job_gates.tat, statement_timestamp())
                  + make_interval(secs => admitted.starts / admitted.rate),
            updated_at = statement_timestamp()
        FROM (
            SELECT rate_key, count(*) AS starts, max(rate_per_second) AS rate
            FROM rate WHERE verdict IS NULL AND rate_key IS NOT NULL
            GROUP BY rate_key
        ) AS admitted
        WHERE job_gates.key = admitted.rate_key
        RETURNING job_gates.key
    ), held AS (
        UPDATE jobcore.jobs
        SET held_reason = rate.verdict,
            held_since = statement_timestamp(),
            {_KEEP_PUBLISH}
            updated_at = statement_timestamp()
        FROM rate
        WHERE jobs.id = rate.job_id
          AND rate.verdict IS NOT NULL
          AND {status_is("jobs.status", JobStatus.PENDING)}
          AND jobs.attempts + 1 = rate.attempt
          AND {_DUE}
        RETURNING rate.message_id, jobs.held_reason
    ), claimed AS (
        -- Status and attempt again: a row another claim changed since the snapshot is
        -- re-checked in its new version (READ COMMITTED), and then left alone.
        UPDATE jobcore.jobs
        SET status = 'running',
            attempts = jobs.attempts + 1,
            lease_token = rate.lease_token,
            lease_expires_at = now() + make_interval(secs => rate.lease),
            worker_id = %(worker_id)s,
            -- The claim is its own `claimed` event (jobcore.kernel.jobevents.with_claims):
            -- its lease, and its time unless it is the job's first (started_at's).
            claim_lease_until = now() + make_interval(secs => rate.lease),
            claimed_at = CASE WHEN jobs.started_at IS NOT NULL THEN statement_timestamp() END,
            started_at = coalesce(jobs.started_at, statement_timestamp()),
            {_KEEP_PUBLISH}
            held_reason = NULL,
            held_since = NULL,
            not_before = NULL,
            updated_at = now()
        FROM rate
        WHERE jobs.id = rate.job_id
          AND rate.verdict IS NULL
          AND {status_is("jobs.status", JobStatus.PENDING)}
          AND jobs.attempts + 1 = rate.attempt
          AND {_DUE}
        RETURNING rate.message_id AS claimed_message_id, rate.lease_token, jobs.id,
                  jobs.payload, jobs.payload_ref, jobs.debounce_payloads,
                  jobs.attempts, jobs.max_attempts,
                  jobs.store_give_backs, jobs.snoozes, jobs.cancel_requested_at,
                  jobs.traceparent, jobs.tracestate, jobs.created_at, jobs.lease_expires_at,
                  greatest(jobs.created_at, jobs.next_attempt_at) AS due_at
    ), resumed AS (
        -- A retry of this claim after its commit went unanswered: the message is in the
        -- inbox already, and its job runs under the lease token of this very request
        -- (drawn per request before the first try: no other claim holds it). The job is
        -- this claim's: its lease counts again from now, and it is answered as claimed.
        UPDATE jobcore.jobs
        SET lease_expires_at = now() + make_interval(secs => again.lease),
            updated_at = now()
        FROM (
            SELECT input.* FROM input LEFT JOIN received USING (message_id)
            WHERE received.message_id IS NULL
        ) AS again
        WHERE jobs.id = again.job_id
          AND {status_is("jobs.status", JobStatus.RUNNING)}
          AND jobs.lease_token = again.lease_token
        RETURNING again.message_id AS claimed_message_id, again.lease_token, jobs.id,
                  jobs.payload, jobs.payload_ref, jobs.debounce_payloads,
                  jobs.attempts, jobs.max_attempts,
                  jobs.store_give_backs, jobs.snoozes, jobs.cancel_requested_at,
                  jobs.traceparent, jobs.tracestate, jobs.created_at, jobs.lease_expires_at,
                  greatest(jobs.created_at, jobs.next_attempt_at) AS due_at
    ), unkept AS (
        -- A fresh message of attempt 1 that neither claimed nor held its job (its queue or
        -- type paused, its job ended or taken by another copy): a publish no job row
        -- keeps, so an event row, unless the job row holds one already (the relay wrote
        -- none for it: OUTBOX_DELETE_PUBLISHED). If the relay's delete comes after this,
        -- it may write one too, for the same message, which the readers list once.
        INSERT INTO jobcore.job_events (job_id, at, kind, attempt, detail)
        SELECT input.job_id, input.published_at, '{JobEventKind.PUBLISHED}', input.attempt,
               jsonb_build_object('relay', input.published_by, 'message_id', input.message_id)
        FROM input
        JOIN received USING (message_id)
        JOIN jobcore.jobs ON jobs.id = input.job_id AND jobs.type = input.type
        WHERE input.attempt = 1 AND input.published_at IS NOT NULL
          AND jobs.published_at IS NULL AND {EVENTS_ON}
          AND NOT EXISTS (SELECT 1 FROM claimed
                          WHERE claimed.claimed_message_id = input.message_id)
          AND NOT EXISTS (SELECT 1 FROM held WHERE held.message_id = input.message_id)
    ), taken AS (
        SELECT * FROM claimed UNION ALL SELECT * FROM resumed
    ), parked AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            priority
        )
        SELECT gen_random_uuid(), %(exchange)s, jobs.queue, jobs.type,
               jsonb_strip_nulls(jsonb_build_object(
                   'traceparent', jobs.traceparent, 'tracestate', jobs.tracestate)),
               convert_to(jsonb_build_object(
                   'v', 1, 'job_id', jobs.id, 'attempt', live.attempt, 'type', jobs.type
               )::text, 'UTF8'),
               jobs.id, jobs.tenant, jobs.priority
        FROM live JOIN jobcore.jobs ON jobs.id = live.job_id
        WHERE live.paused
        RETURNING job_id
    )
    SELECT input.message_id, input.type AS message_type,
           received.message_id IS NOT NULL OR resumed.id IS NOT NULL AS fresh,
           resumed.id IS NOT NULL AS resumed,
           parked.job_id IS NOT NULL AS parked,
           before.status AS status_before,
           held.held_reason,
           taken.*
    FROM input
    LEFT JOIN received USING (message_id)
    LEFT JOIN jobcore.jobs AS before ON before.id = input.job_id
    LEFT JOIN taken ON taken.claimed_message_id = input.message_id
    LEFT JOIN resumed ON resumed.claimed_message_id = input.message_id
    LEFT JOIN parked ON parked.job_id = input.job_id
    LEFT JOIN held ON held.message_id = input.message_id
    """


JOB_CLAIM_MANY = Query[JobClaimManyParams](
    "job_claim_many",
    "Record messages in the inbox and, for the new ones, claim their pending jobs under leases "
    "if their gates let them start (each claim kept on its job row: its `claimed` event), "
    "else hold them, or park them in the outbox while their queue or type is paused.",
    _claim_sql("true"),
)

# A job with no concurrency or rate key has no gate row to lock: JOB_GATES_LOCK locks
# nothing for it, and the claim's concurrency and rate gates let it through. So the messages
# of such jobs are claimed by this statement on its own (one statement, committing by
# itself: no BEGIN, no lock statement, no COMMIT), and only the others go through
# JOB_GATES_LOCK and JOB_CLAIM_MANY (jobcore.database.store.jobs.JobStore.claim). Which jobs those
# are is read from the job rows, as the lock reads them (keys are written at enqueue and
# never change: invariant 15), not from the worker's registry. A message whose job has a
# key is left out here, not recorded in the inbox: JOB_CLAIM_MANY records it. For the
# messages it keeps, this is JOB_CLAIM_MANY word for word (inbox, fence, ordering, parking,
# resuming an unanswered commit of itself), so it answers what JOB_CLAIM_MANY would.
_KEYED = (
    "EXISTS (SELECT 1 FROM jobcore.jobs AS keyed WHERE keyed.id = i.job_id"
    " AND (keyed.concurrency_key IS NOT NULL OR keyed.rate_key IS NOT NULL))"
)
JOB_CLAIM_UNGATED = Query[JobClaimManyParams](
    "job_claim_ungated",
    "Record messages in the inbox and claim their pending jobs, as job_claim_many does, for "
    "the messages whose jobs have no concurrency or rate key (the others are left out).",
    _claim_sql(f"NOT {_KEYED}"),
)


class JobClaimFromOutboxParams(TypedDict):
    consumer: str
    exchange: str
    # One token per row it may take (`limit`), drawn before the statement.
    lease_tokens: list[uuid.UUID]
    # Each job type's lease, in seconds, by `types`.
    leases: list[float]
    limit: int
    queues: list[str]
    types: list[str]
    # Seconds back from now that a row may have become due.
    window: float
    worker_id: str


# A worker with idle handlers that hears an enqueue's NOTIFY takes the new outbox rows
# itself, unpublished (services/worker/direct.py; docs/design.md, "Direct pickup"), in
# one statement: it locks up to `limit` rows of its queues and types that became due in
# the last `window` seconds (a short range of outbox_due_idx, however long the backlog
# behind it), claims their messages as JOB_CLAIM_UNGATED does, word for word, and deletes
# the rows it claimed for. A row a relay is publishing is locked by the relay's claim (SKIP
# LOCKED: left to it, its message comes through the broker); one a relay deleted is not
# found. So each outbox row is published or taken here, never both, and a message
# published anyway (a relay that took the row before this statement) meets the inbox.
# Left to the relays: ordered rows (their turn is the relays' to keep), paused queues and
# types (the message would only be parked again) and messages whose jobs have a
# concurrency or rate key (their claim needs JOB_GATES_LOCK first; such a row, locked for
# this statement only, stays as it was). Every message it keeps is done with as a
# delivery would be: claimed, held, parked (a new outbox row, as JOB_CLAIM_MANY writes
# one), or recorded as seen. Its message's attempt is read from the row's body, which
# jobcore writes (jobcore.execution.job_messages): a body that does not parse fails the
# statement, and the relays publish the row to the consumer that dead-letters it.
JOB_CLAIM_FROM_OUTBOX = Query[JobClaimFromOutboxParams](
    "job_claim_from_outbox",
    "Take the fresh outbox rows of these queues and types that no relay holds, and claim "
    "their jobs as job_claim_ungated does (a job with a concurrency or rate key is left to "
    "the relays).",
    _claim_sql(f"NOT {_KEYED}", from_outbox=True),
)


class JobResumeTokensParams(TypedDict):
    lease_tokens: list[uuid.UUID]
    leases: list[float]
    types: list[str]


# After JOB_CLAIM_FROM_OUTBOX's commit went unanswered: the jobs running under the lease
# tokens drawn for it are the ones it claimed (a token is drawn per statement and never
# reused), their leases counted again from now, and answered as a claim would answer them.
JOB_RESUME_TOKENS = Query[JobResumeTokensParams](
    "job_resume_tokens",
    "The jobs running under these lease tokens, their leases renewed: what a claim whose "
    "commit went unanswered took.",
    f"""
    UPDATE jobcore.jobs
    SET lease_expires_at = now() + make_interval(secs => kind.lease),
        updated_at = now()
    FROM unnest(%(types)s::text[], %(leases)s::float8[]) AS kind(type, lease)
    WHERE jobs.lease_token = ANY(%(lease_tokens)s::uuid[])
      AND {status_is("jobs.status", JobStatus.RUNNING)}
      AND jobs.type = kind.type
    RETURNING NULL::uuid AS message_id, jobs.type AS message_type, true AS fresh,
              true AS resumed, jobs.lease_token, jobs.id,
              jobs.payload, jobs.payload_ref, jobs.debounce_payloads,
              jobs.attempts, jobs.max_attempts,
              jobs.store_give_backs, jobs.snoozes, jobs.cancel_requested_at,
              jobs.traceparent, jobs.tracestate, jobs.created_at, jobs.lease_expires_at,
              greatest(jobs.created_at, jobs.next_attempt_at) AS due_at
    """,
)

# Its complement, after JOB_GATES_LOCK: JOB_CLAIM_MANY for the messages JOB_CLAIM_UNGATED
# leaves out. A batch expected to hold such jobs sends both at once, with no round trip
# between them (jobcore.database.store.jobs.JobStore.claim).
JOB_CLAIM_KEYED = Query[JobClaimManyParams](
    "job_claim_keyed",
    "Record messages in the inbox and claim their pending jobs, as job_claim_many does, for "
    "the messages whose jobs have a concurrency or rate key (the others are left out).",
    _claim_sql(_KEYED),
)


class JobGatesLockParams(TypedDict):
    job_ids: list[uuid.UUID]


# Before every claim, in its transaction: create and lock the job_gates rows of the
# concurrency and rate keys on the jobs' rows, in key order (two claimers lock in the same
# order); jobs with no such key lock nothing. ON CONFLICT DO UPDATE locks an existing row,
# and writes a version only to note, at most once a minute, that the key is in use
# (updated_at: the pruner deletes rows idle for JOBCORE_GATE_RETENTION,
# jobcore.database.sql.job_gates).
JOB_GATES_LOCK = Query[JobGatesLockParams](
    "job_gates_lock",
    "Create and lock, in key order, the gate rows of the concurrency and rate keys of jobs.",
    f"""
    INSERT INTO jobcore.job_gates (key)
    SELECT DISTINCT gate.key
    FROM jobcore.jobs
    CROSS JOIN LATERAL (VALUES (jobs.concurrency_key), (jobs.rate_key)) AS gate(key)
    WHERE jobs.id = ANY(%(job_ids)s::uuid[]) AND {status_is("jobs.status", JobStatus.PENDING)}
      AND gate.key IS NOT NULL
    ORDER BY gate.key
    ON CONFLICT (key) DO UPDATE SET updated_at = statement_timestamp()
    WHERE job_gates.updated_at < statement_timestamp() - interval '1 minute'
    """,
)


class JobNoteUndeliverableParams(TypedDict):
    attempt: int
    error: str
    job_id: uuid.UUID
    message_id: uuid.UUID
    # What the message's headers say of its publish (None: nothing).
    published_at: datetime | None
    published_by: str | None
    type: str


# A message no worker here can run (its job type is unknown to this deployment, as during
# a rolling deploy) goes to the dead-letter queue, where `jobcore dlq replay` recovers it;
# meanwhile its job stays pending, and this says why to whoever polls it. Only the job's
# current attempt, of the type the message names, and only while it is still pending. The
# message's publish, when no claim kept one on the job row (the relay wrote no row for a
# first attempt's first publish: OUTBOX_DELETE_PUBLISHED), is its `published` row.
JOB_NOTE_UNDELIVERABLE = Query[JobNoteUndeliverableParams](
    "job_note_undeliverable",
    "Record on a pending job why its message went to the dead-letter queue (and the event).",
    f"""
    WITH noted AS (
        UPDATE jobcore.jobs SET last_error = %(error)s, updated_at = now()
        WHERE id = %(job_id)s AND type = %(type)s AND {status_is("status", JobStatus.PENDING)}
          AND attempts + 1 = %(attempt)s
        RETURNING id, published_at
    ), unkept AS (
        INSERT INTO jobcore.job_events (job_id, at, kind, attempt, detail)
        SELECT id, %(published_at)s::timestamptz, '{JobEventKind.PUBLISHED}', %(attempt)s,
               jsonb_build_object('relay', %(published_by)s::text,
                                  'message_id', %(message_id)s::uuid)
        FROM noted
        WHERE %(published_at)s::timestamptz IS NOT NULL AND %(attempt)s = 1
          AND noted.published_at IS NULL AND {EVENTS_ON}
    )
    INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
    SELECT id, '{JobEventKind.DEAD_LETTERED}', %(attempt)s,
           jsonb_build_object('by', 'worker', 'reason', {short_error("%(error)s")})
    FROM noted
    WHERE {EVENTS_ON}
    """,
)


class JobHeartbeatParams(TypedDict):
    id: uuid.UUID
    lease: float
    lease_token: uuid.UUID


JOB_HEARTBEAT = Query[JobHeartbeatParams](
    "job_heartbeat",
    "Extend a running job's lease if this worker still holds it; report a cancel request.",
    f"""
    UPDATE jobcore.jobs
    SET lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
    WHERE {LEASE_FENCE}
    RETURNING cancel_requested_at
    """,
)


class JobProgressSetParams(TypedDict):
    fraction: float
    id: uuid.UUID
    lease_token: uuid.UUID
    message: str | None


# A handler's latest progress report (throttled by the worker, jobcore.execution.progress_reports),
# fenced like every write after the claim: a worker that lost the lease writes nothing and
# learns it from the missing row. Not a change of the job's state: updated_at stays.
JOB_PROGRESS_SET = Query[JobProgressSetParams](
    "job_progress_set",
    "Record a running job's progress under its lease, and wake the long-polls waiting for it.",
    f"""
    UPDATE jobcore.jobs
    SET progress_fraction = %(fraction)s,
        progress_message = %(message)s,
        progress_attempt = attempts,
        progress_updated_at = now()
    WHERE {LEASE_FENCE}
    RETURNING id, pg_notify('{JOB_PROGRESS_CHANNEL}', id::text) IS NULL AS notified
    """,
)


class JobSucceedManyParams(CompletionParams):
    effects: str
    ids: list[uuid.UUID]
    lease_tokens: list[uuid.UUID]
    result_refs: list[str | None]
    results: list[str | None]


# Successes are batched like claims. Effects travel as one JSON array
# ([{"job_id": .., "lease_token": .., "kind": .., "detail": {..}}]) so that any number of
# them is still one statement; an attempt's effects are written only if its fenced update
# won. They are matched on the lease token too: one batch can hold two attempts of a job
# (a lost attempt's success, retried through a database outage, next to the success of
# the attempt the reaper started), and only the winner's effects may be written. Returns
# the jobs whose update won. Like every statement that ends a job, it records the job's completion
# webhook (if it has a callback) and wakes long-poll waiters
# (jobcore.database.sql.webhook_deliveries).
JOB_SUCCEED_MANY = Query[JobSucceedManyParams](
    "job_succeed_many",
    "Record successes with their results and effects, each fenced by its lease token.",
    f"""
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ids)s::uuid[], %(lease_tokens)s::uuid[], %(results)s::text[],
            %(result_refs)s::text[]
        ) AS i(id, lease_token, result, result_ref)
    ), done AS (
        UPDATE jobcore.jobs
        SET status = 'succeeded',
            result = input.result::jsonb,
            result_ref = input.result_ref,
            lease_expires_at = NULL,
            finished_at = now(),
            updated_at = now()
        FROM input
        WHERE jobs.id = input.id
          AND {status_is("jobs.status", JobStatus.RUNNING)}
          AND jobs.lease_token = input.lease_token
        RETURNING jobs.id, jobs.attempts, jobs.tenant, jobs.status, jobs.callback_url,
                  jobs.traceparent, jobs.tracestate, jobs.lease_token, jobs.last_error
    ), effects AS (
        INSERT INTO jobcore.job_effects (job_id, attempt, kind, detail)
        SELECT done.id, done.attempts, effect.item ->> 'kind', effect.item -> 'detail'
        FROM jsonb_array_elements(%(effects)s::jsonb) WITH ORDINALITY AS effect(item, n)
        JOIN done ON done.id = (effect.item ->> 'job_id')::uuid
                 AND done.lease_token = (effect.item ->> 'lease_token')::uuid
        ORDER BY effect.n
        RETURNING id
    ), {COMPLETION_WEBHOOKS}
    SELECT done.id, {NOTIFY_JOB_DONE}
    FROM done
    """,
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
# so it survives a broker outage and shows in the database while it waits. Its event and
# its message are dated by the same clock read as the due time (statement_timestamp(): not
# the event column's clock_timestamp(), read later, nor the message's now(), the start of a
# transaction that may hold earlier statements): a delay of 0, which full jitter can draw,
# is due at its event, and the message is due exactly its delay after it was written.
JOB_RETRY = Query[JobRetryParams](
    "job_retry",
    "Put a failed attempt back to pending with a delay and its next message (or end it "
    "cancelled if that was requested).",
    f"""
    WITH back AS (
        UPDATE jobcore.jobs
        SET
            status = CASE WHEN cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
            last_error = %(error)s,
            next_attempt_at = CASE
                WHEN cancel_requested_at IS NULL
                THEN statement_timestamp() + make_interval(secs => %(delay)s)
                ELSE next_attempt_at
            END,
            lease_expires_at = NULL,
            updated_at = now()
        WHERE {LEASE_FENCE}
        RETURNING id, status, tenant, callback_url, traceparent, tracestate, priority,
                  attempts, last_error, worker_id, next_attempt_at, {CLAIM_COLUMNS}
    ), done AS (
        SELECT * FROM back WHERE status = 'cancelled'
    ), {COMPLETION_WEBHOOKS}, retry_events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail, at)
        SELECT back.id, '{JobEventKind.RETRY_SCHEDULED}', back.attempts,
               jsonb_build_object('until', back.next_attempt_at,
                                  'error', {short_error("back.last_error")})
               || {carried_claim("back")},
               statement_timestamp()
        FROM back
        WHERE back.status = 'pending' AND {EVENTS_ON}
    ), message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, available_at, priority, created_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, back.id, back.tenant, back.next_attempt_at,
               back.priority, statement_timestamp()
        FROM back
        WHERE back.status = 'pending'
        RETURNING id
    )
    SELECT back.id, back.status, back.next_attempt_at,
           (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified,
           {NOTIFY_JOB_DONE}
    FROM back LEFT JOIN done ON done.id = back.id
    """,
)


class JobOutcomeWrittenParams(TypedDict):
    consumer: str
    id: uuid.UUID
    lease_token: uuid.UUID
    message_id: uuid.UUID | None


# Only on the retry path of an outcome whose earlier try broke off, and then found no row
# to update: did that try commit unanswered (docs/operations.md, "Statements whose commit
# is unknown")? The row still has this lease token (every outcome leaves it: LEASE_FENCE),
# or the next claim replaced it and recorded the message the outcome wrote (a retry's, a
# release's, a snooze's) in the jobs inbox. NULL: the lease was lost to the reaper.
JOB_OUTCOME_WRITTEN = Query[JobOutcomeWrittenParams](
    "job_outcome_written",
    "Which outcome an attempt's own earlier, unanswered try wrote, if it did.",
    """
    SELECT CASE
               WHEN lease_token = %(lease_token)s
                   THEN CASE WHEN status IN ('succeeded', 'failed', 'cancelled') THEN status
                             ELSE 'pending' END
               WHEN EXISTS (SELECT 1 FROM jobcore.inbox
                            WHERE consumer = %(consumer)s AND message_id = %(message_id)s)
                   THEN 'pending'
           END AS status
    FROM jobcore.jobs
    WHERE id = %(id)s
    """,
)


class JobEndRunningParams(JobFencedParams):
    status: Literal["failed", "cancelled"]
    error: str


# A running job ends `failed` (its last attempt failed, or its payload no longer
# validates) or `cancelled` (its cancellation was requested and its handler stopped).
JOB_END_RUNNING = Query[JobEndRunningParams](
    "job_end_running",
    "Record that a running job ended failed or cancelled, fenced by the lease token.",
    f"""
    WITH done AS (
        UPDATE jobcore.jobs
        SET status = %(status)s,
            last_error = %(error)s,
            lease_expires_at = NULL,
            finished_at = now(),
            updated_at = now()
        WHERE {LEASE_FENCE}
        RETURNING id, tenant, status, callback_url, traceparent, tracestate, attempts,
                  last_error
    ), {COMPLETION_WEBHOOKS}
    SELECT done.id, {NOTIFY_JOB_DONE}
    FROM done
    """,
)


class JobReleaseParams(JobFencedParams, OutboxMessageParams):
    channel: str
    # 0 and None at shutdown. A store outage (the worker could not read the payload or
    # store the result) gives the job back after `delay` seconds with `error` as last_error.
    delay: float
    error: str | None


# A shutdown (or an object store outage) interrupted the attempt through no fault of the
# job: it does not count, and the new message carries the same attempt number, due after
# `delay` (0: at once). A give-back for an outage (`error` set) is counted in
# store_give_backs, which bounds how many the job gets (jobcore.execution.outcomes.store_failed).
# As for JOB_RETRY, the event and the due time read one clock.
JOB_RELEASE = Query[JobReleaseParams](
    "job_release",
    "Give back a running job's lease on shutdown or a store outage: pending again, with a "
    "new message due after a delay (or end it cancelled if that was requested).",
    f"""
    WITH back AS (
        UPDATE jobcore.jobs
        SET
            status = CASE WHEN cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
            attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END,
            store_give_backs = store_give_backs
                + CASE WHEN %(error)s::text IS NULL THEN 0 ELSE 1 END,
            lease_expires_at = NULL,
            last_error = coalesce(%(error)s::text, last_error),
            next_attempt_at = CASE
                WHEN cancel_requested_at IS NULL AND %(delay)s::float8 > 0
                THEN statement_timestamp() + make_interval(secs => %(delay)s::float8)
            END,
            updated_at = now()
        WHERE {LEASE_FENCE}
        RETURNING id, status, tenant, callback_url, traceparent, tracestate, priority,
                  attempts, last_error, worker_id, next_attempt_at, {CLAIM_COLUMNS}
    ), done AS (
        SELECT * FROM back WHERE status = 'cancelled'
    ), {COMPLETION_WEBHOOKS}, release_events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail, at)
        SELECT back.id, '{JobEventKind.RELEASED}', back.attempts + 1,
               jsonb_build_object('worker', back.worker_id)
               || CASE WHEN %(error)s::text IS NULL THEN '{{}}'::jsonb
                       ELSE jsonb_build_object('until', back.next_attempt_at,
                                               'error', {short_error("back.last_error")})
                  END
               || {carried_claim("back")},
               statement_timestamp()
        FROM back
        WHERE back.status = 'pending' AND {EVENTS_ON}
    ), message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            available_at, priority, created_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, back.id, back.tenant,
               coalesce(back.next_attempt_at, statement_timestamp()), back.priority,
               statement_timestamp()
        FROM back
        WHERE back.status = 'pending'
        RETURNING id
    )
    SELECT back.id, back.status, back.next_attempt_at,
           (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified,
           {NOTIFY_JOB_DONE}
    FROM back LEFT JOIN done ON done.id = back.id
    """,
)


class JobSnoozeParams(JobFencedParams, OutboxMessageParams):
    channel: str
    # Seconds until it may run again.
    delay: float
    # Snoozes the job may have in its life (its type's cap), and its last_error when a
    # snooze would pass it.
    max_snoozes: int
    cap_error: str


# The handler asked to run the job again in `delay` seconds (jobcore.execution.outcomes.Snooze):
# pending again without spending an attempt (the attempt count goes back, and the new
# message carries the attempt's own number, as a release's does), its message due then,
# and `not_before` set to that time, so a copy of the attempt's message already in the
# broker (one the sweeper published) cannot claim it sooner. What it held: its concurrency
# slot is given back (a slot is a running job), its rate token stays spent (the attempt
# started), its place in its ordering key is kept (it is still pending, so the later jobs
# of the key keep waiting). Past the cap (`snoozes` already at `max_snoozes`) it fails
# instead, with `cap_error`, and a cancellation asked for ends it cancelled, as a release
# does. As for JOB_RETRY, the event and the due time read one clock.
JOB_SNOOZE = Query[JobSnoozeParams](
    "job_snooze",
    "Put a running job back to pending, due after a delay, without spending an attempt, "
    "with its snoozed event and next message; fail it past its snooze cap (or end it "
    "cancelled if that was requested).",
    f"""
    WITH back AS (
        UPDATE jobcore.jobs
        SET
            status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                          WHEN snoozes >= %(max_snoozes)s THEN 'failed'
                          ELSE 'pending' END,
            finished_at = CASE WHEN cancel_requested_at IS NOT NULL
                                    OR snoozes >= %(max_snoozes)s THEN now() END,
            attempts = CASE WHEN cancel_requested_at IS NULL AND snoozes < %(max_snoozes)s
                            THEN attempts - 1 ELSE attempts END,
            snoozes = CASE WHEN cancel_requested_at IS NULL AND snoozes < %(max_snoozes)s
                           THEN snoozes + 1 ELSE snoozes END,
            last_error = CASE WHEN cancel_requested_at IS NULL AND snoozes >= %(max_snoozes)s
                              THEN %(cap_error)s ELSE last_error END,
            next_attempt_at = CASE WHEN cancel_requested_at IS NULL AND snoozes < %(max_snoozes)s
                THEN statement_timestamp() + make_interval(secs => %(delay)s::float8)
                ELSE next_attempt_at END,
            not_before = CASE WHEN cancel_requested_at IS NULL AND snoozes < %(max_snoozes)s
                THEN statement_timestamp() + make_interval(secs => %(delay)s::float8) END,
            lease_expires_at = NULL,
            updated_at = now()
        WHERE {LEASE_FENCE}
        RETURNING id, status, tenant, callback_url, traceparent, tracestate, priority,
                  attempts, last_error, worker_id, next_attempt_at, snoozes, {CLAIM_COLUMNS}
    ), done AS (
        SELECT * FROM back WHERE status IN ('cancelled', 'failed')
    ), {COMPLETION_WEBHOOKS}, snooze_events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail, at)
        SELECT back.id, '{JobEventKind.SNOOZED}', back.attempts + 1,
               jsonb_build_object('until', back.next_attempt_at, 'snoozes', back.snoozes,
                                  'worker', back.worker_id)
               || {carried_claim("back")},
               statement_timestamp()
        FROM back
        WHERE back.status = 'pending' AND {EVENTS_ON}
    ), message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            available_at, priority, created_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, back.id, back.tenant, back.next_attempt_at,
               back.priority, statement_timestamp()
        FROM back
        WHERE back.status = 'pending'
        RETURNING id
    )
    SELECT back.id, back.status, back.next_attempt_at, back.snoozes,
           (SELECT pg_notify(%(channel)s, '') FROM message) IS NULL AS notified,
           {NOTIFY_JOB_DONE}
    FROM back LEFT JOIN done ON done.id = back.id
    """,
)
