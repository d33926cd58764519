"""The compactor (jobcore.maintenance.compactor): a hot table bloated behind a pinned xmin
horizon gives its space back once the pin ends, never while it holds; a reader holding
the table makes it give up within its lock timeout, and an enqueue waits no longer than
that; and no job enqueued or claimed during a compaction is lost or doubled.

A pin is a connection that took an XID and stays idle in its transaction. This machine's
server runs without autovacuum, so the churn's dead rows stay until the rewrite. The
server is shared: a transaction holding an XID in another database (another test's pin)
holds this one's horizon too, so a shrink is waited for with a deadline, and the tests
about locks count no pin younger than an hour."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute
from jobcore.database.store import database_store
from jobcore.kernel.settings import Settings
from jobcore.maintenance.compactor import Compactor, CompactorConfig, candidates
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.waiting import eventually
from services.worker.metrics import WorkerMetrics
from tests.integration.worker.support import TAKE_OVER, Maintenance, submit

LIVE = 2000
ADD_JOBS = """
    INSERT INTO jobs (id, tenant, type, queue, payload)
    SELECT gen_random_uuid(), %(tenant)s, 'noop', 'default',
           jsonb_build_object('text', repeat('x', 200), 'n', n)
    FROM generate_series(1, %(n)s) AS n
"""
SIZE = "SELECT pg_total_relation_size('jobs') AS bytes"
# A waiting request for the table's exclusive lock, by the compactor's connection.
COMPACTOR_WAITING = """
    SELECT count(*) AS n FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.relation = 'jobs'::regclass AND l.mode = 'AccessExclusiveLock' AND NOT l.granted
      AND a.application_name = 'jobcore-compactor'
"""


def config(**changes: Any) -> CompactorConfig:
    # A pin counts once older than half a second, and a table may be compacted again at
    # once (a rewrite under another test's pin copied the dead rows); the rest as a worker
    # runs it.
    return CompactorConfig(**{"horizon_age": 0.5, "every": 0.001, **changes})


async def one(conn: psycopg.AsyncConnection[Any], query: str) -> Any:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def churn(conn: psycopg.AsyncConnection[Any], rounds: int, n: int = 5000) -> None:
    """Jobs that come and go, as a steady rate with a short retention makes them."""
    for _ in range(rounds):
        await conn.execute(ADD_JOBS, {"tenant": "churn", "n": n})
        await conn.execute("DELETE FROM jobs WHERE tenant = 'churn'")


async def live_jobs(settings: Settings) -> psycopg.AsyncConnection[Any]:
    """A connection of the test's own, after LIVE jobs were added and analyzed (as the
    analyzer would), with the table's size before any churn."""
    conn = await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True, options="-c search_path=jobcore"
    )
    await conn.execute(ADD_JOBS, {"tenant": "live", "n": LIVE})
    await conn.execute("VACUUM ANALYZE jobs")
    return conn


async def worth_compacting(db: Database, cfg: CompactorConfig) -> list[str]:
    async with db.session() as session:
        rows = await database_store.compaction_tables(session, {"tables": ["jobs"]})
    return [c.name for c in candidates(rows, cfg)]


async def pinned_for(db: Database, seconds: float) -> bool:
    async with db.session() as session:
        horizon = await database_store.compaction_horizon(session)
    assert horizon is not None
    return bool(horizon["seconds"] >= seconds)


# Alone, after the parallel tests: the compactor rightly waits for every XID open on the
# server, so another test's pin, or several in a row, kept this table from shrinking
# for the whole of its deadline in a CI run.
@pytest.mark.serial
@pytest.mark.timeout(240)
async def test_a_table_bloated_behind_a_pin_is_compacted_once_the_pin_ends_not_before(
    db: Database, settings: Settings
) -> None:
    cfg = config()
    metrics = WorkerMetrics()
    compactor = Compactor(cfg, settings=settings, metrics=metrics)
    maintenance = Maintenance(db, "a", compactor, metrics=metrics)
    async with await live_jobs(settings) as conn:
        before_pin = await one(conn, SIZE)
        etag = await one(conn, "SELECT xmin::text FROM jobs WHERE tenant = 'live' LIMIT 1")
        async with await psycopg.AsyncConnection.connect(settings.database_url) as pin:
            await pin.execute("SELECT txid_current()")  # an XID, held idle in transaction
            await churn(conn, rounds=8)
            await conn.execute("VACUUM ANALYZE jobs")  # what autovacuum can do: nothing
            bloated = await one(conn, SIZE)
            assert bloated > 5 * before_pin
            # It would pay, and the pin is old enough to count: the compactor waits.
            assert await worth_compacting(db, cfg) == ["jobs"]
            await eventually(lambda: pinned_for(db, cfg.horizon_age), what="the pin to age")
            assert await maintenance.round() == 0
            assert not compactor.compacted_at  # not even tried
            assert await one(conn, SIZE) >= bloated
            await pin.rollback()

        async def shrunk() -> bool:
            await maintenance.round()
            return bool(await one(conn, SIZE) <= 1.5 * before_pin)

        await eventually(shrunk, timeout=120, interval=0.2, what="the table to shrink")
        after = await one(conn, SIZE)
        # Every live job is there, unchanged (its ETag too): the rewrite copies versions.
        assert await one(conn, "SELECT count(*) FROM jobs WHERE tenant = 'live'") == LIVE
        assert await one(conn, f"SELECT count(*) FROM jobs WHERE xmin::text = '{etag}'") >= 1
        # Not left marked as clustered: nothing about the schema changed.
        assert not await one(
            conn, "SELECT bool_or(indisclustered) FROM pg_index WHERE indrelid = 'jobs'::regclass"
        )
    done = compactor.last
    assert done is not None
    assert done.outcome == "done"
    # As measured around the rewrite (before VACUUM made the new files' free-space and
    # visibility maps).
    assert done.bytes_before >= bloated
    assert done.bytes_after <= after
    assert 0 < done.lock_held < cfg.max_seconds
    assert metrics.counts["compacted.jobs.done"] >= 1
    # Once done, it is not worth it again.
    assert await maintenance.round() == 0


async def test_a_reader_holding_the_table_makes_it_give_up_within_its_lock_timeout(
    db: Database, settings: Settings
) -> None:
    cfg = config(lock_timeout=0.5, horizon_age=3600, every=3600)
    compactor = Compactor(cfg, settings=settings, metrics=None)
    maintenance = Maintenance(db, "a", compactor)
    topology = Topology.from_settings(settings)
    async with await live_jobs(settings) as conn:
        await churn(conn, rounds=8)
        await conn.execute("ANALYZE jobs")
        bloated = await one(conn, SIZE)
        assert await worth_compacting(db, cfg) == ["jobs"]
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, options="-c search_path=jobcore"
        ) as reader:
            # READ COMMITTED: the lock stays until the transaction ends, the snapshot does
            # not (no pin: the compactor goes ahead, and meets the lock).
            await reader.execute("SELECT count(*) FROM jobs")
            round_ = asyncio.ensure_future(maintenance.round())
            try:
                await eventually(
                    lambda: one(conn, COMPACTOR_WAITING),
                    timeout=10,
                    interval=0.005,
                    what="the compactor to wait for the lock",
                )
                # An enqueue now queues behind the waiting request, for no longer than its
                # lock timeout.
                started = time.monotonic()
                job = await submit(db, topology, "echo", EchoPayload(text="queued"))
                waited = time.monotonic() - started
                assert await round_ == 0
            finally:
                if not round_.done():
                    round_.cancel()
            assert waited < cfg.lock_timeout + 1.0, waited
            await reader.rollback()
        done = compactor.last
        assert done is not None
        assert done.outcome == "lock_timeout"
        assert cfg.lock_timeout <= done.lock_wait < cfg.lock_timeout + 1.0
        assert compactor.lock_misses == {"jobs": 1}
        assert "jobs" not in compactor.compacted_at
        assert await one(conn, SIZE) >= bloated
        assert await one(conn, f"SELECT count(*) FROM jobs WHERE id = '{job}'") == 1
        # A lock timeout is tried again at the next round, not after JOBCORE_COMPACT_EVERY.
        assert await maintenance.round() == 1
        again = compactor.last
        assert again is not None
        assert again.outcome == "done"
        assert compactor.lock_misses == {}


async def test_jobs_enqueued_and_claimed_during_a_compaction_are_all_there(
    db: Database, settings: Settings
) -> None:
    cfg = config(lock_timeout=1.0, horizon_age=3600)
    compactor = Compactor(cfg, settings=settings, metrics=None)
    maintenance = Maintenance(db, "a", compactor)
    topology = Topology.from_settings(settings)
    enqueued: list[uuid.UUID] = []
    claimed: list[uuid.UUID] = []
    async with await live_jobs(settings) as conn:
        await churn(conn, rounds=8)
        await conn.execute("ANALYZE jobs")
        bloated = await one(conn, SIZE)
        compacting = asyncio.Event()

        async def traffic() -> None:
            # Enqueue and claim until the compaction ended, and a few more after it.
            after = 0
            while after < 5:
                if compacting.is_set():
                    after += 1
                job = await submit(db, topology, "echo", EchoPayload(text=str(len(enqueued))))
                enqueued.append(job)
                if len(enqueued) % 2 == 0:
                    async with db.unit_of_work() as uow:
                        await execute(uow, TAKE_OVER({"id": job, "token": uuid.uuid4()}))
                        await uow.commit()
                    claimed.append(job)

        async def flowing() -> bool:
            return len(enqueued) >= 5

        running = asyncio.ensure_future(traffic())
        await eventually(flowing, what="the traffic to flow")
        during = len(enqueued)
        try:
            assert await maintenance.round() == 1
            during = len(enqueued) - during
        finally:
            compacting.set()
            await running
        assert during > 0  # the traffic went on while the round locked and rewrote
        assert compactor.last is not None
        assert compactor.last.outcome == "done"
        assert compactor.last.bytes_before >= bloated
        ids = [str(job) for job in enqueued]
        cur = await conn.execute(
            "SELECT status, count(*) FROM jobs WHERE id = ANY(%s::uuid[]) GROUP BY status", (ids,)
        )
        statuses = dict(await cur.fetchall())
        assert statuses == {"running": len(claimed), "pending": len(enqueued) - len(claimed)}
        # Each enqueued job has its one message.
        cur = await conn.execute(
            "SELECT count(*) FROM outbox WHERE job_id = ANY(%s::uuid[])", (ids,)
        )
        assert await cur.fetchone() == (len(enqueued),)
        assert await one(conn, "SELECT count(*) FROM jobs WHERE tenant = 'live'") == LIVE
