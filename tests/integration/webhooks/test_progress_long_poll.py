"""A running job's progress in ``GET /jobs/{id}``, and ``?wait=&on=progress`` woken by it."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
from fastapi import FastAPI

from jobcore.database.gateway import Database, execute
from jobcore.database.sql.jobs.run import JOB_PROGRESS_SET
from services.api.schemas import JobView
from tests.integration.webhooks.test_long_poll import parked, pending_job, waiters_of
from tests.integration.worker.support import TAKE_OVER


async def running_job(
    client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> tuple[str, uuid.UUID]:
    """A job of the caller's, running under a lease token the test holds."""
    job_id = await pending_job(client, auth)
    token = uuid.uuid4()
    async with db.connection() as conn:
        await execute(conn, TAKE_OVER({"id": uuid.UUID(job_id), "token": token}))
    return job_id, token


async def report(
    db: Database, job_id: str, token: uuid.UUID, fraction: float, message: str | None
) -> None:
    """Write progress as the worker holding ``token`` does."""
    params = {"id": uuid.UUID(job_id), "lease_token": token, "fraction": fraction}
    async with db.connection() as conn:
        await execute(conn, JOB_PROGRESS_SET({**params, "message": message}))


async def test_a_job_shows_its_progress(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id, token = await running_job(api_client, auth, db)
    before = await api_client.get(f"/jobs/{job_id}", headers=auth)
    assert before.json()["progress"] is None
    await report(db, job_id, token, 0.25, "a quarter")

    response = await api_client.get(f"/jobs/{job_id}", headers=auth)
    assert response.status_code == 200
    body = JobView.model_validate(response.json())
    assert body.progress is not None
    assert (body.progress.fraction, body.progress.message, body.progress.attempt) == (
        0.25,
        "a quarter",
        1,
    )


async def test_a_long_poll_on_progress_wakes_when_progress_is_written(
    api_app: FastAPI, api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id, token = await running_job(api_client, auth, db)
    started = time.monotonic()
    on_progress = asyncio.create_task(
        api_client.get(f"/jobs/{job_id}", params={"wait": "30", "on": "progress"}, headers=auth)
    )
    on_end = asyncio.create_task(api_client.get(f"/jobs/{job_id}?wait=30", headers=auth))
    await parked(api_app, 2)
    await report(db, job_id, token, 0.5, "half")

    response = await on_progress
    assert time.monotonic() - started < 10  # woken, not timed out (the wait was 30 s)
    assert response.status_code == 200
    assert response.json()["status"] == "running"
    assert response.json()["progress"]["fraction"] == 0.5
    assert response.json()["progress"]["message"] == "half"
    # The same notification did not answer the wait for the job's end.
    assert not on_end.done()
    assert waiters_of(api_app).waiting == 1
    # The job ends (as a worker's outcome statement would end it, with its NOTIFY).
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            (uuid.UUID(job_id),),
        )
        await conn.execute("SELECT pg_notify('jobcore_job_done', %s)", (job_id,))
    ended = await on_end
    assert ended.json()["status"] == "cancelled"


async def test_a_long_poll_on_progress_answers_a_finished_job_at_once(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    job_id = await pending_job(api_client, auth)
    await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
    started = time.monotonic()
    response = await api_client.get(
        f"/jobs/{job_id}", params={"wait": "30", "on": "progress"}, headers=auth
    )
    assert response.json()["status"] == "cancelled"
    assert time.monotonic() - started < 10


async def test_an_unknown_on_is_a_problem(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    job_id = await pending_job(api_client, auth)
    response = await api_client.get(
        f"/jobs/{job_id}", params={"wait": "1", "on": "status"}, headers=auth
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "https://jobcore.dev/problems/invalid-request"
    assert response.json()["errors"][0]["loc"] == ["query", "on"]


async def test_the_openapi_document_shows_progress_and_on(api_client: httpx.AsyncClient) -> None:
    schema = (await api_client.get("/openapi.json")).json()
    [on] = [p for p in schema["paths"]["/jobs/{job_id}"]["get"]["parameters"] if p["name"] == "on"]
    assert schema["components"]["schemas"]["WaitFor"]["enum"] == ["end", "progress"]
    assert on["schema"]["default"] == "end"
    progress = schema["components"]["schemas"]["JobProgress"]
    assert set(progress["required"]) == {"fraction", "message", "attempt", "updated_at"}
    assert schema["components"]["schemas"]["JobView"]["properties"]["progress"] == {
        "anyOf": [{"$ref": "#/components/schemas/JobProgress"}, {"type": "null"}]
    }
    assert "/jobs/credit_account" in schema["paths"]
