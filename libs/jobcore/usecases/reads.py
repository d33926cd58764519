"""A tenant's reads of its own jobs: one job, a page of them, a succeeded job's result, a
job's payload.

What ``GET /jobs``, ``GET /jobs/{id}``, ``GET /jobs/{id}/result`` and
``GET /jobs/{id}/payload`` serve. Every read is
scoped to the tenant, so another tenant's job is indistinguishable from a job that does
not exist (:class:`~jobcore.kernel.errors.JobNotFound`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import DictRow

from jobcore.database.gateway import Session
from jobcore.database.store import JobListParams, job_store
from jobcore.kernel.errors import JobNotFound, ResultNotReady
from jobcore.kernel.states import JobStatus


async def get_job(uow: Session, tenant: str, job_id: uuid.UUID) -> DictRow:
    """The tenant's job as it is now."""
    row = await job_store.get(uow, {"id": job_id, "tenant": tenant})
    if row is None:
        raise JobNotFound("no job with that id")
    return row


@dataclass(frozen=True, slots=True)
class JobFilter:
    entity_id: str | None = None
    status: JobStatus | None = None
    type: str | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: list[DictRow]
    # Where the next page starts (the last row's created_at and id); None on the last.
    next_after: tuple[datetime, uuid.UUID] | None


async def list_jobs(
    uow: Session,
    tenant: str,
    where: JobFilter,
    *,
    limit: int,
    after: tuple[datetime, uuid.UUID] | None = None,
) -> JobPage:
    """One page of the tenant's jobs, newest first, from after ``after`` (the
    ``next_after`` of the page before)."""
    after_created_at, after_id = after if after is not None else (None, None)
    params: JobListParams = {
        "tenant": tenant,
        "entity_id": where.entity_id,
        "status": where.status.value if where.status else None,
        "type": where.type,
        "after_created_at": after_created_at,
        "after_id": after_id,
        # One more than the page tells whether another page follows.
        "limit": limit + 1,
    }
    rows = await job_store.list_page(uow, params)
    if len(rows) <= limit:
        return JobPage(rows, None)
    page = rows[:limit]
    return JobPage(page, (page[-1]["created_at"], page[-1]["id"]))


async def job_result(uow: Session, tenant: str, job_id: uuid.UUID) -> DictRow:
    """The result columns of a succeeded job (``result`` inline or ``result_ref``)."""
    row = await job_store.get_result(uow, {"id": job_id, "tenant": tenant})
    if row is None:
        raise JobNotFound("no job with that id")
    if row["status"] != JobStatus.SUCCEEDED:
        raise ResultNotReady(row["status"])
    return row


async def job_payload(uow: Session, tenant: str, job_id: uuid.UUID) -> DictRow:
    """A job's payload columns: ``payload`` inline, or ``payload_ref``, the key of a
    payload too large to keep in the row (``payload`` is then ``{}``, not the payload)."""
    row = await job_store.get_payload(uow, {"id": job_id, "tenant": tenant})
    if row is None:
        raise JobNotFound("no job with that id")
    return row
