"""Read-only statements for the operators' console (``jobcore ui``): the overview's counts
and rates, and the job search. They change no table, so they live apart from the
statements grouped by the table they change; each is served by an existing index."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypedDict

from jobcore.database.sql import NoParams, Query
from jobcore.kernel.states import JobStatus


class ConsoleRatesParams(TypedDict):
    minutes: int


# Per-minute counts over the last `minutes` minutes (the current minute last), each series
# a range scan of jobs_status_created_not_running_idx (status, created_at) per status, the
# running jobs (which it leaves out) from jobs_lease_expiry_idx. An outcome
# counts in the minute it finished, among jobs created up to an hour before the window:
# a job that ran longer than that drops out of the rate, not out of the counts elsewhere.
CONSOLE_RATES = Query[ConsoleRatesParams](
    "console_rates",
    "Jobs enqueued, succeeded and failed per minute over the last `minutes` minutes.",
    """
    WITH window_start AS (
        SELECT date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1) AS at
    ), minutes AS (
        SELECT generate_series(window_start.at, date_trunc('minute', now()),
                               interval '1 minute') AS minute
        FROM window_start
    ), created AS (
        SELECT date_trunc('minute', created_at) AS minute, count(*) AS n
        FROM (
            SELECT created_at FROM jobcore.jobs, window_start
            WHERE status IN ('pending', 'succeeded', 'failed', 'cancelled')
              AND created_at >= window_start.at
            UNION ALL
            SELECT created_at FROM jobcore.jobs, window_start
            WHERE status = 'running' AND created_at >= window_start.at
        ) AS jobs
        GROUP BY 1
    ), finished AS (
        SELECT date_trunc('minute', finished_at) AS minute,
               count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE status = 'failed') AS failed
        FROM jobcore.jobs, window_start
        WHERE status IN ('succeeded', 'failed')
          AND created_at >= window_start.at - interval '1 hour'
          AND finished_at >= window_start.at
        GROUP BY 1
    )
    SELECT minutes.minute,
           coalesce(created.n, 0) AS enqueued,
           coalesce(finished.succeeded, 0) AS succeeded,
           coalesce(finished.failed, 0) AS failed
    FROM minutes
    LEFT JOIN created USING (minute)
    LEFT JOIN finished USING (minute)
    ORDER BY minutes.minute
    """,
)


# The pending jobs from jobs_status_created_not_running_idx, the running ones from
# jobs_lease_expiry_idx (as JOB_COUNT_OPEN_BY_QUEUE).
CONSOLE_BACKLOG_BY_QUEUE = Query[NoParams](
    "console_backlog_by_queue",
    "Per queue: pending and running jobs, and how long the oldest pending one has waited.",
    """
    WITH pending AS (
        SELECT queue, count(*) AS n, min(created_at) AS oldest
        FROM jobcore.jobs WHERE status = 'pending' GROUP BY queue
    ), running AS (
        SELECT queue, count(*) AS n FROM jobcore.jobs WHERE status = 'running' GROUP BY queue
    )
    SELECT queue, coalesce(pending.n, 0) AS pending, coalesce(running.n, 0) AS running,
           coalesce(extract(epoch FROM now() - pending.oldest), 0)::float8
               AS oldest_pending_seconds
    FROM pending FULL JOIN running USING (queue)
    ORDER BY queue
    """,
)


class ConsoleLeasesParams(TypedDict):
    expiring_within_seconds: float


CONSOLE_LEASES = Query[ConsoleLeasesParams](
    "console_leases",
    "Running jobs, those whose lease ends soon and those whose lease has already ended.",
    """
    SELECT count(*) AS running,
           count(*) FILTER (
               WHERE lease_expires_at >= now()
                 AND lease_expires_at < now() + make_interval(secs => %(expiring_within_seconds)s)
           ) AS leases_expiring,
           count(*) FILTER (WHERE lease_expires_at < now()) AS leases_expired
    FROM jobcore.jobs
    WHERE status = 'running'
    """,
)


# webhook_deliveries_status_created_idx.
CONSOLE_FAILED_WEBHOOKS = Query[NoParams](
    "console_failed_webhooks",
    "Webhook deliveries that used up their attempts.",
    "SELECT count(*) AS failed FROM jobcore.webhook_deliveries WHERE status = 'failed'",
)


class ConsoleJobSearchParams(TypedDict):
    after_created_at: datetime | None
    after_id: uuid.UUID | None
    concurrency_key: str | None
    entity_id: str | None
    limit: int
    ordering_key: str | None
    rate_key: str | None
    status: str | None
    tenant: str | None
    type: str | None
    unique_key: str | None


# One keyset page, newest first: the rows after (created_at, id) of the previous page's
# last row. With a tenant, jobs_tenant_created_idx (tenant, created_at, id), read
# backwards, serves the order and the cursor exactly; by status,
# jobs_status_created_not_running_idx (status, created_at), or for running jobs
# jobs_lease_expiry_idx and a sort of the running jobs (as many as the workers run); a
# tenant and entity, jobs_entity_created_idx; a tenant and ordering key, jobs_ordering_idx.
# Across tenants with no status, no index serves (created_at, id) here:
# CONSOLE_JOB_SEARCH_ANY_STATUS below is that list.
CONSOLE_JOB_SEARCH = Query[ConsoleJobSearchParams](
    "console_job_search",
    "A page of the newest jobs matching tenant, type, status, entity id and a key, after "
    "a (created_at, id) cursor.",
    """
    SELECT id, tenant, type, queue, status, entity_id, attempts, max_attempts, last_error,
           held_reason, ordering_key, progress_fraction, created_at, finished_at
    FROM jobcore.jobs
    WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
      AND (%(entity_id)s::text IS NULL OR entity_id = %(entity_id)s)
      AND (%(ordering_key)s::text IS NULL OR ordering_key = %(ordering_key)s)
      AND (%(concurrency_key)s::text IS NULL OR concurrency_key = %(concurrency_key)s)
      AND (%(rate_key)s::text IS NULL OR rate_key = %(rate_key)s)
      AND (%(unique_key)s::text IS NULL OR unique_key = %(unique_key)s)
      AND (%(after_created_at)s::timestamptz IS NULL
           OR (created_at, id) < (%(after_created_at)s::timestamptz, %(after_id)s::uuid))
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


class ConsoleJobSearchAnyStatusParams(TypedDict):
    after_created_at: datetime | None
    after_id: uuid.UUID | None
    limit: int
    type: str | None


# The newest of one status after the cursor: a backward range scan of
# jobs_status_created_not_running_idx (status, created_at), ties on created_at put in id
# order by an incremental sort (the running jobs: jobs_lease_expiry_idx and a sort). The
# cursor's bound is `created_at <=` an index condition even in a generic plan (no `IS NULL
# OR`: no cursor is +infinity).
_NEWEST_OF_STATUS = """
    (SELECT id, tenant, type, queue, status, entity_id, attempts, max_attempts, last_error,
            held_reason, ordering_key, progress_fraction, created_at, finished_at
     FROM jobcore.jobs
     WHERE status = '{status}'
       AND (%(type)s::text IS NULL OR type = %(type)s)
       AND created_at <= coalesce(%(after_created_at)s::timestamptz, 'infinity')
       AND (created_at, id) < (coalesce(%(after_created_at)s::timestamptz, 'infinity'),
                               coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
     ORDER BY created_at DESC, id DESC
     LIMIT %(limit)s)
"""

# The console's job list across tenants, with no status, no entity and no key (a type at
# most): the first page an operator sees. No index holds every job by (created_at, id),
# and one would cost bytes on every job; the status index holds each status by
# created_at (but the running jobs, from jobs_lease_expiry_idx, as many as the workers
# run, sorted), so the page is the newest `limit` of each status, merged (a Merge Append of
# five bounded scans): at most five pages of rows read, whatever the table holds, where a
# scan of the whole table and a sort was planned.
CONSOLE_JOB_SEARCH_ANY_STATUS = Query[ConsoleJobSearchAnyStatusParams](
    "console_job_search_any_status",
    "A page of the newest jobs of every tenant and status (of one type, if given), after a "
    "(created_at, id) cursor.",
    "\n    UNION ALL\n".join(_NEWEST_OF_STATUS.format(status=status.value) for status in JobStatus)
    + """
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


class ConsoleOrderingBlockerParams(TypedDict):
    ordering_key: str
    ordering_seq: int
    tenant: str


# jobs_ordering_blocking_idx: the first job before this one in its key that still blocks it.
CONSOLE_ORDERING_BLOCKER = Query[ConsoleOrderingBlockerParams](
    "console_ordering_blocker",
    "The earliest job of an ordering key, before a given place, that has not let the key "
    "go on (pending, running, or failed and blocking).",
    """
    SELECT id, status, type
    FROM jobcore.jobs
    WHERE tenant = %(tenant)s AND ordering_key = %(ordering_key)s
      AND ordering_seq < %(ordering_seq)s
      AND (status IN ('pending', 'running') OR (status = 'failed' AND ordering_blocks))
    ORDER BY ordering_seq
    LIMIT 1
    """,
)


class ConsoleGateRunningParams(TypedDict):
    concurrency_key: str


# jobs_concurrency_running_idx.
CONSOLE_GATE_RUNNING = Query[ConsoleGateRunningParams](
    "console_gate_running",
    "How many jobs of a concurrency key are running.",
    """
    SELECT count(*) AS running
    FROM jobcore.jobs
    WHERE status = 'running' AND concurrency_key = %(concurrency_key)s
    """,
)


CONSOLE_NOW = Query[NoParams](
    "console_now",
    "The database's clock, which every age on the overview is measured by.",
    "SELECT now() AS now",
)
