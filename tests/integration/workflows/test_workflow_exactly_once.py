"""Readiness is counted exactly once: a replayed settle, a duplicate delivery, and two
dependencies settling at the same instant on two connections release a dependent once."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest

from jobcore.database.gateway import Database
from jobcore.testing import InlineWorker
from tests.integration.workflows.jobtypes import REGISTRY, RUNS
from tests.integration.workflows.test_workflow_runs import step


@pytest.fixture
def worker(jobcore_db: Database) -> InlineWorker:
    RUNS.clear()
    return InlineWorker(jobcore_db, registry=REGISTRY)


async def messages_of(worker: InlineWorker, job_id: uuid.UUID) -> int:
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) AS n FROM jobcore.outbox WHERE job_id = %s", [job_id]
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row["n"])


async def claim(conn: psycopg.AsyncConnection[Any], job_id: uuid.UUID) -> uuid.UUID:
    token = uuid.uuid4()
    await conn.execute(
        "UPDATE jobcore.jobs SET status = 'running', attempts = attempts + 1, lease_token = %s, "
        "lease_expires_at = now() + interval '1 minute' WHERE id = %s AND status = 'pending'",
        [token, job_id],
    )
    return token


async def until_waiting_for_a_lock(worker: InlineWorker, pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        async with worker.db.connection() as conn:
            cursor = await conn.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
            )
            row = await cursor.fetchone()
        if row is not None and row["wait_event_type"] == "Lock":
            return
        await asyncio.sleep(0.01)  # the poll's interval, bounded by the deadline
    raise AssertionError("the second settle never waited for the first's lock")


# The shape of every outcome: fenced on the job's status and its lease token.
SETTLE = (
    "UPDATE jobcore.jobs SET status = 'succeeded', finished_at = now(), lease_token = NULL "
    "WHERE id = %s AND status = 'running' AND lease_token = %s"
)


async def test_a_replayed_settle_and_a_duplicate_delivery_release_a_dependent_once(
    worker: InlineWorker,
) -> None:
    database_url = worker.settings.database_url
    created = await worker.workflow([step("a"), step("b", "a")])
    a, b = created.jobs["a"], created.jobs["b"]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        token = await claim(conn, a)
        first = await conn.execute(SETTLE, [a, token])
        again = await conn.execute(SETTLE, [a, token])
        assert (first.rowcount, again.rowcount) == (1, 0)
    assert await messages_of(worker, b) == 1
    # The same message delivered twice: the worker's inbox takes the second as a duplicate.
    async with worker.db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.outbox "
            "(message_id, exchange, routing_key, message_type, body, job_id, tenant) "
            "SELECT gen_random_uuid(), exchange, routing_key, message_type, body, job_id, tenant "
            "FROM jobcore.outbox WHERE job_id = %s",
            [b],
        )
    await worker.drain()
    assert [label for label, _, _ in RUNS] == ["b"]
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) AS n FROM jobcore.job_events WHERE job_id = %s AND kind = "
            "'dependencies_met'",
            [b],
        )
        assert await cursor.fetchone() == {"n": 1}


@pytest.mark.parametrize("turn", range(5))
async def test_two_dependencies_settling_at_once_on_two_connections_release_once(
    worker: InlineWorker, turn: int
) -> None:
    database_url = worker.settings.database_url
    created = await worker.workflow([step("a"), step("b"), step("join", "a", "b")])
    a, b, join = created.jobs["a"], created.jobs["b"], created.jobs["join"]
    one = await psycopg.AsyncConnection.connect(database_url)
    two = await psycopg.AsyncConnection.connect(database_url)
    try:
        tokens = []
        for conn, job in ((one, a), (two, b)):
            tokens.append(await claim(conn, job))
            await conn.commit()
        # Both settle inside open transactions, then commit together.
        await one.execute(SETTLE, [a, tokens[0]])
        settle_two = asyncio.create_task(two.execute(SETTLE, [b, tokens[1]]))
        # The second settle reaches the workflow's row and waits for the first's lock.
        await until_waiting_for_a_lock(worker, two.info.backend_pid)
        await asyncio.gather(one.commit(), settle_two)
        await two.commit()
    finally:
        await one.close()
        await two.close()
    assert await messages_of(worker, join) == 1
    await worker.drain()
    assert [label for label, _, _ in RUNS] == ["join"]
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT status, open_jobs FROM jobcore.workflows WHERE id = %s", [created.id]
        )
        assert await cursor.fetchone() == {"status": "succeeded", "open_jobs": 0}
