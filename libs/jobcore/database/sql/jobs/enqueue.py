"""Enqueue: the statements that write a new job (one, or a batch of one type), with its
outbox message and its quota check in the same statement, and the reads that answer an
enqueue that wrote nothing (the job holding the idempotency or unique key).

The job row is its own `accepted` event (created_at and accepted_detail, which the
timeline's read lists): no job_events row is written here.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.database.sql import (
    LIVE_SQL,
    OutboxMessageParams,
    Query,
)
from jobcore.database.sql.tenant_quotas import (
    ADMISSION_COLUMNS,
    PREVIEW_REFUSAL,
    QuotaDefaultParams,
    admission_ctes,
    admission_preview_ctes,
    approximate_admission_ctes,
    batch_admission_ctes,
)

# When an enqueued job's outbox row is due: its run_at, never earlier than the start of
# the statement that writes it. The relay's low-water mark (services/relay/low_water.py)
# counts on a row's key being no older than the writing statement's start: an enqueue in
# an application's long transaction, stamped with that transaction's start, would commit
# below the mark and wait for the relay's unbounded look. Its created_at is the same
# instant, so a row due at once stays a "ready" row for the fair claim (available_at <=
# created_at). A run_at in the past was due at once before as now.
MESSAGE_DUE = "greatest({run_at}, statement_timestamp())"

# A job keeps its request's fingerprint only with an idempotency key: the fingerprint is
# read only to tell a replay of that key from a different request (JOB_GET_BY_IDEMPOTENCY_KEY,
# JOB_GET_BATCH_HOLDERS). Without one it is 65 bytes of every row version, its WAL and heap
# (docs/bench/paced/lean-rows).
_KEPT_FINGERPRINT = "CASE WHEN {key}::text IS NOT NULL THEN {fingerprint}::text END"
_ONE_FINGERPRINT = _KEPT_FINGERPRINT.format(
    key="%(idempotency_key)s", fingerprint="%(payload_fingerprint)s"
)
_MANY_FINGERPRINT = _KEPT_FINGERPRINT.format(
    key="input.idempotency_key", fingerprint="input.payload_fingerprint"
)

# Where _job_inserts puts each INSERT's row condition.
_ROWS = "{ROWS}"
_MANY_KEYS = "input.idempotency_key IS NOT NULL OR input.unique_key IS NOT NULL"


def _job_inserts(insert: str, *, keys: str, returning: str) -> str:
    """The CTE ``job``: the rows ``insert`` (an INSERT ... SELECT whose row condition is
    ``{ROWS}``) writes, those with an idempotency or unique key (``keys``) by an INSERT
    ... ON CONFLICT DO NOTHING, the others by a plain INSERT.

    ON CONFLICT is for a key that a racing enqueue took after the statement's snapshot: a
    row without one conflicts with nothing (its id is a fresh uuid), and its speculative
    insertion would cost a WAL record more per job (48 bytes). The two INSERTs
    into jobs are one statement: its statement triggers see both in one transition table
    and fire once. (A single enqueue knows which it is, and runs its statement's ``_PLAIN``
    twin when it has no key: an INSERT that writes nothing still costs its setup.)
    """
    return f"""job_keyed AS (
        {insert.replace(_ROWS, f"({keys})")}
        ON CONFLICT DO NOTHING
        RETURNING {returning}
    ), job_plain AS (
        {insert.replace(_ROWS, f"NOT ({keys})")}
        RETURNING {returning}
    ), job AS (
        SELECT * FROM job_keyed UNION ALL SELECT * FROM job_plain
    )"""


# One statement writes the job, its outbox message and wakes the relays: a round trip
# per statement is the cost that matters on the enqueue path. With an idempotency key
# that is already taken, or a unique key a live job holds, ON CONFLICT (on either index:
# no conflict target) makes the job insert (and so the outbox insert) write nothing and
# return no row; the caller then reads the existing job. Without a
# callback URL the job takes the tenant's default endpoint for its type, if any (a
# primary-key probe of webhook_endpoints).


def _insert_job_with_outbox(
    *, approximate: bool = False, keyed: bool = False, plain: bool = False
) -> str:
    """The enqueue statement, for a tenant the caller has authenticated.

    It returns one row, or none when the request's API key (``key_id``) is no longer
    usable (nothing is written then). ``id`` is NULL when no job was written, because the tenant's
    quotas refused it (``refusal``) or the idempotency key is taken (the caller then
    reads that job). The quotas are checked in the same statement
    (:func:`jobcore.database.sql.tenant_quotas.admission_ctes`), so they cost no round trip; a
    replay of an accepted request skips them. ``plain``: for a job with neither an
    idempotency key nor a unique key, a plain INSERT (:func:`_job_inserts` says why).
    ``approximate``: checked without the lock of the tenant's usage row
    (:func:`jobcore.database.sql.tenant_quotas.approximate_admission_ctes`).

    ``keyed``: for a job type that debounces or throttles by key (jobcore.kernel.keyed). Once
    admitted, the enqueue first runs ``jobcore_job_key_join`` (migration 0034), which locks
    the key's row and either joins the job open to the key (``joined``: ``id`` is that
    job's, and nothing is inserted) or names the new job the key's open one (a debounce
    then sets when it is due). An enqueue that joins counts against the tenant's enqueue
    rate as any other.
    """
    admission = approximate_admission_ctes() if approximate else admission_ctes()
    key_cte = ""
    admitted = "go"
    due = "%(run_at)s"
    key_columns = ""
    key_values = ""
    answer = "job.id, job.created_at"
    joins = ""
    if keyed:
        key_cte = """, keyed AS MATERIALIZED (
        SELECT k.* FROM go CROSS JOIN LATERAL jobcore.jobcore_job_key_join(
            %(key_kind)s, %(job_key)s, go.tenant, %(type)s, %(id)s, %(message_id)s,
            %(payload)s, %(key_period)s, %(key_max_wait)s, %(key_keep)s,
            %(key_max_payloads)s, %(idempotency_key)s, %(payload_fingerprint)s
        ) AS k
    )"""
        admitted = "go JOIN keyed ON NOT keyed.joined"
        due = "coalesce(keyed.due_at, %(run_at)s)"
        key_columns = ", debounce_key, debounce_count, debounce_payloads"
        key_values = """, %(job_key)s, keyed.count,
            CASE WHEN %(key_keep)s = 'all' THEN jsonb_build_array(%(payload)s::jsonb) END"""
        answer = """CASE WHEN keyed.joined THEN keyed.job_id ELSE job.id END AS id,
           CASE WHEN keyed.joined THEN keyed.created_at ELSE job.created_at END AS created_at,
           coalesce(keyed.joined, false) AS joined, keyed.status AS joined_status,
           keyed.due_at, keyed.running_job_id, keyed.replayed_fingerprint"""
        joins = " LEFT JOIN keyed ON true"
    conflict = "" if plain else "ON CONFLICT DO NOTHING"
    jobs = f"""job AS (
        INSERT INTO jobcore.jobs (
            id, tenant, type, queue, idempotency_key, payload_fingerprint,
            payload, entity_id, max_attempts, next_attempt_at, traceparent, tracestate,
            unique_key, priority,
            concurrency_key, concurrency_limit, rate_key, rate_per_second, rate_burst,
            ordering_key, ordering_seq, ordering_blocks,
            callback_url, accepted_detail, payload_ref, batch_id{key_columns}
        )
        SELECT
            %(id)s, go.tenant, %(type)s, %(queue)s, %(idempotency_key)s,
            {_ONE_FINGERPRINT},
            %(payload)s, %(entity_id)s, %(max_attempts)s,
            {due}, %(traceparent)s, %(tracestate)s, %(unique_key)s, %(priority)s,
            %(concurrency_key)s, %(concurrency_limit)s, %(rate_key)s, %(rate_per_second)s,
            %(rate_burst)s, %(ordering_key)s,
            coalesce(%(ordering_seq)s::bigint, (SELECT counter FROM place)),
            %(ordering_blocks)s,
            coalesce(%(callback_url)s, (
                SELECT url FROM jobcore.webhook_endpoints
                WHERE tenant = go.tenant AND job_type IN (%(type)s, '*')
                ORDER BY job_type = '*'
                LIMIT 1
            )),
            nullif(jsonb_strip_nulls(jsonb_build_object('run_at', {due}::timestamptz))
                       || %(event_detail)s, '{{}}'::jsonb),
            %(payload_ref)s, %(batch_id)s{key_values}
        FROM {admitted}
        {conflict}
        RETURNING id, tenant, created_at, priority, next_attempt_at
    )"""
    return f"""
    WITH {admission}{key_cte}, place AS (
        INSERT INTO jobcore.job_gates (key, counter)
        SELECT 'ordering:' || go.tenant || ':' || %(ordering_key)s, 1
        FROM {admitted}
        WHERE %(ordering_key)s::text IS NOT NULL
          AND %(ordering_seq)s::bigint IS NULL
        ON CONFLICT (key) DO UPDATE
        SET counter = job_gates.counter + 1, updated_at = now()
        RETURNING counter
    ), {jobs}, message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, available_at, priority, created_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, job.id, job.tenant,
               {MESSAGE_DUE.format(run_at="job.next_attempt_at")}, job.priority,
               statement_timestamp()
        FROM job
        RETURNING id
    )
    SELECT limits.tenant, {answer},
           (SELECT pg_notify(%(channel)s, '') FROM message WHERE %(notify)s) IS NULL
               AS notified,
           {{ADMISSION_COLUMNS}}
    FROM limits LEFT JOIN admit ON true LEFT JOIN job ON true{joins}
    """.replace("{ADMISSION_COLUMNS}", ADMISSION_COLUMNS)


class JobGateParams(TypedDict):
    """A job's gates, resolved at enqueue (jobcore.kernel.gates); all None: no gate."""

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
    # The payload's key in the object store (jobcore.storage.objectstore) when it is too large to
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
    # The open batch the job joins (jobcore.usecases.batches), or None.
    batch_id: uuid.UUID | None


JOB_INSERT = Query[JobInsertParams](
    "job_insert",
    "Insert a pending job (its own `accepted` event) and its outbox message, and NOTIFY the "
    "relays, in one statement.",
    _insert_job_with_outbox(),
    generic_plan=True,
)


# An enqueue in an application's own transaction, which may stay open for long
# (jobcore.usecases.enqueue.in_transaction): the same writes, its quotas read as committed instead
# of checked under the tenant's usage row lock, so no other enqueue waits for its commit.
JOB_INSERT_APPROXIMATE = Query[JobInsertParams](
    "job_insert_approximate",
    "Insert a pending job and its outbox message, and NOTIFY the relays, its quotas read "
    "as committed without locking the tenant's usage row.",
    _insert_job_with_outbox(approximate=True),
    generic_plan=True,
)


# The same for a job with neither an idempotency key nor a unique key: a plain INSERT.
JOB_INSERT_PLAIN = Query[JobInsertParams](
    "job_insert_plain",
    "Insert a pending job with no idempotency or unique key and its outbox message, and "
    "NOTIFY the relays, in one statement.",
    _insert_job_with_outbox(plain=True),
    generic_plan=True,
)
JOB_INSERT_APPROXIMATE_PLAIN = Query[JobInsertParams](
    "job_insert_approximate_plain",
    "Insert a pending job with no idempotency or unique key and its outbox message, and "
    "NOTIFY the relays, its quotas read as committed without locking the tenant's usage row.",
    _insert_job_with_outbox(approximate=True, plain=True),
    generic_plan=True,
)


class JobKeyParams(TypedDict):
    """A keyed enqueue's key and its type's declaration (jobcore.kernel.keyed)."""

    key_kind: str
    job_key: str
    key_period: float
    # A debounce's cap on a trailing job's wait after its first enqueue (a throttle: its period).
    key_max_wait: float
    # A debounce's payloads, "all" or "last" (a throttle: "last").
    key_keep: str
    key_max_payloads: int


class JobInsertKeyedParams(JobInsertParams, JobKeyParams):
    """A keyed enqueue: the job, and the key it joins or opens."""


JOB_INSERT_KEYED = Query[JobInsertKeyedParams](
    "job_insert_keyed",
    "Join the job open to a debounce or throttle key, or insert a pending job (its own "
    "`accepted` event) and its outbox message as the key's open job and NOTIFY the relays, "
    "in one statement.",
    _insert_job_with_outbox(keyed=True),
    generic_plan=True,
)

JOB_INSERT_KEYED_APPROXIMATE = Query[JobInsertKeyedParams](
    "job_insert_keyed_approximate",
    "Join the job open to a debounce or throttle key, or insert a pending job and its "
    "outbox message as the key's open job, its quotas read as committed without locking "
    "the tenant's usage row.",
    _insert_job_with_outbox(approximate=True, keyed=True),
    generic_plan=True,
)

JOB_INSERT_KEYED_PLAIN = Query[JobInsertKeyedParams](
    "job_insert_keyed_plain",
    "Join the job open to a debounce or throttle key, or insert a pending job with no "
    "idempotency or unique key and its outbox message as the key's open job and NOTIFY "
    "the relays, in one statement.",
    _insert_job_with_outbox(keyed=True, plain=True),
    generic_plan=True,
)

JOB_INSERT_KEYED_APPROXIMATE_PLAIN = Query[JobInsertKeyedParams](
    "job_insert_keyed_approximate_plain",
    "Join the job open to a debounce or throttle key, or insert a pending job with no "
    "idempotency or unique key and its outbox message as the key's open job, its quotas "
    "read as committed without locking the tenant's usage row.",
    _insert_job_with_outbox(approximate=True, keyed=True, plain=True),
    generic_plan=True,
)


class JobInsertPreviewParams(QuotaDefaultParams):
    idempotency_key: str | None
    key_id: uuid.UUID | None
    tenant: str
    type: str
    unique_key: str | None


# Before an enqueue uploads a payload to the object store (jobcore.usecases.enqueue.submit): what
# JOB_INSERT would answer without writing, read without a lock. A replay, a taken unique key or a
# refusal is answered from it, with no upload; the insert stays the judge of the rest.
JOB_INSERT_PREVIEW = Query[JobInsertPreviewParams](
    "job_insert_preview",
    "Read what inserting a job would meet, without writing or locking: the job holding its "
    "idempotency key, the live job holding its unique key, the quota that would refuse it "
    "(no row if the API key is no longer usable).",
    f"""
    WITH {admission_preview_ctes()}
    SELECT keyed.id AS keyed_id, keyed.status AS keyed_status,
           keyed.created_at AS keyed_created_at, keyed.payload_fingerprint,
           live.id AS live_id, live.status AS live_status,
           {PREVIEW_REFUSAL} AS refusal,
           usage.rate_tat, limits.rate, limits.burst, limits.max_unfinished,
           clock_timestamp() AS now
    FROM limits
    LEFT JOIN usage ON true
    LEFT JOIN LATERAL (
        SELECT id, status, created_at, payload_fingerprint FROM jobcore.jobs
        WHERE tenant = %(tenant)s::text AND type = %(type)s
          AND idempotency_key = %(idempotency_key)s
    ) AS keyed ON true
    LEFT JOIN LATERAL (
        SELECT id, status FROM jobcore.jobs
        WHERE tenant = %(tenant)s::text AND type = %(type)s
          AND unique_key = %(unique_key)s AND status IN {LIVE_SQL}
    ) AS live ON true
    """,
)


class JobInsertManyParams(QuotaDefaultParams):
    """Jobs of one job type for one tenant, as parallel arrays (one element per item;
    ``ns`` numbers them for the answer), and their shared columns."""

    bodies: list[bytes]
    callback_urls: list[str | None]
    channel: str
    entity_ids: list[str | None]
    # What each job's `accepted` event says besides run_at (jobs.accepted_detail).
    event_details: list[Jsonb]
    exchange: str
    fingerprints: list[str]
    headers: list[Jsonb]
    idempotency_keys: list[str | None]
    ids: list[uuid.UUID]
    # The API key the items came with (checked usable in the statement), or None.
    key_id: uuid.UUID | None
    max_attempts: list[int]
    message_ids: list[uuid.UUID]
    # False: the caller wakes the relays itself once the transaction committed.
    notify: bool
    ns: list[int]
    payloads: list[Jsonb]
    priorities: list[int]
    # Flow control (jobcore.kernel.gates): each item's keys, the type's limits (no ordering key:
    # these items take none).
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
    traceparents: list[str | None]
    tracestates: list[str | None]
    type: str
    unique_keys: list[str | None]
    # The open batch every item joins (jobcore.usecases.batches), or None.
    batch_id: uuid.UUID | None


# What a batch's job says of its `accepted` event: its detail's `batch` key is kept as
# accepted_in_batch (a bit, where the key was 24 bytes of each row version: migration
# 0045), and the rest as the single enqueue writes it (JOB_INSERT). The timeline's read
# puts the key back (jobcore.database.sql.job_events.ACCEPTED_DETAIL).
_MANY_ACCEPTED = """
            nullif(jsonb_strip_nulls(jsonb_build_object('run_at', input.run_at))
                       || (input.event_detail - 'batch'), '{}'::jsonb),
            CASE WHEN input.event_detail -> 'batch' = 'true'::jsonb THEN true END"""

# The batch's jobs (JOB_INSERT_MANY).
_MANY_JOBS = _job_inserts(
    f"""
        INSERT INTO jobcore.jobs (
            id, tenant, type, queue, status, idempotency_key, payload_fingerprint,
            payload, entity_id, max_attempts, next_attempt_at, traceparent, tracestate,
            unique_key, priority, concurrency_key, concurrency_limit, rate_key,
            rate_per_second, rate_burst, ordering_blocks, callback_url, accepted_detail,
            accepted_in_batch, batch_id
        )
        SELECT
            input.id, %(tenant)s::text, %(type)s, %(queue)s, 'pending', input.idempotency_key,
            {_MANY_FINGERPRINT},
            input.payload, input.entity_id, input.max_attempts,
            input.run_at, input.traceparent, input.tracestate, input.unique_key,
            input.priority, input.concurrency_key, %(concurrency_limit)s, input.rate_key,
            %(rate_per_second)s, %(rate_burst)s, %(ordering_blocks)s,
            coalesce(input.callback_url, hook.url),{_MANY_ACCEPTED},
            %(batch_id)s::uuid
        FROM fresh AS input CROSS JOIN room CROSS JOIN hook
        WHERE input.rank <= room.admitted AND {{ROWS}}
        ORDER BY input.n""",
    keys=_MANY_KEYS,
    returning="id, status, created_at",
)


# Batch enqueue (jobcore.usecases.enqueue.write_many), and the API's coalesced single enqueues: one
# multi-row insert of the jobs and one of their outbox rows, each row's columns its own. The caller
# holds the tenant's usage row (TENANT_USAGE_LOCK). An item is new when no job holds its
# idempotency key and no live job its unique key (at this snapshot): the first
# `room.admitted` new items are inserted, the rest are refused by the quota named in
# `refusal`. ON CONFLICT DO NOTHING (either unique index) covers what the snapshot
# could not see: a racing insert of the same key (it waits for that transaction), and an
# earlier item of the same batch with the same key. An item with no job and no refusal
# is answered from the jobs that hold its keys (JOB_GET_BATCH_HOLDERS).
# Each item's keys are looked up on their own (LATERAL ... LIMIT 1, which the planner
# cannot turn into a join): as NOT EXISTS, a generic plan made while the table had no
# statistics (a new database, autovacuum off or behind) anti-joined the batch to every
# job of the tenant and type, read once per batch through the idempotency index, so each
# batch read all of them and the enqueue rate fell as jobs piled up (docs/bench/enqueue).
JOB_INSERT_MANY = Query[JobInsertManyParams](
    "job_insert_many",
    "Insert a batch of pending jobs with their outbox messages, as many as the tenant's "
    "quotas admit (none if the API key is no longer usable), and NOTIFY the relays, in "
    "one statement.",
    f"""
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ns)s::int[], %(ids)s::uuid[], %(idempotency_keys)s::text[],
            %(fingerprints)s::text[], %(payloads)s::jsonb[], %(entity_ids)s::text[],
            %(max_attempts)s::int[], %(run_ats)s::timestamptz[], %(unique_keys)s::text[],
            %(message_ids)s::uuid[], %(bodies)s::bytea[], %(concurrency_keys)s::text[],
            %(rate_keys)s::text[], %(priorities)s::int[], %(callback_urls)s::text[],
            %(traceparents)s::text[], %(tracestates)s::text[], %(headers)s::jsonb[],
            %(event_details)s::jsonb[]
        ) AS i(n, id, idempotency_key, payload_fingerprint, payload, entity_id,
               max_attempts, run_at, unique_key, message_id, body, concurrency_key, rate_key,
               priority, callback_url, traceparent, tracestate, headers, event_detail)
    ), fresh AS (
        -- Each new item whole, so that the inserts read it without a join: joined to
        -- `input` again, an item the keyed INSERT filters out left the plain one's row
        -- estimate low enough for a nested loop over both (1,000 x 1,000 rows for a
        -- batch of 1,000: 117 ms against 13).
        SELECT input.*, row_number() OVER (ORDER BY input.n) AS rank
        FROM input
        -- An item without a key looks nothing up (a gate on its key, before any scan): a
        -- generic plan made while the statistics said `jobs` was small may read a key
        -- through another index of the tenant's jobs, every one of them per item.
        LEFT JOIN LATERAL (
            SELECT 1 AS held FROM jobcore.jobs
            WHERE input.idempotency_key IS NOT NULL
              AND jobs.tenant = %(tenant)s::text AND jobs.type = %(type)s
              AND jobs.idempotency_key = input.idempotency_key
            LIMIT 1
        ) AS keyed ON true
        LEFT JOIN LATERAL (
            SELECT 1 AS held FROM jobcore.jobs
            WHERE input.unique_key IS NOT NULL
              AND jobs.tenant = %(tenant)s::text AND jobs.type = %(type)s
              AND jobs.unique_key = input.unique_key
              AND jobs.unique_key IS NOT NULL AND jobs.status IN {LIVE_SQL}
            LIMIT 1
        ) AS live ON true
        WHERE keyed.held IS NULL AND live.held IS NULL
    ), wanted AS (
        SELECT count(*) AS n FROM fresh
    ), {batch_admission_ctes()}, hook AS (
        SELECT (
            SELECT url FROM jobcore.webhook_endpoints
            WHERE tenant = %(tenant)s::text AND job_type IN (%(type)s, '*')
            ORDER BY job_type = '*'
            LIMIT 1
        ) AS url
    ), {_MANY_JOBS}, message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, available_at, priority, created_at
        )
        SELECT input.message_id, %(exchange)s, %(routing_key)s, %(type)s, input.headers,
               input.body, job.id, %(tenant)s::text, {MESSAGE_DUE.format(run_at="input.run_at")},
               input.priority, statement_timestamp()
        FROM job JOIN input ON input.id = job.id
        RETURNING id
    )
    SELECT input.n, job.id, job.status, job.created_at,
           CASE WHEN fresh.rank > room.admitted THEN room.refusal END AS refusal,
           (SELECT pg_notify(%(channel)s, '') FROM message WHERE %(notify)s LIMIT 1) IS NULL
               AS notified,
           limits.rate, limits.burst, limits.max_unfinished,
           coalesce((SELECT rate_tat FROM charged), (SELECT rate_tat FROM usage)) AS rate_tat,
           clock_timestamp() AS now
    FROM input
    LEFT JOIN fresh USING (n)
    LEFT JOIN job ON job.id = input.id
    CROSS JOIN room CROSS JOIN limits
    ORDER BY input.n
    """,
    # Planned once per connection, as the single enqueue is: planned anew, its dozen CTEs
    # cost more to plan than to run, on the way of every batch from its BEGIN to its COMMIT
    # (docs/bench/measurements.md, "Plans"). Its generic plan probes each item's keys by
    # index (tests/integration/test_job_plans.py).
    generic_plan=True,
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
        SELECT id, status, created_at, payload_fingerprint FROM jobcore.jobs
        WHERE tenant = %(tenant)s AND type = %(type)s
          AND idempotency_key = input.idempotency_key AND idempotency_key IS NOT NULL
    ) AS keyed ON true
    LEFT JOIN LATERAL (
        SELECT id, status FROM jobcore.jobs
        WHERE tenant = %(tenant)s AND type = %(type)s
          AND unique_key = input.unique_key AND unique_key IS NOT NULL
          AND status IN {LIVE_SQL}
    ) AS live ON true
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
    SELECT * FROM jobcore.jobs
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
    SELECT id, status FROM jobcore.jobs
    WHERE tenant = %(tenant)s AND type = %(type)s
      AND unique_key = %(unique_key)s AND status IN {LIVE_SQL}
    """,
)
