"""Job ids and their messages' ids are time-ordered (UUID version 7, jobcore.kernel.ids):
each is the key of an index entry every job writes, and ids that grow with time fill the
index's right end instead of leaving pages everywhere two thirds full."""

from __future__ import annotations

import uuid

import httpx

from jobcore.database.gateway import Database
from jobcore.kernel.ids import new_id
from tests.integration.api.support import enqueue


async def _message_ids(db: Database, job_ids: list[str]) -> list[uuid.UUID]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT message_id FROM jobcore.outbox WHERE job_id = ANY(%s::uuid[])"
            " ORDER BY array_position(%s::uuid[], job_id)",
            (job_ids, job_ids),
        )
        return [row["message_id"] for row in await cur.fetchall()]


async def test_jobs_and_their_messages_get_ids_in_the_order_they_were_made(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    before = new_id()
    single = await enqueue(api_client, auth, payload={"text": "a"})
    batch = await api_client.post(
        "/jobs/echo/batch",
        json={"items": [{"payload": {"text": "b"}}, {"payload": {"text": "c"}}]},
        headers=auth,
    )
    assert single.status_code == 202, single.text
    assert batch.status_code == 200, batch.text
    job_ids = [single.json()["job_id"], *(item["job_id"] for item in batch.json()["items"])]
    ids = [uuid.UUID(job_id) for job_id in job_ids]
    messages = await _message_ids(db, job_ids)
    assert len(messages) == 3
    for made in (*ids, *messages):
        assert made.version == 7, made
        # Their first 48 bits are the millisecond they were made: none before `before`'s.
        assert made.bytes[:6] >= before.bytes[:6], (made, before)
    assert ids[0].bytes[:6] <= ids[1].bytes[:6]


def test_fresh_ids_sort_by_the_millisecond_they_were_made() -> None:
    made = [new_id() for _ in range(1_000)]
    assert len(set(made)) == len(made)
    stamps = [made_id.bytes[:6] for made_id in made]
    assert stamps == sorted(stamps)
