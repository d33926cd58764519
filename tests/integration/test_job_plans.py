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
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
import pytest
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.database.sql import Query, native_placeholders, outbox
from jobcore.database.sql.console import (
    CONSOLE_BACKLOG_BY_QUEUE,
    CONSOLE_JOB_SEARCH_ANY_STATUS,
    CONSOLE_RATES,
)
from jobcore.database.sql.flow_pauses import FLOW_QUEUE_OVERVIEW
from jobcore.database.sql.job_keys import JOB_KEYS_PRUNE_BATCH
from jobcore.database.sql.jobs import edit, reads, recovery, run
from jobcore.database.sql.jobs.enqueue import (
    JOB_INSERT_KEYED,
    JOB_INSERT_MANY,
    JobInsertManyParams,
)
from jobcore.execution.registry import JobType
from jobcore.kernel.keyed import Debounce
from jobcore.kernel.settings import Settings
from jobcore.usecases.enqueue.submit import EnqueueRequest, _job_params
from jobcore.usecases.enqueue.write_one import job_key_params
from tests.support import databases, plans
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
    run.JOB_SNOOZE,
    edit.JOB_LOCK_FOR_EDIT,
    edit.JOB_EDIT,
)
# Indexes that hold jobs by status: reading one of them finds every pending (or running) job.
BY_STATUS = re.compile(
    r"Index (?:Only )?Scan using "
    r"(jobs_status_created_not_running_idx|jobs_lease_expiry_idx) on jobs (\w+)"
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
        "batch_id": None,
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


def _explain(url: str, query: Query[Any], params: dict[str, Any]) -> tuple[int, str]:
    """The pages of its tables and indexes the statement read, run (EXPLAIN ANALYZE) as
    the pools run it (tests.support.plans), and its plan."""
    measured = plans.explain(url, query, params)
    return measured.blocks, measured.text


def _rows(url: str, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def test_the_overdue_gauge_reads_each_queues_first_entry_at_a_million_jobs(
    million_jobs: str,
) -> None:
    """Once a minute, the leader's gauge grouped all 100,000 pending rows (15,860 buffers);
    it reads the first entry of each queue in jobs_due_idx now."""
    blocks, text = _explain(million_jobs, reads.JOB_OVERDUE_BY_QUEUE, {})
    assert "jobs_due_idx" in text, text
    assert "Seq Scan on jobs" not in text, text
    assert "Bitmap" not in text, text
    # Three queues: a few index pages each, whatever the backlog.
    assert blocks <= 100, (blocks, text)

    # Both in one transaction, so both read one now(): apart, a second's rounding could
    # fall between them.
    with psycopg.connect(million_jobs) as conn:
        found = {q: round(s) for q, s in conn.execute(reads.JOB_OVERDUE_BY_QUEUE.sql)}
        grouped = {q: round(s) for q, s in conn.execute(OVERDUE_BY_GROUPING)}
    assert set(found) == {"default", "reports", "emails"}
    assert found == grouped


@pytest.mark.parametrize("depth", [0, MILLION // 2], ids=["first page", "half-way down"])
def test_the_console_list_across_tenants_reads_a_page_per_status_at_a_million_jobs(
    million_jobs: str, depth: int
) -> None:
    """With no tenant and no status, the list was a scan of the whole table and a sort
    (420-441 ms a page); it merges the newest page of each status from
    jobs_status_created_not_running_idx now, at any depth."""
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
    blocks, text = _explain(million_jobs, CONSOLE_JOB_SEARCH_ANY_STATUS, params)
    assert "Seq Scan on jobs" not in text, text
    # The four statuses that pile up, newest first from the status index (running jobs,
    # as many as the workers run at most, may come from the lease index).
    assert text.count("Index Scan Backward using jobs_status_created_not_running_idx") >= 4, text
    # Five statuses, at most a page of rows from each: bounded, not the table's 15,000 pages.
    assert blocks <= 5 * PAGE, (blocks, text)

    listed = [row[0] for row in _rows(million_jobs, CONSOLE_JOB_SEARCH_ANY_STATUS.sql, params)]
    assert listed == [row[0] for row in _rows(million_jobs, NEWEST_BY_SORTING, params)]
    assert len(listed) == PAGE


def test_a_tenants_pages_read_the_ascending_tenant_index_backwards_at_a_million_jobs(
    million_jobs: str,
) -> None:
    """jobs_tenant_created_idx is ascending (migration 0043, so that a tenant's new jobs
    fill its pages): newest first is the index read backwards, the keyset position an
    index condition, no sort, a page's worth of buffers; the second page starts where
    the first ended."""
    params: dict[str, Any] = {
        "tenant": "t1",
        "entity_id": None,
        "after_created_at": None,
        "after_id": None,
        "status": None,
        "type": None,
        "limit": PAGE,
    }
    for page in range(2):
        blocks, text = _explain(million_jobs, reads.JOB_LIST, params)
        assert "Index Scan Backward using jobs_tenant_created_idx" in text, text
        assert "Sort" not in text, text
        assert blocks <= 2 * PAGE, (page, blocks, text)
        rows = _rows(
            million_jobs,
            "SELECT created_at, id FROM jobs WHERE tenant = %(tenant)s"
            " AND (created_at, id) < (coalesce(%(after_created_at)s::timestamptz, 'infinity'),"
            " coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))"
            " ORDER BY created_at DESC, id DESC LIMIT %(limit)s",
            params,
        )
        assert len(rows) == PAGE
        params["after_created_at"], params["after_id"] = rows[-1]


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
    blocks, text = _explain(million_jobs, reads.JOB_LIST_FOR_ENTITY, params)
    assert "jobs_entity_created_idx" in text, text
    assert blocks <= 10, (blocks, text)
    [(entity, tenant)] = _rows(
        million_jobs,
        "SELECT pg_relation_size('jobs_entity_created_idx'),"
        " pg_relation_size('jobs_tenant_created_idx')",
    )
    assert entity * 100 < tenant, (entity, tenant)


# --- the job's own control: a snooze and an edit, at a million jobs ----------------------

# One job in ten of the million has a message still in the outbox (100,000 rows, a tenth
# of them the pending jobs'), for the edit's look for the job's unpublished message.
OUTBOX_ROWS = """
    INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id, tenant,
                        available_at)
    SELECT gen_random_uuid(), 'jobcore.jobs', 'default', 'noop', '\\x7b7d'::bytea,
           ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 't', now()
    FROM generate_series(10, %(n)s, 10) AS g
"""


def _job_id(g: int) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-4000-8000-{g:012x}")


def _explain_write(
    url: str, query: Query[Any], params: dict[str, Any], *, setup: list[tuple[str, Any]]
) -> tuple[int, str, list[Any]]:
    """A writing statement's pages read and plan (tests.support.plans) after ``setup``, in
    a transaction that rolls back: the shared million stays as it was. Also the
    statement's answer (its rows, from a second run after the first rolled back)."""
    measured = plans.explain(url, query, params, setup=setup)
    with psycopg.connect(url) as conn:
        try:
            for statement, args in setup:
                conn.execute(statement, args)
            answer = conn.execute(query.sql, params).fetchall()
        finally:
            conn.rollback()
    return measured.blocks, measured.text, answer


def test_a_snooze_writes_its_job_event_and_message_by_key_at_a_million_jobs(
    million_jobs: str,
) -> None:
    job_id, token = _job_id(500_000), uuid.uuid4()
    params = {
        "id": job_id,
        "lease_token": token,
        "delay": 60.0,
        "max_snoozes": 100,
        "cap_error": "capped",
        "channel": "jobcore_outbox",
        "message_id": uuid.uuid4(),
        "exchange": "jobcore.jobs",
        "routing_key": "default",
        "message_type": "noop",
        "headers": Jsonb({}),
        "body": b"{}",
        "webhook_max_attempts": 8,
        "webhook_exchange": "jobcore.jobs",
        "webhook_routing_key": "webhooks",
        "webhook_outbox_channel": "jobcore_outbox",
    }
    running = (
        "UPDATE jobs SET status = 'running', attempts = 1, lease_token = %s WHERE id = %s",
        (token, job_id),
    )
    blocks, text, answer = _explain_write(million_jobs, run.JOB_SNOOZE, params, setup=[running])
    assert "Seq Scan on jobs" not in text, text
    assert "jobs_pkey" in text, text
    assert [(row[0], row[1]) for row in answer] == [(job_id, "pending")]
    # What it reads is the job's row and its index entries, as the release it is modelled on
    # (a status change updates every index of jobs: a couple of hundred buffers, whatever
    # the table's 15,000 pages).
    released, _, _ = _explain_write(
        million_jobs, run.JOB_RELEASE, {**params, "error": None}, setup=[running]
    )
    assert blocks <= released + 50, (blocks, released, text)
    assert blocks <= 500, (blocks, text)


def test_an_edit_locks_and_changes_its_job_and_its_message_by_key_at_a_million_jobs(
    million_jobs: str,
) -> None:
    job_id = _job_id(500_000)  # pending, and one of the jobs with an outbox row
    outbox = (OUTBOX_ROWS, {"n": MILLION})
    analyzed = ("ANALYZE outbox", None)
    lock_blocks, lock_text, [locked] = _explain_write(
        million_jobs, edit.JOB_LOCK_FOR_EDIT, {"id": job_id, "tenant": None}, setup=[]
    )
    assert "jobs_pkey" in lock_text, lock_text
    assert lock_blocks <= 10, (lock_blocks, lock_text)
    params = {
        "id": job_id,
        "version": locked[6],
        "payload": Jsonb({"changed": True}),
        "priority": 2,
        "run_at": datetime.now(UTC) + timedelta(hours=1),
        "fields": ["run_at", "priority", "payload"],
        "actor": "plans",
        "channel": "jobcore_outbox",
        "message_id": uuid.uuid4(),
        "exchange": "jobcore.jobs",
        "routing_key": "default",
        "message_type": "noop",
        "headers": Jsonb({}),
        "body": b"{}",
    }
    blocks, text, answer = _explain_write(
        million_jobs, edit.JOB_EDIT, params, setup=[outbox, analyzed]
    )
    assert "Seq Scan" not in text, text
    assert "jobs_pkey" in text, text
    assert "outbox_job_idx" in text, text
    assert blocks <= 150, (blocks, text)
    # The job's one unpublished message moved; none was added.
    [(edited_id, _version, _due, moved, superseded, _notified)] = answer
    assert (edited_id, moved, superseded) == (job_id, 1, 0)


# --- debounce and throttle keys at a million jobs ----------------------------------------

# Keys of other accounts, each naming a job whose first message is still in the outbox.
OTHER_KEYS = 100_000
OTHER_KEYS_SQL = """
    WITH keyed AS (
        INSERT INTO jobs (id, tenant, type, queue, status, debounce_key, debounce_count)
        SELECT gen_random_uuid(), 't' || (g %% 100), 'digest', 'default', 'pending',
               'debounce:digest:tenant=t' || (g %% 100) || ':account=' || g, 1
        FROM generate_series(1, %(n)s) AS g
        RETURNING id, tenant, debounce_key
    ), message AS (
        INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id,
                            tenant, available_at)
        SELECT gen_random_uuid(), 'jobcore.jobs', 'default', 'digest', '\\x7b7d', id, tenant,
               now() + interval '1 minute'
        FROM keyed
        RETURNING message_id, job_id
    )
    INSERT INTO job_keys (key, kind, tenant, job_id, message_id, first_at, last_at, expires_at)
    SELECT keyed.debounce_key, 'debounce', keyed.tenant, keyed.id, message.message_id,
           now(), now(), now() - interval '2 days'
    FROM keyed JOIN message ON message.job_id = keyed.id
"""


class Change(BaseModel):
    account: str
    n: int


def _keyed_enqueue(settings: Settings, account: str, n: int) -> dict[str, Any]:
    """JOB_INSERT_KEYED's parameters for an enqueue of a debounced type, as the enqueue
    use case makes them."""

    async def never(ctx: Any) -> None:  # pragma: no cover - never run
        return None

    kind = JobType(
        name="digest",
        queue="default",
        payload_model=Change,
        handler=never,
        debounce=Debounce(30.0, per="account", payloads="all"),
    )
    request = EnqueueRequest(tenant="t1", job_type=kind, payload=Change(account=account, n=n))
    params, _ = _job_params(
        Topology.from_settings(settings),
        request,
        quotas=settings.quota_defaults,
        payload_store=None,
        inline_payload_max_bytes=None,
        trace={},
    )
    key = job_key_params(kind, tenant="t1", payload=request.document)
    assert key is not None
    return {**params, **key}


def test_a_debounced_enqueue_joins_its_key_in_a_few_pages_at_a_million_jobs(
    million_jobs: str, settings: Settings
) -> None:
    """The keyed enqueue (JOB_INSERT_KEYED and the key's function) reaches the key's row,
    its job and its message by their keys, whatever the number of jobs and keys: the pages
    of its tables it reads (the function's statements' included) stay about a hundred."""
    sql, names = native_placeholders(JOB_INSERT_KEYED.sql)
    with psycopg.connect(million_jobs, cursor_factory=psycopg.ClientCursor) as conn:
        cur = conn.cursor()

        def literals(params: dict[str, Any]) -> str:
            return ", ".join(cur.mogrify("%s", (params[name],)) for name in names)

        conn.execute(OTHER_KEYS_SQL, {"n": OTHER_KEYS})
        conn.execute("ANALYZE job_keys")
        conn.execute("ANALYZE outbox")
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as jobcore.database.gateway
        conn.execute(f"PREPARE keyed AS {sql}")
        first = conn.execute(f"EXECUTE keyed({literals(_keyed_enqueue(settings, 'x', 0))})")
        opened = first.fetchone()
        measured = plans.explain_in(
            conn, f"EXECUTE keyed({literals(_keyed_enqueue(settings, 'x', 1))})"
        )
        joined = conn.execute(
            "SELECT debounce_count FROM jobs WHERE debounce_key LIKE '%%account=x'"
        ).fetchall()
        conn.rollback()
    assert opened is not None
    assert joined == [(2,)]  # the second enqueue joined the first's job
    # About 95 pages here: the key's row, its message and the job by their keys, and the
    # job's new row version (a join moves its due time, which jobs_due_idx holds, so each
    # of the jobs indexes gets an entry, three or four levels deep at this size). A scan of
    # the 100,000 keys or their messages would read 1,819 more.
    assert measured.blocks <= 300, (measured.blocks, measured.text)


def test_the_key_prune_reads_only_expired_keys_at_a_million_jobs(
    million_jobs: str,
) -> None:
    """The pruner's batch of spent keys finds them through job_keys_expires_at_idx and
    each key's message through its job's entries in outbox_job_idx (message ids have no
    index of their own since migration 0042): a batch of keys whose messages still wait
    deletes nothing and reads a bounded number of pages."""
    sql, names = native_placeholders(JOB_KEYS_PRUNE_BATCH.sql)
    with psycopg.connect(million_jobs, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute(OTHER_KEYS_SQL, {"n": OTHER_KEYS})
        # A thousand keys whose messages are published: spent.
        conn.execute(
            "DELETE FROM outbox WHERE message_id IN "
            "(SELECT message_id FROM job_keys ORDER BY key LIMIT 1000)"
        )
        conn.execute(
            "UPDATE job_keys SET expires_at = now() - interval '3 days' WHERE NOT EXISTS"
            " (SELECT 1 FROM outbox WHERE outbox.message_id = job_keys.message_id)"
        )
        conn.execute("ANALYZE job_keys")
        conn.execute("ANALYZE outbox")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE pruned AS {sql}")
        params = {"keep": 86400.0 * 2.5, "limit": 500}
        cur = conn.cursor()
        values = ", ".join(cur.mogrify("%s", (params[name],)) for name in names)
        measured = plans.explain_in(conn, f"EXECUTE pruned({values})")
        left = conn.execute("SELECT count(*) FROM job_keys").fetchone()
        conn.rollback()
    text = measured.text
    assert "job_keys_expires_at_idx" in text, text
    assert "outbox_job_idx" in text, text
    assert "Seq Scan on outbox" not in text, text
    assert left == (OTHER_KEYS - 500,)
    # 500 keys deleted, each an index entry, a probe of the outbox's job index, its
    # heap page and its delete (about 11 pages a key here): bounded by the batch, not by
    # the 100,000 keys.
    assert measured.blocks <= 20 * 500, (measured.blocks, text)


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
    blocks, text = _explain(million_outbox, outbox.OUTBOX_OLDEST_LIVE, {"window": window})
    assert "outbox_due_idx" in text, text
    assert re.search(r"Index Cond: .*available_at >= \(now\(\) - make_interval", text), text
    assert blocks <= 10, (blocks, text)
    [(seconds,)] = _rows(million_outbox, outbox.OUTBOX_OLDEST_LIVE.sql, {"window": window})
    assert window - MARK_WINDOW <= seconds <= window


def test_the_bounded_few_claim_reads_its_window_not_the_backlog_at_a_million_rows(
    million_outbox: str,
) -> None:
    """Bounded by the mark, the few claim reads the window's rows (300 here, more than
    a batch: it answers that they do not fit) whatever lies below it."""
    params = {"limit": 100, "window": _window_over_the_newest(million_outbox)}
    blocks, text = _explain(million_outbox, outbox.OUTBOX_CLAIM_FEW, params)
    assert "outbox_due_idx" in text, text
    assert re.search(r"Index Cond: .*available_at >= \(now\(\) - make_interval", text), text
    assert blocks <= 100, (blocks, text)


def test_the_relays_look_for_writers_reads_no_table(million_outbox: str) -> None:
    blocks, text = _explain(million_outbox, outbox.OUTBOX_OLDEST_WRITER, {})
    assert not re.search(r"Scan\b.* on (jobcore\.)?outbox\b", text), text
    assert blocks <= 20, (blocks, text)


# What the workers run meanwhile: statistics that see running jobs (with none, a generic
# plan may read the status index's running entries, the dead ones behind a pin too).
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
    params: dict[str, Any] = {"limit": 100, "window": 6.0}
    setup = [(RUNNING_JOBS, None), ("ANALYZE jobs", None)]
    blocks, text, _ = _explain_write(million_jobs, query, params, setup=setup)
    assert "jobs_lease_expiry_idx" in text, text
    assert re.search(r"Index Cond: .*lease_expires_at >= \(now\(\) - make_interval", text), text
    assert blocks <= 10, (blocks, text)


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
    blocks, text = _explain(
        million_outbox, query, {**params, "window": _window_over_the_newest(million_outbox)}
    )
    assert "outbox_due_idx" in text, text
    assert re.search(r"Index Cond: .*available_at >= \(now\(\) - make_interval", text), text
    assert blocks <= 10, (blocks, text)


# --- what migration 0042 dropped: its statements' new ways, at a million jobs ---------------

# Each index of the two tables every job writes, and why it is there. A job's row versions
# (pending, running, finished) each enter every index of jobs whose predicate they match,
# and its outbox row every index of the outbox: an entry is WAL, index bytes and a dead
# entry for VACUUM (issue 49). Migration 0042 dropped outbox_message_id_key (an entry per
# message, at a random place, for a row deleted milliseconds later: the statements that
# named a message by its id alone name its job now) and made the status index leave the
# running jobs out (the claim's row version writes it nothing).
LEAN_INDEXES = {
    "jobs": {
        "jobs_pkey": None,
        "jobs_tenant_created_idx": None,
        "jobs_status_created_not_running_idx": "(status <> 'running'::text)",
        "jobs_due_idx": "((status = 'pending'::text) AND (held_reason IS NULL))",
        "jobs_lease_expiry_idx": "(status = 'running'::text)",
        "jobs_finished_idx": (
            "(status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text]))"
        ),
        "jobs_batch_idx": "(batch_id IS NOT NULL)",
        "jobs_concurrency_running_idx": (
            "((status = 'running'::text) AND (concurrency_key IS NOT NULL))"
        ),
        "jobs_entity_created_idx": "(entity_id IS NOT NULL)",
        "jobs_held_concurrency_idx": (
            "((status = 'pending'::text) AND (held_reason = 'concurrency'::text))"
        ),
        "jobs_held_idx": "((status = 'pending'::text) AND (held_reason IS NOT NULL))",
        "jobs_held_ordering_idx": (
            "((status = 'pending'::text) AND (held_reason = 'ordering'::text))"
        ),
        "jobs_held_rate_idx": "((status = 'pending'::text) AND (held_reason = 'rate_limit'::text))",
        "jobs_idempotency_uidx": "(idempotency_key IS NOT NULL)",
        "jobs_ordering_blocking_idx": (
            "((ordering_key IS NOT NULL) AND ((status = ANY (ARRAY['pending'::text, "
            "'running'::text])) OR ((status = 'failed'::text) AND ordering_blocks)))"
        ),
        "jobs_ordering_idx": "(ordering_key IS NOT NULL)",
        "jobs_unique_uidx": (
            "((unique_key IS NOT NULL) AND (status = ANY (ARRAY['pending'::text, "
            "'running'::text])))"
        ),
        "jobs_workflow_idx": "(workflow_id IS NOT NULL)",
    },
    "outbox": {
        "outbox_pkey": None,
        "outbox_job_idx": None,
        "outbox_due_idx": "(quarantined_at IS NULL)",
        "outbox_fair_due_idx": "(quarantined_at IS NULL)",
        "outbox_ready_lanes_due_idx": "((quarantined_at IS NULL) AND (available_at <= created_at))",
        "outbox_later_due_idx": "((quarantined_at IS NULL) AND (available_at > created_at))",
        "outbox_quarantined_job_idx": "(quarantined_at IS NOT NULL)",
        "outbox_quarantined_message_idx": "(quarantined_at IS NOT NULL)",
    },
}
INDEX_PREDICATES = """
    SELECT c.relname, pg_get_expr(i.indpred, i.indrelid)
    FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
    WHERE i.indrelid = to_regclass(%(table)s)
"""


@pytest.mark.parametrize("table", sorted(LEAN_INDEXES))
def test_the_hot_tables_keep_only_the_indexes_a_statement_reads(
    million_jobs: str, table: str
) -> None:
    """A new index of jobs or outbox costs every job (a non-partial one, an entry per row
    version): it comes with the statement that reads it and a change here. Of an outbox
    row, five indexes take an entry on the happy path (the primary key, outbox_job_idx and
    the three due indexes of unquarantined rows written due); of a job's three versions,
    jobs_pkey and jobs_tenant_created_idx each, the status index the pending and the
    finished one, and each version the one partial index of its status."""
    found = dict(_rows(million_jobs, INDEX_PREDICATES, {"table": table}))
    assert found == LEAN_INDEXES[table]


def test_the_open_counts_per_queue_read_running_jobs_from_the_lease_index_at_a_million_jobs(
    million_jobs: str,
) -> None:
    """The status index leaves running jobs out (migration 0042): the counts of open jobs
    per queue read them from jobs_lease_expiry_idx (the pending ones as before, from the
    status index or, 100,000 of them spread over the table here, the table), and count
    what the single grouping over both statuses counted. (In a
    transaction rolled back: the module's database stays as its fixture made it.)"""
    grouped = """
        SELECT queue, count(*) FILTER (WHERE status = 'pending'),
               count(*) FILTER (WHERE status = 'running')
        FROM jobs WHERE status IN ('pending', 'running') GROUP BY queue ORDER BY queue
    """
    with psycopg.connect(million_jobs) as conn:
        try:
            conn.execute(RUNNING_JOBS)
            conn.execute("ANALYZE jobs")
            expected = conn.execute(grouped).fetchall()
            for query in (
                reads.JOB_COUNT_OPEN_BY_QUEUE,
                CONSOLE_BACKLOG_BY_QUEUE,
                FLOW_QUEUE_OVERVIEW,
            ):
                text = "\n".join(
                    line for (line,) in conn.execute(f"EXPLAIN (COSTS OFF) {query.sql}")
                )
                assert "jobs_lease_expiry_idx" in text, (query.name, text)
                answer = conn.execute(query.sql).fetchall()
                counts = sorted((row[0], row[1], row[2]) for row in answer)
                assert counts == expected, (query.name, counts, expected)
        finally:
            conn.rollback()
    assert ("default", MILLION // 30, 2000) in expected


def test_the_console_rates_read_the_window_from_the_status_and_lease_indexes_at_a_million_jobs(
    million_jobs: str,
) -> None:
    _blocks, text = _explain(million_jobs, CONSOLE_RATES, {"minutes": 5})
    assert "jobs_status_created_not_running_idx" in text, text
    assert "jobs_lease_expiry_idx" in text, text
    # In one transaction, so both read the same now(): run apart, a minute that turned in
    # between moved the window by a minute of the fixture's jobs.
    with psycopg.connect(million_jobs) as conn:
        rates = conn.execute(CONSOLE_RATES.sql, {"minutes": 5}).fetchall()
        row = conn.execute(
            "SELECT count(*) FROM jobs"
            " WHERE created_at >= date_trunc('minute', now()) - interval '4 minutes'"
        ).fetchone()
        conn.rollback()
    assert row is not None
    assert sum(rate[1] for rate in rates) == row[0]


def test_an_outcomes_retry_finds_its_doing_by_key_at_a_million_jobs(
    million_jobs: str,
) -> None:
    """JOB_OUTCOME_WRITTEN reads the job by its key (the lease token an outcome leaves),
    and the next claim's record of the outcome's message by the inbox's key, among
    100,000 inbox rows."""
    job_id, token, message_id = _job_id(500_000), uuid.uuid4(), uuid.uuid4()
    inbox = (
        "INSERT INTO inbox (consumer, message_id)"
        " SELECT 'jobs', gen_random_uuid() FROM generate_series(1, 100000)",
        None,
    )
    received = ("INSERT INTO inbox (consumer, message_id) VALUES ('jobs', %s)", (message_id,))
    setup = [inbox, ("ANALYZE inbox", None), received]
    params = {"id": job_id, "lease_token": token, "consumer": "jobs", "message_id": message_id}
    blocks, text, answer = _explain_write(
        million_jobs, run.JOB_OUTCOME_WRITTEN, params, setup=setup
    )
    assert "inbox_pkey" in text, text
    assert "Seq Scan" not in text, text
    assert blocks <= 20, (blocks, text)
    assert answer == [("pending",)]
    # Another message is no sign of this attempt's outcome; the token left on the row is.
    other = {**params, "message_id": uuid.uuid4()}
    _, _, lost = _explain_write(million_jobs, run.JOB_OUTCOME_WRITTEN, other, setup=setup)
    assert lost == [(None,)]
    for status, said in (("pending", "pending"), ("succeeded", "succeeded")):
        left = (
            "UPDATE jobs SET status = %s, lease_token = %s WHERE id = %s",
            (status, token, job_id),
        )
        _, _, found = _explain_write(
            million_jobs, run.JOB_OUTCOME_WRITTEN, other, setup=[*setup, left]
        )
        assert found == [(said,)], status


def test_a_workers_claim_from_the_outbox_skips_a_backlog_at_a_million_jobs(
    million_jobs: str,
) -> None:
    """Direct pickup's claim (JOB_CLAIM_FROM_OUTBOX) locks the rows due in its last
    second, a short range of outbox_due_idx, not the 100,000 rows a broker outage left,
    which are the relays' to publish; its jobs are then probed by primary key."""
    backlog = (
        "INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id,"
        " available_at) SELECT gen_random_uuid(), 'jobcore.jobs', 'default', 'noop',"
        " '\\x7b7d', gen_random_uuid(), now() - interval '1 hour'"
        " FROM generate_series(1, 100000)",
        None,
    )
    fresh = (
        "INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id)"
        " SELECT g, 'jobcore.jobs', 'default', 'noop',"
        " convert_to(json_build_object('v', 1, 'job_id', g, 'attempt', 1, 'type', 'noop')"
        "::text, 'UTF8'), g FROM (SELECT gen_random_uuid() AS g FROM generate_series(1, 3)) AS s",
        None,
    )
    setup = [backlog, ("ANALYZE outbox", None), fresh]
    params = {
        "consumer": "jobs",
        "exchange": "jobcore.jobs",
        "worker_id": "w",
        "queues": ["default"],
        "types": ["noop"],
        "leases": [30.0],
        "lease_tokens": [uuid.uuid4() for _ in range(16)],
        "limit": 16,
        "window": 1.0,
    }
    blocks, text, answer = _explain_write(
        million_jobs, run.JOB_CLAIM_FROM_OUTBOX, params, setup=setup
    )
    assert "outbox_due_idx" in text, text
    assert "Seq Scan on outbox" not in text, text
    # The three rows taken (their jobs are not in the table: recorded, claiming nothing).
    assert len(answer) == 3
    # 72 pages measured (each row's job and inbox probes, the outbox locks and deletes);
    # a look through the backlog would read its 100,000 rows' thousand-odd pages.
    assert blocks <= 150, (blocks, text)


@pytest.mark.parametrize("query", [outbox.OUTBOX_REQUEUE, outbox.OUTBOX_DISCARD], ids=str)
def test_an_operator_names_a_quarantined_row_by_its_message_id_at_a_million_jobs(
    million_jobs: str, query: Query[Any]
) -> None:
    """`jobcore outbox requeue|discard <message id>` reads outbox_quarantined_message_idx,
    which quarantined rows alone enter, not the 100,000 rows waiting."""
    message_id = uuid.uuid4()
    quarantined = (
        "INSERT INTO outbox (message_id, exchange, routing_key, message_type, body,"
        " quarantined_at) VALUES (%s, 'jobcore.webhooks', 'webhooks', 'webhook',"
        " '\\x7b7d', now())",
        (message_id,),
    )
    others = (
        "UPDATE outbox SET quarantined_at = now() WHERE id IN"
        " (SELECT id FROM outbox ORDER BY id LIMIT 50)",
        None,
    )
    setup = [(OUTBOX_ROWS, {"n": MILLION}), others, quarantined, ("ANALYZE outbox", None)]
    params = {"id": None, "message_id": message_id, "channel": "jobcore_outbox"}
    blocks, text, answer = _explain_write(million_jobs, query, params, setup=setup)
    assert "Seq Scan on outbox" not in text, text
    # A probe of it (or, the quarantined rows being few, a read of all of them).
    assert re.search(r"outbox_quarantined_\w+_idx", text), text
    assert blocks <= 50, (blocks, text)
    assert [row[1] for row in answer] == [message_id]
