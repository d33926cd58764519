"""Tenant quotas on the real database: the enqueue rate limit (429 with RateLimit
headers, held across API processes), the cap on unfinished jobs (exact under racing
requests), the caps on long-polls; a replay is never refused; another tenant never
notices."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import httpx
from fastapi import FastAPI

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_one
from jobcore.database.sql import Query
from jobcore.execution.registry import default_registry
from jobcore.kernel.quotas import Quotas
from jobcore.kernel.settings import Settings
from jobcore.maintenance.usage_folder import UsageFolder, UsageFolderConfig
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.waiting import eventually
from jobcore.usecases import quotas as quota_usecases
from jobcore.usecases.enqueue.submit import EnqueueRequest
from jobcore.usecases.enqueue.submit import enqueue as enqueue_job
from services.api.longpolls import LongPollSlots
from tests.integration.api.conftest import OTHER_TENANT, TENANT
from tests.integration.api.support import (
    api,
    assert_problem,
    counts,
    enqueue,
    finish_job,
    start_job,
)

# One request per 100 s: nothing refills while a test runs, so every count is exact.
SLOW_RATE = 0.01

# The count of unfinished jobs is the row's plus the deltas not yet folded into it (a
# tenant with no quotas has no row until the usage folder makes one).
TENANT_USAGE = Query(
    "tenant_usage_row",
    "A tenant's usage row, with its count of unfinished jobs.",
    """
    SELECT t.tenant, u.rate_tat, u.last_refusal, u.last_refused_at,
           coalesce(u.unfinished, 0) + (
               SELECT coalesce(sum(delta), 0) FROM tenant_usage_deltas WHERE tenant = %(t)s
           ) AS unfinished
    FROM (SELECT %(t)s::text AS tenant) AS t
    LEFT JOIN tenant_usage AS u ON u.tenant = t.tenant
    """,
)
JOBS_OF = Query(
    "jobs_of_tenant",
    "How many jobs a tenant has.",
    "SELECT count(*) AS n FROM jobs WHERE tenant = %(t)s",
)


def quota_settings(settings: Settings, **quotas: Any) -> Settings:
    defaults: dict[str, Any] = {
        "quota_enqueue_rate": 0.0,
        "quota_max_unfinished": 0,
        "quota_max_long_polls": 0,
        "api_max_long_polls": 0,
    }
    return settings.model_copy(update={**defaults, **quotas})


async def usage(db: Database, tenant: str) -> dict[str, Any]:
    async with db.connection() as conn:
        row = await fetch_one(conn, TENANT_USAGE({"t": tenant}))
    assert row is not None
    return dict(row)


async def jobs_of(db: Database, tenant: str) -> int:
    async with db.connection() as conn:
        row = await fetch_one(conn, JOBS_OF({"t": tenant}))
    assert row is not None
    return int(row["n"])


def remaining(response: httpx.Response) -> int:
    match = re.fullmatch(r'"enqueue";r=(\d+);t=(\d+)', response.headers["RateLimit"])
    assert match, response.headers["RateLimit"]
    return int(match.group(1))


def refusals(app: FastAPI, reason: str) -> float:
    value = app.state.api.metrics.registry.get_sample_value(
        "jobcore_api_quota_refusals_total", {"reason": reason}
    )
    return float(value or 0)


async def test_the_rate_limit_answers_429_with_headers_and_spares_other_tenants(
    settings: Settings, db: Database, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    config = quota_settings(settings, quota_enqueue_rate=SLOW_RATE, quota_enqueue_burst=3)
    async with api(config) as (app, client):
        seen = []
        for _ in range(3):
            accepted = await enqueue(client, auth)
            assert accepted.status_code == 202, accepted.text
            # q is the burst, w the seconds the bucket takes to fill (3 at 0.01/s).
            assert accepted.headers["RateLimit-Policy"] == '"enqueue";q=3;w=300'
            seen.append(remaining(accepted))
        assert seen == [2, 1, 0]

        refused = await enqueue(client, auth)
        body = assert_problem(refused, 429, "enqueue-rate-limited")
        assert body["limit"] == SLOW_RATE
        assert refused.headers["RateLimit-Policy"] == '"enqueue";q=3;w=300'
        assert remaining(refused) == 0
        # The next token comes 100 s after the first was used.
        assert 90 <= int(refused.headers["Retry-After"]) <= 100
        assert refusals(app, "enqueue_rate") == 1

        # The other tenant has a bucket of its own, full.
        for _ in range(3):
            theirs = await enqueue(client, other_auth)
            assert theirs.status_code == 202, theirs.text
    assert await jobs_of(db, TENANT) == 3
    assert await jobs_of(db, OTHER_TENANT) == 3
    assert (await counts(db))["jobs_without_message"] == 0
    assert (await usage(db, TENANT))["last_refusal"] == "enqueue_rate"
    assert (await usage(db, OTHER_TENANT))["last_refusal"] is None


async def test_the_rate_limit_holds_across_api_processes(
    settings: Settings, db: Database, auth: dict[str, str]
) -> None:
    # Two apps with their own pools on one database: what `jobcore api --workers 2` or
    # two hosts do. Their requests alternate; the tenant's burst is shared.
    config = quota_settings(settings, quota_enqueue_rate=SLOW_RATE, quota_enqueue_burst=4)
    async with api(config) as (_, first), api(config) as (_, second):
        answers = [await enqueue(client, auth) for client in (first, second) * 4]
    assert [a.status_code for a in answers] == [202] * 4 + [429] * 4
    assert [remaining(a) for a in answers[:4]] == [3, 2, 1, 0]
    assert await jobs_of(db, TENANT) == 4


async def test_the_cap_on_unfinished_jobs_answers_429_until_a_job_ends(
    settings: Settings, db: Database, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    config = quota_settings(settings, quota_max_unfinished=2)
    async with api(config) as (app, client):
        first = (await enqueue(client, auth)).json()["job_id"]
        second = (await enqueue(client, auth)).json()["job_id"]
        refused = await enqueue(client, auth)
        body = assert_problem(refused, 429, "too-many-unfinished-jobs")
        assert body["limit"] == 2
        assert int(refused.headers["Retry-After"]) >= 1
        assert refusals(app, "max_unfinished") == 1
        # Another tenant is not held back by this one's backlog: it has a cap of its own.
        assert [(await enqueue(client, other_auth)).status_code for _ in range(3)] == [
            202,
            202,
            429,
        ]

        # A job that ends (through any statement: here a worker's claim and success, and a
        # cancel) makes room; a running job still counts.
        await start_job(db, first)
        assert_problem(await enqueue(client, auth), 429, "too-many-unfinished-jobs")
        await finish_job(db, first, "succeeded", result={"ok": True})
        assert (await enqueue(client, auth)).status_code == 202
        assert_problem(await enqueue(client, auth), 429, "too-many-unfinished-jobs")
        assert (await client.post(f"/jobs/{second}/cancel", headers=auth)).status_code == 200
        assert (await enqueue(client, auth)).status_code == 202
    assert (await usage(db, TENANT))["unfinished"] == 2
    assert (await usage(db, OTHER_TENANT))["unfinished"] == 2
    assert await jobs_of(db, TENANT) == 4


async def test_racing_requests_at_the_cap_minus_one_make_exactly_one_job(
    settings: Settings, db: Database, auth: dict[str, str]
) -> None:
    config = quota_settings(settings, quota_max_unfinished=10, db_pool_max=20)
    async with api(config) as (_, client):
        for _ in range(9):
            assert (await enqueue(client, auth)).status_code == 202
        answers = await asyncio.gather(*(enqueue(client, auth) for _ in range(50)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [202] + [429] * 49
    assert await jobs_of(db, TENANT) == 10
    assert (await usage(db, TENANT))["unfinished"] == 10


async def test_a_replay_gets_its_answer_at_a_cap_and_out_of_rate(
    settings: Settings, db: Database, auth: dict[str, str]
) -> None:
    config = quota_settings(
        settings, quota_enqueue_rate=SLOW_RATE, quota_enqueue_burst=1, quota_max_unfinished=1
    )
    key = {"Idempotency-Key": "export-1"}
    async with api(config) as (_, client):
        original = await enqueue(client, auth, headers=key)
        assert original.status_code == 202
        # Both quotas are used up now: new work is refused...
        assert (await enqueue(client, auth)).status_code == 429
        # ...a retry of the accepted request is not new work.
        for _ in range(3):
            replay = await enqueue(client, auth, headers=key)
            assert replay.status_code == 202, replay.text
            assert replay.headers["Idempotent-Replayed"] == "true"
            assert replay.json()["job_id"] == original.json()["job_id"]
            assert remaining(replay) == 0
        # A replay with another payload is still a conflict, not a quota refusal.
        changed = await enqueue(client, auth, payload={"text": "other"}, headers=key)
        assert_problem(changed, 422, "idempotency-key-reused")
    assert await jobs_of(db, TENANT) == 1


async def test_a_tenant_override_beats_the_default(
    settings: Settings, db: Database, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    config = quota_settings(settings, quota_max_unfinished=1)
    await quota_usecases.set_quotas(db, TENANT, max_unfinished=3)
    async with api(config) as (_, client):
        assert [(await enqueue(client, auth)).status_code for _ in range(4)] == [202] * 3 + [429]
        assert [(await enqueue(client, other_auth)).status_code for _ in range(2)] == [202, 429]
        # Back to the default: 3 unfinished is over it.
        await quota_usecases.set_quotas(db, TENANT, max_unfinished=None)
        assert (await enqueue(client, auth)).status_code == 429
        # 0 is unlimited.
        await quota_usecases.set_quotas(db, TENANT, max_unfinished=0)
        assert (await enqueue(client, auth)).status_code == 202


async def pending_job(client: httpx.AsyncClient, auth: dict[str, str]) -> str:
    response = await enqueue(client, auth)
    assert response.status_code == 202
    return str(response.json()["job_id"])


async def parked(app: FastAPI, n: int) -> None:
    async def probe() -> bool:
        return bool(app.state.job_waiters.waiting == n)

    await eventually(probe, what=f"{n} parked long-poll(s)")


async def test_a_tenant_over_its_long_poll_cap_is_answered_at_once_and_others_still_wait(
    settings: Settings, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    config = quota_settings(settings, quota_max_long_polls=1)
    async with api(config) as (app, client):
        mine, theirs = await pending_job(client, auth), await pending_job(client, other_auth)
        waiting = asyncio.create_task(client.get(f"/jobs/{mine}?wait=30", headers=auth))
        await parked(app, 1)
        refused = await client.get(f"/jobs/{mine}?wait=30", headers=auth)
        body = assert_problem(refused, 429, "too-many-long-polls")
        assert body["limit"] == 1
        assert refused.headers["Retry-After"] == "1"
        assert refusals(app, "long_polls_tenant") == 1
        # Without wait the tenant is served as always.
        assert (await client.get(f"/jobs/{mine}", headers=auth)).status_code == 200

        # The other tenant's long-poll parks and is answered when its job ends.
        other = asyncio.create_task(client.get(f"/jobs/{theirs}?wait=30", headers=other_auth))
        await parked(app, 2)
        assert not other.done()
        assert (await client.post(f"/jobs/{theirs}/cancel", headers=other_auth)).status_code == 200
        assert (await other).json()["status"] == "cancelled"
        assert (await client.post(f"/jobs/{mine}/cancel", headers=auth)).status_code == 200
        assert (await waiting).json()["status"] == "cancelled"
        slots: LongPollSlots = app.state.long_poll_slots
        assert slots.total == 0
        assert slots.held(TENANT) == 0
        # Its slot is free again.
        again = await pending_job(client, auth)
        task = asyncio.create_task(client.get(f"/jobs/{again}?wait=30", headers=auth))
        await parked(app, 1)
        assert (await client.post(f"/jobs/{again}/cancel", headers=auth)).status_code == 200
        assert (await task).status_code == 200


async def test_the_process_cap_on_long_polls_answers_429_past_it(
    settings: Settings, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    config = quota_settings(settings, api_max_long_polls=2)
    async with api(config) as (app, client):
        jobs = [await pending_job(client, auth) for _ in range(2)]
        tasks = [
            asyncio.create_task(client.get(f"/jobs/{job}?wait=30", headers=auth)) for job in jobs
        ]
        await parked(app, 2)
        theirs = await pending_job(client, other_auth)
        refused = await client.get(f"/jobs/{theirs}?wait=30", headers=other_auth)
        assert_problem(refused, 429, "too-many-long-polls")
        assert refusals(app, "long_polls_process") == 1
        # A finished job needs no wait, so no slot: answered even at the cap.
        await client.post(f"/jobs/{theirs}/cancel", headers=other_auth)
        done = await client.get(f"/jobs/{theirs}?wait=30", headers=other_auth)
        assert done.json()["status"] == "cancelled"
        for job in jobs:
            await client.post(f"/jobs/{job}/cancel", headers=auth)
        assert [(await t).status_code for t in tasks] == [200, 200]


async def test_the_count_of_unfinished_jobs_follows_every_way_a_job_ends(
    db: Database, settings: Settings, auth: dict[str, str]
) -> None:
    n = 3
    config = quota_settings(settings)
    async with api(config) as (_, client):
        ids = [await pending_job(client, auth) for _ in range(n)]
    assert (await usage(db, TENANT))["unfinished"] == n
    await start_job(db, ids[0])
    await finish_job(db, ids[0], "failed", last_error="boom")
    assert (await usage(db, TENANT))["unfinished"] == n - 1
    # An operator's retry makes a failed job pending again: it counts again.
    async with db.connection() as conn:
        await execute(
            conn,
            Query(
                "retry_failed",
                "Back to pending.",
                "UPDATE jobs SET status = 'pending' WHERE id = %(id)s",
            )({"id": uuid.UUID(ids[0])}),
        )
        assert (await usage(db, TENANT))["unfinished"] == n
        await execute(
            conn,
            Query("delete_job", "Delete a job.", "DELETE FROM jobs WHERE id = %(id)s")(
                {"id": uuid.UUID(ids[1])}
            ),
        )
    assert (await usage(db, TENANT))["unfinished"] == n - 1


async def test_a_request_that_queued_for_its_tenants_lock_is_judged_when_it_gets_it(
    settings: Settings, db: Database, auth: dict[str, str]
) -> None:
    # One request a second. The second request starts within that second, but queues
    # behind a lock on the tenant's row until the second is over: judged by the time it
    # started it would be early and refused; judged when it holds the lock, it is on time.
    config = quota_settings(settings, quota_enqueue_rate=1.0, quota_enqueue_burst=1)
    async with api(config) as (_, client):
        assert (await enqueue(client, auth)).status_code == 202
        tat = (await usage(db, TENANT))["rate_tat"]
        async with db.unit_of_work() as holder:
            await execute(
                holder,
                Query(
                    "lock_usage",
                    "Hold the tenant's usage row.",
                    "SELECT 1 FROM tenant_usage WHERE tenant = %(t)s FOR UPDATE",
                )({"t": TENANT}),
            )
            second = asyncio.create_task(enqueue(client, auth))

            async def queued_since() -> Any:
                async with db.connection() as conn:
                    row = await fetch_one(conn, WAITING_ENQUEUE({}))
                return row and row["query_start"]

            started = await eventually(queued_since, what="the enqueue waiting for the lock")
            assert started < tat  # the premise: it started inside the used-up second

            async def past_tat() -> bool:
                async with db.connection() as conn:
                    row = await fetch_one(conn, CLOCK_PAST({"at": tat}))
                return bool(row and row["past"])

            await eventually(past_tat, timeout=5, what="the used-up second to pass")
        answer = await second
    assert answer.status_code == 202, answer.text
    assert await jobs_of(db, TENANT) == 2


WAITING_ENQUEUE = Query(
    "waiting_enqueue",
    "The start of an enqueue statement waiting for a lock.",
    """
    SELECT query_start FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock'
      AND query LIKE '%%INSERT INTO jobcore.tenant_usage%%'
    """,
)
CLOCK_PAST = Query(
    "clock_past",
    "Whether the database's clock is past a time.",
    "SELECT clock_timestamp() > %(at)s AS past",
)


async def test_a_retry_racing_its_own_first_attempt_gets_its_job_not_a_refusal(
    settings: Settings, db: Database, topology: Topology, auth: dict[str, str]
) -> None:
    # The first attempt holds the tenant's row, its job not yet committed, when the retry
    # arrives: the retry's snapshot cannot see the job, so it is admitted (or not) as new
    # work, after the first commits, at the cap. It must still answer the first's job.
    config = quota_settings(settings, quota_max_unfinished=1)
    key = "export-race"
    async with api(config) as (_, client):
        async with db.unit_of_work() as first:
            request = EnqueueRequest(
                tenant=TENANT,
                job_type=default_registry.get("echo"),
                payload=EchoPayload(text="hello"),
                # The retry's body as the API takes it (`enqueue` posts this).
                sent={"text": "hello"},
                idempotency_key=key,
            )
            accepted = await enqueue_job(first, topology, request)
            retry = asyncio.create_task(enqueue(client, auth, headers={"Idempotency-Key": key}))

            async def retry_queued() -> Any:
                async with db.connection() as conn:
                    return await fetch_one(conn, WAITING_ENQUEUE({}))

            await eventually(retry_queued, what="the retry waiting for the first attempt")
            await first.commit()
        answer = await retry
    assert answer.status_code == 202, answer.text
    assert answer.headers["Idempotent-Replayed"] == "true"
    assert answer.json()["job_id"] == str(accepted.job_id)
    assert await jobs_of(db, TENANT) == 1


# Long enough for any statement that does not wait for a lock, on a loaded machine; a
# statement that waits for another transaction's lock never ends while that one is open.
UNBLOCKED = 30.0

END_JOBS = Query(
    "end_jobs",
    "End running jobs, as a worker's success batch does.",
    """
    UPDATE jobs SET status = 'succeeded', lease_token = NULL, lease_expires_at = NULL,
        finished_at = now(), updated_at = now()
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running'
    """,
)
DELTAS_OF = Query(
    "deltas_of_tenant",
    "How many ended jobs of a tenant are not folded into its usage row yet.",
    "SELECT count(*) AS n FROM tenant_usage_deltas WHERE tenant = %(t)s",
)
CAPPED = Quotas(enqueue_rate=0.0, enqueue_burst=1, max_unfinished=10, max_long_polls=0)


async def new_job(db: Database, topology: Topology, tenant: str) -> uuid.UUID:
    async with db.session() as session:
        result = await enqueue_job(
            session,
            topology,
            EnqueueRequest(
                tenant=tenant,
                job_type=default_registry.get("echo"),
                payload=EchoPayload(text="hello"),
            ),
            quotas=CAPPED,
        )
    return result.job_id


async def test_ending_jobs_of_two_tenants_in_opposite_orders_waits_for_nobody(
    db: Database, topology: Topology
) -> None:
    # Two workers' success batches, each ending a job of X and one of Y, in opposite
    # orders, neither committed. Counted on each tenant's row, the second statement of
    # each waited for the other's row lock: a deadlock, which PostgreSQL broke after
    # deadlock_timeout by aborting one batch. An enqueue of X queued behind both.
    x1, x2, y1, y2 = [
        await new_job(db, topology, tenant)
        for tenant in (TENANT, TENANT, OTHER_TENANT, OTHER_TENANT)
    ]
    for job in (x1, x2, y1, y2):
        await start_job(db, job)
    async with db.unit_of_work() as first, db.unit_of_work() as second:
        for uow, job in ((first, x1), (second, y2), (first, y1), (second, x2)):
            ended = await asyncio.wait_for(execute(uow, END_JOBS({"ids": [job]})), UNBLOCKED)
            assert ended == 1
        async with db.unit_of_work() as enqueuer:
            await asyncio.wait_for(
                enqueue_job(
                    enqueuer,
                    topology,
                    EnqueueRequest(
                        tenant=TENANT,
                        job_type=default_registry.get("echo"),
                        payload=EchoPayload(text="while they end"),
                    ),
                    quotas=CAPPED,
                ),
                UNBLOCKED,
            )
            await enqueuer.commit()
        await first.commit()
        await second.commit()
    assert (await usage(db, TENANT))["unfinished"] == 1
    assert (await usage(db, OTHER_TENANT))["unfinished"] == 0
    # The maintenance leader's usage folder folds X's deltas into its row.
    await new_job(db, topology, TENANT)
    async with db.unit_of_work() as uow:
        await UsageFolder(UsageFolderConfig(interval=1.0)).work(uow)
        await uow.commit()
    async with db.connection() as conn:
        deltas = await fetch_one(conn, DELTAS_OF({"t": TENANT}))
    assert deltas is not None
    assert deltas["n"] == 0
    assert (await usage(db, TENANT))["unfinished"] == 2


async def test_an_admission_queued_behind_a_fold_counts_the_folded_jobs_once(
    settings: Settings, db: Database, topology: Topology, auth: dict[str, str]
) -> None:
    # At a cap of 2 with 2 jobs, one of which ended (not folded yet): an enqueue is
    # admitted and, before it commits, folds the ended job into the row. A second enqueue
    # queued behind it began before that commit, so its snapshot still shows the folded
    # job as not folded: counted in the row and again as a delta, it would see 1 of 2
    # and be admitted over the cap.
    config = quota_settings(settings, quota_max_unfinished=2)
    async with api(config) as (_, client):
        first_job = await pending_job(client, auth)
        await pending_job(client, auth)
        await start_job(db, first_job)
        await finish_job(db, first_job, "succeeded", result={"ok": True})
        async with db.unit_of_work() as first:
            await enqueue_job(
                first,
                topology,
                EnqueueRequest(
                    tenant=TENANT,
                    job_type=default_registry.get("echo"),
                    payload=EchoPayload(text="hello"),
                ),
                quotas=config.quota_defaults,
            )
            second = asyncio.create_task(enqueue(client, auth))

            async def queued() -> Any:
                async with db.connection() as conn:
                    return await fetch_one(conn, WAITING_ENQUEUE({}))

            await eventually(queued, what="the second enqueue waiting for the first")
            await first.commit()
        assert_problem(await second, 429, "too-many-unfinished-jobs")
    assert (await usage(db, TENANT))["unfinished"] == 2
    assert await jobs_of(db, TENANT) == 3
