"""``/batches``: create a batch with its jobs and callbacks, add jobs while it is open,
close, read, list and cancel it; its callbacks run as jobs once, through the testing kit's
InlineWorker."""

from __future__ import annotations

from typing import Any

import httpx

from jobcore.database.gateway import Database
from jobcore.testing import InlineWorker
from services.api.schemas import BatchCreated, BatchJobsAdded, BatchList, BatchView
from tests.integration.api.support import assert_problem, job_row

CALLBACKS = {
    "on_success": {"type": "batch_done", "payload": {"note": "all good"}},
    "on_complete": {"type": "batch_done", "payload": {"note": "all done"}},
    "on_death": {"type": "batch_done", "payload": {"note": "one died"}},
}


def echo(text: str) -> dict[str, Any]:
    return {"type": "echo", "payload": {"text": text}}


async def create(
    client: httpx.AsyncClient, auth: dict[str, str], body: dict[str, Any]
) -> dict[str, Any]:
    response = await client.post("/batches", json=body, headers=auth)
    assert response.status_code == 201, response.text
    BatchCreated.model_validate(response.json())
    created: dict[str, Any] = response.json()
    assert response.headers["location"] == f"/batches/{created['id']}"
    return created


async def read(client: httpx.AsyncClient, auth: dict[str, str], batch_id: str) -> dict[str, Any]:
    response = await client.get(f"/batches/{batch_id}", headers=auth)
    assert response.status_code == 200, response.text
    BatchView.model_validate(response.json())
    body: dict[str, Any] = response.json()
    return body


async def test_a_batch_runs_and_fires_its_callbacks_once(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    created = await create(
        api_client, auth, {"jobs": [echo("a"), echo("b")], **CALLBACKS, "description": "two"}
    )
    assert (created["status"], created["total"], created["pending"]) == ("closed", 2, 2)
    assert created["callbacks"]["on_success"] == {"type": "batch_done", "job_id": None}
    await InlineWorker(db).drain()
    batch = await read(api_client, auth, created["id"])
    assert (batch["status"], batch["succeeded"], batch["failed_job_ids"]) == (
        "succeeded",
        2,
        [],
    )
    success = batch["callbacks"]["on_success"]["job_id"]
    complete = batch["callbacks"]["on_complete"]["job_id"]
    assert success
    assert complete
    assert batch["callbacks"]["on_death"]["job_id"] is None
    ran = await job_row(db, success)
    assert ran["status"] == "succeeded"
    assert ran["result"] == {"event": "success", "failed": 0}
    assert ran["payload"]["batch"]["id"] == created["id"]
    listed = await api_client.get("/batches", headers=auth)
    BatchList.model_validate(listed.json())
    assert [item["id"] for item in listed.json()["items"]] == [created["id"]]


async def test_an_open_batch_takes_jobs_until_closed(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    created = await create(api_client, auth, {"jobs": [echo("a")], **CALLBACKS, "open": True})
    assert created["status"] == "open"
    await InlineWorker(db).drain()
    assert (await read(api_client, auth, created["id"]))["callbacks"]["on_complete"][
        "job_id"
    ] is None
    added = await api_client.post(
        f"/batches/{created['id']}/jobs", json={"jobs": [echo("b")]}, headers=auth
    )
    assert added.status_code == 200, added.text
    BatchJobsAdded.model_validate(added.json())
    closed = await api_client.post(f"/batches/{created['id']}/close", headers=auth)
    assert closed.status_code == 200
    assert (closed.json()["total"], closed.json()["status"]) == (2, "closed")
    late = await api_client.post(
        f"/batches/{created['id']}/jobs", json={"jobs": [echo("c")]}, headers=auth
    )
    assert_problem(late, 409, "batch-closed")
    await InlineWorker(db).drain()
    batch = await read(api_client, auth, created["id"])
    assert (batch["status"], batch["succeeded"]) == ("succeeded", 2)


async def test_cancel_nest_and_refusals(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: Database,
) -> None:
    parent = await create(api_client, auth, {"open": True, **CALLBACKS})
    child = await create(api_client, auth, {"jobs": [echo("x")], "parent_id": parent["id"]})
    assert (await read(api_client, auth, parent["id"]))["total"] == 1
    cancelled = await api_client.post(f"/batches/{parent['id']}/cancel", headers=auth)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert (await read(api_client, auth, child["id"]))["cancelled"] == 1
    parent_now = await read(api_client, auth, parent["id"])
    assert (parent_now["cancelled"], parent_now["pending"]) == (1, 0)
    assert parent_now["callbacks"]["on_complete"]["job_id"] is not None
    # Another tenant sees none of it.
    assert_problem(
        await api_client.get(f"/batches/{parent['id']}", headers=other_auth),
        404,
        "batch-not-found",
    )
    # A bad job refuses the whole batch, located.
    bad = await api_client.post(
        "/batches", json={"jobs": [echo("ok"), {"type": "echo", "payload": {}}]}, headers=auth
    )
    body = assert_problem(bad, 422, "invalid-request")
    assert body["errors"][0]["loc"] == ["body", "jobs", 1, "payload", "text"]
    unknown = await api_client.post(
        "/batches", json={"jobs": [{"type": "nope", "payload": {}}]}, headers=auth
    )
    assert unknown.status_code == 422
    # A callback type that does not take the batch's outcome is refused.
    wrong = await api_client.post(
        "/batches", json={"on_success": {"type": "echo", "payload": {"text": "x"}}}, headers=auth
    )
    assert_problem(wrong, 422, "invalid-request")
    async with db.connection() as conn:
        rows = await (await conn.execute("SELECT count(*) AS n FROM batches")).fetchone()
    assert rows is not None
    assert rows["n"] == 2


async def test_a_value_of_another_json_type_than_the_schemas_is_refused(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    """What the OpenAPI document refuses, the routes refuse (422), rather than convert it
    as pydantic's lax mode would: 0 for `close`, "2" for `max_attempts`, a number for
    `run_at`. Nothing is written; the same request with JSON's own types is taken."""
    created = await create(api_client, auth, {"open": True})
    jobs_before = await job_count(db)
    for body in (
        {"jobs": [echo("a")], "close": 0},
        {"jobs": [{**echo("a"), "max_attempts": "2"}]},
        {"jobs": [{**echo("a"), "run_at": 1_900_000_000}]},
        {"jobs": [{**echo("a"), "delay": "5"}]},
    ):
        refused = await api_client.post(f"/batches/{created['id']}/jobs", json=body, headers=auth)
        assert_problem(refused, 422, "invalid-request")
    refused = await api_client.post(
        "/batches", json={"jobs": [echo("a")], "open": "yes"}, headers=auth
    )
    assert_problem(refused, 422, "invalid-request")
    # An item of POST /jobs/{type}/batch is the same model.
    refused = await api_client.post(
        "/jobs/echo/batch",
        json={"items": [{"payload": {"text": "a"}, "max_attempts": "2"}]},
        headers=auth,
    )
    assert_problem(refused, 422, "invalid-request")
    assert await job_count(db) == jobs_before
    taken = await api_client.post(
        f"/batches/{created['id']}/jobs",
        json={"jobs": [{**echo("a"), "max_attempts": 2, "delay": 5}], "close": False},
        headers=auth,
    )
    assert taken.status_code == 200, taken.text
    assert (await read(api_client, auth, created["id"]))["total"] == 1


async def job_count(db: Database) -> int:
    async with db.connection() as conn:
        row = await (await conn.execute("SELECT count(*) AS jobs FROM jobcore.jobs")).fetchone()
    assert row is not None
    return int(row["jobs"])
