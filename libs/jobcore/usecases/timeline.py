"""A job's timeline: its events and where it is now, for `GET /jobs/{id}/timeline`,
`jobcore jobs timeline` and the console's job page."""

from __future__ import annotations

import uuid

from jobcore.database.gateway import Database
from jobcore.database.store import job_event_store
from jobcore.kernel.jobevents import with_job_row
from jobcore.usecases.whereabouts import JobEvent, JobTimeline, whereabouts

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
    recorded = [
        {
            "id": row["event_id"],
            "at": row["event_at"],
            "kind": row["event_kind"],
            "attempt": row["event_attempt"],
            "detail": row["event_detail"],
        }
        for row in rows
        if row["event_id"] is not None
    ]
    # The `claimed`, first `published` and ending events are kept on the job row (and
    # on the events that end attempts or reopen it). With events off none of them is
    # listed, as their rows were not written before (the timeline holds what was recorded
    # while events were on).
    events_on = db.settings.job_events
    events = [
        JobEvent(e["id"], e["at"], e["kind"], e["attempt"], e["detail"])
        for e in with_job_row(recorded, job if events_on else {})
    ]
    return JobTimeline(
        job["id"],
        job["tenant"],
        job["type"],
        job["status"],
        whereabouts(job),
        events,
        events_recorded=events_on,
    )
