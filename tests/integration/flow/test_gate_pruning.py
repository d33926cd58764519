"""Idle gate rows (job_gates) go with the pruner (jobcore.database.sql.job_gates): the rows of keys
whose jobs are done, never a row a job still waits on or whose state is still ahead; and a
prune racing the claims never takes a row from under a claim (the rate holds, the
concurrency limit holds, while rows are deleted and written again)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from datetime import timedelta

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all_after
from jobcore.database.sql.inbox import JOBS_CONSUMER
from jobcore.database.sql.jobs.run import JOB_CLAIM_MANY, JOB_GATES_LOCK
from jobcore.kernel.settings import Settings
from jobcore.maintenance.retention import Retention
from tests.support.flow import job, max_overlap, run

pytestmark = pytest.mark.timeout(120)

OLD = "now() - interval '2 days'"  # past the default JOBCORE_GATE_RETENTION (1 day)


async def gate(db: Database, key: str, *, updated: str = OLD, **state: str) -> None:
    columns = ["key", "updated_at", *state]
    values = ["%(key)s", updated, *state.values()]
    await run(
        db,
        f"INSERT INTO job_gates ({', '.join(columns)}) VALUES ({', '.join(values)})",
        {"key": key},
    )


async def test_gates_of_finished_keys_are_pruned_and_gates_in_use_are_not(
    db: Database, settings: Settings
) -> None:
    # Idle: nothing waits on them, their state is all past.
    await gate(db, "concurrency:flow_x:tenant=t:account=done")
    await gate(db, "rate:flow_x:tenant=t:account=done", tat=OLD, released_until=OLD)
    await gate(db, "ordering:t:gone", counter="7")
    await job(db, "succeeded", concurrency_key="concurrency:flow_x:tenant=t:account=done")
    # In use, or state still ahead.
    await gate(db, "concurrency:flow_x:tenant=t:account=running")
    await job(db, "running", concurrency_key="concurrency:flow_x:tenant=t:account=running")
    await gate(db, "concurrency:flow_x:tenant=t:account=held")
    await job(
        db,
        "pending",
        concurrency_key="concurrency:flow_x:tenant=t:account=held",
        held_reason="concurrency",
    )
    await gate(db, "rate:flow_x:tenant=t:account=held", tat=OLD)
    await job(db, "pending", rate_key="rate:flow_x:tenant=t:account=held", held_reason="rate_limit")
    await gate(db, "rate:flow_x:tenant=t:account=ahead", tat="now() + interval '1 hour'")
    await gate(db, "rate:flow_x:tenant=t:account=handed", released_until="now()")
    await gate(db, "concurrency:flow_x:tenant=t:account=recent", updated="now()")
    # An ordering key's row counts its places: kept while any job of the key is kept,
    # a finished one too (its retry takes its place again).
    await gate(db, "ordering:t:kept", counter="3")
    await job(db, "succeeded", ordering_key="kept", ordering_seq=3)
    await gate(db, "ordering:other:done", counter="2")
    await job(db, "failed", ordering_key="done", ordering_seq=2)  # tenant t: not other's

    dry = await Retention(settings, db).count()
    assert dry.tables["job_gates"] == 4
    done = await Retention(settings, db).prune()
    assert done.tables["job_gates"] == 4
    left = {row["key"] for row in await run(db, "SELECT key FROM job_gates")}
    assert left == {
        "concurrency:flow_x:tenant=t:account=running",
        "concurrency:flow_x:tenant=t:account=held",
        "rate:flow_x:tenant=t:account=held",
        "rate:flow_x:tenant=t:account=ahead",
        "rate:flow_x:tenant=t:account=handed",
        "concurrency:flow_x:tenant=t:account=recent",
        "ordering:t:kept",
    }


RATE = 20.0  # starts a second of the raced rate key, burst 1
KEEP = timedelta(milliseconds=20)  # the gate retention while racing: rows go at once
RACE_SECONDS = 30.0


async def claim(db: Database, topology: Topology, job_id: uuid.UUID) -> bool:
    """One claim of ``job_id`` as a worker makes it (lock, then claim, one round trip)."""
    params = {
        "consumer": JOBS_CONSUMER,
        "exchange": topology.jobs_exchange,
        "worker_id": "race",
        "message_ids": [uuid.uuid4()],
        "job_ids": [job_id],
        "types": ["flow_x"],
        "attempts": [1],
        "lease_tokens": [uuid.uuid4()],
        "leases": [60.0],
        "published_ats": [None],
        "published_bys": [None],
    }
    async with db.connection() as conn:
        rows = await fetch_all_after(
            conn, JOB_GATES_LOCK({"job_ids": [job_id]}), JOB_CLAIM_MANY(params)
        )
    return rows[0]["id"] is not None


async def test_a_prune_racing_claims_never_takes_a_row_from_under_them(
    db: Database, settings: Settings, topology: Topology
) -> None:
    rated = [
        await job(
            db,
            "pending",
            rate_key="rate:flow_x:race",
            rate_per_second=RATE,
            rate_burst=1,
            created_at=f"2026-01-01T00:00:{n:02d}Z",
        )
        for n in range(30)
    ]
    limited = [
        await job(db, "pending", concurrency_key="concurrency:flow_x:race", concurrency_limit=1)
        for _ in range(30)
    ]
    racing = settings.model_copy(update={"gate_retention": KEEP})
    deadline = time.monotonic() + RACE_SECONDS
    pruned = 0

    async def claimer(jobs: list[uuid.UUID], finish: bool) -> None:
        waiting = list(jobs)
        while waiting and time.monotonic() < deadline:
            job_id = waiting[0]
            if await claim(db, topology, job_id):
                waiting.pop(0)
                if finish:  # the slot is freed again: the key's row goes idle
                    await run(
                        db,
                        "UPDATE jobs SET status = 'succeeded', finished_at = clock_timestamp() "
                        "WHERE id = %(id)s",
                        {"id": job_id},
                    )
            # Claims at uneven times, so the rows fall idle between them now and then.
            await asyncio.sleep(random.uniform(0, 0.08))  # pacing, not synchronisation

    async def pruner() -> None:
        nonlocal pruned
        while time.monotonic() < deadline and not all(t.done() for t in claimers):
            report = await Retention(racing, db).prune(sweep_files=False)
            pruned += report.tables["job_gates"]
            await asyncio.sleep(0)

    claimers = [asyncio.create_task(claimer(rated[n::2], finish=False)) for n in range(2)] + [
        asyncio.create_task(claimer(limited[n::2], finish=True)) for n in range(2)
    ]
    await asyncio.gather(pruner(), *claimers)

    rows = await run(
        db,
        "SELECT id, rate_key, started_at, finished_at FROM jobs "
        "WHERE status IN ('running', 'succeeded') ORDER BY started_at",
    )
    starts = [r["started_at"] for r in rows if r["rate_key"] is not None]
    runs = [(r["started_at"], r["finished_at"]) for r in rows if r["rate_key"] is None]
    assert len(starts) == len(rated)
    assert len(runs) == len(limited)
    assert pruned > 0  # the rows were deleted (and written again) while the claims ran
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 1 / RATE - 1e-6, sorted(gaps)[:5]
    assert max_overlap(runs) == 1
