"""A job's timeline: its events and where it is now, for `GET /jobs/{id}/timeline`,
`jobcore jobs timeline` and the console's job page."""

from __future__ import annotations

import uuid

from jobcore.db import Database, fetch_all, fetch_one
from jobcore.sql.job_events import JOB_EVENT_LIST
from jobcore.sql.jobs import JOB_GET, JOB_GET_ANY_TENANT
from jobcore.timeline import JobEvent, JobTimeline, whereabouts

# The events a timeline shows: the latest ones, if a job somehow has more (a job is
# bounded by its max_attempts, and each attempt writes a handful).
MAX_EVENTS = 1000


async def job_timeline(
    db: Database, job_id: uuid.UUID, *, tenant: str | None, limit: int = MAX_EVENTS
) -> JobTimeline | None:
    """The job's events, oldest first, and where it is now; None when there is no such job
    (or, with ``tenant``, when it is another tenant's: operators pass None)."""
    async with db.unit_of_work() as uow:
        if tenant is None:
            job = await fetch_one(uow, JOB_GET_ANY_TENANT({"id": job_id}))
        else:
            job = await fetch_one(uow, JOB_GET({"id": job_id, "tenant": tenant}))
        if job is None:
            return None
        rows = await fetch_all(uow, JOB_EVENT_LIST({"job_id": job_id, "limit": limit}))
    events = [
        JobEvent(row["id"], row["at"], row["kind"], row["attempt"], row["detail"]) for row in rows
    ]
    return JobTimeline(
        job["id"], job["tenant"], job["type"], job["status"], whereabouts(job), events
    )
