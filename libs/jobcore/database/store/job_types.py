"""The ``job_type_registry`` table (what the workers' registries declare of each job type,
which ``jobcore.enqueue()`` checks an enqueue from SQL against): :class:`JobTypeStore`
(:mod:`jobcore.database.sql.job_type_registry`)."""

from __future__ import annotations

from jobcore.database.gateway import AsyncConn, execute
from jobcore.database.sql.job_type_registry import JOB_TYPE_REGISTER, JobTypeRegisterParams

__all__ = ["JobTypeRegisterParams", "JobTypeStore", "job_type_store"]


class JobTypeStore:
    __slots__ = ()

    async def register(self, on: AsyncConn, params: JobTypeRegisterParams) -> int:
        """Upsert a worker's job types; how many rows changed (none when nothing did)."""
        return await execute(on, JOB_TYPE_REGISTER(params))


job_type_store = JobTypeStore()
