"""``GET /jobs/{id}?wait=``: answers when the job ends, woken by LISTEN/NOTIFY, never hung
by a missed notification."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
from fastapi import FastAPI

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from services.api.routes.waiting import wait_seconds
from services.api.waiters import APPLICATION_NAME, JobWaiters


async def pending_job(client: httpx.AsyncClient, auth: dict[str, str]) -> str:
    response = await client.post("/jobs/echo", json={"text": "x"}, headers=auth)
    assert response.status_code == 202
    return str(response.json()["job_id"])


def waiters_of(app: FastAPI) -> JobWaiters:
    waiters: JobWaiters = app.state.job_waiters
    return waiters


async def parked(app: FastAPI, n: int) -> None:
    async def probe() -> bool:
        return waiters_of(app).waiting >= n

    await eventually(probe, what=f"{n} waiting request(s)")


async def cancel_silently(db: Database, job_id: str) -> None:
    """End a job without the NOTIFY the real statements send (a missed notification)."""
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            (uuid.UUID(job_id),),
        )


async def test_a_waiter_answers_as_soon_as_its_job_ends(
    api_app: FastAPI, api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    job_id = await pending_job(api_client, auth)
    started = time.monotonic()
    waiting = asyncio.create_task(api_client.get(f"/jobs/{job_id}?wait=30", headers=auth))
    await parked(api_app, 1)
    assert not waiting.done()
    cancelled = await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
    assert cancelled.status_code == 200
    response = await waiting
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert time.monotonic() - started < 10  # woken, not timed out (the wait was 30 s)
    assert waiters_of(api_app).waiting == 0


async def test_a_wait_that_ends_answers_the_current_status(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    job_id = await pending_job(api_client, auth)
    started = time.monotonic()
    response = await api_client.get(f"/jobs/{job_id}", params={"wait": "0.3"}, headers=auth)
    assert time.monotonic() - started >= 0.3
    assert response.status_code == 200
    assert response.json()["status"] == "pending"


async def test_a_terminal_job_answers_at_once_and_so_does_another_tenants(
    api_client: httpx.AsyncClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    job_id = await pending_job(api_client, auth)
    await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
    started = time.monotonic()
    done = await api_client.get(f"/jobs/{job_id}?wait=30", headers=auth)
    assert done.json()["status"] == "cancelled"
    theirs = await api_client.get(f"/jobs/{job_id}?wait=30", headers=other_auth)
    assert theirs.status_code == 404
    missing = await api_client.get(f"/jobs/{uuid.uuid4()}?wait=30", headers=auth)
    assert missing.status_code == 404
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("wait", ["abc", "-1", "nan", "inf", "1e999", ""])
async def test_a_bad_wait_is_a_422_problem_naming_it(
    api_client: httpx.AsyncClient, auth: dict[str, str], wait: str
) -> None:
    job_id = await pending_job(api_client, auth)
    response = await api_client.get(f"/jobs/{job_id}", params={"wait": wait}, headers=auth)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "https://jobcore.dev/problems/invalid-request"
    assert [error["loc"] for error in body["errors"]] == [["query", "wait"]]


async def test_any_non_negative_number_is_a_wait(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    """What /openapi.json promises (a number, at least 0) is what the route takes."""
    job_id = await pending_job(api_client, auth)
    for wait in ("0", "0.0", "1e-9", "0.001"):
        response = await api_client.get(f"/jobs/{job_id}", params={"wait": wait}, headers=auth)
        assert response.status_code == 200, (wait, response.text)
    [wait] = [
        p
        for p in (await api_client.get("/openapi.json")).json()["paths"]["/jobs/{job_id}"]["get"][
            "parameters"
        ]
        if p["name"] == "wait"
    ]
    assert wait["schema"]["type"] == "number"
    assert wait["schema"]["minimum"] == 0


def test_long_waits_are_capped() -> None:
    assert wait_seconds(1000, 60) == 60
    assert wait_seconds(0, 60) == 0
    assert wait_seconds(None, 60) == 0
    assert wait_seconds(2.5, 60) == 2.5
    assert Settings.model_fields["api_max_wait"].default == 60


async def test_a_missed_notification_is_caught_when_the_wait_ends(
    api_app: FastAPI, api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id = await pending_job(api_client, auth)
    waiting = asyncio.create_task(api_client.get(f"/jobs/{job_id}?wait=1", headers=auth))
    await parked(api_app, 1)
    await cancel_silently(db, job_id)
    response = await waiting
    assert response.json()["status"] == "cancelled"


async def test_waiters_poll_while_the_listener_is_down(
    api_app: FastAPI, api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    await waiters_of(api_app).stop(2.0)
    assert not waiters_of(api_app).listening
    job_id = await pending_job(api_client, auth)
    started = time.monotonic()
    waiting = asyncio.create_task(api_client.get(f"/jobs/{job_id}?wait=30", headers=auth))
    await parked(api_app, 1)
    await cancel_silently(db, job_id)
    response = await waiting
    assert response.json()["status"] == "cancelled"
    assert time.monotonic() - started < 10  # a fallback poll, not the end of the wait


async def test_the_listener_reconnects_when_its_connection_drops(
    api_app: FastAPI, api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    waiters = waiters_of(api_app)
    await eventually(lambda: _true(waiters.listening), what="the listener")
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (APPLICATION_NAME,),
        )
        assert [row["killed"] for row in await cur.fetchall()] == [True]

    async def listening_again() -> bool:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                (APPLICATION_NAME,),
            )
            row = await cur.fetchone()
        return row is not None and row["n"] == 1 and waiters.listening

    await eventually(listening_again, timeout=15, what="the listener to reconnect")
    job_id = await pending_job(api_client, auth)
    started = time.monotonic()
    waiting = asyncio.create_task(api_client.get(f"/jobs/{job_id}?wait=30", headers=auth))
    await parked(api_app, 1)
    await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
    response = await waiting
    assert response.json()["status"] == "cancelled"
    assert time.monotonic() - started < 10


async def _true(value: bool) -> bool:
    return value
