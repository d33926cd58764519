"""POST /jobs/{type}?ordering_key=: validated, stored with the job's place in its key, shown
by GET /jobs/{id} with why the job waits; part of the idempotency fingerprint."""

from __future__ import annotations

import uuid

import httpx

from jobcore.database.gateway import Database
from tests.integration.api.support import assert_problem, enqueue, job_row


async def test_ordering_key_is_stored_with_places_in_enqueue_order_per_tenant_and_key(
    api_client: httpx.AsyncClient, auth: dict[str, str], other_auth: dict[str, str], db: Database
) -> None:
    ids = []
    for key_auth, key in (
        (auth, "acct-1"),
        (auth, "acct-1"),
        (auth, "acct-2"),
        (other_auth, "acct-1"),
    ):
        response = await enqueue(api_client, key_auth, params={"ordering_key": key})
        assert response.status_code == 202, response.text
        ids.append(uuid.UUID(response.json()["job_id"]))
    rows = [await job_row(db, job_id) for job_id in ids]
    assert [(r["ordering_key"], r["ordering_seq"]) for r in rows] == [
        ("acct-1", 1),
        ("acct-1", 2),
        ("acct-2", 1),
        ("acct-1", 1),  # another tenant's key of the same name is another key
    ]
    unordered = await enqueue(api_client, auth)
    row = await job_row(db, uuid.UUID(unordered.json()["job_id"]))
    assert row["ordering_key"] is None
    assert row["ordering_seq"] is None

    shown = (await api_client.get(f"/jobs/{ids[1]}", headers=auth)).json()
    assert shown["ordering_key"] == "acct-1"
    assert shown["held_reason"] is None
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET held_reason = 'ordering', held_since = now() WHERE id = %s",
            (ids[1],),
        )
    shown = (await api_client.get(f"/jobs/{ids[1]}", headers=auth)).json()
    assert shown["held_reason"] == "ordering"
    assert shown["held_since"] is not None


async def test_a_bad_ordering_key_is_refused(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    for bad in ("", "x" * 256, "tab\there"):
        response = await enqueue(api_client, auth, params={"ordering_key": bad})
        assert_problem(response, 422, "invalid-request")


async def test_the_ordering_key_is_part_of_the_idempotent_request(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    headers = {"Idempotency-Key": "ordered-1"}
    first = await enqueue(api_client, auth, params={"ordering_key": "a"}, headers=headers)
    again = await enqueue(api_client, auth, params={"ordering_key": "a"}, headers=headers)
    assert again.json()["job_id"] == first.json()["job_id"]
    other = await enqueue(api_client, auth, params={"ordering_key": "b"}, headers=headers)
    assert_problem(other, 422, "idempotency-key-reused")
