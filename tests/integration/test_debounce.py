"""Debounce and throttle by key (jobcore.kernel.keyed), against the real PostgreSQL: what
each enqueue joins, the trailing job's due time and payloads, concurrent enqueues of one
key from several connections, an enqueue while the key's job runs or is being published,
throttling's leading edge, and the independence of keys and tenants."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel, ConfigDict, Field

from jobcore import enqueue_in
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.claims import ClaimedJob, ClaimRequest
from jobcore.execution.registry import JobContext, JobType, Registry, default_registry
from jobcore.kernel.errors import EnqueueRateExceeded, IdempotencyConflict
from jobcore.kernel.keyed import Debounce, Throttle
from jobcore.kernel.quotas import Quotas
from jobcore.kernel.settings import Settings
from jobcore.maintenance.retention import Retention
from jobcore.testing.draining import InlineWorker
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue, enqueue_many, enqueue_on
from jobcore.usecases.enqueue.write_many import ItemStatus
from jobcore.usecases.enqueue.write_one import EnqueueResult


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str = Field(max_length=100)
    n: int = 0


SEEN: dict[uuid.UUID, list[tuple[int, list[int]]]] = {}


async def record(ctx: JobContext[Event]) -> dict[str, object]:
    SEEN.setdefault(ctx.job_id, []).append((ctx.payload.n, [p.n for p in ctx.payloads]))
    return {"n": ctx.payload.n}


def debounced(
    name: str = "digest",
    *,
    period: float = 30.0,
    max_wait: float | None = None,
    payloads: Any = "all",
    max_payloads: int = 1000,
    cancel_running: bool = False,
) -> JobType[Event]:
    return JobType(
        name=name,
        queue="testq",
        payload_model=Event,
        handler=record,
        debounce=Debounce(
            period,
            max_wait=max_wait,
            per="account",
            payloads=payloads,
            max_payloads=max_payloads,
            cancel_running=cancel_running,
        ),
    )


def throttled(period: float = 30.0) -> JobType[Event]:
    return JobType(
        name="ping",
        queue="testq",
        payload_model=Event,
        handler=record,
        throttle=Throttle(period, per="account"),
    )


async def send(
    db: Database,
    topology: Topology,
    kind: JobType[Event],
    n: int,
    *,
    account: str = "a",
    tenant: str = "t",
) -> EnqueueResult:
    request = EnqueueRequest(tenant=tenant, job_type=kind, payload=Event(account=account, n=n))
    return await enqueue_on(db, topology, request)


async def rows(db: Database, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    async with db.connection() as conn:
        cur = await conn.execute(sql, params or {})
        return list(await cur.fetchall())


async def jobs_of(db: Database, kind: str) -> list[Any]:
    return await rows(
        db,
        """
        SELECT j.id, j.tenant, j.status, j.payload, j.debounce_key, j.debounce_count,
               j.debounce_payloads, j.next_attempt_at, j.concurrency_key, j.concurrency_limit,
               j.cancel_requested_at, o.available_at
        FROM jobs j LEFT JOIN outbox o ON o.job_id = j.id
        WHERE j.type = %(type)s ORDER BY j.created_at
        """,
        {"type": kind},
    )


async def test_enqueues_of_a_key_within_the_period_become_one_trailing_job(
    db: Database, topology: Topology
) -> None:
    kind = debounced()
    answers = [await send(db, topology, kind, n) for n in range(5)]

    first = answers[0]
    assert not first.joined
    assert all(a.joined and a.job_id == first.job_id for a in answers[1:])
    [job] = await jobs_of(db, "digest")
    assert job["id"] == first.job_id
    assert job["debounce_count"] == 5
    assert [p["n"] for p in job["debounce_payloads"]] == [0, 1, 2, 3, 4]
    assert job["payload"]["n"] == 4  # the last
    # Due a period after the last enqueue, the job's row and its message alike.
    assert job["available_at"] == job["next_attempt_at"]
    [key] = await rows(db, "SELECT * FROM job_keys")
    assert key["enqueues"] == 5
    assert job["next_attempt_at"] - key["last_at"] == pytest.approx(
        timedelta(seconds=30), abs=timedelta(seconds=1)
    )


async def test_payloads_last_keeps_only_the_last(db: Database, topology: Topology) -> None:
    kind = debounced(payloads="last")
    for n in range(3):
        await send(db, topology, kind, n)
    [job] = await jobs_of(db, "digest")
    assert job["payload"]["n"] == 2
    assert job["debounce_payloads"] is None
    assert job["debounce_count"] == 3


async def test_max_wait_bounds_the_delay_under_a_never_quiet_stream(
    db: Database, topology: Topology
) -> None:
    kind = debounced(period=1.0, max_wait=1.5)
    first = await send(db, topology, kind, 0)
    [key] = await rows(db, "SELECT first_at FROM job_keys")
    cap = key["first_at"] + timedelta(seconds=1.5)
    deadline = asyncio.get_running_loop().time() + 10
    dues = []
    n = 1
    # Enqueue every 50 ms, never quiet for a period, until past the max wait.
    while True:
        answer = await send(db, topology, kind, n)
        assert answer.joined
        assert answer.job_id == first.job_id
        [job] = await jobs_of(db, "digest")
        dues.append(job["next_attempt_at"])
        assert job["next_attempt_at"] <= cap
        [now] = await rows(db, "SELECT clock_timestamp() AS now")
        if now["now"] > cap:
            break
        assert asyncio.get_running_loop().time() < deadline
        n += 1
        await asyncio.sleep(0.05)
    assert dues[-1] == cap
    [job] = await jobs_of(db, "digest")
    assert job["available_at"] == cap
    assert job["debounce_count"] == n + 1


async def test_concurrent_enqueues_of_one_key_coalesce_into_one_job(
    db: Database, topology: Topology
) -> None:
    kind = debounced()
    connections, each = 8, 25

    async def producer(c: int) -> list[EnqueueResult]:
        return [await send(db, topology, kind, c * 1000 + i) for i in range(each)]

    answers = [
        a for batch in await asyncio.gather(*map(producer, range(connections))) for a in batch
    ]

    [job] = await jobs_of(db, "digest")
    assert {a.job_id for a in answers} == {job["id"]}
    assert sum(not a.joined for a in answers) == 1
    sent = sorted(c * 1000 + i for c in range(connections) for i in range(each))
    assert sorted(p["n"] for p in job["debounce_payloads"]) == sent  # no payload lost
    assert job["debounce_count"] == connections * each


async def test_a_full_job_takes_no_more_and_the_next_enqueue_opens_the_next(
    db: Database, topology: Topology
) -> None:
    kind = debounced(max_payloads=3)
    answers = [await send(db, topology, kind, n) for n in range(5)]
    assert [a.joined for a in answers] == [False, True, True, False, True]
    first, second = await jobs_of(db, "digest")
    assert [p["n"] for p in first["debounce_payloads"]] == [0, 1, 2]
    assert [p["n"] for p in second["debounce_payloads"]] == [3, 4]


async def test_an_event_during_a_run_schedules_exactly_one_more_run(
    db: Database, topology: Topology
) -> None:
    kind = debounced()
    running = await send(db, topology, kind, 0)
    await _run(db, running.job_id)

    answers = [await send(db, topology, kind, n) for n in (1, 2, 3)]

    assert not answers[0].joined
    assert answers[0].job_id != running.job_id
    assert all(a.joined and a.job_id == answers[0].job_id for a in answers[1:])
    active, trailing = await jobs_of(db, "digest")
    assert active["status"] == "running"
    assert active["cancel_requested_at"] is None
    assert trailing["status"] == "pending"
    assert [p["n"] for p in trailing["debounce_payloads"]] == [1, 2, 3]
    # The key's jobs run one at a time: the trailing run starts after the active one.
    assert trailing["concurrency_key"] == active["concurrency_key"] is not None
    assert trailing["concurrency_limit"] == 1


async def test_a_type_that_says_so_cancels_the_active_run(db: Database, topology: Topology) -> None:
    kind = debounced(cancel_running=True)
    running = await send(db, topology, kind, 0)
    await _run(db, running.job_id)

    answer = await send(db, topology, kind, 1)

    assert not answer.joined
    active, trailing = await jobs_of(db, "digest")
    assert active["cancel_requested_at"] is not None
    assert active["status"] == "running"
    assert trailing["status"] == "pending"
    [event] = await rows(
        db,
        "SELECT kind FROM job_events WHERE job_id = %(id)s AND kind = 'cancel_requested'",
        {"id": running.job_id},
    )
    assert event["kind"] == "cancel_requested"


async def test_a_job_published_but_not_claimed_is_joined_without_moving_its_due_time(
    db: Database, topology: Topology, settings: Settings
) -> None:
    kind = debounced()
    first = await send(db, topology, kind, 0)
    [before] = await jobs_of(db, "digest")
    # A relay holds the message's row while it publishes it: the enqueue does not wait.
    async with await psycopg.AsyncConnection.connect(settings.database_url) as relay:
        await relay.execute(
            "SELECT id FROM outbox WHERE job_id = %(id)s FOR UPDATE", {"id": first.job_id}
        )
        answer = await asyncio.wait_for(send(db, topology, kind, 1), timeout=10)
        # Published: the row is gone.
        await relay.execute("DELETE FROM outbox WHERE job_id = %(id)s", {"id": first.job_id})
        await relay.commit()
    again = await send(db, topology, kind, 2)
    assert answer.joined
    assert again.joined
    assert answer.job_id == again.job_id == first.job_id
    [job] = await jobs_of(db, "digest")
    assert job["next_attempt_at"] == before["next_attempt_at"]
    assert [p["n"] for p in job["debounce_payloads"]] == [0, 1, 2]


async def test_a_job_held_by_its_key_takes_the_events_that_come_meanwhile(
    db: Database, topology: Topology
) -> None:
    """A trailing job that came due during a long run was claimed and held (its key's
    concurrency of 1): the events during the run join it, one run after the active one."""
    kind = debounced()
    running = await send(db, topology, kind, 0)
    await _run(db, running.job_id)
    trailing = await send(db, topology, kind, 1)
    async with db.connection() as conn:
        await conn.execute("DELETE FROM outbox WHERE job_id = %(id)s", {"id": trailing.job_id})
        await conn.execute(
            "UPDATE jobs SET held_reason = 'concurrency', held_since = now() WHERE id = %(id)s",
            {"id": trailing.job_id},
        )
    later = [await send(db, topology, kind, n) for n in (2, 3)]
    assert all(a.joined and a.job_id == trailing.job_id for a in later)
    active, held = await jobs_of(db, "digest")
    assert (active["status"], held["status"]) == ("running", "pending")
    assert [p["n"] for p in held["debounce_payloads"]] == [1, 2, 3]


async def test_throttle_answers_the_leading_job_within_the_period(
    db: Database, topology: Topology
) -> None:
    kind = throttled()
    answers = [await send(db, topology, kind, n) for n in range(4)]

    leading = answers[0]
    assert not leading.joined
    assert all(a.joined and a.job_id == leading.job_id for a in answers[1:])
    [job] = await jobs_of(db, "ping")
    assert job["payload"]["n"] == 0
    # Leading edge: due at once.
    assert job["next_attempt_at"] is None

    # The period over, the next enqueue opens the next one.
    async with db.connection() as conn:
        await conn.execute("UPDATE job_keys SET first_at = first_at - interval '31 seconds'")
    later = await send(db, topology, kind, 9)
    assert not later.joined
    assert later.job_id != leading.job_id
    assert len(await jobs_of(db, "ping")) == 2


async def test_concurrent_throttled_enqueues_write_one_job(
    db: Database, topology: Topology
) -> None:
    kind = throttled()
    answers = await asyncio.gather(*(send(db, topology, kind, n) for n in range(20)))
    assert len({a.job_id for a in answers}) == 1
    assert sum(not a.joined for a in answers) == 1
    assert len(await jobs_of(db, "ping")) == 1


async def test_keys_and_tenants_are_independent(db: Database, topology: Topology) -> None:
    for kind in (debounced(), throttled()):
        answers = [
            await send(db, topology, kind, n, account=account, tenant=tenant)
            for n in range(2)
            for account in ("a", "b")
            for tenant in ("t1", "t2")
        ]
        assert sum(not a.joined for a in answers) == 4
        jobs = await jobs_of(db, kind.name)
        assert len(jobs) == 4
        assert len({(j["tenant"], j["debounce_key"]) for j in jobs}) == 4


async def test_a_batch_of_one_key_joins_one_job(db: Database, topology: Topology) -> None:
    kind = debounced()
    requests = [
        EnqueueRequest(tenant="t", job_type=kind, payload=Event(account="a", n=n)) for n in range(3)
    ]
    async with db.unit_of_work() as uow:
        result = await enqueue_many(uow, topology, requests)
        await uow.commit()
    assert [o.status for o in result.outcomes] == [
        ItemStatus.CREATED,
        ItemStatus.JOINED,
        ItemStatus.JOINED,
    ]
    assert len({o.job_id for o in result.outcomes}) == 1
    [job] = await jobs_of(db, "digest")
    assert job["debounce_count"] == 3


async def test_the_trailing_run_gets_every_payload(db: Database, topology: Topology) -> None:
    registry = Registry()
    kind = registry.register(debounced(period=0.2))
    worker = InlineWorker(db, registry=registry)
    ids = {await worker.enqueue("digest", {"account": "a", "n": n}) for n in range(4)}
    [job_id] = ids

    drained = await worker.drain(scheduled_within=5)

    assert drained.succeeded == 1
    assert SEEN.pop(job_id) == [(3, [0, 1, 2, 3])]
    assert kind.debounce is not None


async def _run(db: Database, job_id: uuid.UUID) -> None:
    """The job's message published and the job claimed: what a relay and a worker do."""
    async with db.connection() as conn:
        await conn.execute("DELETE FROM outbox WHERE job_id = %(id)s", {"id": job_id})
        await conn.execute(
            """
            UPDATE jobs SET status = 'running', attempts = 1, lease_token = gen_random_uuid(),
                   lease_expires_at = now() + interval '1 minute', started_at = now()
            WHERE id = %(id)s
            """,
            {"id": job_id},
        )


async def test_enqueue_in_one_transaction_joins_its_own_job(
    db: Database, topology: Topology
) -> None:
    kind = debounced()
    async with db.unit_of_work() as uow:
        first = await enqueue(
            uow, topology, EnqueueRequest(tenant="t", job_type=kind, payload=Event(account="a"))
        )
        second = await enqueue(
            uow,
            topology,
            EnqueueRequest(tenant="t", job_type=kind, payload=Event(account="a", n=1)),
        )
        await uow.commit()
    assert not first.joined
    assert second.joined
    assert second.job_id == first.job_id


async def test_spent_keys_are_pruned_and_open_ones_are_not(
    db: Database, topology: Topology, settings: Settings
) -> None:
    debounce, throttle = debounced(), throttled()
    for account in ("spent", "unpublished", "recent"):
        await send(db, topology, debounce, 0, account=account)
        await send(db, topology, throttle, 0, account=account)
    async with db.connection() as conn:
        # Past the retention (JOBCORE_GATE_RETENTION, a day by default); "unpublished"
        # still has its job's first message in the outbox.
        await conn.execute(
            "UPDATE job_keys SET expires_at = now() - interval '2 days'"
            " WHERE key NOT LIKE '%%account=recent'"
        )
        await conn.execute(
            "DELETE FROM outbox WHERE job_id IN (SELECT job_id FROM job_keys"
            " WHERE key NOT LIKE '%%account=unpublished')"
        )

    dry = await Retention(settings, db).count()
    done = await Retention(settings, db).prune()

    assert dry.tables["job_keys"] == done.tables["job_keys"] == 2
    left = sorted(
        row["key"].rsplit(":", 1)[-1] for row in await rows(db, "SELECT key FROM job_keys")
    )
    assert left == ["account=recent"] * 2 + ["account=unpublished"] * 2
    # A pruned key starts afresh.
    again = await send(db, topology, debounce, 1, account="spent")
    assert not again.joined


async def test_a_retry_of_a_joining_request_joins_once(db: Database, topology: Topology) -> None:
    for kind in (debounced(), throttled()):

        def request(n: int, key: str) -> EnqueueRequest:
            return EnqueueRequest(
                tenant="t",
                job_type=kind,  # noqa: B023 - used at once, in this iteration
                payload=Event(account="a", n=n),
                idempotency_key=key,
            )

        first = await enqueue_on(db, topology, request(0, "k0"))
        joined = await enqueue_on(db, topology, request(1, "k1"))
        retried = await enqueue_on(db, topology, request(1, "k1"))

        assert joined.joined
        assert not joined.replayed
        assert retried.joined
        assert retried.replayed
        assert retried.job_id == joined.job_id == first.job_id
        with pytest.raises(IdempotencyConflict):
            await enqueue_on(db, topology, request(2, "k1"))
        [job] = await jobs_of(db, kind.name)
        if kind.debounce is not None:
            assert [p["n"] for p in job["debounce_payloads"]] == [0, 1]
            assert job["debounce_count"] == 2
        # The first request wrote the job: its retry is an idempotency replay as ever.
        again = await enqueue_on(db, topology, request(0, "k0"))
        assert again.replayed
        assert again.job_id == first.job_id
        assert not again.joined


async def test_enqueue_in_answers_joined_and_a_key_waits_for_the_open_transaction(
    settings: Settings, db: Database
) -> None:
    def payload(change: str) -> dict[str, str]:
        return {"account": "acct-1", "change": change}

    url = settings.database_url
    async with (
        await psycopg.AsyncConnection.connect(url) as first,
        await psycopg.AsyncConnection.connect(url) as second,
    ):
        opened = await enqueue_in(
            first, default_registry, "reindex_account", payload("a"), tenant="t", settings=settings
        )
        again = await enqueue_in(
            first, default_registry, "reindex_account", payload("b"), tenant="t", settings=settings
        )
        assert not opened.joined
        assert again.joined
        assert again.job_id == opened.job_id
        # Another transaction's enqueue of the key waits for this one's commit, then joins
        # the job it committed.
        waiting = asyncio.create_task(
            enqueue_in(
                second,
                default_registry,
                "reindex_account",
                payload("c"),
                tenant="t",
                settings=settings,
            )
        )
        pid = second.info.backend_pid

        async def blocked() -> bool:
            found = await rows(
                db,
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %(pid)s",
                {"pid": pid},
            )
            return bool(found) and found[0]["wait_event_type"] == "Lock"

        await eventually(blocked, what="the second enqueue waiting for the key's lock")
        assert not waiting.done()
        await first.commit()
        joined = await asyncio.wait_for(waiting, timeout=10)
        await second.commit()
    assert joined.joined
    assert joined.job_id == opened.job_id
    [job] = await jobs_of(db, "reindex_account")
    assert [p["change"] for p in job["debounce_payloads"]] == ["a", "b", "c"]


async def test_joins_count_against_the_tenants_enqueue_rate(
    db: Database, topology: Topology
) -> None:
    quotas = Quotas(enqueue_rate=0.01, enqueue_burst=3, max_unfinished=0, max_long_polls=0)
    kind = debounced()

    async def send_limited(n: int, tenant: str = "t") -> EnqueueResult:
        request = EnqueueRequest(tenant=tenant, job_type=kind, payload=Event(account="a", n=n))
        return await enqueue_on(db, topology, request, quotas=quotas)

    answers = [await send_limited(n) for n in range(3)]
    assert [a.joined for a in answers] == [False, True, True]
    with pytest.raises(EnqueueRateExceeded):
        await send_limited(3)
    [job] = await jobs_of(db, "digest")
    assert [p["n"] for p in job["debounce_payloads"]] == [0, 1, 2]  # the refused one is not in
    # Another tenant's bucket is its own.
    assert not (await send_limited(0, tenant="u")).joined


async def test_a_joined_requests_key_goes_with_its_job(
    db: Database, topology: Topology, settings: Settings
) -> None:
    kind = throttled()
    first = await send(db, topology, kind, 0)
    request = EnqueueRequest(
        tenant="t", job_type=kind, payload=Event(account="a", n=1), idempotency_key="retry-me"
    )
    assert (await enqueue_on(db, topology, request)).joined
    assert len(await rows(db, "SELECT * FROM job_key_joins")) == 1
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '400 days'"
            " WHERE id = %(id)s",
            {"id": first.job_id},
        )
    await Retention(settings, db).prune()
    assert await jobs_of(db, "ping") == []
    assert await rows(db, "SELECT * FROM job_key_joins") == []


async def test_a_claim_that_meets_a_join_runs_the_merged_payload(
    db: Database, settings: Settings
) -> None:
    """The trailing job's message was published; a worker claims it while an enqueue's
    join of the job is uncommitted: the claim waits for the join and gets both payloads."""
    registry = Registry()
    kind = registry.register(debounced())
    worker = InlineWorker(db, registry=registry)
    job_id = await worker.enqueue("digest", {"account": "a", "n": 0})
    [key] = await rows(db, "SELECT message_id FROM job_keys")
    async with db.connection() as conn:  # published: the relay deleted its row
        await conn.execute("DELETE FROM outbox WHERE job_id = %(id)s", {"id": job_id})

    async with await psycopg.AsyncConnection.connect(settings.database_url) as app:
        joined = await enqueue_in(
            app, registry, "digest", {"account": "a", "n": 1}, tenant="test", settings=settings
        )
        assert joined.joined
        assert joined.job_id == job_id
        claim = asyncio.create_task(
            worker.executor.claim([ClaimRequest(key["message_id"], job_id, kind, 1)])
        )

        async def waiting() -> bool:
            found = await rows(
                db,
                "SELECT count(*) AS n FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            return found[0]["n"] > 0

        await eventually(waiting, what="the claim waiting for the join's row lock")
        assert not claim.done()
        await app.commit()
    [claimed] = await asyncio.wait_for(claim, timeout=10)
    assert isinstance(claimed, ClaimedJob)
    assert claimed.raw_payload == {"account": "a", "n": 1}
    assert claimed.raw_payloads == [{"account": "a", "n": 0}, {"account": "a", "n": 1}]
