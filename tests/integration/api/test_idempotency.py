"""Idempotency-Key: replays answer the same job, reuse with another payload is refused."""

from __future__ import annotations

import asyncio

import httpx

from jobcore.db import Database
from tests.integration.api.support import assert_problem, counts, enqueue


async def test_replay_with_the_same_payload_answers_the_same_job(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    headers = {"Idempotency-Key": "order-1 / attempt"}
    first = await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    # The same payload, written differently (key order, a default spelled out).
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
