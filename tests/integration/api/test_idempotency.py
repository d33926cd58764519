"""Idempotency-Key: replays answer the same job, reuse with another payload is refused."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import Field

from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.usecases.enqueue.write_one import legacy_fingerprint
from services.api.app import create_app
from tests.integration.api.support import assert_problem, counts, enqueue, job_row


async def test_replay_with_the_same_payload_answers_the_same_job(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    headers = {"Idempotency-Key": "order-1 / attempt"}
    first = await enqueue(api_client, auth, payload={"text": "a", "count": 1}, headers=headers)
    # The same payload, written in another key order.
    again = await enqueue(api_client, auth, payload={"count": 1, "text": "a"}, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert await counts(db) == {"jobs": 1, "outbox": 1, "jobs_without_message": 0}


async def test_reuse_with_another_payload_is_422(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    headers = {"Idempotency-Key": "k"}
    first = await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    reused = await enqueue(api_client, auth, payload={"text": "b"}, headers=headers)
    body = assert_problem(reused, 422, "idempotency-key-reused")
    assert first.json()["job_id"] in body["detail"]
    assert (await counts(db))["jobs"] == 1


async def test_keys_are_scoped_per_tenant_and_job_type(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: Database,
) -> None:
    headers = {"Idempotency-Key": "shared"}
    mine = await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    theirs = await enqueue(api_client, other_auth, payload={"text": "a"}, headers=headers)
    other_type = await enqueue(api_client, auth, "noop", payload={}, headers=headers)
    ids = {r.json()["job_id"] for r in (mine, theirs, other_type)}
    assert len(ids) == 3
    assert all("idempotent-replayed" not in r.headers for r in (mine, theirs, other_type))
    assert (await counts(db))["jobs"] == 3


async def test_invalid_keys_are_400(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    bad_keys: list[bytes] = [b"", b"x" * 256, b"tab\there", b"bell\x07", "é".encode("latin-1")]
    for key in bad_keys:
        response = await api_client.post(
            "/jobs/echo",
            json={"text": "a"},
            headers=[(b"Authorization", auth["Authorization"].encode()), (b"Idempotency-Key", key)],
        )
        assert_problem(response, 400, "invalid-idempotency-key")
    longest = await enqueue(api_client, auth, headers={"Idempotency-Key": "~" * 255})
    assert longest.status_code == 202, longest.text
    assert (await counts(db))["jobs"] == 1


async def test_fifty_concurrent_posts_with_one_key_make_exactly_one_job(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    headers = {"Idempotency-Key": "burst"}
    responses = await asyncio.gather(
        *(enqueue(api_client, auth, payload={"text": "same"}, headers=headers) for _ in range(50))
    )
    assert [r.status_code for r in responses] == [202] * 50, [r.text for r in responses]
    job_ids = {r.json()["job_id"] for r in responses}
    assert len(job_ids) == 1
    replayed = [r.headers.get("idempotent-replayed") for r in responses]
    assert replayed.count("true") == 49
    assert replayed.count(None) == 1
    assert await counts(db) == {"jobs": 1, "outbox": 1, "jobs_without_message": 0}


IN_AN_HOUR = (datetime.now(UTC) + timedelta(hours=1)).isoformat()


@pytest.mark.parametrize(
    ("sent", "retried"),
    [
        ({}, {"callback_url": "https://93.184.216.34/hooks"}),
        ({"callback_url": "https://93.184.216.34/a"}, {"callback_url": "https://93.184.216.34/b"}),
        ({}, {"max_attempts": 2}),
        ({"max_attempts": 3}, {"max_attempts": 2}),
        ({}, {"entity_id": "order-1"}),
        ({"entity_id": "order-1"}, {"entity_id": "order-2"}),
        ({}, {"delay": 60}),
        ({"delay": 60}, {"delay": 61}),
        ({"delay": 60}, {"run_at": IN_AN_HOUR}),
        ({}, {"run_at": IN_AN_HOUR}),
    ],
)
async def test_reuse_with_other_parameters_is_the_same_422_as_another_payload(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    db: Database,
    sent: dict[str, Any],
    retried: dict[str, Any],
) -> None:
    headers = {"Idempotency-Key": "k"}
    first = await enqueue(api_client, auth, params=sent, headers=headers)
    assert first.status_code == 202, first.text
    reused = await enqueue(api_client, auth, params=retried, headers=headers)
    body = assert_problem(reused, 422, "idempotency-key-reused")
    assert first.json()["job_id"] in body["detail"]
    assert (await counts(db))["jobs"] == 1


async def test_a_retry_with_every_parameter_is_replayed_later(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    # A delay is kept as sent: the same delay retried a moment later is the same request.
    params = {
        "callback_url": "https://93.184.216.34/hooks",
        "delay": 30,
        "max_attempts": 2,
        "entity_id": "order-1",
    }
    headers = {"Idempotency-Key": "all"}
    first = await enqueue(api_client, auth, params=params, headers=headers)
    again = await enqueue(api_client, auth, params=params, headers=headers)
    assert first.status_code == again.status_code == 202, again.text
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert (await counts(db))["jobs"] == 1


async def test_key_order_and_whitespace_in_the_body_do_not_matter(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    headers = {**auth, "Idempotency-Key": "raw", "Content-Type": "application/json"}
    bodies = [b'{"text":"a","count":2}', b'{\n  "count" : 2 ,\t"text": "a"\n}\n']
    answers = [await api_client.post("/jobs/echo", content=b, headers=headers) for b in bodies]
    assert [a.status_code for a in answers] == [202, 202], [a.text for a in answers]
    assert answers[0].json()["job_id"] == answers[1].json()["job_id"]
    assert answers[1].headers["idempotent-replayed"] == "true"


async def test_a_default_spelled_out_is_a_different_request(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    # The fingerprint is of the request as sent, not of what the model made of it.
    headers = {"Idempotency-Key": "spelled"}
    first = await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    assert first.status_code == 202
    spelled = await enqueue(api_client, auth, payload={"text": "a", "count": 1}, headers=headers)
    assert_problem(spelled, 422, "idempotency-key-reused")


class EchoPayloadWithLanguage(EchoPayload):
    """The echo payload after a deploy that added a field with a default."""

    language: str = Field(default="en", max_length=8)


@asynccontextmanager
async def client_of(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as c:
            yield c


async def test_a_retry_after_a_deploy_adds_a_defaulted_field_is_replayed(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    db: Database,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    headers = {"Idempotency-Key": "across-a-deploy"}
    before = await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    assert before.status_code == 202, before.text

    deployed = dataclasses.replace(
        default_registry.get("echo"), payload_model=EchoPayloadWithLanguage
    )
    monkeypatch.setitem(default_registry._types, "echo", deployed)
    async with client_of(settings) as after_deploy:
        retried = await enqueue(after_deploy, auth, payload={"text": "a"}, headers=headers)
        changed = await enqueue(after_deploy, auth, payload={"text": "b"}, headers=headers)

    assert retried.status_code == 202, retried.text
    assert retried.json()["job_id"] == before.json()["job_id"]
    assert retried.headers["idempotent-replayed"] == "true"
    assert_problem(changed, 422, "idempotency-key-reused")
    # The replay answers the job written before the deploy, as it was written.
    assert "language" not in (await job_row(db, before.json()["job_id"]))["payload"]
    assert (await counts(db))["jobs"] == 1


SET_FINGERPRINT = Query(
    "set_fingerprint",
    "Give a job the fingerprint an earlier release wrote.",
    "UPDATE jobs SET payload_fingerprint = %(fingerprint)s WHERE id = %(id)s",
)


async def test_a_job_from_before_the_upgrade_is_still_replayed_by_its_payload(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    headers = {"Idempotency-Key": "from-the-last-release"}
    first = await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    old = legacy_fingerprint(EchoPayload(text="a"))
    async with db.unit_of_work() as uow:
        await execute(uow, SET_FINGERPRINT({"id": first.json()["job_id"], "fingerprint": old}))
        await uow.commit()

    again = await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    other = await enqueue(api_client, auth, payload={"text": "b"}, headers=headers)

    assert again.status_code == 202, again.text
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert_problem(other, 422, "idempotency-key-reused")


async def test_only_a_job_with_an_idempotency_key_keeps_its_requests_fingerprint(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    # The fingerprint is read only to tell a replay of a key from another request: a job
    # without a key does not write it into every version of its row.
    keyed = await enqueue(
        api_client, auth, payload={"text": "a"}, headers={"Idempotency-Key": "fp-1"}
    )
    plain = await enqueue(api_client, auth, payload={"text": "a"})
    batch = await api_client.post(
        "/jobs/echo/batch",
        json={
            "items": [
                {"payload": {"text": "b"}, "idempotency_key": "fp-2"},
                {"payload": {"text": "b"}},
            ]
        },
        headers=auth,
    )
    assert keyed.status_code == plain.status_code == 202
    assert batch.status_code == 200, batch.text
    batch_keyed, batch_plain = (item["job_id"] for item in batch.json()["items"])
    for job_id in (keyed.json()["job_id"], batch_keyed):
        assert len((await job_row(db, job_id))["payload_fingerprint"]) == 64
    for job_id in (plain.json()["job_id"], batch_plain):
        assert (await job_row(db, job_id))["payload_fingerprint"] is None
    # And the keys still tell a replay from another request, single and in a batch.
    again = await enqueue(
        api_client, auth, payload={"text": "a"}, headers={"Idempotency-Key": "fp-1"}
    )
    assert again.json()["job_id"] == keyed.json()["job_id"]
    reused = await api_client.post(
        "/jobs/echo/batch",
        json={"items": [{"payload": {"text": "c"}, "idempotency_key": "fp-2"}]},
        headers=auth,
    )
    assert reused.status_code == 200, reused.text
    assert reused.json()["items"][0]["status"] == "invalid"
