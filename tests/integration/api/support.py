"""Helpers for the API tests: reading rows, and playing the worker's part in a job's life."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from psycopg.types.json import Jsonb

from jobcore.database.gateway import Database, execute, fetch_all, fetch_one
from jobcore.database.sql import Query
from jobcore.kernel.settings import Settings
from services.api.app import create_app
from services.api.problems import PROBLEM_BASE, PROBLEM_MEDIA_TYPE

COUNT_ROWS = Query(
    "count_rows",
    "Jobs and outbox rows, for checking that nothing was half written.",
    """
    SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM outbox) AS outbox,
           (SELECT count(*) FROM jobs j WHERE NOT EXISTS
                (SELECT 1 FROM outbox o WHERE o.job_id = j.id)) AS jobs_without_message
    """,
)

JOB_ROW = Query("job_row", "One job row.", "SELECT * FROM jobs WHERE id = %(id)s")
OUTBOX_ROWS = Query(
    "outbox_rows", "A job's outbox rows.", "SELECT * FROM outbox WHERE job_id = %(id)s"
)

# What a worker does when it claims a job, and when the job ends: enough for the API's
# view of it (the worker's own statements are not the API's to test).
START_JOB = Query(
    "start_job",
    "Make a job running, as a worker's claim would.",
    """
    UPDATE jobs SET status = 'running', attempts = attempts + 1, lease_token = %(token)s,
        lease_expires_at = now() + interval '1 minute', worker_id = 'test-worker',
        started_at = now(), updated_at = now()
    WHERE id = %(id)s AND status = 'pending'
    """,
)
FINISH_JOB = Query(
    "finish_job",
    "End a running job with a status, result and error, as a worker's outcome would.",
    """
    UPDATE jobs SET status = %(status)s, result = %(result)s, result_ref = %(result_ref)s,
        last_error = %(last_error)s, lease_token = NULL, lease_expires_at = NULL,
        finished_at = now(), updated_at = now()
    WHERE id = %(id)s AND status = 'running'
    """,
)


async def counts(db: Database) -> dict[str, int]:
    async with db.unit_of_work() as uow:
        row = await fetch_one(uow, COUNT_ROWS({}))
    assert row is not None
    return dict(row)


async def job_row(db: Database, job_id: uuid.UUID | str) -> dict[str, Any]:
    async with db.unit_of_work() as uow:
        row = await fetch_one(uow, JOB_ROW({"id": uuid.UUID(str(job_id))}))
    assert row is not None, f"no job {job_id}"
    return dict(row)


async def outbox_rows(db: Database, job_id: uuid.UUID | str) -> list[dict[str, Any]]:
    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, OUTBOX_ROWS({"id": uuid.UUID(str(job_id))}))
    return [dict(r) for r in rows]


async def start_job(db: Database, job_id: uuid.UUID | str) -> None:
    async with db.unit_of_work() as uow:
        changed = await execute(
            uow, START_JOB({"id": uuid.UUID(str(job_id)), "token": uuid.uuid4()})
        )
        await uow.commit()
    assert changed == 1


async def finish_job(
    db: Database,
    job_id: uuid.UUID | str,
    status: str,
    *,
    result: Any = None,
    result_ref: str | None = None,
    last_error: str | None = None,
) -> None:
    async with db.unit_of_work() as uow:
        changed = await execute(
            uow,
            FINISH_JOB(
                {
                    "id": uuid.UUID(str(job_id)),
                    "status": status,
                    "result": None if result is None else Jsonb(result),
                    "result_ref": result_ref,
                    "last_error": last_error,
                }
            ),
        )
        await uow.commit()
    assert changed == 1


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """The response is RFC 9457 problem JSON with this status and type; return its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE, response.headers
    body: dict[str, Any] = response.json()
    assert body["type"] == PROBLEM_BASE + slug, body
    assert body["status"] == status
    assert body["title"]
    assert isinstance(body["detail"], str)
    return body


async def enqueue(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    job_type: str = "echo",
    payload: Any = None,
    **kwargs: Any,
) -> httpx.Response:
    return await client.post(
        f"/jobs/{job_type}",
        json={"text": "hello"} if payload is None else payload,
        headers={**auth, **kwargs.pop("headers", {})},
        **kwargs,
    )


@contextlib.asynccontextmanager
async def api(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app on ``settings`` through its lifespan, and a client that calls it in-process."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as c:
            yield app, c
