"""jobcore.enqueue()'s two admissions, as enqueue_in's (jobcore.kernel.quotas.Admission): by
default, approximate, the tenant's quotas are read as committed and no lock is held that
another enqueue waits for; ``admission => 'exact'`` locks the tenant's usage row until the
caller's transaction ends, and never passes the cap. Ordering is asserted, never a
duration, but for the third enqueue's bound (docs/how-to/enqueue-in-transaction.md)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest

from jobcore.database.gateway import Database
from jobcore.execution.job_type_records import record_job_types
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases import quotas as quota_usecases
from tests.integration.intx.test_lock_footprint import (
    HOLD,
    THIRD_DEADLINE,
    visible_jobs,
    waiting_on_a_lock,
)

pytestmark = pytest.mark.usefixtures("orders")

ENQUEUE = "SELECT jobcore.enqueue('echo', %(p)s::jsonb, tenant => 't')"
ENQUEUE_AS = "SELECT jobcore.enqueue('echo', %(p)s::jsonb, tenant => 't', admission => %(a)s)"


@pytest.fixture
async def quoted(settings: Settings, db: Database) -> Settings:
    """Tenant t has quotas of its own (a rate limit and a cap, both far from reached), and
    the workers have recorded their job types."""
    async with db.connection() as conn:
        await record_job_types(conn, default_registry, settings, registered_by="tests")
    await quota_usecases.set_quotas(
        db, "t", enqueue_rate=1000.0, enqueue_burst=1000, max_unfinished=1000
    )
    return settings


async def connect(settings: Settings, name: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(settings.database_url, application_name=name)


async def sql_enqueue(
    conn: psycopg.AsyncConnection[Any], text: str, admission: str | None = None
) -> uuid.UUID:
    params = {"p": psycopg.types.json.Jsonb({"text": text}), "a": admission}
    cur = await conn.execute(ENQUEUE if admission is None else ENQUEUE_AS, params)
    row = await cur.fetchone()
    assert row is not None
    job_id: uuid.UUID = row[0]
    return job_id


async def third_sql_enqueue(
    settings: Settings, name: str, took: list[float], admission: str | None = None
) -> uuid.UUID:
    """jobcore_enqueue of tenant t from a connection of its own, committed; ``took`` gets
    the seconds from the call to the commit (the connection made before)."""
    async with await connect(settings, name) as conn:
        started = time.monotonic()
        job_id = await sql_enqueue(conn, "third", admission)
        await conn.commit()
        took.append(time.monotonic() - started)
    return job_id


async def test_two_open_transactions_do_not_hold_up_a_third_sql_enqueue(
    quoted: Settings, db: Database
) -> None:
    """Two transactions of tenant t each call jobcore_enqueue (the default admission) and
    stay open HOLD seconds; a third jobcore_enqueue of t, from another connection, answers
    meanwhile, without waiting for a lock."""
    name = "sql-third-approximate"
    async with (
        await connect(quoted, "sql-first") as first,
        await connect(quoted, "sql-second") as second,
    ):
        for conn, n in ((first, 1), (second, 2)):
            await conn.execute("INSERT INTO orders VALUES (%s, 10)", [n])
            # Bounded: with the exact admission the second waits for the first's commit.
            await asyncio.wait_for(sql_enqueue(conn, f"order {n}"), timeout=30)
        opened = time.monotonic()
        took: list[float] = []
        third = asyncio.create_task(third_sql_enqueue(quoted, name, took))

        async def answered_or_stuck() -> bool:
            return third.done() or await waiting_on_a_lock(db, name)

        try:
            await eventually(answered_or_stuck, timeout=30, what="the third enqueue to answer")
            assert third.done(), "the third enqueue waits for a lock the open transactions hold"
            third_id = await third
        finally:
            if not third.done():
                third.cancel()
        assert took[0] < THIRD_DEADLINE, f"the third enqueue took {took[0]:.3f}s"
        assert await visible_jobs(db) == {third_id}
        # The scenario: both stay open HOLD seconds after their enqueues.
        await asyncio.sleep(max(0.0, HOLD - (time.monotonic() - opened)))
        assert await visible_jobs(db) == {third_id}
        await first.commit()
        await second.commit()
    assert len(await visible_jobs(db)) == 3


async def test_the_exact_admission_makes_the_tenants_enqueues_queue(
    quoted: Settings, db: Database
) -> None:
    """The opt-in exact admission: the tenant's usage row is held until the caller's
    transaction ends, and an enqueue of the tenant waits for that commit."""
    name = "sql-third-exact"
    async with await connect(quoted, "sql-holder") as holder:
        await sql_enqueue(holder, "holds the usage row", "exact")
        took: list[float] = []
        third = asyncio.create_task(third_sql_enqueue(quoted, name, took, "exact"))
        try:
            await eventually(
                lambda: waiting_on_a_lock(db, name), timeout=30, what="the third to queue"
            )
            assert not third.done()
            await holder.commit()
            third_id = await asyncio.wait_for(third, timeout=30)
        finally:
            if not third.done():
                third.cancel()
    assert len(await visible_jobs(db)) == 2
    assert third_id in await visible_jobs(db)


def refusal(error: psycopg.Error) -> tuple[str | None, str | None]:
    return error.sqlstate, error.diag.message_primary


async def test_the_cap_refuses_once_committed_jobs_fill_it(quoted: Settings, db: Database) -> None:
    await quota_usecases.set_quotas(db, "t", enqueue_rate=0.0, max_unfinished=2)
    async with await connect(quoted, "sql-cap") as conn:
        await sql_enqueue(conn, "1")
        await sql_enqueue(conn, "2")  # its own first job counts: 1 < 2
        await conn.execute("SAVEPOINT enqueue")
        with pytest.raises(psycopg.Error) as refused:
            await sql_enqueue(conn, "3")
        assert refusal(refused.value) == (
            "JC429",
            "jobcore_enqueue: the tenant has 2 unfinished jobs, its limit; retry when some "
            "have finished",
        )
        await conn.execute("ROLLBACK TO SAVEPOINT enqueue")
        await conn.execute("INSERT INTO orders VALUES (1, 10)")  # still usable
        await conn.commit()
        with pytest.raises(psycopg.Error) as refused:
            await sql_enqueue(conn, "4")
        assert refused.value.sqlstate == "JC429"
        await conn.rollback()
    assert len(await visible_jobs(db)) == 2


async def test_transactions_open_together_pass_the_cap_by_what_they_hold(
    quoted: Settings, db: Database
) -> None:
    """The documented bound of the approximate admission: with one place left, each of
    three open transactions sees it free and takes it; once they commit, the next is
    refused."""
    await quota_usecases.set_quotas(db, "t", enqueue_rate=0.0, max_unfinished=2)
    async with await connect(quoted, "sql-committed") as conn:
        await sql_enqueue(conn, "committed")
        await conn.commit()
    conns = [await connect(quoted, f"sql-open-{n}") for n in range(3)]
    try:
        for conn in conns:
            await sql_enqueue(conn, "open")
        for conn in conns:
            await conn.commit()
    finally:
        for conn in conns:
            await conn.close()
    assert len(await visible_jobs(db)) == 4  # the cap, 2, plus the two held uncommitted
    async with await connect(quoted, "sql-late") as conn:
        with pytest.raises(psycopg.Error) as refused:
            await sql_enqueue(conn, "late")
        assert refused.value.sqlstate == "JC429"


async def test_the_exact_admission_never_passes_the_cap(quoted: Settings, db: Database) -> None:
    """Three transactions racing for the last place: one takes it, the two others wait
    for its commit and are refused."""
    await quota_usecases.set_quotas(db, "t", enqueue_rate=0.0, max_unfinished=1)

    async def one(n: int) -> str | None:
        """The SQLSTATE of the enqueue's refusal, None when it was admitted."""
        async with await connect(quoted, f"sql-race-{n}") as conn:
            try:
                await sql_enqueue(conn, str(n), "exact")
            except psycopg.Error as error:
                return error.sqlstate
            await conn.commit()
            return None

    answers = await asyncio.gather(*(one(n) for n in range(3)))
    assert sorted(answers, key=str) == ["JC429", "JC429", None]
    assert len(await visible_jobs(db)) == 1


async def test_an_empty_bucket_refuses_without_being_drawn_from(
    quoted: Settings, db: Database
) -> None:
    """The rate limit: approximate admissions do not draw from the tenant's bucket; a
    bucket the exact admission emptied refuses both."""
    await quota_usecases.set_quotas(db, "t", enqueue_rate=0.01, enqueue_burst=1, max_unfinished=0)
    async with await connect(quoted, "sql-rate") as conn:
        for n in range(3):
            await sql_enqueue(conn, f"approximate {n}")
        await conn.commit()
        cur = await conn.execute("SELECT count(*) FROM tenant_usage WHERE tenant = 't'")
        assert await cur.fetchone() == (0,)  # nothing drawn: no usage row written
        await sql_enqueue(conn, "exact", "exact")  # the burst of 1
        await conn.commit()
        for admission in ("approximate", "exact"):
            with pytest.raises(psycopg.Error) as refused:
                await sql_enqueue(conn, f"{admission}, bucket empty", admission)
            assert refused.value.sqlstate == "JC429"
            assert "enqueue rate limit (0.01/s, bursts of 1)" in str(refused.value)
            await conn.rollback()
    assert len(await visible_jobs(db)) == 4


@pytest.mark.parametrize("admission", ["", "Exact", "none"])
async def test_an_unknown_admission_is_refused(
    admission: str, quoted: Settings, db: Database
) -> None:
    async with await connect(quoted, "sql-bad-admission") as conn:
        with pytest.raises(psycopg.Error) as refused:
            await sql_enqueue(conn, "a", admission)
    assert refused.value.sqlstate == "JC400"
    assert refused.value.diag.column_name == "admission"
    assert "one of approximate, exact" in str(refused.value)
    assert await visible_jobs(db) == set()
