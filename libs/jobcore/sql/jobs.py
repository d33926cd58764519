"""Statements that change ``jobs`` (the outbox, inbox, job_effects, webhook_deliveries and
job_events rows some of them write alongside the job in the same statement), and the
reads of jobs. Each change of a job writes its event (jobcore.jobevents) in a CTE of the
statement that makes it, but the first: the job row is its own `accepted` event
(created_at and accepted_detail, which the timeline's read lists); the reads of one job
carry what jobcore.timeline.whereabouts needs to say where it is.

Sections, in the order a job meets them: enqueue; the API's reads, listing and cancel;
the operators' and the /metrics reads; the worker's claim, heartbeat and fenced outcomes
(each hot-path statement is one round trip and one transaction: the inbox insert and the
claim, or an outcome and the outbox row of a retry, commit together or not at all; every
write after the claim is fenced by ``status = 'running' AND lease_token = <the token the
claim handed out>``); the reaper and the rescuer; anti-entropy (a job's ``message_note``
is JSON saying what was last noticed about its message, with an ``event``:
``dead_lettered`` or ``republished``, kept apart from ``last_error``); and the pruner.

The pruner's *rules* are parallel arrays ``statuses``, ``types``, ``keep`` (seconds), one
per (status, type) pair that has finished jobs (:data:`JOB_TERMINAL_KINDS` lists them), so
every rule is one range scan of ``jobs_finished_idx`` (status, type, finished_at).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal, TypedDict

from psycopg.types.json import Jsonb

from jobcore.channels import JOB_PROGRESS_CHANNEL
from jobcore.jobevents import JobEventKind
from jobcore.sql import (
    LIVE_SQL,
    TERMINAL_SQL,
    CompletionParams,
    NoParams,
    OutboxMessageParams,
    Query,
)
from jobcore.sql.flow_pauses import pause_kind, paused
from jobcore.sql.job_events import (
    DONE_EVENTS,
    EVENTS_ON,
    WHEREABOUTS_COLUMNS,
    WHEREABOUTS_JOINS,
    short_error,
)
from jobcore.sql.tenant_quotas import (
    ADMISSION_COLUMNS,
    QuotaDefaultParams,
    admission_ctes,
    batch_admission_ctes,
)
from jobcore.sql.webhook_deliveries import COMPLETION_WEBHOOKS, JOB_DONE_CHANNEL, NOTIFY_JOB_DONE

# One statement writes the job, its outbox message and wakes the relays: a round trip
# per statement is the cost that matters on the enqueue path. With an idempotency key
# that is already taken, or a unique key a live job holds, ON CONFLICT (on either index:
# no conflict target) makes the job insert (and so the outbox insert) write nothing and
# return no row; the caller then reads the existing job. Without a
# callback URL the job takes the tenant's default endpoint for its type, if any (a
# primary-key probe of webhook_endpoints).


def _insert_job_with_outbox() -> str:
    """The enqueue statement, for a tenant the caller has authenticated.

    It returns one row, or none when the request's API key (``key_id``) is no longer
    usable (nothing is written then). ``id`` is NULL when no job was written, because the tenant's
    quotas refused it (``refusal``) or the idempotency key is taken (the caller then
    reads that job). The quotas are checked in the same statement
    (:func:`jobcore.sql.tenant_quotas.admission_ctes`), so they cost no round trip; a
    replay of an accepted request skips them.
    """
    return f"""
    WITH {admission_ctes()}, place AS (
        INSERT INTO job_gates (key, counter)
        SELECT 'ordering:' || admit.tenant || ':' || %(ordering_key)s, 1
        FROM admit
        WHERE admit.last_refusal IS NULL AND %(ordering_key)s::text IS NOT NULL
          AND %(ordering_seq)s::bigint IS NULL
        ON CONFLICT (key) DO UPDATE
        SET counter = job_gates.counter + 1, updated_at = now()
        RETURNING counter
    ), job AS (
        INSERT INTO jobs (
            id, tenant, type, queue, idempotency_key, payload_fingerprint,
            payload, entity_id, max_attempts, next_attempt_at, traceparent, tracestate,
            unique_key, priority,
            concurrency_key, concurrency_limit, rate_key, rate_per_second, rate_burst,
            ordering_key, ordering_seq, ordering_blocks,
            callback_url, accepted_detail, payload_ref
        )
        SELECT
            %(id)s, admit.tenant, %(type)s, %(queue)s, %(idempotency_key)s,
            %(payload_fingerprint)s, %(payload)s, %(entity_id)s, %(max_attempts)s,
            %(run_at)s, %(traceparent)s, %(tracestate)s, %(unique_key)s, %(priority)s,
            %(concurrency_key)s, %(concurrency_limit)s, %(rate_key)s, %(rate_per_second)s,
            %(rate_burst)s, %(ordering_key)s,
            coalesce(%(ordering_seq)s::bigint, (SELECT counter FROM place)),
            %(ordering_blocks)s,
            coalesce(%(callback_url)s, (
                SELECT url FROM webhook_endpoints
                WHERE tenant = admit.tenant AND job_type IN (%(type)s, '*')
                ORDER BY job_type = '*'
                LIMIT 1
            )),
            nullif(jsonb_strip_nulls(jsonb_build_object('run_at', %(run_at)s::timestamptz))
                       || %(event_detail)s, '{{}}'::jsonb),
            %(payload_ref)s
        FROM admit
        WHERE admit.last_refusal IS NULL
        ON CONFLICT DO NOTHING
        RETURNING id, tenant, created_at, priority
    ), message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, available_at, priority
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, job.id, job.tenant, coalesce(%(run_at)s, now()),
               job.priority
        FROM job
        RETURNING id
    )
    SELECT limits.tenant, job.id, job.created_at,
           (SELECT pg_notify(%(channel)s, '') FROM message WHERE %(notify)s) IS NULL
               AS notified,
           {ADMISSION_COLUMNS}
    FROM limits LEFT JOIN admit ON true LEFT JOIN job ON true
    """


class JobGateParams(TypedDict):
    """A job's gates, resolved at enqueue (jobcore.gates); all None: no gate."""

    concurrency_key: str | None
    concurrency_limit: int | None
    ordering_blocks: bool
    ordering_key: str | None
    # None: the next place in the key; a retry of a failed job takes the place it had.
    ordering_seq: int | None
    rate_burst: int | None
    rate_key: str | None
    rate_per_second: float | None


class JobInsertParams(OutboxMessageParams, QuotaDefaultParams, JobGateParams):
    """The job, its first message, and the default quotas of a tenant without overrides."""

    callback_url: str | None
    channel: str
    # False: the caller wakes the relays itself once the statement committed (OUTBOX_WAKE).
    notify: bool
    entity_id: str | None
    # What the `accepted` event says besides run_at (its schedule): jobs.accepted_detail.
    event_detail: Jsonb
    id: uuid.UUID
    idempotency_key: str | None
    # The payload's key in the object store (jobcore.objectstore) when it is too large to
    # keep inline; ``payload`` is then {}.
    payload_ref: str | None
    # The API key the request came with (checked usable in the statement), or None.
    key_id: uuid.UUID | None
    max_attempts: int
    payload: Jsonb
    payload_fingerprint: str | None
    priority: int
    queue: str
    run_at: datetime | None
    traceparent: str | None
    tracestate: str | None
    tenant: str
    type: str
    unique_key: str | None


JOB_INSERT = Query[JobInsertParams](
    "job_insert",
    "Insert a pending job (its own `accepted` event) and its outbox message, and NOTIFY the "
    "relays, in one statement.",
    _insert_job_with_outbox(),
    generic_plan=True,
)


class JobInsertManyParams(QuotaDefaultParams):
    """A batch of one job type for one tenant, as parallel arrays (one element per item;
    ``ns`` numbers them for the answer), and the batch's shared columns."""

    bodies: list[bytes]
    callback_url: str | None
    channel: str
    entity_ids: list[str | None]
    exchange: str
    fingerprints: list[str]
    headers: Jsonb
    idempotency_keys: list[str | None]
    ids: list[uuid.UUID]
    max_attempts: list[int]
    message_ids: list[uuid.UUID]
    ns: list[int]
    payloads: list[Jsonb]
    priority: int
    # Flow control (jobcore.gates): each item's keys, the type's limits (no ordering key:
    # a batch's items take none).
    concurrency_keys: list[str | None]
    concurrency_limit: int | None
    rate_keys: list[str | None]
    rate_per_second: float | None
    rate_burst: int | None
    ordering_blocks: bool
    queue: str
    routing_key: str
    run_ats: list[datetime | None]
    tenant: str
    traceparent: str | None
    tracestate: str | None
    type: str
    unique_keys: list[str | None]


# Batch enqueue (jobcore.batch): one multi-row insert of the jobs and one of their outbox
# rows. The caller holds the tenant's usage row (TENANT_USAGE_LOCK). An item is new when
# no job holds its idempotency key and no live job its unique key (at this snapshot): the
# first `room.admitted` new items are inserted, the rest are refused by the quota named
# in `refusal`. ON CONFLICT DO NOTHING (either unique index) covers what the snapshot
# could not see: a racing insert of the same key (it waits for that transaction), and an
# earlier item of the same batch with the same key. An item with no job and no refusal
# is answered from the jobs that hold its keys (JOB_GET_BATCH_HOLDERS).
JOB_INSERT_MANY = Query[JobInsertManyParams](
    "job_insert_many",
    "Insert a batch of pending jobs with their outbox messages, as many as the tenant's "
    "quotas admit, and NOTIFY the relays, in one statement.",
    f"""
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ns)s::int[], %(ids)s::uuid[], %(idempotency_keys)s::text[],
            %(fingerprints)s::text[], %(payloads)s::jsonb[], %(entity_ids)s::text[],
            %(max_attempts)s::int[], %(run_ats)s::timestamptz[], %(unique_keys)s::text[],
            %(message_ids)s::uuid[], %(bodies)s::bytea[], %(concurrency_keys)s::text[],
            %(rate_keys)s::text[]
        ) AS i(n, id, idempotency_key, payload_fingerprint, payload, entity_id,
               max_attempts, run_at, unique_key, message_id, body, concurrency_key, rate_key)
    ), fresh AS (
        SELECT input.n, row_number() OVER (ORDER BY input.n) AS rank
        FROM input
        WHERE NOT EXISTS (
                  SELECT 1 FROM jobs
                  WHERE jobs.tenant = %(tenant)s::text AND jobs.type = %(type)s
                    AND jobs.idempotency_key = input.idempotency_key
              )
          AND NOT EXISTS (
                  SELECT 1 FROM jobs
                  WHERE jobs.tenant = %(tenant)s::text AND jobs.type = %(type)s
                    AND jobs.unique_key = input.unique_key
                    AND jobs.unique_key IS NOT NULL AND jobs.status IN {LIVE_SQL}
              )
    ), wanted AS (
        SELECT count(*) AS n FROM fresh
    ), {batch_admission_ctes()}, hook AS (
        SELECT coalesce(%(callback_url)s, (
            SELECT url FROM webhook_endpoints
            WHERE tenant = %(tenant)s::text AND job_type IN (%(type)s, '*')
            ORDER BY job_type = '*'
            LIMIT 1
        )) AS url
    ), job AS (
        INSERT INTO jobs (
            id, tenant, type, queue, status, idempotency_key, payload_fingerprint,
            payload, entity_id, max_attempts, next_attempt_at, traceparent, tracestate,
            unique_key, priority, concurrency_key, concurrency_limit, rate_key,
            rate_per_second, rate_burst, ordering_blocks, callback_url, accepted_detail
        )
        SELECT
            input.id, %(tenant)s::text, %(type)s, %(queue)s, 'pending', input.idempotency_key,
            input.payload_fingerprint, input.payload, input.entity_id, input.max_attempts,
            input.run_at, %(traceparent)s, %(tracestate)s, input.unique_key, %(priority)s,
            input.concurrency_key, %(concurrency_limit)s, input.rate_key,
            %(rate_per_second)s, %(rate_burst)s, %(ordering_blocks)s, hook.url,
            jsonb_strip_nulls(jsonb_build_object('run_at', input.run_at, 'batch', true))
        FROM input JOIN fresh USING (n) CROSS JOIN room CROSS JOIN hook
        WHERE fresh.rank <= room.admitted
        ORDER BY input.n
        ON CONFLICT DO NOTHING
        RETURNING id, status, created_at
    ), message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, available_at, priority
        )
        SELECT input.message_id, %(exchange)s, %(routing_key)s, %(type)s, %(headers)s,
               input.body, job.id, %(tenant)s::text, coalesce(input.run_at, now()),
               %(priority)s
        FROM job JOIN input ON input.id = job.id
        RETURNING id
    )
    SELECT input.n, job.id, job.status, job.created_at,
           CASE WHEN fresh.rank > room.admitted THEN room.refusal END AS refusal,
           (SELECT pg_notify(%(channel)s, '') FROM message LIMIT 1) IS NULL AS notified,
           limits.rate, limits.burst, limits.max_unfinished,
           (SELECT rate_tat FROM charged) AS rate_tat, clock_timestamp() AS now
    FROM input
    LEFT JOIN fresh USING (n)
    LEFT JOIN job ON job.id = input.id
    CROSS JOIN room CROSS JOIN limits
    ORDER BY input.n
    """,
)


class JobGetBatchHoldersParams(TypedDict):
    idempotency_keys: list[str | None]
    ns: list[int]
    tenant: str
    type: str
    unique_keys: list[str | None]


JOB_GET_BATCH_HOLDERS = Query[JobGetBatchHoldersParams](
    "job_get_batch_holders",
    "For each item of a batch, the job that holds its idempotency key and the live job "
    "that holds its unique key.",
    f"""
    SELECT input.n,
           keyed.id AS keyed_id, keyed.status AS keyed_status,
           keyed.created_at AS keyed_created_at, keyed.payload_fingerprint,
           live.id AS live_id, live.status AS live_status
    FROM unnest(%(ns)s::int[], %(idempotency_keys)s::text[], %(unique_keys)s::text[])
        AS input(n, idempotency_key, unique_key)
    LEFT JOIN LATERAL (
        SELECT id, status, created_at, payload_fingerprint FROM jobs
        WHERE tenant = %(tenant)s AND type = %(type)s
          AND idempotency_key = input.idempotency_key AND idempotency_key IS NOT NULL
    ) AS keyed ON true
    LEFT JOIN LATERAL (
        SELECT id, status FROM jobs
        WHERE tenant = %(tenant)s AND type = %(type)s
          AND unique_key = input.unique_key AND unique_key IS NOT NULL
          AND status IN {LIVE_SQL}
    ) AS live ON true
    """,
)


class JobGetParams(TypedDict):
    id: uuid.UUID
    tenant: str


# The job with what says where it is now (jobcore.sql.job_events.WHEREABOUTS_COLUMNS).
JOB_GET = Query[JobGetParams](
    "job_get",
    "Read one job of one tenant (another tenant's job reads as missing), with its whereabouts "
    "and whether its queue or type is paused.",
    f"""
    SELECT jobs.*, {pause_kind("jobs.queue", "jobs.type")} AS paused, {WHEREABOUTS_COLUMNS}
    FROM jobs {WHEREABOUTS_JOINS}
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
    SELECT jobs.*, {pause_kind("jobs.queue", "jobs.type")} AS paused, {WHEREABOUTS_COLUMNS}
    FROM jobs {WHEREABOUTS_JOINS}
    WHERE jobs.id = %(id)s
    """,
)


class JobGetByIdempotencyKeyParams(TypedDict):
    idempotency_key: str | None
    tenant: str
    type: str


JOB_GET_BY_IDEMPOTENCY_KEY = Query[JobGetByIdempotencyKeyParams](
    "job_get_by_idempotency_key",
    "Find the job that already holds an idempotency key (tenant and type scoped).",
    """
    SELECT * FROM jobs
    WHERE tenant = %(tenant)s AND type = %(type)s AND idempotency_key = %(idempotency_key)s
    """,
)


class JobGetUniqueHolderParams(TypedDict):
    tenant: str
    type: str
    unique_key: str | None


# Served by jobs_unique_uidx: the query names its predicate.
JOB_GET_UNIQUE_HOLDER = Query[JobGetUniqueHolderParams](
    "job_get_unique_holder",
    "Find the pending or running job that holds a unique key (tenant and type scoped).",
    f"""
    SELECT id, status FROM jobs
    WHERE tenant = %(tenant)s AND type = %(type)s
      AND unique_key = %(unique_key)s AND status IN {LIVE_SQL}
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
JOB_LIST_FOR_ENTITY = Query[JobListParams](
    "job_list_for_entity",
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


JOB_GET_RESULT = Query[JobGetResultParams](
    "job_get_result",
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
JOB_LOCK_FOR_CANCEL = Query[JobLockForCancelParams](
    "job_lock_for_cancel",
    "Lock a tenant's job and read its status, before cancelling it.",
    """
    SELECT id, status FROM jobs WHERE id = %(id)s AND tenant = %(tenant)s FOR UPDATE
    """,
)


class JobCancelPendingParams(CompletionParams):
    id: uuid.UUID


# Ends the job, so it records the completion webhook and wakes waiters
# (jobcore.sql.webhook_deliveries).
JOB_CANCEL_PENDING = Query[JobCancelPendingParams](
    "job_cancel_pending",
    "Cancel a job that no worker runs yet (fenced on status = 'pending').",
    """
    WITH done AS (
        UPDATE jobs
        SET status = 'cancelled', cancel_requested_at = now(), finished_at = now(),
            held_reason = NULL, held_since = NULL, updated_at = now()
        WHERE id = %(id)s AND status = 'pending'
        RETURNING id, tenant, status, callback_url, traceparent, tracestate,
                  cancel_requested_at, attempts, last_error
    ), """
    + COMPLETION_WEBHOOKS
    + ", "
    + DONE_EVENTS
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


JOB_REQUEST_CANCEL = Query[JobRequestCancelParams](
    "job_request_cancel",
    "Ask the worker running a job to stop it (fenced on status = 'running') and NOTIFY it.",
    f"""
    WITH job AS (
        UPDATE jobs
        SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
        WHERE id = %(id)s AND status = 'running'
        RETURNING id, status, cancel_requested_at, attempts
    ), requested AS (
        INSERT INTO job_events (job_id, kind, attempt)
        SELECT job.id, '{JobEventKind.CANCEL_REQUESTED}', job.attempts FROM job
        WHERE {EVENTS_ON}
    )
    SELECT id, status, cancel_requested_at,
           pg_notify(%(channel)s, id::text) IS NULL AS notified
    FROM job
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
    FROM jobs
    WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


# Served by jobs_status_created_idx (status, created_at): a range scan per status.
JOB_COUNT_OPEN_BY_QUEUE = Query[NoParams](
    "job_count_open_by_queue",
    "Pending and running jobs per queue.",
    """
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM jobs
    WHERE status IN ('pending', 'running')
    GROUP BY queue
    """,
)


# Once per sweeper round, by the sweeper's lease holder (services/worker/sweeper.py), for
# the alert on due jobs that wait (deploy/prometheus/alerts.yaml): a job is due from
# greatest(created_at, next_attempt_at), as JOB_LOCK_STALE counts it; gated ones wait on
# purpose. Not per scrape: it reads every pending row.
JOB_OVERDUE_BY_QUEUE = Query[NoParams](
    "job_overdue_by_queue",
    "Per queue, how long its longest-waiting due pending job (not held by a gate) has been due.",
    """
    SELECT queue,
           extract(epoch FROM now() - min(greatest(created_at, next_attempt_at)))::float8
               AS overdue_seconds
    FROM jobs
    WHERE status = 'pending'
      AND held_reason IS NULL
      AND greatest(created_at, next_attempt_at) <= now()
    GROUP BY queue
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
    SELECT jobs.*, {pause_kind("jobs.queue", "jobs.type")} AS paused, {WHEREABOUTS_COLUMNS}
    FROM unnest(%(ids)s::uuid[], %(tenants)s::text[]) AS waited(id, tenant)
    JOIN jobs ON jobs.id = waited.id AND jobs.tenant = waited.tenant
    {WHEREABOUTS_JOINS}
    """,
)


# --- the worker: cancel requests, claim, heartbeat, fenced outcomes --------------------

JOB_CANCEL_LISTEN = Query[NoParams](
    "job_cancel_listen", "Hear cancel requests for running jobs.", f"LISTEN {CANCEL_CHANNEL}"
)


JOB_CANCEL_UNLISTEN = Query[NoParams](
    "job_cancel_unlisten",
    "Stop hearing cancel requests before a connection returns to the pool.",
    f"UNLISTEN {CANCEL_CHANNEL}",
)


class JobCancelRequestedParams(TypedDict):
    ids: list[uuid.UUID]


# The polling twin of the cancel NOTIFY, for workers with nowhere to LISTEN (PgBouncer in
# transaction mode): a primary-key probe per job this worker runs.
JOB_CANCEL_REQUESTED = Query[JobCancelRequestedParams](
    "job_cancel_requested",
    "Which of these running jobs someone asked to cancel.",
    """
    SELECT id FROM jobs
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running' AND cancel_requested_at IS NOT NULL
    """,
)


class JobClaimManyParams(TypedDict):
    attempts: list[int]
    consumer: str
    exchange: str
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
# Gates (jobcore.gates), checked in this order, each only among the jobs the previous
# ones let through: ordering (an earlier job of the tenant's ordering key is pending,
# running, or failed and blocking), concurrency (the key's running jobs plus this one's
# rank among the batch's would pass the limit), rate (GCRA on the key's job_gates row:
# admitted while the tat stays within `burst` intervals of now). A job a gate stops is
# *held*: it stays pending with `held_reason` set, its attempt unused; its message is done
# with (the inbox has it), and the gate releaser publishes a new one later. Every batch
# runs JOB_GATES_LOCK first in the same transaction (pipelined: one round trip), whatever
# the worker's registry declares: the counts here then come from a snapshot taken after
# every other claim of those keys committed. Times are statement_timestamp(), so a job's
# started_at is later than the finished_at of whatever it waited for.
JOB_CLAIM_MANY = Query[JobClaimManyParams](
    "job_claim_many",
    "Record messages in the inbox and, for the new ones, claim their pending jobs under leases "
    "if their gates let them start (each with its `claimed` event), else hold them, or park "
    "them in the outbox while their queue or type is paused.",
    f"""
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
    ), live AS (
        -- Fresh messages whose job waits for exactly their attempt, and whether its queue
        -- or type is paused (read once: a job's queue and type never change).
        SELECT input.*, jobs.created_at, jobs.concurrency_key, jobs.concurrency_limit,
               jobs.rate_key, jobs.rate_per_second, jobs.rate_burst,
               {paused("jobs.queue", "jobs.type")} AS paused,
               CASE WHEN jobs.ordering_key IS NOT NULL AND EXISTS (
                   SELECT 1 FROM jobs AS earlier
                   WHERE earlier.tenant = jobs.tenant
                     AND earlier.ordering_key = jobs.ordering_key
                     AND earlier.ordering_seq < jobs.ordering_seq
                     AND (earlier.status IN ('pending', 'running')
                          OR (earlier.status = 'failed' AND earlier.ordering_blocks))
               ) THEN 'ordering' END AS held
        FROM input
        JOIN received USING (message_id)
        JOIN jobs ON jobs.id = input.job_id
        WHERE jobs.status = 'pending'
          AND jobs.type = input.type
          AND jobs.attempts + 1 = input.attempt
    ), concurrency AS (
        SELECT live.*,
               CASE WHEN held IS NULL AND concurrency_key IS NOT NULL
                         AND (SELECT count(*) FROM jobs AS running
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
        FROM concurrency LEFT JOIN job_gates AS gate ON gate.key = concurrency.rate_key
    ), spent AS (
        UPDATE job_gates
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
        UPDATE jobs
        SET held_reason = rate.verdict,
            held_since = statement_timestamp(),
            updated_at = statement_timestamp()
        FROM rate
        WHERE jobs.id = rate.job_id
          AND rate.verdict IS NOT NULL
          AND jobs.status = 'pending'
          AND jobs.attempts + 1 = rate.attempt
        RETURNING rate.message_id, jobs.held_reason
    ), claimed AS (
        -- Status and attempt again: a row another claim changed since the snapshot is
        -- re-checked in its new version (READ COMMITTED), and then left alone.
        UPDATE jobs
        SET status = 'running',
            attempts = jobs.attempts + 1,
            lease_token = rate.lease_token,
            lease_expires_at = now() + make_interval(secs => rate.lease),
            worker_id = %(worker_id)s,
            started_at = coalesce(jobs.started_at, statement_timestamp()),
            held_reason = NULL,
            held_since = NULL,
            updated_at = now()
        FROM rate
        WHERE jobs.id = rate.job_id
          AND rate.verdict IS NULL
          AND jobs.status = 'pending'
          AND jobs.attempts + 1 = rate.attempt
        RETURNING rate.message_id AS claimed_message_id, rate.lease_token, jobs.id,
                  jobs.payload, jobs.payload_ref, jobs.attempts, jobs.max_attempts,
                  jobs.cancel_requested_at,
                  jobs.traceparent, jobs.tracestate, jobs.created_at, jobs.lease_expires_at,
                  greatest(jobs.created_at, jobs.next_attempt_at) AS due_at
    ), resumed AS (
        -- A retry of this claim after its commit went unanswered: the message is in the
        -- inbox already, and its job runs under the lease token of this very request
        -- (drawn per request before the first try: no other claim holds it). The job is
        -- this claim's: its lease counts again from now, and it is answered as claimed.
        UPDATE jobs
        SET lease_expires_at = now() + make_interval(secs => again.lease),
            updated_at = now()
        FROM (
            SELECT input.* FROM input LEFT JOIN received USING (message_id)
            WHERE received.message_id IS NULL
        ) AS again
        WHERE jobs.id = again.job_id
          AND jobs.status = 'running'
          AND jobs.lease_token = again.lease_token
        RETURNING again.message_id AS claimed_message_id, again.lease_token, jobs.id,
                  jobs.payload, jobs.payload_ref, jobs.attempts, jobs.max_attempts,
                  jobs.cancel_requested_at,
                  jobs.traceparent, jobs.tracestate, jobs.created_at, jobs.lease_expires_at,
                  greatest(jobs.created_at, jobs.next_attempt_at) AS due_at
    ), taken AS (
        SELECT * FROM claimed UNION ALL SELECT * FROM resumed
    ), parked AS (
        INSERT INTO outbox (
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
        FROM live JOIN jobs ON jobs.id = live.job_id
        WHERE live.paused
        RETURNING job_id
    ), claim_events AS (
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT id, '{JobEventKind.CLAIMED}', attempts,
               jsonb_build_object('worker', %(worker_id)s::text, 'lease_until', lease_expires_at)
        FROM claimed
        WHERE {EVENTS_ON}
        ORDER BY id
    )
    SELECT input.message_id,
           received.message_id IS NOT NULL OR resumed.id IS NOT NULL AS fresh,
           resumed.id IS NOT NULL AS resumed,
           parked.job_id IS NOT NULL AS parked,
           before.status AS status_before,
           held.held_reason,
           taken.*
    FROM input
    LEFT JOIN received USING (message_id)
    LEFT JOIN jobs AS before ON before.id = input.job_id
    LEFT JOIN taken ON taken.claimed_message_id = input.message_id
    LEFT JOIN resumed ON resumed.claimed_message_id = input.message_id
    LEFT JOIN parked ON parked.job_id = input.job_id
    LEFT JOIN held ON held.message_id = input.message_id
    """,
)


class JobGatesLockParams(TypedDict):
    job_ids: list[uuid.UUID]


# Before every claim, in its transaction: create and lock the job_gates rows of the
# concurrency and rate keys on the jobs' rows, in key order (two claimers lock in the same
# order); jobs with no such key lock nothing. ON CONFLICT DO UPDATE locks an existing row,
# and writes a version only to note, at most once a minute, that the key is in use
# (updated_at: the pruner deletes rows idle for JOBCORE_GATE_RETENTION, jobcore.sql.job_gates).
JOB_GATES_LOCK = Query[JobGatesLockParams](
    "job_gates_lock",
    "Create and lock, in key order, the gate rows of the concurrency and rate keys of jobs.",
    """
    INSERT INTO job_gates (key)
    SELECT DISTINCT gate.key
    FROM jobs
    CROSS JOIN LATERAL (VALUES (jobs.concurrency_key), (jobs.rate_key)) AS gate(key)
    WHERE jobs.id = ANY(%(job_ids)s::uuid[]) AND jobs.status = 'pending'
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
    type: str


# A message no worker here can run (its job type is unknown to this deployment, as during
# a rolling deploy) goes to the dead-letter queue, where `jobcore dlq replay` recovers it;
# meanwhile its job stays pending, and this says why to whoever polls it. Only the job's
# current attempt, of the type the message names, and only while it is still pending.
JOB_NOTE_UNDELIVERABLE = Query[JobNoteUndeliverableParams](
    "job_note_undeliverable",
    "Record on a pending job why its message went to the dead-letter queue (and the event).",
    f"""
    WITH noted AS (
        UPDATE jobs SET last_error = %(error)s, updated_at = now()
        WHERE id = %(job_id)s AND type = %(type)s AND status = 'pending'
          AND attempts + 1 = %(attempt)s
        RETURNING id
    )
    INSERT INTO job_events (job_id, kind, attempt, detail)
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
    """
    UPDATE jobs
    SET lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
    WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
    RETURNING cancel_requested_at
    """,
)


class JobProgressSetParams(TypedDict):
    fraction: float
    id: uuid.UUID
    lease_token: uuid.UUID
    message: str | None


# A handler's latest progress report (throttled by the worker, services.worker.job_progress),
# fenced like every write after the claim: a worker that lost the lease writes nothing and
# learns it from the missing row. Not a change of the job's state: updated_at stays.
JOB_PROGRESS_SET = Query[JobProgressSetParams](
    "job_progress_set",
    "Record a running job's progress under its lease, and wake the long-polls waiting for it.",
    f"""
    UPDATE jobs
    SET progress_fraction = %(fraction)s,
        progress_message = %(message)s,
        progress_attempt = attempts,
        progress_updated_at = now()
    WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
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
# webhook (if it has a callback) and wakes long-poll waiters (jobcore.sql.webhook_deliveries).
JOB_SUCCEED_MANY = Query[JobSucceedManyParams](
    "job_succeed_many",
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
                  jobs.traceparent, jobs.tracestate, jobs.lease_token, jobs.last_error
    ), effects AS (
        INSERT INTO job_effects (job_id, attempt, kind, detail)
        SELECT done.id, done.attempts, effect.item ->> 'kind', effect.item -> 'detail'
        FROM jsonb_array_elements(%(effects)s::jsonb) WITH ORDINALITY AS effect(item, n)
        JOIN done ON done.id = (effect.item ->> 'job_id')::uuid
                 AND done.lease_token = (effect.item ->> 'lease_token')::uuid
        ORDER BY effect.n
        RETURNING id
    ), """
    + COMPLETION_WEBHOOKS
    + ", "
    + DONE_EVENTS
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


_BACK_RETURNING = (
    "RETURNING id, status, tenant, callback_url, traceparent, tracestate, priority, "
    "attempts, last_error, worker_id"
)


_CANCELLED_ARE_DONE = (
    """done AS (
        SELECT * FROM back WHERE status = 'cancelled'
    ), """
    + COMPLETION_WEBHOOKS
    + ", "
    + DONE_EVENTS
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
JOB_RETRY = Query[JobRetryParams](
    "job_retry",
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
    + f""", retry_events AS (
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT back.id, '{JobEventKind.RETRY_SCHEDULED}', back.attempts,
               jsonb_build_object('until', back.next_attempt_at,
                                  'error', {short_error("back.last_error")})
        FROM back
        WHERE back.status = 'pending' AND {EVENTS_ON}
    ), message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, available_at, priority
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, back.id, back.tenant, back.next_attempt_at,
               back.priority
        FROM back
        WHERE back.status = 'pending'
        RETURNING id
    )
    SELECT back.id, back.status, back.next_attempt_at,"""
    + _NOTIFY_BACK,
)


class JobOutcomeWrittenParams(TypedDict):
    consumer: str
    id: uuid.UUID
    lease_token: uuid.UUID
    message_id: uuid.UUID | None


# Only on the retry path of an outcome whose earlier try broke off, and then found no row
# to update: did that try commit unanswered (docs/operations.md, "Statements whose commit
# is unknown")? Ended under this lease token (success and failure keep the token), or the
# next message the outcome wrote (a retry's, a release's) is in the outbox, or already in
# the jobs inbox. NULL: the lease was lost to someone else. A retry or release that ended
# the job cancelled wrote neither: it counts as a lost lease (nothing else is affected).
JOB_OUTCOME_WRITTEN = Query[JobOutcomeWrittenParams](
    "job_outcome_written",
    "Which outcome an attempt's own earlier, unanswered try wrote, if it did.",
    """
    SELECT CASE
               WHEN status IN ('succeeded', 'failed', 'cancelled')
                    AND lease_token = %(lease_token)s THEN status
               WHEN EXISTS (SELECT 1 FROM outbox WHERE message_id = %(message_id)s)
                    OR EXISTS (SELECT 1 FROM inbox
                               WHERE consumer = %(consumer)s AND message_id = %(message_id)s)
                   THEN 'pending'
           END AS status
    FROM jobs
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
    """
    WITH done AS (
        UPDATE jobs
        SET status = %(status)s,
            last_error = %(error)s,
            lease_expires_at = NULL,
            finished_at = now(),
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        RETURNING id, tenant, status, callback_url, traceparent, tracestate, attempts,
                  last_error
    ), """
    + COMPLETION_WEBHOOKS
    + ", "
    + DONE_EVENTS
    + """
    SELECT done.id, """
    + NOTIFY_JOB_DONE
    + """
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
# `delay` (0: at once).
JOB_RELEASE = Query[JobReleaseParams](
    "job_release",
    "Give back a running job's lease on shutdown or a store outage: pending again, with a "
    "new message due after a delay (or end it cancelled if that was requested).",
    """
    WITH back AS (
        UPDATE jobs
        SET"""
    + _PENDING_UNLESS_CANCEL_REQUESTED
    + """
            attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END,
            lease_token = NULL,
            lease_expires_at = NULL,
            last_error = coalesce(%(error)s::text, last_error),
            next_attempt_at = CASE
                WHEN cancel_requested_at IS NULL AND %(delay)s::float8 > 0
                THEN now() + make_interval(secs => %(delay)s::float8)
            END,
            updated_at = now()
        WHERE id = %(id)s AND status = 'running' AND lease_token = %(lease_token)s
        """
    + _BACK_RETURNING
    + """, next_attempt_at
    ), """
    + _CANCELLED_ARE_DONE
    + f""", release_events AS (
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT back.id, '{JobEventKind.RELEASED}', back.attempts + 1,
               jsonb_build_object('worker', back.worker_id)
               || CASE WHEN %(error)s::text IS NULL THEN '{{}}'::jsonb
                       ELSE jsonb_build_object('until', back.next_attempt_at,
                                               'error', {short_error("back.last_error")})
                  END
        FROM back
        WHERE back.status = 'pending' AND {EVENTS_ON}
    ), message AS (
        INSERT INTO outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            available_at, priority
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, back.id, back.tenant,
               coalesce(back.next_attempt_at, now()), back.priority
        FROM back
        WHERE back.status = 'pending'
        RETURNING id
    )
    SELECT back.id, back.status, back.next_attempt_at,"""
    + _NOTIFY_BACK,
)


# --- the reaper -------------------------------------------------------------------------


class JobLockExpiredParams(TypedDict):
    limit: int


JOB_LOCK_EXPIRED = Query[JobLockExpiredParams](
    "job_lock_expired",
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
JOB_REAP_EXPIRED = Query[JobReapExpiredParams](
    "job_reap_expired",
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
        RETURNING id, status, tenant, callback_url, traceparent, tracestate, priority,
                  attempts, last_error, worker_id
    ), done AS (
        SELECT * FROM reaped WHERE status <> 'pending'
    ), """
    + COMPLETION_WEBHOOKS
    + f""", reap_events AS (
        -- lease_lost, then (for a job that ends here) cancelled or finished, in that order
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT reaped.id, event.kind, reaped.attempts, event.detail
        FROM reaped
        CROSS JOIN LATERAL (
            VALUES
                (1, '{JobEventKind.LEASE_LOST}',
                 jsonb_build_object('worker', reaped.worker_id, 'then', reaped.status)),
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
        INSERT INTO outbox (
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
# is refused once its job has ended (jobcore.sql.outbox.OUTBOX_REQUEUE).
JOB_FAIL_QUARANTINED = Query[JobFailQuarantinedParams](
    "job_fail_quarantined",
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
                  jobs.tracestate, jobs.last_error, jobs.attempts
    ), """
    + COMPLETION_WEBHOOKS
    + ", "
    + DONE_EVENTS
    + """
    SELECT done.id, done.last_error, """
    + NOTIFY_JOB_DONE
    + """
    FROM done
    """,
)


class JobOrderingUnblockParams(TypedDict):
    id: uuid.UUID


# A failed job of an ordering key keeps the later ones waiting when its type blocks; an
# operator's retry (a copy that takes its place) or unblock lets them go.
JOB_ORDERING_UNBLOCK = Query[JobOrderingUnblockParams](
    "job_ordering_unblock",
    "Stop a failed job from holding back the later jobs of its ordering key.",
    """
    UPDATE jobs SET ordering_blocks = false, updated_at = now()
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
    UPDATE jobs SET ordering_blocks = false, updated_at = now()
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
        (SELECT tenant, ordering_key FROM jobs
         WHERE status = 'pending' AND held_reason = 'ordering'
         ORDER BY tenant, ordering_key LIMIT 1)
        UNION ALL
        SELECT next.tenant, next.ordering_key
        FROM ordering_keys AS done
        CROSS JOIN LATERAL (
            SELECT tenant, ordering_key FROM jobs
            WHERE status = 'pending' AND held_reason = 'ordering'
              AND (tenant, ordering_key) > (done.tenant, done.ordering_key)
            ORDER BY tenant, ordering_key LIMIT 1
        ) AS next
    ), concurrency_keys AS (
        (SELECT concurrency_key AS key FROM jobs
         WHERE status = 'pending' AND held_reason = 'concurrency'
         ORDER BY concurrency_key LIMIT 1)
        UNION ALL
        SELECT next.key
        FROM concurrency_keys AS done
        CROSS JOIN LATERAL (
            SELECT concurrency_key AS key FROM jobs
            WHERE status = 'pending' AND held_reason = 'concurrency'
              AND concurrency_key > done.key
            ORDER BY concurrency_key LIMIT 1
        ) AS next
    ), rate_keys AS (
        (SELECT rate_key AS key FROM jobs
         WHERE status = 'pending' AND held_reason = 'rate_limit'
         ORDER BY rate_key LIMIT 1)
        UNION ALL
        SELECT next.key
        FROM rate_keys AS done
        CROSS JOIN LATERAL (
            SELECT rate_key AS key FROM jobs
            WHERE status = 'pending' AND held_reason = 'rate_limit' AND rate_key > done.key
            ORDER BY rate_key LIMIT 1
        ) AS next
    ), ordering_due AS (
        SELECT head.id, now() AS due_at
        FROM ordering_keys AS k
        CROSS JOIN LATERAL (
            SELECT id, ordering_seq FROM jobs
            WHERE status = 'pending' AND held_reason = 'ordering'
              AND tenant = k.tenant AND ordering_key = k.ordering_key
            ORDER BY ordering_seq LIMIT 1
        ) AS head
        -- The key's first blocking job before it, if any: one probe of
        -- jobs_ordering_blocking_idx (a NOT EXISTS may be planned as a scan of the key).
        LEFT JOIN LATERAL (
            SELECT true AS blocked FROM jobs AS earlier
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
            SELECT concurrency_limit FROM jobs
            WHERE status = 'pending' AND held_reason = 'concurrency' AND concurrency_key = k.key
            ORDER BY created_at, id LIMIT 1
        ) AS head
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM jobs AS running
            WHERE running.concurrency_key = k.key AND running.status = 'running'
        ) AS running
        CROSS JOIN LATERAL (
            SELECT id FROM jobs
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
            SELECT rate_per_second, rate_burst FROM jobs
            WHERE status = 'pending' AND held_reason = 'rate_limit' AND rate_key = k.key
            ORDER BY created_at, id LIMIT 1
        ) AS head
        LEFT JOIN job_gates AS gate ON gate.key = k.key
    ), rate_due AS (
        SELECT held.id,
               h.first_start + make_interval(secs => (held.rank - 1) / h.rate) AS due_at
        FROM rate_heads AS h
        CROSS JOIN LATERAL (
            SELECT id, row_number() OVER (ORDER BY created_at, id) AS rank
            FROM (
                SELECT id, created_at FROM jobs
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
        FROM jobs
        WHERE jobs.id = releasable.id
          AND jobs.status = 'pending' AND jobs.held_reason IS NOT NULL
        FOR UPDATE SKIP LOCKED
    ) AS job
    """,
)


class JobReleaseHeldParams(TypedDict):
    attempts: list[int]
    available_at: list[datetime]
    bodies: list[bytes]
    channel: str
    exchanges: list[str]
    headers: list[Jsonb]
    ids: list[uuid.UUID]
    message_ids: list[uuid.UUID]
    message_types: list[str]
    routing_keys: list[str]


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
        UPDATE jobs
        SET held_reason = NULL, held_since = NULL, updated_at = now()
        FROM input
        WHERE jobs.id = input.id
          AND jobs.status = 'pending'
          AND jobs.held_reason IS NOT NULL
          AND jobs.attempts + 1 = input.attempt
        RETURNING jobs.id, jobs.tenant, jobs.rate_key, jobs.rate_per_second, jobs.priority
    ), handed_out AS (
        -- An upsert: a key's row the pruner took (idle, its state all past) comes back.
        INSERT INTO job_gates AS gate (key, released_until)
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
        INSERT INTO outbox (
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


JOB_HELD_COUNT = Query[NoParams](
    "job_held_count",
    "Held jobs per reason and type (what waits on a gate).",
    """
    SELECT held_reason, type, count(*) AS held
    FROM jobs
    WHERE status = 'pending' AND held_reason IS NOT NULL
    GROUP BY held_reason, type
    ORDER BY held_reason, type
    """,
)


# --- anti-entropy (jobcore.stranded) ----------------------------------------------------


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
      AND held_reason IS NULL
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
                      ELSE '{{}}'::jsonb END,
            updated_at = now()
        FROM input
        WHERE jobs.id = input.id
          AND jobs.status = 'pending'
          AND jobs.attempts + 1 = input.attempt
        RETURNING jobs.id, jobs.tenant, input.attempt, input.reason, jobs.republish_count,
                  jobs.priority, input.silent_seconds, input.message_id
    ), republish_events AS (
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT id, '{JobEventKind.REPUBLISHED}', attempt,
               jsonb_build_object('reason', reason, 'silent_seconds', round(silent_seconds),
                                  'message_id', message_id)
        FROM republished
        WHERE {EVENTS_ON}
        ORDER BY id
    ), messages AS (
        INSERT INTO outbox (
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
    ), dead_letter_event AS (
        INSERT INTO job_events (job_id, kind, attempt, detail)
        SELECT id, '{JobEventKind.DEAD_LETTERED}', %(attempt)s::int,
               jsonb_strip_nulls(jsonb_build_object(
                   'by', 'broker', 'reason', %(reason)s::text, 'queue', %(queue)s::text))
        FROM noted
        WHERE {EVENTS_ON}
    )
    SELECT id FROM noted
    """,
)


# --- the pruner (jobcore.retention) -----------------------------------------------------


_RULES = """
    rules AS (
        SELECT *
        FROM unnest(%(statuses)s::text[], %(types)s::text[], %(keep)s::float8[])
            AS r(status, type, keep)
    )"""


# The distinct (status, type) pairs of finished jobs by a loose index scan: one index
# probe per pair, however many jobs there are, then the oldest finished_at of each.
JOB_TERMINAL_KINDS = Query[NoParams](
    "job_terminal_kinds",
    "Each (status, type) of finished jobs, with how long ago its oldest one finished.",
    f"""
    WITH RECURSIVE kinds AS (
        (
            SELECT status, type FROM jobs
            WHERE status IN {TERMINAL_SQL}
            ORDER BY status, type
            LIMIT 1
        )
        UNION ALL
        SELECT next.status, next.type
        FROM kinds
        CROSS JOIN LATERAL (
            SELECT status, type FROM jobs
            WHERE status IN {TERMINAL_SQL} AND (status, type) > (kinds.status, kinds.type)
            ORDER BY status, type
            LIMIT 1
        ) AS next
    )
    SELECT kinds.status, kinds.type,
           extract(epoch FROM now() - oldest.finished_at)::float8 AS oldest_age
    FROM kinds
    CROSS JOIN LATERAL (
        SELECT finished_at FROM jobs
        WHERE jobs.status = kinds.status AND jobs.type = kinds.type
          AND jobs.status IN {TERMINAL_SQL} AND finished_at IS NOT NULL
        ORDER BY finished_at
        LIMIT 1
    ) AS oldest
    ORDER BY kinds.status, kinds.type
    """,
)


class JobPruneCountParams(TypedDict):
    keep: list[float]
    statuses: list[str]
    types: list[str]


# What JOB_PRUNE_BATCH would delete now, per rule, and what would go with those jobs.
JOB_PRUNE_COUNT = Query[JobPruneCountParams](
    "job_prune_count",
    "Count, per (status, type), the finished jobs past their retention and what goes with them.",
    f"""
    WITH {_RULES}
    SELECT rules.status, rules.type,
           count(doomed.id) AS jobs,
           coalesce(sum(doomed.job_effects), 0)::bigint AS job_effects,
           coalesce(sum(doomed.webhook_deliveries), 0)::bigint AS webhook_deliveries,
           coalesce(sum(doomed.outbox), 0)::bigint AS outbox,
           count(doomed.result_ref) AS result_files
    FROM rules
    LEFT JOIN LATERAL (
        SELECT jobs.id, jobs.result_ref,
               (SELECT count(*) FROM job_effects WHERE job_id = jobs.id) AS job_effects,
               (SELECT count(*) FROM webhook_deliveries WHERE job_id = jobs.id)
                   AS webhook_deliveries,
               (SELECT count(*) FROM outbox
                WHERE job_id = jobs.id AND quarantined_at IS NOT NULL) AS outbox
        FROM jobs
        WHERE jobs.status = rules.status AND jobs.type = rules.type
          AND jobs.status IN {TERMINAL_SQL}
          AND jobs.finished_at < now() - make_interval(secs => rules.keep)
    ) AS doomed ON true
    GROUP BY rules.status, rules.type
    ORDER BY rules.status, rules.type
    """,
)


class JobPruneBatchParams(TypedDict):
    keep: list[float]
    limit: int
    statuses: list[str]
    types: list[str]


# Every statement repeats `status IN (terminal)` although the rule names the status: the
# planner uses the partial index only when the query implies its predicate by itself.
#
# One batch: at most `limit` jobs past their retention, oldest first within each rule,
# locked (SKIP LOCKED: a job someone is touching waits for the next round, nobody waits
# for us), then deleted with what belongs to them: its timeline's events, by its id (they
# have no foreign key, so nothing else deletes them). Effects and deliveries would go by
# their foreign keys' ON DELETE CASCADE (index-backed: job_effects_job_id_idx,
# webhook_deliveries_job_created_idx); deleting them here first counts them. Quarantined
# outbox rows of the job (never published, so never to be) go too, on
# outbox_quarantined_job_idx; unquarantined rows are the relay's to publish, and a worker
# acknowledges a message whose job is gone with no effect. The ids go to each DELETE as one
# array (`= ANY`), which the planner serves from the index whatever it guesses the tables
# hold; `IN (SELECT ...)` was planned as a hash join over a sequential scan of the outbox.
# Returns one row per job, with its result_ref: the caller deletes those files once this
# commits.
JOB_PRUNE_BATCH = Query[JobPruneBatchParams](
    "job_prune_batch",
    "Delete a batch of finished jobs past their retention, with their effects, deliveries and "
    "quarantined outbox rows.",
    f"""
    WITH {_RULES}, doomed AS (
        SELECT job.id
        FROM rules
        CROSS JOIN LATERAL (
            SELECT id FROM jobs
            WHERE jobs.status = rules.status AND jobs.type = rules.type
              AND jobs.status IN {TERMINAL_SQL}
              AND jobs.finished_at < now() - make_interval(secs => rules.keep)
            ORDER BY jobs.finished_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS job
        LIMIT %(limit)s
    ), effects AS (
        DELETE FROM job_effects WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
    ), deliveries AS (
        DELETE FROM webhook_deliveries WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
    ), timeline AS (
        -- no foreign key cascades them (migration 0019); job_events_pkey leads with job_id
        DELETE FROM job_events WHERE job_id = ANY(ARRAY(SELECT id FROM doomed))
    ), messages AS (
        DELETE FROM outbox
        WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) AND quarantined_at IS NOT NULL
        RETURNING 1
    ), gone AS (
        DELETE FROM jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed))
        RETURNING id, status, type, result_ref, payload_ref
    )
    SELECT gone.id, gone.status, gone.type, gone.result_ref, gone.payload_ref,
           (SELECT count(*) FROM effects) AS job_effects,
           (SELECT count(*) FROM deliveries) AS webhook_deliveries,
           (SELECT count(*) FROM messages) AS outbox
    FROM gone
    """,
)


class JobIdsExistingParams(TypedDict):
    ids: list[uuid.UUID]


# For the result-file sweep: which of these job ids still have a row (primary key probes).
JOB_IDS_EXISTING = Query[JobIdsExistingParams](
    "job_ids_existing",
    "Which of the given job ids still exist.",
    "SELECT id FROM jobs WHERE id = ANY(%(ids)s::uuid[])",
)
