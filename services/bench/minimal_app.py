"""The enqueue scenario's baseline: the smallest FastAPI + psycopg app that does an enqueue.

``POST /jobs/noop`` reads the JSON body and, in one transaction, inserts a job row and its
outbox row, then answers 202 with the job's id. No API key, no idempotency, no quotas, no
events, no NOTIFY, no tracing, no logging: what a hand-rolled version would start from.

Its tables (:data:`TABLES`, the default ``own``) are copies of jobcore's ``jobs`` and
``outbox`` made at startup with ``LIKE ... INCLUDING ALL``: the same columns, defaults,
constraints and indexes, but none of jobcore's triggers. On jobcore's own tables
(``JOBCORE_BENCH_MINIMAL_TABLES=jobcore``) every insert into ``jobs`` also fires the tenant
quota trigger (migration 0010), which updates the tenant's ``tenant_usage`` row and so
locks it until COMMIT, two round trips later (the outbox insert, the commit): at 64
clients the baseline queued on that one row (its INSERT into jobs spent nearly all its
time waiting for that lock), which a hand-rolled app without per-tenant
counters never does, and the bench's enqueue ratio read 1.00× where wrk against a
trigger-free app read 0.5×.

Served by ``uvicorn --factory services.bench.minimal_app:app_from_environment --loop uvloop
--http httptools`` in one process, with a pool of :data:`POOL_SIZE` connections on
``JOBCORE_DATABASE_URL``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

POOL_SIZE = 8
TENANT = "minimal"
TABLES_ENV = "JOBCORE_BENCH_MINIMAL_TABLES"
# own: trigger-free copies of jobs and outbox; jobcore: jobcore's tables, triggers and all.
TABLES = ("own", "jobcore")
OWN_TABLES = {"jobs": "bench_minimal_jobs", "outbox": "bench_minimal_outbox"}

INSERT_JOB = """
    INSERT INTO {jobs} (id, tenant, type, queue, status, payload, max_attempts)
    VALUES (%s, %s, 'noop', 'default', 'pending', %s, 5)
"""
INSERT_OUTBOX = """
    INSERT INTO {outbox} (message_id, exchange, routing_key, message_type, body, job_id, tenant)
    VALUES (%s, 'jobs', 'default', 'noop', %s, %s, %s)
"""


def create_app(database_url: str, tables: str = "own") -> FastAPI:
    if tables not in TABLES:
        raise ValueError(f"{TABLES_ENV} takes {' or '.join(TABLES)}, got {tables!r}")
    names = OWN_TABLES if tables == "own" else {"jobs": "jobcore.jobs", "outbox": "jobcore.outbox"}
    insert_job = INSERT_JOB.format(**names)
    insert_outbox = INSERT_OUTBOX.format(**names)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=POOL_SIZE, max_size=POOL_SIZE, open=False
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.open(wait=True)
        if tables == "own":
            async with pool.connection() as conn:
                for source, copy in OWN_TABLES.items():
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {copy} (LIKE jobcore.{source} INCLUDING ALL)"
                    )
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/jobs/noop", status_code=202)
    async def enqueue(request: Request) -> dict[str, str]:
        payload = await request.json()
        job_id = uuid.uuid4()
        body = orjson.dumps({"job_id": str(job_id), "attempt": 1, "type": "noop"})
        # The pool commits when the connection goes back (BEGIN, 2 INSERTs, COMMIT).
        async with pool.connection() as conn:
            await conn.execute(insert_job, (job_id, TENANT, Jsonb(payload)))
            await conn.execute(insert_outbox, (uuid.uuid4(), body, job_id, TENANT))
        return {"id": str(job_id), "status": "pending"}

    return app


def app_from_environment() -> FastAPI:
    return create_app(os.environ["JOBCORE_DATABASE_URL"], os.environ.get(TABLES_ENV, "own"))
