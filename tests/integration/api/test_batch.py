"""``POST /jobs/{type}/batch``: up to 1,000 jobs in one request and one transaction, each
item answered on its own (created, replayed, unique_conflict, refused, invalid); the
quotas count items; what is wrong with the batch as a whole answers as a single enqueue."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from jobcore.database.gateway import Database
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from jobcore.usecases.timeline import job_timeline
from services.api.problems import PROBLEM_BASE
from services.api.schemas import BatchAnswer
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import (
    api,
    assert_problem,
    counts,
    enqueue,
    finish_job,
    job_row,
    outbox_rows,
    start_job,
)


async def batch(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    items: list[Any],
    job_type: str = "echo",
    **kwargs: Any,
) -> httpx.Response:
    return await client.post(
        f"/jobs/{job_type}/batch", json={"items": items}, headers=auth, **kwargs
    )


def answered(response: httpx.Response) -> list[dict[str, Any]]:
    """The items of a 200 batch answer, checked against the documented schema."""
    assert response.status_code == 200, response.text
    BatchAnswer.model_validate(response.json())
    items: list[dict[str, Any]] = response.json()["items"]
    assert [item["index"] for item in items] == list(range(len(items)))
    return items


def problem_slug(item: dict[str, Any]) -> str:
    assert item["problem"]["type"].startswith(PROBLEM_BASE), item
    return str(item["problem"]["type"].removeprefix(PROBLEM_BASE))


def unlimited(settings: Settings, **quotas: Any) -> Settings:
    defaults = {"quota_enqueue_rate": 0.0, "quota_max_unfinished": 0}
    return settings.model_copy(update={**defaults, **quotas})


async def test_valid_items_are_written_together_and_invalid_ones_refuse_the_batch(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    # An item the schema refuses refuses the whole batch (a 422 locating each), so that a
    # schema-invalid request is never a 200; nothing of it is written.
    refused = await batch(
        api_client,
        auth,
        [
            {"payload": {"text": "a"}},
            {"payload": {"text": 5}},  # invalid payload
            {"payload": {"text": "c"}, "max_attempts": 0},  # invalid item parameter
            {"text": "no payload key"},  # invalid item
            {"payload": {"text": "e"}, "delay": 5, "run_at": soon},  # both: invalid
        ],
    )
    assert_problem(refused, 422, "invalid-request")
    locs = [error["loc"] for error in refused.json()["errors"]]
    assert ["items", 1, "text"] in locs
    assert ["items", 2, "max_attempts"] in locs
    assert ["items", 4, "delay"] in locs
    assert {tuple(loc[:2]) for loc in locs} == {
        ("items", 1),
        ("items", 2),
        ("items", 3),
        ("items", 4),
    }
    assert await counts(db) == {"jobs": 0, "outbox": 0, "jobs_without_message": 0}

    response = await batch(
        api_client,
        auth,
        [
            {"payload": {"text": "a"}},
            {"payload": {"text": "b"}, "entity_id": "order-1", "max_attempts": 2},
            {"payload": {"text": "d"}, "run_at": soon},
        ],
    )
    items = answered(response)
    assert [item["status"] for item in items] == ["created", "created", "created"]
    assert response.json()["counts"] == {
        "created": 3,
        "replayed": 0,
        "joined": 0,
        "unique_conflict": 0,
        "refused": 0,
        "invalid": 0,
    }
    assert await counts(db) == {"jobs": 3, "outbox": 3, "jobs_without_message": 0}
    second = await job_row(db, items[1]["job_id"])
    assert (second["entity_id"], second["max_attempts"], second["tenant"]) == (
        "order-1",
        2,
        TENANT,
    )
    scheduled = await job_row(db, items[2]["job_id"])
    assert scheduled["next_attempt_at"] == datetime.fromisoformat(soon)
    assert (await outbox_rows(db, items[2]["job_id"]))[0]["available_at"] == datetime.fromisoformat(
        soon
    )
    view = await api_client.get(f"/jobs/{items[0]['job_id']}", headers=auth)
    assert (view.json()["status"], view.json()["payload"]) == ("pending", {"text": "a", "count": 1})


async def test_idempotency_keys_replay_across_batches_and_single_requests(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    items = [{"payload": {"text": "a"}, "idempotency_key": "k1"}, {"payload": {"text": "b"}}]
    first = answered(await batch(api_client, auth, items))
    again = answered(await batch(api_client, auth, items))
    assert [i["status"] for i in again] == ["replayed", "created"]
    assert again[0]["job_id"] == first[0]["job_id"]
    # The same request as a single POST with the key is the same request.
    single = await enqueue(
        api_client, auth, payload={"text": "a"}, headers={"Idempotency-Key": "k1"}
    )
    assert (single.status_code, single.json()["job_id"]) == (202, first[0]["job_id"])
    assert single.headers["Idempotent-Replayed"] == "true"
    # Another request under the key: that item is invalid, the rest go through.
    reused = answered(
        await batch(
            api_client,
            auth,
            [{"payload": {"text": "other"}, "idempotency_key": "k1"}, {"payload": {"text": "c"}}],
        )
    )
    assert [i["status"] for i in reused] == ["invalid", "created"]
    assert problem_slug(reused[0]) == "idempotency-key-reused"
    # Twice in one batch: the second item is the first's replay.
    twice = answered(
        await batch(
            api_client,
            auth,
            [
                {"payload": {"text": "t"}, "idempotency_key": "k2"},
                {"payload": {"text": "t"}, "idempotency_key": "k2"},
            ],
        )
    )
    assert [i["status"] for i in twice] == ["created", "replayed"]
    assert twice[0]["job_id"] == twice[1]["job_id"]
    assert (await counts(db))["jobs"] == 5


async def _usage_deltas(db: Database) -> tuple[int, int]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, coalesce(sum(delta), 0) AS total"
            " FROM jobcore.tenant_usage_deltas WHERE tenant = %s",
            (TENANT,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"]), int(row["total"])


async def test_a_batch_of_keyed_and_plain_items_is_one_statement_for_the_usage_count(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    # Items with a key are inserted apart from those without one (ON CONFLICT is only for
    # a key): still one statement, whose trigger appends one delta for all its jobs.
    before = await _usage_deltas(db)
    items = [
        {"payload": {"text": "a"}, "idempotency_key": "mixed-1"},
        {"payload": {"text": "b"}},
        {"payload": {"text": "c"}, "unique_key": "mixed-2"},
        {"payload": {"text": "d"}},
    ]
    answer = answered(await batch(api_client, auth, items))
    assert [i["status"] for i in answer] == ["created"] * 4
    after = await _usage_deltas(db)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 4)
    assert (await counts(db))["jobs"] == 4
    assert (await counts(db))["jobs_without_message"] == 0


HELD_ECHO = {"payload": {"text": "x"}, "unique_key": "held"}


async def test_unique_keys_in_a_batch_conflict_with_live_jobs_and_each_other(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    held = (await enqueue(api_client, auth, params={"unique_key": "held"})).json()["job_id"]
    items = answered(
        await batch(
            api_client,
            auth,
            [
                {"payload": {"account": "acct-1"}},
                {"payload": {"account": "acct-1", "note": "again"}},
                {"payload": {}, "unique_key": "held"},
                {"payload": {"account": "acct-2"}},
            ],
            job_type="sync_account",
        )
    )
    assert [i["status"] for i in items] == ["created", "unique_conflict", "created", "created"]
    too_long = await batch(
        api_client, auth, [{"payload": {"account": "a" * 256}}], job_type="sync_account"
    )
    assert_problem(too_long, 422, "invalid-request")
    assert too_long.json()["errors"][0]["loc"] == ["items", 0, "account"]
    assert (items[1]["job_id"], items[1]["job_status"]) == (items[0]["job_id"], "pending")
    assert problem_slug(items[1]) == "unique-job-exists"
    # "held" is an echo job's key: another type, no conflict. In echo's batch, a conflict.
    echo = answered(
        await batch(api_client, auth, [{"payload": {"text": "x"}, "unique_key": "held"}])
    )
    assert (echo[0]["status"], echo[0]["job_id"]) == ("unique_conflict", held)
    # Once the holder has ended, the key is free for a batch too.
    await start_job(db, held)
    await finish_job(db, held, "succeeded")
    echo = answered(
        await batch(api_client, auth, [{"payload": {"text": "x"}, "unique_key": "held"}])
    )
    assert echo[0]["status"] == "created"


async def test_parallel_batches_with_one_unique_key_make_exactly_one_job(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    answers = await asyncio.gather(
        *(
            batch(
                api_client,
                auth,
                [{"payload": {"text": f"{n}-{i}"}, "unique_key": "burst"} for i in range(5)],
            )
            for n in range(10)
        )
    )
    statuses = [item["status"] for response in answers for item in answered(response)]
    assert statuses.count("created") == 1
    assert statuses.count("unique_conflict") == 49
    assert await counts(db) == {"jobs": 1, "outbox": 1, "jobs_without_message": 0}


async def test_the_rate_limit_counts_items_and_refuses_the_rest(
    settings: Settings, auth: dict[str, str], db: Database
) -> None:
    config = unlimited(settings, quota_enqueue_rate=0.01, quota_enqueue_burst=3)
    async with api(config) as (app, client):
        response = await batch(client, auth, [{"payload": {"text": str(n)}} for n in range(5)])
        items = answered(response)
        assert [i["status"] for i in items] == ["created"] * 3 + ["refused"] * 2
        assert problem_slug(items[3]) == "enqueue-rate-limited"
        assert items[3]["problem"]["retry_after"] >= 1
        assert items[3]["problem"]["limit"] == 0.01
        assert response.headers["RateLimit"].startswith('"enqueue";r=0;')
        # The bucket is empty: a single request is refused too.
        assert_problem(await enqueue(client, auth), 429, "enqueue-rate-limited")
        refused = app.state.api.metrics.registry.get_sample_value(
            "jobcore_api_quota_refusals_total", {"reason": "enqueue_rate"}
        )
        assert refused == 3
    assert (await counts(db))["jobs"] == 3


async def test_the_cap_on_unfinished_jobs_admits_what_fits(
    settings: Settings, auth: dict[str, str], db: Database
) -> None:
    async with api(unlimited(settings, quota_max_unfinished=4)) as (_, client):
        one = (await enqueue(client, auth)).json()["job_id"]
        items = answered(
            await batch(client, auth, [{"payload": {"text": str(n)}} for n in range(5)])
        )
        assert [i["status"] for i in items] == ["created"] * 3 + ["refused"] * 2
        assert problem_slug(items[4]) == "too-many-unfinished-jobs"
        await start_job(db, one)
        await finish_job(db, one, "succeeded")
        items = answered(await batch(client, auth, [{"payload": {"text": "x"}}] * 2))
        assert [i["status"] for i in items] == ["created", "refused"]
    assert (await counts(db))["jobs"] == 5


async def test_what_is_wrong_with_the_whole_batch_answers_as_a_single_enqueue(
    settings: Settings, auth: dict[str, str], db: Database
) -> None:
    config = settings.model_copy(update={"max_batch_body_bytes": 4096, "max_body_bytes": 1024})
    async with api(config) as (_, client):
        for body in ({"items": []}, {"items": {}}, [], {"items": [{"payload": {}}], "x": 1}):
            response = await client.post("/jobs/echo/batch", json=body, headers=auth)
            assert_problem(response, 422, "invalid-request")
        too_many = await client.post(
            "/jobs/echo/batch",
            content=b'{"items": [' + b",".join([b"{}"] * 1001) + b"]}",
            headers={**auth, "Content-Type": "application/json"},
        )
        assert_problem(too_many, 422, "invalid-request")
        large = await batch(client, auth, [{"payload": {"text": "x" * 1000}}] * 5)
        assert_problem(large, 413, "body-too-large")
        # One item's payload over the single request's limit: the batch, naming the item.
        over = await batch(
            client,
            auth,
            [{"payload": {"text": "x" * 1000, "pad": "y" * 100}}, {"payload": {"text": "ok"}}],
        )
        assert_problem(over, 422, "invalid-request")
        assert over.json()["errors"] == [
            {"loc": ["items", 0], "msg": over.json()["errors"][0]["msg"], "type": "body-too-large"}
        ]
        unknown = await client.post("/jobs/nope/batch", json={"items": [{}]}, headers=auth)
        assert_problem(unknown, 404, "unknown-job-type")
        malformed = await client.post(
            "/jobs/echo/batch",
            content=b"{",
            headers={**auth, "Content-Type": "application/json"},
        )
        assert_problem(malformed, 400, "malformed-json")
    assert (await counts(db))["jobs"] == 0  # none of these batches wrote anything


async def test_a_batch_is_authenticated_first_and_needs_the_enqueue_scope(
    api_client: httpx.AsyncClient, db: Database
) -> None:
    # A bad body from a caller without a valid key: 401, the body never read.
    missing = await api_client.post("/jobs/echo/batch", content=b"{")
    assert_problem(missing, 401, "missing-api-key")
    made_up = await api_client.post(
        "/jobs/nope/batch", content=b"{", headers={"Authorization": "Bearer jc_madeup"}
    )
    assert_problem(made_up, 401, "invalid-api-key")
    reader = await key_usecases.create_key(db, TENANT, "r", scopes=[Scope.READ], actor="tests")
    refused = await batch(
        api_client, {"Authorization": f"Bearer {reader.key}"}, [{"payload": {"text": "a"}}]
    )
    assert assert_problem(refused, 403, "insufficient-scope")["required_scope"] == "enqueue"
    assert (await counts(db))["jobs"] == 0


async def test_the_openapi_document_describes_the_batch_route_and_unique_keys(
    api_client: httpx.AsyncClient,
) -> None:
    schema = (await api_client.get("/openapi.json")).json()
    route = schema["paths"]["/jobs/echo/batch"]["post"]
    body = route["requestBody"]["content"]["application/json"]["schema"]
    item = body["properties"]["items"]["items"]
    assert body["properties"]["items"]["maxItems"] == 1000
    assert item["properties"]["payload"]["$ref"] == "#/components/schemas/EchoPayload"
    assert {"idempotency_key", "unique_key", "entity_id", "run_at", "delay"} <= set(
        item["properties"]
    )
    assert route["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BatchAnswer"
    }
    single = schema["paths"]["/jobs/sync_account"]["post"]
    assert "unique_key" in {p["name"] for p in single["parameters"]}
    assert "409" in single["responses"]
    assert "`account`" in single["description"]
    problem = schema["components"]["schemas"]["Problem"]["properties"]
    assert {"job_id", "retry_after"} <= set(problem)
    assert "unique_key" in schema["components"]["schemas"]["JobView"]["properties"]


async def test_each_batched_job_gets_its_accepted_event(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    items = answered(
        await batch(api_client, auth, [{"payload": {"text": "a"}}, {"payload": {"text": "b"}}])
    )
    assert [item["status"] for item in items] == ["created", "created"]
    for item in items:
        # The job row is its `accepted` event (jobs.accepted_detail), read by the timeline.
        timeline = await job_timeline(db, uuid.UUID(item["job_id"]), tenant=None)
        assert timeline is not None
        events = [(event.kind, event.detail) for event in timeline.events]
        assert events == [("accepted", {"batch": True})]
        # Said by a bit on the row, not by JSON in each of its versions (migration 0045).
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT accepted_detail, accepted_in_batch FROM jobs WHERE id = %s",
                (uuid.UUID(item["job_id"]),),
            )
            assert await cur.fetchone() == {"accepted_detail": None, "accepted_in_batch": True}
            # Its first message has its id (jobcore.execution.job_messages.job_message_row).
            cur = await conn.execute(
                "SELECT message_id FROM outbox WHERE job_id = %s", (uuid.UUID(item["job_id"]),)
            )
            assert await cur.fetchall() == [{"message_id": uuid.UUID(item["job_id"])}]
