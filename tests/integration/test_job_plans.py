"""The statements that reach jobs by id find them through the primary key whatever the
statistics say (jobcore.sql.status_is).

ANALYZE mostly runs while no job is pending or running, so the statistics see none. A
generic plan then reached ``jobs.id = ... AND jobs.status = 'pending'`` through the status
index, and a backlog made every claim read every pending job. Each statement is prepared
here as the pools prepare them (a generic plan), on a table whose statistics see only
finished jobs, and its plan is read.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, cast

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobcore.settings import Settings
from jobcore.sql import Query, native_placeholders
from jobcore.sql.jobs import run
from jobcore.sql.jobs.enqueue import JOB_INSERT_MANY, JobInsertManyParams

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


# --- the batch enqueue's key probes, on a table that was never analyzed -------------------

# Jobs of the batch's tenant and type already in the table: each holds an idempotency key
# that no item of the batch asks for.
PILED_UP = 3000
BATCH = 4


def _batch(tenant: str, keys: list[str]) -> JobInsertManyParams:
    n = len(keys)
    return {
        "ns": list(range(n)),
        "ids": [uuid.uuid4() for _ in keys],
        "idempotency_keys": list(keys),
        "fingerprints": ["f"] * n,
        "payloads": [Jsonb({}) for _ in keys],
        "entity_ids": [None] * n,
        "max_attempts": [3] * n,
        "run_ats": [None] * n,
        "unique_keys": [None] * n,
        "message_ids": [uuid.uuid4() for _ in keys],
        "bodies": [b"{}"] * n,
        "concurrency_keys": [None] * n,
        "rate_keys": [None] * n,
        "priorities": [0] * n,
        "callback_urls": [None] * n,
        "traceparents": [None] * n,
        "tracestates": [None] * n,
        "headers": [Jsonb({}) for _ in keys],
        "event_details": [Jsonb({}) for _ in keys],
        "tenant": tenant,
        "type": "noop",
        "queue": "default",
        "routing_key": "default",
        "exchange": "jobcore.jobs",
        "channel": "jobcore_outbox",
        "notify": False,
        "key_id": None,
        "concurrency_limit": None,
        "rate_per_second": None,
        "rate_burst": None,
        "ordering_blocks": False,
        "default_rate": 0.0,
        "default_burst": 1,
        "default_max_unfinished": 0,
        "default_max_long_polls": 0,
    }


def _jobs_rows_read(plan: Any) -> int:
    """Rows that the plan's scans of ``jobs`` returned, over all their loops."""
    total = 0
    if plan.get("Relation Name") == "jobs" and "Scan" in plan["Node Type"]:
        total += int(plan["Actual Rows"]) * int(plan["Actual Loops"])
    for child in plan.get("Plans", []):
        total += _jobs_rows_read(child)
    return total


async def test_a_batch_enqueue_looks_up_only_its_own_keys_on_a_table_never_analyzed(
    settings: Settings,
) -> None:
    """A generic plan made on a new database (no statistics) must keep probing the
    idempotency index by each item's key once jobs pile up; a plan that reads the
    tenant's every job per batch made the enqueue rate fall as the table grew."""
    sql, names = native_placeholders(JOB_INSERT_MANY.sql)
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True, cursor_factory=psycopg.AsyncClientCursor
    ) as conn:
        cur = conn.cursor()

        def literals(params: JobInsertManyParams) -> str:
            values = cast(dict[str, Any], params)
            return ", ".join(cur.mogrify("%s", (values[name],)) for name in names)

        await conn.execute("INSERT INTO tenant_usage (tenant) VALUES ('plans')")
        await conn.execute("SET plan_cache_mode = force_generic_plan")  # as jobcore.db
        await conn.execute(f"PREPARE batch AS {sql}")
        # Planned now, while the table holds no job.
        await conn.execute(f"EXECUTE batch({literals(_batch('plans', ['first']))})")
        await conn.execute(
            f"""
            INSERT INTO jobs (id, tenant, type, queue, status, idempotency_key)
            SELECT gen_random_uuid(), 'plans', 'noop', 'default', 'pending', 'k' || i
            FROM generate_series(1, {PILED_UP}) AS i
            """
        )
        keys = [f"new-{i}" for i in range(BATCH)]
        explained = await conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE batch({literals(_batch('plans', keys))})"
        )
        plan = (await explained.fetchone())[0][0]["Plan"]  # type: ignore[index]
        inserted = await conn.execute(
            "SELECT count(*) FROM jobs WHERE idempotency_key = ANY(%s)", (keys,)
        )
        assert (await inserted.fetchone()) == (BATCH,)
    # No item's key is taken: its probes find nothing (the inserts' own RETURNING aside).
    assert _jobs_rows_read(plan) == 0, json.dumps(plan, indent=1)[:6000]
