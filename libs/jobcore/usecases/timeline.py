"""A job's timeline: its events and where it is now, for `GET /jobs/{id}/timeline`,
`jobcore jobs timeline` and the console's job page."""

from __future__ import annotations

import uuid

from jobcore.db import Database
from jobcore.store import job_event_store
from jobcore.timeline import JobEvent, JobTimeline, whereabouts

# The events a timeline shows: the latest ones, if a job somehow has more (a job is
# bounded by its max_attempts, and each attempt writes a handful).
MAX_EVENTS = 1000


async def job_timeline(
    db: Database, job_id: uuid.UUID, *, tenant: str | None, limit: int = MAX_EVENTS
) -> JobTimeline | None:
    """The job's events, oldest first, and where it is now; None when there is no such job
    (or, with ``tenant``, when it is another tenant's: operators pass None)."""
    async with db.session() as session:
        rows = await job_event_store.timeline(
            session, {"id": job_id, "tenant": tenant, "limit": limit}
        )
    if not rows:
        return None
    job = rows[0]
    events = [
        JobEvent(
            row["event_id"],
            row["event_at"],
            row["event_kind"],
            row["event_attempt"],
            row["event_detail"],
        )
        for row in rows
        if row["event_id"] is not None
    ]
    return JobTimeline(
        job["id"],
        job["tenant"],
        job["type"],
        job["status"],
        whereabouts(job),
        events,
        events_recorded=db.settings.job_events,
    )
