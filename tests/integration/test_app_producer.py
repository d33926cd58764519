"""The chaos run's application producer keeps an exact account: every committed
transaction's job exists, no rolled-back transaction's job does, a commit whose answer was
lost is settled by its application row, and the report catches a job of a rolled-back
transaction should one exist."""

from __future__ import annotations

import asyncio
import random
import uuid
from urllib.parse import urlsplit

from jobcore.database.gateway import Database
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.testing.app_producer import APP_TABLE, AppProducer
from jobcore.testing.pipeline import via_port
from jobcore.testing.tcpproxy import Mode, TcpProxy

TRANSACTIONS = 40


def producer(settings: Settings, share: float, seed: int = 3) -> AppProducer:
    return AppProducer(
        settings.database_url,
        settings,
        load_job_modules(["jobcore.testing.jobtypes"]),
        "t",
        random.Random(seed),
        rollback_share=share,
    )


async def job_ids(db: Database) -> set[str]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT id FROM jobs WHERE tenant = 't'")
        return {str(row["id"]) for row in await cur.fetchall()}


async def test_committed_jobs_exist_and_rolled_back_ones_do_not(
    settings: Settings, db: Database
) -> None:
    app = producer(settings, 0.5)
    await app.prepare()
    stop = asyncio.Event()
    started = await app.steady(1000.0, stop, limit=TRANSACTIONS)
    await app.settle(settings.database_url)
    report = await app.report(settings.database_url)

    assert started == TRANSACTIONS
    assert report.committed + report.rolled_back == TRANSACTIONS
    # Seeded: both kinds happen.
    assert report.committed > 5
    assert report.rolled_back > 5
    assert report.jobs_from_rollbacks == 0
    assert await job_ids(db) == set(app.committed)
    async with db.connection() as conn:
        cur = await conn.execute(f"SELECT job_id FROM {APP_TABLE}")
        rows = {str(row["job_id"]) for row in await cur.fetchall()}
    assert rows == set(app.committed)


async def test_a_lost_commit_answer_is_settled_by_the_application_row(
    settings: Settings, db: Database
) -> None:
    app = producer(settings, 0.0)
    await app.prepare()
    await app.produce_one()
    await app.close()
    [committed] = app.committed
    async with db.connection() as conn:
        cur = await conn.execute(f"SELECT id FROM {APP_TABLE}")
        [row] = await cur.fetchall()
    # As if its commit's answer had been lost, and one more that never committed.
    app.committed = []
    app.unknown = [(row["id"], committed), (uuid.uuid4(), str(uuid.uuid4()))]
    await app.settle(settings.database_url)
    report = await app.report(settings.database_url)
    assert app.committed == [committed]
    assert report.unknown_commits == 2
    assert (report.committed, report.rolled_back, report.jobs_from_rollbacks) == (1, 1, 0)


async def test_the_report_counts_a_job_of_a_rolled_back_transaction(
    settings: Settings, db: Database
) -> None:
    app = producer(settings, 0.0)
    await app.prepare()
    await app.produce_one()
    await app.close()
    # Accounted as rolled back, though it committed: what the run must catch.
    app.rolled_back, app.committed = app.committed, []
    report = await app.report(settings.database_url)
    assert report.jobs_from_rollbacks == 2  # its job, and its application row


async def test_a_connection_that_stops_answering_does_not_hang_the_producer(
    settings: Settings, db: Database
) -> None:
    """A proxy that holds the connection open and forwards nothing (the chaos run's
    database cut): the transaction is given up after its step timeout, and the next one
    commits on a new connection."""
    target = urlsplit(settings.database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    try:
        app = producer(settings, 0.0)
        app.database_url = via_port(settings.database_url, proxy.port)
        app.step_timeout = 1.0
        await app.prepare()
        await app.produce_one()
        proxy.set_mode(Mode.BLACKHOLE)
        await asyncio.wait_for(app.produce_one(), timeout=30)
        assert (app.failed, len(app.unknown)) in {(1, 0), (0, 1)}
        proxy.set_mode(Mode.FORWARD)
        await app.produce_one()
        await app.close()
        await app.settle(settings.database_url)
        assert len(app.committed) == 3 - app.failed
        assert await job_ids(db) == set(app.committed)
    finally:
        await proxy.stop()
