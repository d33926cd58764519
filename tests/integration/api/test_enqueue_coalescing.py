"""Coalesced single enqueues on the real database (services.api.coalescing,
jobcore.usecases.enqueue.submit.enqueue_coalesced): concurrent POSTs of one tenant commit together,
each job written exactly as its single enqueue writes it, each request answered as it would be
uncoalesced."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from jobcore.access.apikeys import InvalidApiKey
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all, fetch_one
from jobcore.database.sql import Query
from jobcore.execution.registry import default_registry
from jobcore.kernel.envelope import decode
from jobcore.kernel.errors import JobcoreError, QuotaExceeded
from jobcore.kernel.gates import Limit, Rate
from jobcore.kernel.priorities import Priority
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.usecases import keys as key_usecases
from jobcore.usecases import quotas as quota_usecases
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue, enqueue_coalesced
from jobcore.usecases.enqueue.write_one import EnqueueResult
from tests.integration.api.conftest import OTHER_TENANT, TENANT
from tests.integration.api.support import api
from tests.integration.api.support import enqueue as post

# One request per 100 s: nothing refills while a test runs, so every count is exact.
SLOW_RATE = 0.01
TRACE = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=1",
}

JOBS_OF = Query(
    "coalescing_jobs_of",
    "A tenant's jobs, with the transaction that wrote each.",
    "SELECT xmin::text AS writer, * FROM jobs WHERE tenant = %(t)s ORDER BY created_at, id",
)
OUTBOX_OF = Query(
    "coalescing_outbox_of",
    "A tenant's outbox rows.",
    "SELECT * FROM outbox WHERE tenant = %(t)s",
)
EVENTS_OF = Query(
    "coalescing_events_of",
    "How many job_events rows each of a tenant's jobs has.",
    """
    SELECT j.id, count(e.job_id) AS n FROM jobs AS j
    LEFT JOIN job_events AS e ON e.job_id = j.id
    WHERE j.tenant = %(t)s GROUP BY j.id
    """,
)


def unlimited(settings: Settings, coalesce_max: int = 64) -> Settings:
    return settings.model_copy(
        update={
            "quota_enqueue_rate": 0.0,
            "quota_max_unfinished": 0,
            "quota_max_long_polls": 0,
            "api_max_long_polls": 0,
            "db_pool_max": 20,
            "api_enqueue_coalesce_max": coalesce_max,
        }
    )


async def rows(db: Database, query: Query[Any], tenant: str) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        return [dict(row) for row in await fetch_all(conn, query({"t": tenant}))]


async def test_concurrent_posts_of_one_tenant_commit_together_each_answered(
    settings: Settings, db: Database, auth: dict[str, str]
) -> None:
    async with api(unlimited(settings)) as (app, client):
        # The key is verified (and remembered) first: the racing requests then reach the
        # enqueue without a statement of their own.
        first = await post(client, auth, payload={"text": "first"})
        assert first.status_code == 202, first.text
        answers = await asyncio.gather(
            *(post(client, auth, payload={"text": f"n{n}"}) for n in range(40))
        )
        coalescer = app.state.api.enqueues
        groups, coalesced = coalescer.groups_written, coalescer.requests_coalesced
        metrics = (await client.get("/metrics")).text
    assert [a.status_code for a in answers] == [202] * 40, [a.text for a in answers]
    ids = {a.json()["job_id"] for a in answers} | {first.json()["job_id"]}
    assert len(ids) == 41
    assert groups >= 1
    assert coalesced >= 2
    assert f"jobcore_api_coalesced_enqueues_total {float(coalesced)}" in metrics
    jobs = await rows(db, JOBS_OF, TENANT)
    assert {str(job["id"]) for job in jobs} == ids
    # Jobs that share a writing transaction: fewer transactions than requests.
    assert len({job["writer"] for job in jobs}) <= 41 - coalesced + groups
    assert len({job["writer"] for job in jobs}) < 41
    # Each job's payload is its own request's, with exactly one outbox message of its own.
    by_id = {a.json()["job_id"]: n for n, a in enumerate(answers)}
    for job in jobs:
        if str(job["id"]) in by_id:
            assert job["payload"] == {"text": f"n{by_id[str(job['id'])]}", "count": 1}
    messages = await rows(db, OUTBOX_OF, TENANT)
    assert sorted(str(m["job_id"]) for m in messages) == sorted(ids)
    assert len({m["message_id"] for m in messages}) == 41
    for message in messages:
        decoded = decode(bytes(message["body"]))
        assert (str(decoded.job_id), decoded.attempt) == (str(message["job_id"]), 1)


# Columns that differ between any two jobs (or their messages) whatever wrote them.
JOB_VOLATILE = {"writer", "id", "tenant", "created_at", "updated_at"}
MESSAGE_VOLATILE = {"id", "message_id", "job_id", "body", "tenant", "created_at", "available_at"}


async def test_a_coalesced_job_is_written_as_its_single_enqueue_writes_it(
    db: Database, topology: Topology
) -> None:
    # Gates, a callback, a priority, a schedule, keys, an origin, a trace context: each
    # request is written once alone (one tenant) and once coalesced (the other).
    gated = dataclasses.replace(
        default_registry.get("echo"), concurrency=Limit(2), rate=Rate(5.0, burst=2)
    )
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    keys = {
        tenant: (await key_usecases.create_key(db, tenant, "tests", actor="tests")).record.id
        for tenant in (TENANT, OTHER_TENANT)
    }

    def requests(tenant: str) -> list[EnqueueRequest]:
        def one(text: str, **fields: Any) -> EnqueueRequest:
            return EnqueueRequest(
                tenant=tenant,
                job_type=gated,
                payload=EchoPayload(text=text),
                sent={"text": text},
                key_id=keys[tenant],
                **fields,
            )

        return [
            one("plain"),
            one(
                "full",
                idempotency_key="order-1",
                unique_key="account-1",
                entity_id="order:1",
                max_attempts=2,
                run_at=later,
                priority=Priority.HIGH,
                callback_url="https://hooks.example.test/done",
                origin={"schedule": "nightly"},
            ),
            one("low", priority=Priority.LOW, entity_id="order:2"),
        ]

    for request in requests(TENANT):
        async with db.session() as session:
            await enqueue(session, topology, request, trace=dict(TRACE))
    coalesced = requests(OTHER_TENANT)
    answers = await enqueue_coalesced(db, topology, coalesced, [dict(TRACE)] * len(coalesced))
    assert all(isinstance(answer, EnqueueResult) for answer in answers)

    def comparable(tenant_rows: list[dict[str, Any]], volatile: set[str]) -> list[Any]:
        return sorted(
            ({k: v for k, v in row.items() if k not in volatile} for row in tenant_rows),
            key=repr,
        )

    single_jobs = await rows(db, JOBS_OF, TENANT)
    coalesced_jobs = await rows(db, JOBS_OF, OTHER_TENANT)
    assert len(single_jobs) == len(coalesced_jobs) == 3
    assert comparable(single_jobs, JOB_VOLATILE) == comparable(coalesced_jobs, JOB_VOLATILE)
    assert len({job["writer"] for job in coalesced_jobs}) == 1
    assert len({job["writer"] for job in single_jobs}) == 3
    full = next(job for job in coalesced_jobs if job["entity_id"] == "order:1")
    assert set(full["accepted_detail"]) == {"run_at", "schedule"}
    assert full["accepted_detail"]["schedule"] == "nightly"
    assert full["traceparent"] == TRACE["traceparent"]
    assert full["callback_url"] == "https://hooks.example.test/done"

    single_messages = await rows(db, OUTBOX_OF, TENANT)
    coalesced_messages = await rows(db, OUTBOX_OF, OTHER_TENANT)
    assert comparable(single_messages, MESSAGE_VOLATILE) == comparable(
        coalesced_messages, MESSAGE_VOLATILE
    )
    for message in coalesced_messages:
        assert message["headers"] == TRACE
        assert decode(bytes(message["body"])).job_id == message["job_id"]
    by_job = {m["job_id"]: m for m in coalesced_messages}
    for job in coalesced_jobs:
        assert by_job[job["id"]]["priority"] == job["priority"]
        if job["next_attempt_at"] is not None:
            assert by_job[job["id"]]["available_at"] == job["next_attempt_at"]
    events = [row["n"] for row in await rows(db, EVENTS_OF, TENANT)]
    assert sorted(events) == sorted(row["n"] for row in await rows(db, EVENTS_OF, OTHER_TENANT))


Answer = EnqueueResult | JobcoreError
Write = Callable[[Sequence[EnqueueRequest]], Awaitable[list[Answer]]]


def summary(answer: Answer, replayed_ids: dict[str, uuid.UUID]) -> tuple[Any, ...]:
    """What an answer says, but the ids and instants that differ between two tenants."""
    header = (
        answer.rate_headers.get("RateLimit")
        if isinstance(answer, EnqueueResult)
        else answer.headers.get("RateLimit")
        if isinstance(answer, QuotaExceeded)
        else None
    )
    left = None if header is None else re.sub(r";t=\d+", "", header)
    if isinstance(answer, EnqueueResult):
        replay = answer.replayed and answer.job_id in replayed_ids.values()
        return ("job", answer.status, answer.replayed, replay, left)
    return (type(answer).__name__, left)


async def mixed_scenario(
    db: Database, topology: Topology, tenant: str, write: Write
) -> list[tuple[Any, ...]]:
    """A tenant with a burst of 7 (SLOW_RATE) that used 3 for two keyed jobs and a job
    holding a unique key; then, in order: new work, a replay, a key reused with another
    payload, a unique conflict, and new work past the rate limit."""
    await quota_usecases.set_quotas(db, tenant, enqueue_rate=SLOW_RATE, enqueue_burst=7)
    echo = default_registry.get("echo")

    def request(text: str, **fields: Any) -> EnqueueRequest:
        return EnqueueRequest(
            tenant=tenant, job_type=echo, payload=EchoPayload(text=text), **fields
        )

    async with db.session() as session:
        keyed = await enqueue(session, topology, request("a", idempotency_key="k1"))
        await enqueue(session, topology, request("held", unique_key="u1"))
        await enqueue(session, topology, request("z", idempotency_key="k0"))
    answers = await write(
        [
            request("n0"),
            request("a", idempotency_key="k1"),
            request("other", idempotency_key="k0"),
            request("b", unique_key="u1"),
            request("n1"),
            request("n2", idempotency_key="k2"),
            request("n3"),
            request("n4"),
            request("n5", idempotency_key="k3"),
            request("n6", unique_key="u2"),
        ]
    )
    return [summary(answer, {"k1": keyed.job_id}) for answer in answers]


async def test_a_coalesced_group_answers_each_request_as_it_is_answered_uncoalesced(
    db: Database, topology: Topology
) -> None:
    async def one_by_one(requests: Sequence[EnqueueRequest]) -> list[Answer]:
        answers: list[Answer] = []
        for request in requests:
            try:
                async with db.session() as session:
                    answers.append(await enqueue(session, topology, request))
            except JobcoreError as exc:
                answers.append(exc)
        return answers

    async def together(requests: Sequence[EnqueueRequest]) -> list[Answer]:
        return await enqueue_coalesced(db, topology, requests, [{}] * len(requests))

    alone = await mixed_scenario(db, topology, TENANT, one_by_one)
    coalesced = await mixed_scenario(db, topology, OTHER_TENANT, together)
    assert coalesced == alone
    kinds = [entry[0] for entry in alone]
    assert kinds == [
        "job",
        "job",
        "IdempotencyConflict",
        "UniqueJobExists",
        "job",
        "job",
        "job",
        "EnqueueRateExceeded",
        "EnqueueRateExceeded",
        "EnqueueRateExceeded",
    ]
    assert alone[1][2:4] == (True, True)  # the replay answers the keyed job


async def test_racing_posts_get_the_answers_they_get_uncoalesced(
    settings: Settings, db: Database, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    # The same racing requests, on a process that coalesces (one tenant) and on one that
    # does not (the other): the same answers, but for which of the new ones the rate
    # limit refuses (the order they arrive in).
    async def scenario(tenant: str, headers: dict[str, str], coalesce_max: int) -> Any:
        await quota_usecases.set_quotas(db, tenant, enqueue_rate=SLOW_RATE, enqueue_burst=8)
        async with api(unlimited(settings, coalesce_max)) as (app, client):
            keyed = await post(
                client, headers, payload={"text": "a"}, headers={"Idempotency-Key": "k1"}
            )
            held = await post(client, headers, "sync_account", {"account": "acct-1"})
            assert (keyed.status_code, held.status_code) == (202, 202)
            calls = [
                post(client, headers, payload={"text": "a"}, headers={"Idempotency-Key": "k1"}),
                post(client, headers, payload={"text": "b"}, headers={"Idempotency-Key": "k1"}),
                post(client, headers, "sync_account", {"account": "acct-1"}),
                *(post(client, headers, payload={"text": f"n{n}"}) for n in range(10)),
            ]
            answers = await asyncio.gather(*calls)
            coalesced = app.state.api.enqueues.requests_coalesced

        def said(response: httpx.Response) -> tuple[Any, ...]:
            body = response.json()
            return (
                response.status_code,
                body.get("type"),
                response.headers.get("Idempotent-Replayed"),
                body.get("job_id") == keyed.json()["job_id"],
            )

        fixed = [said(a) for a in answers[:3]]
        new = sorted(said(a) for a in answers[3:])
        return fixed, new, coalesced

    with_coalescing = await scenario(TENANT, auth, 64)
    without = await scenario(OTHER_TENANT, other_auth, 1)
    assert with_coalescing[:2] == without[:2]
    assert without[2] == 0
    assert with_coalescing[2] >= 2
    fixed, new, _ = without
    assert [entry[0] for entry in fixed] == [202, 422, 409]
    assert fixed[0][2:] == ("true", True)
    # 8 of burst: 2 used before, 6 of the 10 new admitted.
    assert [entry[0] for entry in new] == [202] * 6 + [429] * 4


async def test_a_group_with_a_revoked_key_writes_nothing(db: Database, topology: Topology) -> None:
    created = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    await key_usecases.revoke_key(db, created.record.id, actor="tests")
    echo = default_registry.get("echo")
    requests = [
        EnqueueRequest(
            tenant=TENANT,
            job_type=echo,
            payload=EchoPayload(text=f"n{n}"),
            key_id=created.record.id,
        )
        for n in range(3)
    ]
    try:
        await enqueue_coalesced(db, topology, requests, [{}] * 3)
    except InvalidApiKey:
        pass
    else:
        raise AssertionError("a revoked key's enqueues were written")
    assert await rows(db, JOBS_OF, TENANT) == []
    async with db.connection() as conn:
        usage = await fetch_one(
            conn,
            Query(
                "coalescing_usage_of",
                "A tenant's usage row.",
                "SELECT count(*) AS n FROM tenant_usage WHERE tenant = %(t)s",
            )({"t": TENANT}),
        )
    assert usage is not None
    assert usage["n"] == 0
