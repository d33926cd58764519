"""The statements that reach jobs by id find them through the primary key whatever the
statistics say (jobcore.database.sql.status_is); and, at 1,000,000 jobs, the overdue gauge and the
console's list across tenants read an index's few pages, not the table.

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
from collections.abc import Iterator
from datetime import datetime
from typing import Any, cast

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobcore.database.sql import Query, native_placeholders, outbox
from jobcore.database.sql.console import CONSOLE_JOB_SEARCH_ANY_STATUS
from jobcore.database.sql.jobs import reads, recovery, run
from jobcore.database.sql.jobs.enqueue import JOB_INSERT_MANY, JobInsertManyParams
from jobcore.kernel.settings import Settings
from tests.support import databases
from tests.support.services import ServiceUrls

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
        await conn.execute(
            "SET plan_cache_mode = force_generic_plan"
        )  # as jobcore.database.gateway
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
        await conn.execute(
            "SET plan_cache_mode = force_generic_plan"
        )  # as jobcore.database.gateway
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


# --- at a million jobs ---------------------------------------------------------------------

MILLION = 1_000_000
# 100 tenants, three queues; one job in ten pending (100,000), of which some wait for a
# retry an hour away and some are held by their ordering key; the rest finished, created
# 10 ms apart. Ids in insertion order (a random uuid costs the fill a third more, and no
# plan here reads jobs by id).
MILLION_JOBS = """
    INSERT INTO jobs (id, tenant, type, queue, status, attempts, created_at, finished_at,
                      next_attempt_at, held_reason, held_since)
    SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
           't' || (g %% 100), 'noop', (ARRAY['default', 'reports', 'emails'])[1 + g %% 3],
           CASE g %% 10 WHEN 0 THEN 'pending' WHEN 1 THEN 'failed' WHEN 2 THEN 'cancelled'
                       ELSE 'succeeded' END,
           1, now() - (%(n)s - g) * interval '10 ms',
           CASE WHEN g %% 10 <> 0 THEN now() - (%(n)s - g) * interval '10 ms' END,
           CASE WHEN g %% 70 = 0 THEN now() + interval '1 hour' END,
           CASE WHEN g %% 110 = 0 THEN 'ordering' END,
           CASE WHEN g %% 110 = 0 THEN now() END
    FROM generate_series(1, %(n)s) AS g
"""
# What each statement replaced, for its answers (the plans below are the statements').
OVERDUE_BY_GROUPING = """
    SELECT queue,
           extract(epoch FROM now() - min(greatest(created_at, next_attempt_at)))::float8
               AS overdue_seconds
    FROM jobs
    WHERE status = 'pending' AND held_reason IS NULL
      AND greatest(created_at, next_attempt_at) <= now()
    GROUP BY queue
"""
NEWEST_BY_SORTING = """
    SELECT id FROM jobs
    WHERE created_at <= coalesce(%(after_created_at)s::timestamptz, 'infinity')
      AND (created_at, id) < (coalesce(%(after_created_at)s::timestamptz, 'infinity'),
                              coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
    ORDER BY created_at DESC, id DESC LIMIT %(limit)s
"""
# A page of the console's list (100 shown, one more asked for).
PAGE = 101


@pytest.fixture(scope="module")
def million_jobs(service_urls: ServiceUrls, template_database: str) -> Iterator[str]:
    """A migrated database holding 1,000,000 jobs, vacuumed and analyzed (as autovacuum
    would leave it), shared by this module's tests, which only read it."""
    name = databases.create_database(service_urls.pg_admin_url, template=template_database)
    url = databases.with_database(service_urls.pg_admin_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(MILLION_JOBS, {"n": MILLION})
            conn.execute("VACUUM ANALYZE jobs")
        yield url
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def _explain(url: str, query: Query[Any], params: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The statement's plan, run (EXPLAIN ANALYZE, BUFFERS) as the pools run it: a generic
    plan, prepared once."""
    sql, names = native_placeholders(query.sql)
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        cur = conn.cursor()
        values = ", ".join(cur.mogrify("%s", (params[name],)) for name in names)
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as jobcore.database.gateway
        conn.execute(f"PREPARE measured AS {sql}")
        execute = f"EXECUTE measured({values})" if names else "EXECUTE measured"
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {execute}").fetchone()
        text = conn.execute(f"EXPLAIN (COSTS OFF) {execute}").fetchall()
    assert row is not None
    return row[0][0]["Plan"], "\n".join(line for (line,) in text)


def _buffers(plan: dict[str, Any]) -> int:
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def _rows(url: str, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def test_the_overdue_gauge_reads_each_queues_first_entry_at_a_million_jobs(
    million_jobs: str,
) -> None:
    """Once a minute, the leader's gauge grouped all 100,000 pending rows (15,860 buffers);
    it reads the first entry of each queue in jobs_due_idx now."""
    plan, text = _explain(million_jobs, reads.JOB_OVERDUE_BY_QUEUE, {})
    assert "jobs_due_idx" in text, text
    assert "Seq Scan on jobs" not in text, text
    assert "Bitmap" not in text, text
    # Three queues: a few index pages each, whatever the backlog.
    assert _buffers(plan) <= 100, (_buffers(plan), text)

    found = {q: round(s) for q, s in _rows(million_jobs, reads.JOB_OVERDUE_BY_QUEUE.sql)}
    grouped = {q: round(s) for q, s in _rows(million_jobs, OVERDUE_BY_GROUPING)}
    assert set(found) == {"default", "reports", "emails"}
    assert found == grouped


@pytest.mark.parametrize("depth", [0, MILLION // 2], ids=["first page", "half-way down"])
def test_the_console_list_across_tenants_reads_a_page_per_status_at_a_million_jobs(
    million_jobs: str, depth: int
) -> None:
    """With no tenant and no status, the list was a scan of the whole table and a sort
    (420-441 ms a page); it merges the newest page of each status from
    jobs_status_created_idx now, at any depth."""
    after: tuple[datetime | None, uuid.UUID | None] = (None, None)
    if depth:
        after = cast(
            tuple[datetime, uuid.UUID],
            _rows(
                million_jobs,
                "SELECT created_at, id FROM jobs ORDER BY created_at DESC, id DESC "
                "OFFSET %(depth)s LIMIT 1",
                {"depth": depth},
            )[0],
        )
    params = {"type": None, "after_created_at": after[0], "after_id": after[1], "limit": PAGE}
    plan, text = _explain(million_jobs, CONSOLE_JOB_SEARCH_ANY_STATUS, params)
    assert "Seq Scan on jobs" not in text, text
    # The four statuses that pile up, newest first from the status index (running jobs,
    # as many as the workers run at most, may come from the lease index).
    assert text.count("Index Scan Backward using jobs_status_created_idx") >= 4, text
    # Five statuses, at most a page of rows from each: bounded, not the table's 15,000 pages.
    assert _buffers(plan) <= 5 * PAGE, (_buffers(plan), text)

    listed = [row[0] for row in _rows(million_jobs, CONSOLE_JOB_SEARCH_ANY_STATUS.sql, params)]
    assert listed == [row[0] for row in _rows(million_jobs, NEWEST_BY_SORTING, params)]
    assert len(listed) == PAGE


def test_an_entitys_page_reads_the_partial_entity_index_that_jobs_without_one_stay_out_of(
    million_jobs: str,
) -> None:
    """jobs_entity_created_idx holds only jobs that name an entity (none of these), so a
    job's status changes write it no entry; the entity listing's generic plan, whose
    `entity_id = $n` implies the index's predicate, still reads it."""
    params = {
        "tenant": "t1",
        "entity_id": "order-1",
        "after_created_at": None,
        "after_id": None,
        "status": None,
        "type": None,
        "limit": PAGE,
    }
    plan, text = _explain(million_jobs, reads.JOB_LIST_FOR_ENTITY, params)
    assert "jobs_entity_created_idx" in text, text
    assert _buffers(plan) <= 10, (_buffers(plan), text)
    [(entity, tenant)] = _rows(
        million_jobs,
        "SELECT pg_relation_size('jobs_entity_created_idx'),"
        " pg_relation_size('jobs_tenant_created_idx')",
    )
    assert entity * 100 < tenant, (entity, tenant)


# --- the low-water marks, at a million rows -------------------------------------------------

# A million due outbox rows (a long broker outage's backlog), 10 ms apart, the newest now.
MILLION_OUTBOX = """
    INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, tenant,
                        available_at, created_at)
    SELECT gen_random_uuid(), 'jobcore.jobs', 'default', 'noop', '\\x7b7d'::bytea,
           't' || (g %% 100), now() - (%(n)s - g) * interval '10 ms',
           now() - (%(n)s - g) * interval '10 ms'
    FROM generate_series(1, %(n)s) AS g
"""
# The relay's window right after a look (services/relay/low_water.py): its slack and period.
MARK_WINDOW = 3.0


@pytest.fixture(scope="module")
def million_outbox(service_urls: ServiceUrls, template_database: str) -> Iterator[str]:
    name = databases.create_database(service_urls.pg_admin_url, template=template_database)
    url = databases.with_database(service_urls.pg_admin_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(MILLION_OUTBOX, {"n": MILLION})
            conn.execute("VACUUM ANALYZE outbox")
        yield url
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def _window_over_the_newest(url: str) -> float:
    """A window that holds the last MARK_WINDOW seconds of the fixture's rows (written a
    while before the test runs)."""
    [(age,)] = _rows(url, "SELECT extract(epoch FROM now() - max(available_at)) FROM outbox")
    return float(age) + MARK_WINDOW


def test_the_relays_look_for_its_mark_reads_from_the_last_mark_at_a_million_rows(
    million_outbox: str,
) -> None:
    """The look's plain read starts its range of outbox_due_idx at the last mark (the
    Index Cond holds both ends) and stops at the first live row."""
    window = _window_over_the_newest(million_outbox)
    plan, text = _explain(million_outbox, outbox.OUTBOX_OLDEST_LIVE, {"window": window})
    assert "outbox_due_idx" in text, text
    assert re.search(r"Index Cond: .*available_at >= \(now\(\) - make_interval", text), text
    assert _buffers(plan) <= 10, (_buffers(plan), text)
    [(seconds,)] = _rows(million_outbox, outbox.OUTBOX_OLDEST_LIVE.sql, {"window": window})
    assert window - MARK_WINDOW <= seconds <= window


def test_the_bounded_few_claim_reads_its_window_not_the_backlog_at_a_million_rows(
    million_outbox: str,
) -> None:
    """Bounded by the mark, the few claim reads the window's rows (300 here, more than
    a batch: it answers that they do not fit) whatever lies below it."""
    params = {"limit": 100, "window": _window_over_the_newest(million_outbox)}
    plan, text = _explain(million_outbox, outbox.OUTBOX_CLAIM_FEW, params)
    assert "outbox_due_idx" in text, text
    assert re.search(r"Index Cond: .*available_at >= \(now\(\) - make_interval", text), text
    assert _buffers(plan) <= 100, (_buffers(plan), text)


def test_the_relays_look_for_writers_reads_no_table(million_outbox: str) -> None:
    plan, text = _explain(million_outbox, outbox.OUTBOX_OLDEST_WRITER, {})
    assert "outbox" not in text.replace("'outbox'::regclass", ""), text
    assert _buffers(plan) <= 20, (_buffers(plan), text)


# What the workers run meanwhile: statistics that see running jobs (with none, a generic
# plan may read jobs_status_created_idx's running entries, the dead ones behind a pin too).
RUNNING_JOBS = """
    INSERT INTO jobs (id, tenant, type, queue, status, attempts, lease_token, lease_expires_at)
    SELECT gen_random_uuid(), 't1', 'noop', 'default', 'running', 1, gen_random_uuid(),
           now() + interval '30 s'
    FROM generate_series(1, 2000)
"""


@pytest.mark.parametrize(
    "query", [recovery.JOB_OLDEST_EXPIRED, recovery.JOB_LOCK_EXPIRED], ids=lambda q: q.name
)
def test_the_reapers_scans_read_the_lease_index_from_the_mark_at_a_million_jobs(
    million_jobs: str, query: Query[Any]
) -> None:
    """Both ends of the range in the Index Cond of jobs_lease_expiry_idx, which holds
    only running jobs: the million finished ones cost nothing. (Run in a transaction
    rolled back: the module's database stays as its fixture made it.)"""
    sql, names = native_placeholders(query.sql)
    params: dict[str, Any] = {"limit": 100, "window": 6.0}
    with psycopg.connect(million_jobs, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute(RUNNING_JOBS)
        conn.execute("ANALYZE jobs")
        values = ", ".join(conn.cursor().mogrify("%s", (params[name],)) for name in names)
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE reaper_scan AS {sql}")
        execute = f"EXECUTE reaper_scan({values})"
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {execute}").fetchone()
        text = "\n".join(line for (line,) in conn.execute(f"EXPLAIN (COSTS OFF) {execute}"))
        conn.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert "jobs_lease_expiry_idx" in text, text
    assert re.search(r"Index Cond: .*lease_expires_at >= \(now\(\) - make_interval", text), text
    assert _buffers(plan) <= 10, (_buffers(plan), text)


@pytest.mark.parametrize(
    ("query", "params"),
    [
        (outbox.OUTBOX_ANY_DUE, {}),
        (outbox.OUTBOX_ANY_OVERDUE, {"seconds": 1.0}),
    ],
    ids=["any_due", "any_overdue"],
)
def test_a_relays_probe_for_due_rows_reads_from_its_mark_at_a_million_rows(
    million_outbox: str, query: Query[Any], params: dict[str, Any]
) -> None:
    plan, text = _explain(
        million_outbox, query, {**params, "window": _window_over_the_newest(million_outbox)}
    )
    assert "outbox_due_idx" in text, text
    assert re.search(r"Index Cond: .*available_at >= \(now\(\) - make_interval", text), text
    assert _buffers(plan) <= 10, (_buffers(plan), text)
