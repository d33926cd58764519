"""The enqueue scenario's baseline: the smallest FastAPI + psycopg app that does an enqueue.

``POST /jobs/noop`` reads the JSON body and, in one transaction, inserts a job row and its
outbox row into jobcore's own tables (so the same indexes and triggers run), then answers
202 with the job's id. No API key, no idempotency, no quotas, no events, no NOTIFY, no
tracing, no logging: what a hand-rolled version would start from.

Served by ``uvicorn --factory services.bench.minimal_app:app_from_environment --loop uvloop
--http httptools`` in one process, with a pool of :data:`POOL_SIZE` connections on
``JOBCORE_DATABASE_URL``. Issue 18 measured jobcore against exactly this shape.
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

INSERT_JOB = """
    INSERT INTO jobs (id, tenant, type, queue, status, payload, max_attempts)
    VALUES (%s, %s, 'noop', 'default', 'pending', %s, 5)
"""
INSERT_OUTBOX = """
    INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id, tenant)
    VALUES (%s, 'jobs', 'default', 'noop', %s, %s, %s)
"""


def create_app(database_url: str) -> FastAPI:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=POOL_SIZE, max_size=POOL_SIZE, open=False
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.open(wait=True)
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
            await conn.execute(INSERT_JOB, (job_id, TENANT, Jsonb(payload)))
            await conn.execute(INSERT_OUTBOX, (uuid.uuid4(), body, job_id, TENANT))
        return {"id": str(job_id), "status": "pending"}

    return app


def app_from_environment() -> FastAPI:
    return create_app(os.environ["JOBCORE_DATABASE_URL"])
