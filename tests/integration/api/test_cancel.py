"""POST /jobs/{id}/cancel: pending stops at once, running is asked to stop, finished is 409."""

from __future__ import annotations

import asyncio

import httpx
import psycopg

from jobcore.database.gateway import Database
from jobcore.database.sql.jobs.cancel import CANCEL_CHANNEL
from jobcore.kernel.settings import Settings
from services.api.schemas import CancelAnswer
from tests.integration.api.support import (
    assert_problem,
    enqueue,
    finish_job,
    job_row,
    start_job,
)


async def test_cancelling_a_pending_job_cancels_it_at_once(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    response = await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
    assert response.status_code == 200, response.text
    answer = CancelAnswer.model_validate(response.json())
    assert answer.status == "cancelled"
    assert str(answer.job_id) == job_id
    job = await job_row(db, job_id)
    assert job["status"] == "cancelled"
    assert job["finished_at"] is not None
    assert job["cancel_requested_at"] is not None
    view = (await api_client.get(f"/jobs/{job_id}", headers=auth)).json()
    assert view["status"] == "cancelled"


async def test_cancelling_a_running_job_asks_its_worker_to_stop(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database, settings: Settings
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    await start_job(db, job_id)
    listener = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    try:
        await listener.execute(f"LISTEN {CANCEL_CHANNEL}")
        response = await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
        notify = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    finally:
        await listener.close()
    assert CANCEL_CHANNEL == "jobcore_cancel"  # the channel workers listen on
    assert (notify.channel, notify.payload) == (CANCEL_CHANNEL, job_id)

    assert response.status_code == 202, response.text
    answer = CancelAnswer.model_validate(response.json())
    assert answer.status == "running"
    assert answer.cancel_requested
    job = await job_row(db, job_id)
    assert job["status"] == "running"  # the worker ends it, fenced by its lease
    assert job["cancel_requested_at"] == answer.cancel_requested_at

    # Asking again changes nothing but is answered the same way.
    again = await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
    assert again.status_code == 202
    assert (
        CancelAnswer.model_validate(again.json()).cancel_requested_at == answer.cancel_requested_at
    )

    # The worker stops it: the job ends cancelled and cancelling is now a 409.
    await finish_job(db, job_id, "cancelled")
    body = assert_problem(
        await api_client.post(f"/jobs/{job_id}/cancel", headers=auth), 409, "job-not-cancellable"
    )
    assert body["job_status"] == "cancelled"


async def test_finished_jobs_cannot_be_cancelled(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    for final in ("succeeded", "failed"):
        job_id = (await enqueue(api_client, auth)).json()["job_id"]
        await start_job(db, job_id)
        await finish_job(db, job_id, final)
        response = await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)
        body = assert_problem(response, 409, "job-not-cancellable")
        assert body["job_status"] == final
        assert (await job_row(db, job_id))["status"] == final
