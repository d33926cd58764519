"""The ``job_events`` table (what happened to each job): :class:`JobEventStore`, its read
(:mod:`jobcore.sql.job_events`). Events are written by the job statements that cause
them, through :class:`jobcore.store.JobStore`."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, fetch_all
from jobcore.sql.job_events import JOB_TIMELINE, JobTimelineParams

__all__ = ["JobEventStore", "JobTimelineParams", "job_event_store"]


class JobEventStore:
    __slots__ = ()

    async def timeline(self, on: Reader, params: JobTimelineParams) -> list[DictRow]:
        """The job with where it is now, a row per event, oldest first (one row of NULL
        event columns for a job without events; none for no such job)."""
        return await fetch_all(on, JOB_TIMELINE(params))


job_event_store = JobEventStore()
