"""Read-only statements for the operators' console (``jobcore ui``): the overview's counts
and rates, and the job search. They change no table, so they live apart from the
statements grouped by the table they change; each is served by an existing index."""

from __future__ import annotations

from typing import TypedDict

from jobcore.sql import NoParams, Query


class ConsoleRatesParams(TypedDict):
    minutes: int


# Per-minute counts over the last `minutes` minutes (the current minute last), each series
# a range scan of jobs_status_created_idx (status, created_at) per status. An outcome
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
        FROM jobs, window_start
        WHERE status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')
          AND created_at >= window_start.at
        GROUP BY 1
    ), finished AS (
        SELECT date_trunc('minute', finished_at) AS minute,
               count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE status = 'failed') AS failed
        FROM jobs, window_start
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


# A range scan of jobs_status_created_idx for the two open statuses.
CONSOLE_BACKLOG_BY_QUEUE = Query[NoParams](
    "console_backlog_by_queue",
    "Per queue: pending and running jobs, and how long the oldest pending one has waited.",
    """
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'running') AS running,
           coalesce(extract(epoch FROM now() - min(created_at)
                    FILTER (WHERE status = 'pending')), 0)::float8 AS oldest_pending_seconds
    FROM jobs
    WHERE status IN ('pending', 'running')
    GROUP BY queue
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
    FROM jobs
    WHERE status = 'running'
    """,
)


# webhook_deliveries_status_created_idx.
CONSOLE_FAILED_WEBHOOKS = Query[NoParams](
    "console_failed_webhooks",
    "Webhook deliveries that used up their attempts.",
    "SELECT count(*) AS failed FROM webhook_deliveries WHERE status = 'failed'",
)


class ConsoleJobSearchParams(TypedDict):
    entity_id: str | None
    limit: int
    status: str | None
    tenant: str | None
    type: str | None


# With a tenant, jobs_tenant_created_idx (or the entity index) serves it; across tenants by
# entity alone it scans newest first until `limit` rows match (an operator's search).
CONSOLE_JOB_SEARCH = Query[ConsoleJobSearchParams](
    "console_job_search",
    "The newest jobs matching any of tenant, type, status and entity id.",
    """
    SELECT id, tenant, type, queue, status, entity_id, attempts, max_attempts, last_error,
           created_at, finished_at
    FROM jobs
    WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
      AND (%(entity_id)s::text IS NULL OR entity_id = %(entity_id)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


CONSOLE_NOW = Query[NoParams](
    "console_now",
    "The database's clock, which every age on the overview is measured by.",
    "SELECT now() AS now",
)
