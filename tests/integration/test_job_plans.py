"""The statements that reach jobs by id find them through the primary key whatever the
statistics say (jobcore.sql.status_is).

ANALYZE mostly runs while no job is pending or running, so the statistics see none. A
generic plan then reached ``jobs.id = ... AND jobs.status = 'pending'`` through the status
index, and a backlog made every claim read every pending job. Each statement is prepared
here as the pools prepare them (a generic plan), on a table whose statistics see only
finished jobs, and its plan is read.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from jobcore.settings import Settings
from jobcore.sql import Query, native_placeholders
from jobcore.sql.jobs import run

BY_ID = (
    run.JOB_CLAIM_UNGATED,
    run.JOB_CLAIM_MANY,
    run.JOB_CLAIM_KEYED,
    run.JOB_GATES_LOCK,
    run.JOB_NOTE_UNDELIVERABLE,
    run.JOB_HEARTBEAT,
    run.JOB_PROGRESS_SET,
    run.JOB_SUCCEED_MANY,
    run.JOB_RETRY,
    run.JOB_END_RUNNING,
    run.JOB_RELEASE,
)
# Indexes that hold jobs by status: reading one of them finds every pending (or running) job.
BY_STATUS = re.compile(
    r"Index (?:Only )?Scan using (jobs_status_created_idx|jobs_lease_expiry_idx) on jobs (\w+)"
)
# The concurrency gate counts a key's running jobs (jobs_concurrency_running_idx holds them
# by key); read through the status index instead, it reads the running jobs, a number the
# workers' concurrency bounds, and only for jobs with a concurrency key.
COUNTS_RUNNING = "running"
FINISHED_JOBS = """
    INSERT INTO jobs (id, tenant, type, queue, status, attempts, started_at, finished_at)
    SELECT gen_random_uuid(), 'plans', 'noop', 'default', 'succeeded', 1, now(), now()
    FROM generate_series(1, 500)
"""


@pytest.fixture
async def analyzed_when_all_finished(settings: Settings) -> str:
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True
    ) as conn:
        await conn.execute(FINISHED_JOBS)
        await conn.execute("ANALYZE jobs")
    return settings.database_url


@pytest.mark.parametrize("query", BY_ID, ids=lambda query: query.name)
async def test_a_job_is_found_by_its_key_when_the_statistics_see_none_pending(
    analyzed_when_all_finished: str, query: Query[Any]
) -> None:
    sql, names = native_placeholders(query.sql)
    async with await psycopg.AsyncConnection.connect(
        analyzed_when_all_finished, autocommit=True
    ) as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")  # as jobcore.db
        await conn.execute(f"PREPARE by_id AS {sql}")
        cur = await conn.execute(f"EXPLAIN EXECUTE by_id({', '.join('NULL' for _ in names)})")
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
    by_status = [m.group(0) for m in BY_STATUS.finditer(plan) if m.group(2) != COUNTS_RUNNING]
    assert by_status == [], plan
