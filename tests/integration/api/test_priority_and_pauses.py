"""POST /jobs/{type}?priority= and what GET /jobs/{id} says about priority and pauses."""

from __future__ import annotations

import httpx

from jobcore.database.gateway import Database
from jobcore.usecases import pauses as pause_usecases
from services.api.schemas import JobView
from tests.integration.api.support import assert_problem, enqueue, start_job


async def view(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> JobView:
    response = await client.get(f"/jobs/{job_id}", headers=auth)
    assert response.status_code == 200, response.text
    return JobView.model_validate(response.json())


async def stored_priority(db: Database, job_id: str) -> tuple[int, list[int]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT priority FROM jobs WHERE id = %s", (job_id,))
        job = await cur.fetchone()
        cur = await conn.execute("SELECT priority FROM outbox WHERE job_id = %s", (job_id,))
        messages = await cur.fetchall()
    assert job is not None
    return job["priority"], [m["priority"] for m in messages]


async def test_a_request_sets_the_priority_of_its_job_and_of_its_message(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    high = await enqueue(api_client, auth, params={"priority": "high"})
    plain = await enqueue(api_client, auth)
    assert (high.status_code, plain.status_code) == (202, 202)

    assert (await view(api_client, auth, high.json()["job_id"])).priority == "high"
    # echo declares no priority: the default.
    assert (await view(api_client, auth, plain.json()["job_id"])).priority == "normal"
    assert await stored_priority(db, high.json()["job_id"]) == (2, [2])
    assert await stored_priority(db, plain.json()["job_id"]) == (1, [1])


async def test_an_unknown_priority_is_a_422_problem_naming_the_parameter(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    for bad in ("urgent", "2", "HIGH "):
        body = assert_problem(
            await enqueue(api_client, auth, params={"priority": bad}), 422, "invalid-request"
        )
        assert body["errors"][0]["loc"] == ["query", "priority"]


async def test_the_same_idempotency_key_with_another_priority_is_another_request(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    key = {"Idempotency-Key": "prio"}
    first = await enqueue(api_client, auth, headers=key, params={"priority": "low"})
    again = await enqueue(api_client, auth, headers=key, params={"priority": "low"})
    other = await enqueue(api_client, auth, headers=key, params={"priority": "high"})
    assert first.status_code == again.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"]
    assert_problem(other, 422, "idempotency-key-reused")


async def test_a_pending_job_of_a_paused_queue_or_type_says_what_it_waits_for(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    assert (await view(api_client, auth, job_id)).waiting_for is None

    await pause_usecases.set_paused(db, "queue", "testq", paused=True, actor="tests")
    # Enqueue still answers 202 while its queue is paused.
    assert (await enqueue(api_client, auth)).status_code == 202
    assert (await view(api_client, auth, job_id)).waiting_for == "queue paused"

    await pause_usecases.set_paused(db, "queue", "testq", paused=False, actor="tests")
    await pause_usecases.set_paused(db, "type", "echo", paused=True, actor="tests")
    assert (await view(api_client, auth, job_id)).waiting_for == "job type paused"

    # Only a pending job waits: one that runs says nothing of the pause.
    await start_job(db, job_id)
    assert (await view(api_client, auth, job_id)).waiting_for is None


async def test_openapi_documents_the_priority_and_the_new_fields(
    api_client: httpx.AsyncClient,
) -> None:
    spec = (await api_client.get("/openapi.json")).json()
    params = {p["name"]: p for p in spec["paths"]["/jobs/echo"]["post"]["parameters"]}
    assert "priority" in params
    assert "high" in str(params["priority"]["schema"])
    fields = spec["components"]["schemas"]["JobView"]["properties"]
    assert {"priority", "waiting_for"} <= set(fields)
