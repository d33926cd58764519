"""What one round of the gate releaser reads (jobcore.database.sql.jobs.gates.JOB_LOCK_RELEASABLE):
the jobs it can release, not every held job. Held jobs are written straight into the table
(many of them, behind one key); the round's statement runs under EXPLAIN ANALYZE
and the test counts the rows its plan read from `jobs` and the pages it read, at a small and
a large number of held jobs. No timing: rows and pages."""

from __future__ import annotations

from typing import Any

import pytest

from jobcore.database.gateway import Database
from jobcore.database.sql.jobs.gates import JOB_LOCK_RELEASABLE
from jobcore.maintenance.held_jobs import RATE_HORIZON
from tests.support.plans import table_blocks

SMALL, LARGE = 2_000, 20_000
LIMIT = 500
RATE = 10.0

# Held jobs behind one key of each kind, oldest first (created 1 ms apart).
HELD_SQL = {
    "rate_limit": """
        INSERT INTO jobs (id, tenant, type, queue, status, held_reason, held_since,
                          created_at, rate_key, rate_per_second, rate_burst)
        SELECT gen_random_uuid(), 't', 'flow_rated', 'testq', 'pending', 'rate_limit',
               now(), now() - (%(n)s - g) * interval '1 ms', 'rate:hot', %(rate)s, 1
        FROM generate_series(1, %(n)s) AS g
    """,
    "concurrency": """
        INSERT INTO jobs (id, tenant, type, queue, status, held_reason, held_since,
                          created_at, concurrency_key, concurrency_limit)
        SELECT gen_random_uuid(), 't', 'flow_limited', 'testq', 'pending', 'concurrency',
               now(), now() - (%(n)s - g) * interval '1 ms', 'concurrency:hot', 2
        FROM generate_series(1, %(n)s) AS g
    """,
    "ordering": """
        INSERT INTO jobs (id, tenant, type, queue, status, held_reason, held_since,
                          created_at, ordering_key, ordering_seq)
        SELECT gen_random_uuid(), 't', 'flow_ordered', 'testq', 'pending', 'ordering',
               now(), now() - (%(n)s - g) * interval '1 ms', 'hot', g + 1
        FROM generate_series(1, %(n)s) AS g
    """,
}
# What lets some of them go: the rate key's token is due now; one of the concurrency
# key's two slots is taken; the ordering key's first job has succeeded.
GATE_SQL = {
    "rate_limit": "INSERT INTO job_gates (key, tat) VALUES ('rate:hot', now())",
    "concurrency": """
        INSERT INTO jobs (id, tenant, type, queue, status, started_at, concurrency_key,
                          concurrency_limit)
        VALUES (gen_random_uuid(), 't', 'flow_limited', 'testq', 'running', now(),
                'concurrency:hot', 2)
    """,
    "ordering": """
        INSERT INTO jobs (id, tenant, type, queue, status, finished_at, ordering_key,
                          ordering_seq)
        VALUES (gen_random_uuid(), 't', 'flow_ordered', 'testq', 'succeeded', now(), 'hot', 1)
    """,
}
# What a round may release of each: the rate key's starts within the horizon (one now,
# then one every 1/RATE s), the free slot, the key's next job.
RELEASABLE = {"rate_limit": 1 + int(RATE_HORIZON * RATE), "concurrency": 1, "ordering": 1}


def jobs_rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's nodes on `jobs` returned or filtered out, over all their loops."""
    own = 0
    if plan.get("Relation Name") == "jobs":
        loops = plan.get("Actual Loops", 1)
        own = (
            plan.get("Actual Rows", 0)
            + plan.get("Rows Removed by Filter", 0)
            + plan.get("Rows Removed by Index Recheck", 0)
        ) * loops
    return own + sum(jobs_rows_read(child) for child in plan.get("Plans", []))


async def explain_round(db: Database, kind: str, held: int) -> tuple[int, int, int]:
    """Held jobs of ``kind`` behind one key, then one round's statement under EXPLAIN
    ANALYZE (rolled back): rows it read from jobs, pages of the database's own tables and
    indexes it read (tests.support.plans: not the catalog reads other tests' DDL can cause),
    rows it locked."""
    async with db.connection() as conn:
        await conn.execute("TRUNCATE jobs, job_gates CASCADE")
        await conn.execute(HELD_SQL[kind], {"n": held, "rate": RATE})
        await conn.execute(GATE_SQL[kind])
        await conn.execute("ANALYZE jobs")
        async with conn.transaction(force_rollback=True):
            before = await table_blocks(conn)
            cur = await conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + JOB_LOCK_RELEASABLE.sql,
                {"limit": LIMIT, "horizon": RATE_HORIZON},
            )
            row = await cur.fetchone()
            pages = await table_blocks(conn) - before
    assert row is not None
    plan = next(iter(row.values()))[0]["Plan"]
    return jobs_rows_read(plan), pages, plan["Actual Rows"]


@pytest.mark.parametrize("kind", ["rate_limit", "concurrency", "ordering"])
async def test_a_release_round_reads_what_it_can_release_not_every_held_job(
    db: Database, kind: str
) -> None:
    small_rows, small_buffers, small_locked = await explain_round(db, kind, SMALL)
    large_rows, large_buffers, large_locked = await explain_round(db, kind, LARGE)

    assert small_locked == large_locked == RELEASABLE[kind]
    # Ten times the held jobs: no more rows read, a few more index pages at most (a
    # deeper b-tree), never the held jobs themselves.
    assert large_rows <= small_rows, (small_rows, large_rows)
    assert large_rows <= 4 * RELEASABLE[kind] + 20, large_rows
    assert large_buffers <= small_buffers + 10, (small_buffers, large_buffers)
