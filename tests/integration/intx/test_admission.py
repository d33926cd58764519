"""The two admissions of an in-transaction enqueue (jobcore.kernel.quotas.Admission): the default,
approximate, reads the tenant's usage as committed and holds no lock; its cap can be
passed by what transactions open together hold uncommitted, and by no more. The exact
one serialises and never passes it (docs/how-to/enqueue-in-transaction.md)."""

from __future__ import annotations

import asyncio

import pytest

from jobcore.database.gateway import Database
from jobcore.kernel.errors import EnqueueRateExceeded, TooManyUnfinishedJobs
from jobcore.kernel.settings import Settings
from tests.integration.intx.apptx import app_tx

pytestmark = pytest.mark.usefixtures("orders")


def capped(settings: Settings, cap: int) -> Settings:
    return settings.model_copy(update={"quota_max_unfinished": cap, "quota_enqueue_rate": 0.0})


async def jobs_of_t(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs WHERE tenant = 't'")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_the_cap_refuses_once_committed_jobs_fill_it(
    settings: Settings, db: Database
) -> None:
    config = capped(settings, 2)
    async with app_tx("psycopg_async", config) as tx:
        await tx.enqueue("echo", {"text": "1"})
        await tx.enqueue("echo", {"text": "2"})  # its own first job counts: 1 < 2
        with pytest.raises(TooManyUnfinishedJobs):
            await tx.enqueue("echo", {"text": "3"})
        await tx.add_order(1)  # still usable
        await tx.commit()
    async with app_tx("sqlalchemy", config) as tx:
        with pytest.raises(TooManyUnfinishedJobs):
            await tx.enqueue("echo", {"text": "4"})
        await tx.rollback()
    assert await jobs_of_t(db) == 2


async def test_transactions_open_together_pass_the_cap_by_what_they_hold(
    settings: Settings, db: Database
) -> None:
    """The documented bound: with one place left, each of three open transactions sees it
    free and takes it; once they commit, the next is refused."""
    config = capped(settings, 2)
    async with app_tx("psycopg_async", config) as tx:
        await tx.enqueue("echo", {"text": "committed"})
        await tx.commit()
    async with (
        app_tx("psycopg_async", config) as a,
        app_tx("sqlalchemy_async", config) as b,
        app_tx("psycopg", config) as c,
    ):
        for tx in (a, b, c):
            await tx.enqueue("echo", {"text": tx.kind})
            # Its own job counts for it: a second one is refused in the same transaction.
            with pytest.raises(TooManyUnfinishedJobs):
                await tx.enqueue("echo", {"text": "second"})
        for tx in (a, b, c):
            await tx.commit()
    assert await jobs_of_t(db) == 4  # the cap, 2, plus the two others held uncommitted
    async with app_tx("psycopg_async", config) as tx:
        with pytest.raises(TooManyUnfinishedJobs):
            await tx.enqueue("echo", {"text": "late"})


async def test_the_exact_admission_never_passes_the_cap(settings: Settings, db: Database) -> None:
    """Three transactions racing for the last place: one takes it, the two others wait
    for its commit and are refused."""
    config = capped(settings, 1)

    async def one(n: int) -> bool:
        async with app_tx("psycopg_async", config) as tx:
            try:
                await tx.enqueue("echo", {"text": str(n)}, admission="exact")
            except TooManyUnfinishedJobs:
                return False
            await tx.commit()
            return True

    admitted = await asyncio.gather(*(one(n) for n in range(3)))
    assert sorted(admitted) == [False, False, True]
    assert await jobs_of_t(db) == 1


async def test_an_empty_bucket_refuses_without_being_drawn_from(
    settings: Settings, db: Database
) -> None:
    """The rate limit: a bucket the exact admissions emptied refuses the approximate one;
    approximate admissions do not draw from it."""
    config = settings.model_copy(
        update={"quota_enqueue_rate": 0.01, "quota_enqueue_burst": 1, "quota_max_unfinished": 0}
    )
    async with app_tx("psycopg_async", config) as tx:
        for n in range(3):
            await tx.enqueue("echo", {"text": f"approximate {n}"})
        await tx.commit()
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM tenant_usage WHERE tenant = 't'")
        row = await cur.fetchone()
    assert row is not None
    assert row["n"] == 0  # nothing drawn: no usage row written
    async with app_tx("psycopg_async", config) as tx:
        await tx.enqueue("echo", {"text": "exact"}, admission="exact")  # the burst of 1
        await tx.commit()
    async with app_tx("psycopg_async", config) as tx:
        with pytest.raises(EnqueueRateExceeded):
            await tx.enqueue("echo", {"text": "approximate, bucket empty"})
        with pytest.raises(EnqueueRateExceeded):
            await tx.enqueue("echo", {"text": "exact, bucket empty"}, admission="exact")
    assert await jobs_of_t(db) == 4
