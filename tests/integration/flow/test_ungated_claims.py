"""The claim skips the gate lock for jobs with no concurrency or rate key
(jobcore.database.store.jobs.JobStore.claim, jobcore.database.sql.jobs.run.JOB_CLAIM_UNGATED): those
are claimed by one statement on its own, and only the keyed jobs of a batch lock their gate
rows and claim behind them, so their limits hold as before."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database import gateway as jobcore_db
from jobcore.database.gateway import Database
from jobcore.database.sql.inbox import JOBS_CONSUMER
from jobcore.database.store import JobClaimManyParams, job_store
from jobcore.database.store import jobs as store_jobs
from tests.support.flow import job, run

pytestmark = pytest.mark.timeout(120)

KEY = "concurrency:flow_x:tenant=t:account=a"
RATE_KEY = "rate:flow_x:tenant=t:account=a"


def params(topology: Topology, job_ids: list[uuid.UUID]) -> JobClaimManyParams:
    return {
        "consumer": JOBS_CONSUMER,
        "exchange": topology.jobs_exchange,
        "worker_id": "w",
        "message_ids": [uuid.uuid4() for _ in job_ids],
        "job_ids": job_ids,
        "types": ["flow_x"] * len(job_ids),
        "attempts": [1] * len(job_ids),
        "lease_tokens": [uuid.uuid4() for _ in job_ids],
        "leases": [60.0] * len(job_ids),
        "published_ats": [None] * len(job_ids),
        "published_bys": [None] * len(job_ids),
    }


@pytest.fixture
def locked(monkeypatch: pytest.MonkeyPatch) -> list[list[uuid.UUID]]:
    """The job ids of every gate lock the claims ran (JOB_GATES_LOCK's parameter)."""
    calls: list[list[uuid.UUID]] = []
    after = jobcore_db.fetch_all_after
    beside = jobcore_db.fetch_all_beside

    async def spy_after(conn: Any, first: Any, statement: Any) -> Any:
        calls.append(list(first.params["job_ids"]))
        return await after(conn, first, statement)

    async def spy_beside(conn: Any, first: Any, statement: Any, alone: Any) -> Any:
        calls.append(list(first.params["job_ids"]))
        return await beside(conn, first, statement, alone)

    monkeypatch.setattr(store_jobs, "fetch_all_after", spy_after)
    monkeypatch.setattr(store_jobs, "fetch_all_beside", spy_beside)
    return calls


async def test_jobs_without_keys_are_claimed_with_no_gate_lock(
    db: Database, topology: Topology, locked: list[list[uuid.UUID]]
) -> None:
    """Unless the caller expects keyed jobs, a batch of gate-less ones is one statement."""
    job_ids = [await job(db) for _ in range(3)]
    claim = params(topology, job_ids)
    async with db.connection() as conn:
        rows = await job_store.claim(conn, claim)
    assert {row["message_id"]: row["id"] for row in rows} == dict(
        zip(claim["message_ids"], job_ids, strict=True)
    )
    assert all(row["fresh"] for row in rows)
    assert locked == []
    assert await run(db, "SELECT key FROM job_gates") == []
    inbox = await run(db, "SELECT count(*) AS n FROM inbox")
    assert inbox[0]["n"] == 3


@pytest.mark.parametrize("expected", [False, True], ids=["found", "expected"])
async def test_keyed_jobs_of_a_batch_still_lock_and_keep_their_limits(
    db: Database, topology: Topology, locked: list[list[uuid.UUID]], expected: bool
) -> None:
    """Keyed jobs found by the claim of the gate-less ones (a second round trip), or
    expected by the caller (one round trip, the gate lock beside that claim)."""
    await job(db, "running", concurrency_key=KEY, concurrency_limit=1, attempts=1)
    free = await job(db)
    limited = await job(db, concurrency_key=KEY, concurrency_limit=1)
    rated = [await job(db, rate_key=RATE_KEY, rate_per_second=0.01, rate_burst=1) for _ in range(2)]
    claim = params(topology, [free, limited, *rated])
    async with db.connection() as conn:
        rows = await job_store.claim(conn, claim, keyed=expected)
    job_of = dict(zip(claim["message_ids"], claim["job_ids"], strict=True))
    by_job = {job_of[row["message_id"]]: row for row in rows}
    assert by_job[free]["id"] == free
    assert (by_job[limited]["id"], by_job[limited]["held_reason"]) == (None, "concurrency")
    # Burst 1: the first of the rate key's jobs starts, the second waits.
    assert [by_job[r]["held_reason"] for r in rated] == [None, "rate_limit"]
    assert all(row["fresh"] for row in rows)
    # One gate lock, over the keyed jobs (or, expected, over the batch: it locks only keys).
    assert locked == [claim["job_ids"] if expected else [limited, *rated]]
    keys = {row["key"] for row in await run(db, "SELECT key FROM job_gates")}
    assert keys == {KEY, RATE_KEY}


@pytest.mark.parametrize("expected", [False, True], ids=["found", "expected"])
async def test_racing_mixed_batches_keep_the_concurrency_limit(
    db: Database, topology: Topology, expected: bool
) -> None:
    limit = 2
    keyed = [await job(db, concurrency_key=KEY, concurrency_limit=limit) for _ in range(16)]
    free = [await job(db) for _ in range(16)]
    batches = [[*keyed[i : i + 2], *free[i : i + 2]] for i in range(0, 16, 2)]

    async def claim(job_ids: list[uuid.UUID]) -> list[Any]:
        async with db.connection() as conn:
            return await job_store.claim(conn, params(topology, job_ids), keyed=expected)

    answers = await asyncio.gather(*(claim(batch) for batch in batches))
    assert sum(len(rows) for rows in answers) == 32
    running = await run(
        db,
        "SELECT concurrency_key IS NOT NULL AS keyed, count(*) AS n FROM jobs"
        " WHERE status = 'running' GROUP BY 1",
    )
    counts = {row["keyed"]: row["n"] for row in running}
    assert counts == {True: limit, False: 16}
