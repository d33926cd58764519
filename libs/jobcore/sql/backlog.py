"""Statements behind the backlog gauges on /metrics (read at scrape time, cached briefly)."""

from __future__ import annotations

from jobcore.sql import NoParams, Query

# Served by jobs_status_created_idx (status, created_at): a range scan per status.
OPEN_JOBS_BY_QUEUE = Query[NoParams](
    "open_jobs_by_queue",
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
