"""POST /jobs/{type}: 202 with the job and its outbox message committed together."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import psycopg

from jobcore.database.gateway import Database
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.envelope import decode
from jobcore.kernel.settings import Settings
from services.api.schemas import Accepted
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import (
    assert_problem,
    counts,
    enqueue,
    job_row,
    outbox_rows,
)


async def test_enqueue_answers_202_with_the_job_and_writes_job_and_message(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database, settings: Settings
) -> None:
    listener = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    try:
        await listener.execute(f"LISTEN {OUTBOX_CHANNEL}")
        response = await enqueue(api_client, auth, payload={"text": "hi", "count": 2})
        notify = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    finally:
        await listener.close()
    assert notify.channel == OUTBOX_CHANNEL

    assert response.status_code == 202, response.text
    answer = Accepted.model_validate(response.json())
    assert answer.status == "pending"
    assert response.headers["location"] == f"/jobs/{answer.job_id}"
    assert answer.links.self_ == f"/jobs/{answer.job_id}"
    assert "idempotent-replayed" not in response.headers

    job = await job_row(db, answer.job_id)
    assert (job["tenant"], job["type"], job["queue"], job["status"]) == (
        TENANT,
        "echo",
        "testq",
        "pending",
    )
    assert job["payload"] == {"text": "hi", "count": 2}
    assert job["max_attempts"] == 3  # the echo type's own limit
    [message] = await outbox_rows(db, answer.job_id)
    envelope = decode(bytes(message["body"]))
    assert (envelope.job_id, envelope.attempt, envelope.type) == (answer.job_id, 1, "echo")
    assert message["routing_key"] == "testq"
    # The first message has the job's id, which the claim need not keep on the job row.
    assert message["message_id"] == answer.job_id


async def test_payload_defaults_are_applied_and_stored(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    response = await enqueue(api_client, auth, payload={"text": "x"})
    job = await job_row(db, response.json()["job_id"])
    assert job["payload"] == {"text": "x", "count": 1}


async def test_entity_id_max_attempts_and_run_at(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    run_at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    response = await enqueue(
        api_client,
        auth,
        params={"entity_id": "order-42", "max_attempts": 7, "run_at": run_at.isoformat()},
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    job = await job_row(db, job_id)
    assert job["entity_id"] == "order-42"
    assert job["max_attempts"] == 7
    assert job["next_attempt_at"] == run_at
    [message] = await outbox_rows(db, job_id)
    # The relay publishes it when due, not before.
    assert message["available_at"] == run_at


async def test_delay_schedules_the_message(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    before = datetime.now(UTC)
    response = await enqueue(api_client, auth, params={"delay": 600})
    assert response.status_code == 202, response.text
    [message] = await outbox_rows(db, response.json()["job_id"])
    assert before + timedelta(seconds=599) < message["available_at"]
    assert message["available_at"] < datetime.now(UTC) + timedelta(seconds=601)


async def test_bad_scheduling_and_bounds_are_422_with_field_errors(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    soon = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    cases: list[tuple[dict[str, str | int], str]] = [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 101}, "max_attempts"),
        ({"delay": -1}, "delay"),
        ({"run_at": "tomorrow"}, "run_at"),
        ({"run_at": "2030-01-01T00:00:00"}, "run_at"),  # no offset
        ({"run_at": "2999-01-01T00:00:00+00:00"}, "run_at"),  # too far ahead
        ({"run_at": "0001-01-01T00:00:00+14:00"}, "run_at"),  # before year 1 in UTC
        ({"run_at": soon, "delay": 5}, "delay"),
        ({"entity_id": ""}, "entity_id"),
        ({"entity_id": "a\x00b"}, "entity_id"),
        ({"entity_id": "x" * 256}, "entity_id"),
    ]
    for params, field in cases:
        response = await enqueue(api_client, auth, params=params)
        body = assert_problem(response, 422, "invalid-request")
        assert [e["loc"][-1] for e in body["errors"]] == [field], (params, body)
    assert (await counts(db))["jobs"] == 0


async def test_invalid_payload_is_422_with_field_errors(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    response = await enqueue(api_client, auth, payload={"text": 5, "count": 5000, "extra": 1})
    body = assert_problem(response, 422, "invalid-payload")
    assert sorted(tuple(e["loc"]) for e in body["errors"]) == [("count",), ("extra",), ("text",)]
    # Not a JSON object at all:
    response = await enqueue(api_client, auth, payload=["text"])
    assert_problem(response, 422, "invalid-payload")
    assert (await counts(db))["jobs"] == 0


async def test_unknown_job_type_is_404(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    for name in ("nope", "ECHO", uuid.uuid4().hex, "x" * 300):
        response = await enqueue(api_client, auth, job_type=name)
        body = assert_problem(response, 404, "unknown-job-type")
        assert name[:20] in body["detail"]
    assert (await counts(db))["jobs"] == 0


async def test_every_registered_type_has_its_route_and_schema(
    api_client: httpx.AsyncClient, api_app: object
) -> None:
    spec = (await api_client.get("/openapi.json")).json()
    enqueue_paths = {p for p, ops in spec["paths"].items() if "post" in ops}
    assert {"/jobs/echo", "/jobs/noop"} <= enqueue_paths
    body = spec["paths"]["/jobs/echo"]["post"]["requestBody"]["content"]["application/json"]
    ref = body["schema"]["$ref"].rsplit("/", 1)[1]
    assert spec["components"]["schemas"][ref]["properties"]["text"]["maxLength"] == 1000
    assert "202" in spec["paths"]["/jobs/echo"]["post"]["responses"]
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "/bench/noop" not in spec["paths"]
