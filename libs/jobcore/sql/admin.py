"""Statements for operators (`jobcore jobs ...`): across tenants, never on a hot path."""

from __future__ import annotations

from typing import TypedDict

from jobcore.sql import Query


class JobListAllTenantsParams(TypedDict):
    limit: int
    status: str | None
    tenant: str | None
    type: str | None


ADMIN_LIST_JOBS = Query[JobListAllTenantsParams](
    "admin_list_jobs",
    "The newest jobs of every tenant (or one), optionally filtered by status and type.",
    """
    SELECT id, tenant, type, status, attempts, max_attempts, entity_id, last_error,
           created_at, finished_at
    FROM jobs
    WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)
