"""POST /jobs/{type} and its batch route for a debounced or throttled job type: each
answer says which job the request joined, over HTTP and through the Python client."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from jobcore.client import AsyncClient
from jobcore.database.gateway import Database
from tests.integration.api.support import enqueue
from tests.integration.api.test_probes_and_metrics import samples


async def jobs(db: Database, kind: str) -> list[Any]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT id, debounce_count, debounce_payloads FROM jobs WHERE type = %(t)s",
            {"t": kind},
        )
        return list(await cur.fetchall())


async def test_each_enqueue_answers_the_job_it_joined(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    answers = [
        await enqueue(
            api_client, auth, "reindex_account", payload={"account": "a", "change": str(n)}
        )
        for n in range(3)
    ]
    assert [a.status_code for a in answers] == [202] * 3
    bodies = [a.json() for a in answers]
    assert [b["joined"] for b in bodies] == [False, True, True]
    assert len({b["job_id"] for b in bodies}) == 1
    assert {a.headers["location"] for a in answers} == {f"/jobs/{bodies[0]['job_id']}"}
    [job] = await jobs(db, "reindex_account")
    assert [p["change"] for p in job["debounce_payloads"]] == ["0", "1", "2"]
    shown = (await api_client.get(f"/jobs/{job['id']}", headers=auth)).json()
    assert shown["debounce_key"].endswith(":account=a")
    assert shown["debounce_count"] == 3
    assert shown["payload"] == {"account": "a", "change": "2"}

    # Another key is another job.
    other = await enqueue(api_client, auth, "reindex_account", payload={"account": "b"})
    assert other.json()["joined"] is False
    assert other.json()["job_id"] != bodies[0]["job_id"]

    # Joins are requests answered, not jobs written.
    values = samples((await api_client.get("/metrics")).text)
    requests = "jobcore_api_enqueue_requests_total"
    assert values[(requests, (("result", "joined"), ("type", "reindex_account")))] == 2
    assert values[(requests, (("result", "accepted"), ("type", "reindex_account")))] == 2
    assert values[("jobcore_api_jobs_enqueued_total", (("type", "reindex_account"),))] == 2


async def test_a_plain_enqueue_answers_joined_false(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    answer = await enqueue(api_client, auth)
    assert answer.status_code == 202
    assert answer.json()["joined"] is False


async def test_the_batch_route_answers_joined_items(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    items = [{"payload": {"dashboard": "sales"}} for _ in range(3)]
    items.append({"payload": {"dashboard": "ops"}})
    answer = await api_client.post(
        "/jobs/refresh_dashboard/batch", json={"items": items}, headers=auth
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [i["status"] for i in body["items"]] == ["created", "joined", "joined", "created"]
    assert [i["joined"] for i in body["items"]] == [False, True, True, False]
    first = body["items"][0]["job_id"]
    assert body["items"][1]["job_id"] == body["items"][2]["job_id"] == first
    assert body["counts"]["joined"] == 2
    assert body["counts"]["created"] == 2
    assert len(await jobs(db, "refresh_dashboard")) == 2


async def test_the_python_client_says_joined(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    token = auth["Authorization"].removeprefix("Bearer ")
    async with AsyncClient("http://jobcore.test", token, http=api_client) as client:
        first = await client.enqueue("refresh_dashboard", {"dashboard": "sales"})
        second = await client.enqueue("refresh_dashboard", {"dashboard": "sales"})
        batch = await client.enqueue_batch(
            "refresh_dashboard",
            [{"payload": {"dashboard": "sales"}}, {"payload": {"dashboard": "new"}}],
        )
    assert (first.joined, second.joined) == (False, True)
    assert second.job_id == first.job_id
    assert [i.joined for i in batch.items] == [True, False]
    assert batch.items[0].job_id == first.job_id
    assert batch.counts.joined == 1


async def test_a_debounced_type_takes_no_run_at_or_delay(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    for query in ({"delay": "5"}, {"run_at": soon}):
        answer = await enqueue(
            api_client, auth, "reindex_account", payload={"account": "a"}, params=query
        )
        assert answer.status_code == 422, answer.text
        [error] = answer.json()["errors"]
        assert error["loc"] == ["query", next(iter(query))]
    assert await jobs(db, "reindex_account") == []
