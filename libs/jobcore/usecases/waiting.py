"""What a long-poll (``GET /jobs/{id}?wait=``) reads: the job and how many long-polls its
tenant may park, before it waits; the notifications that end a wait; the jobs waited for,
many in one statement, after.

Jobs NOTIFY ``jobcore_job_done`` in the statement that makes them terminal, and
``jobcore_job_progress`` when a worker writes a running job's progress (at most a few
times a second per job); the payload is the job's id. Where the waiting happens (one
LISTEN connection per API process, events per request) is the API's:
:mod:`services.api.waiters`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from psycopg.rows import DictRow

from jobcore.db import AsyncConn, Executor, Session
from jobcore.store import job_store, tenant_store
from jobcore.usecases.reads import get_job

WaitedJob = tuple[str, uuid.UUID]  # (tenant, job id)


async def job_to_wait_for(
    uow: Session, tenant: str, job_id: uuid.UUID, default_max_long_polls: int
) -> tuple[DictRow, int]:
    """The tenant's job as it is now, and how many long-polls the tenant may park on one
    API process (its ``max_long_polls`` quota, else ``default_max_long_polls``)."""
    row = await get_job(uow, tenant, job_id)
    return row, await tenant_max_long_polls(uow, tenant, default_max_long_polls)


async def tenant_max_long_polls(uow: Session, tenant: str, default: int) -> int:
    row = await tenant_store.max_long_polls(
        uow, {"tenant": tenant, "default_max_long_polls": default}
    )
    assert row is not None  # one row: the override or the default
    return int(row["max_long_polls"])


async def listen_for_jobs(conn: Executor) -> None:
    """Have ``conn`` (autocommit, held for the listener's life) hear jobs end and jobs'
    progress change."""
    await job_store.listen_done(conn)
    await job_store.listen_progress(conn)


async def read_waited_jobs(
    uow: Session | AsyncConn, wanted: Sequence[WaitedJob]
) -> dict[WaitedJob, DictRow]:
    """The jobs waited for, as they are now, in one statement, by (tenant, id); a tenant's
    job that does not exist is not in it."""
    found = await job_store.get_waited(
        uow, {"ids": [j for _, j in wanted], "tenants": [t for t, _ in wanted]}
    )
    return {(row["tenant"], row["id"]): row for row in found}
