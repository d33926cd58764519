"""The workflow statements at 1,000,000 jobs: each reads an index's few pages, never a table.

The database holds 900,000 jobs outside any workflow and 10,000 workflows of 10 steps each
(a chain), 9,000 of them finished; vacuumed and analyzed, as autovacuum would leave it.
Each statement is prepared as the pools prepare them (a generic plan). The trigger's
statements are not plannable on their own: a settle and a retry run for real in a
transaction, and ``pg_stat_xact_user_tables`` says which tables they scanned, and how.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobcore.database.sql import Query
from jobcore.database.sql import workflows as sql
from tests.support import databases, plans
from tests.support.services import ServiceUrls

MILLION = 1_000_000
WORKFLOWS = 10_000
STEPS = 10
PLAIN = MILLION - WORKFLOWS * STEPS

FILL = f"""
INSERT INTO jobcore.jobs (id, tenant, type, queue, status, attempts, created_at, finished_at)
SELECT gen_random_uuid(), 't' || (g % 100), 'noop', 'default',
       CASE g % 10 WHEN 0 THEN 'failed' ELSE 'succeeded' END, 1,
       now() - (2000000 - g) * interval '10 ms', now() - (2000000 - g) * interval '10 ms'
FROM generate_series(1, {PLAIN}) AS g;

INSERT INTO jobcore.workflows (id, tenant, name, status, jobs_total, unsettled, open_jobs, exchange,
                       created_at, finished_at, idempotency_key, request_fingerprint)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(w), 12, '0'))::uuid, 't' || (w % 100),
       'w' || w, CASE WHEN w <= {WORKFLOWS - 1000} THEN 'succeeded' ELSE 'running' END,
       {STEPS}, CASE WHEN w <= {WORKFLOWS - 1000} THEN 0 ELSE {STEPS} END,
       CASE WHEN w <= {WORKFLOWS - 1000} THEN 0 ELSE {STEPS} END, 'jobcore.jobs',
       now() - ({WORKFLOWS} - w) * interval '1 s',
       CASE WHEN w <= {WORKFLOWS - 1000} THEN now() - ({WORKFLOWS} - w) * interval '1 s' END,
       CASE WHEN w % 2 = 0 THEN 'key-' || w END, md5(w::text)
FROM generate_series(1, {WORKFLOWS}) AS w;

INSERT INTO jobcore.jobs (id, tenant, type, queue, status, attempts, created_at, finished_at,
                  held_reason, held_since, workflow_id)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(w * 100 + s), 12, '0'))::uuid,
       't' || (w % 100), 'noop', 'default',
       CASE WHEN w <= {WORKFLOWS - 1000} THEN 'succeeded' ELSE 'pending' END, 0,
       now() - ({WORKFLOWS} - w) * interval '1 s',
       CASE WHEN w <= {WORKFLOWS - 1000} THEN now() END,
       CASE WHEN w > {WORKFLOWS - 1000} AND s > 0 THEN 'dependencies' END,
       CASE WHEN w > {WORKFLOWS - 1000} AND s > 0 THEN now() END,
       ('00000000-0000-4000-8000-' || lpad(to_hex(w), 12, '0'))::uuid
FROM generate_series(1, {WORKFLOWS}) AS w, generate_series(0, {STEPS - 1}) AS s;

INSERT INTO jobcore.workflow_jobs (job_id, workflow_id, name, waiting, routing_key)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(w * 100 + s), 12, '0'))::uuid,
       ('00000000-0000-4000-8000-' || lpad(to_hex(w), 12, '0'))::uuid, 's' || s,
       CASE WHEN s = 0 OR w <= {WORKFLOWS - 1000} THEN 0 ELSE 1 END, 'default'
FROM generate_series(1, {WORKFLOWS}) AS w, generate_series(0, {STEPS - 1}) AS s;

INSERT INTO jobcore.workflow_edges (workflow_id, upstream, downstream, policy, state)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(w), 12, '0'))::uuid,
       ('00000000-0000-4000-9000-' || lpad(to_hex(w * 100 + s - 1), 12, '0'))::uuid,
       ('00000000-0000-4000-9000-' || lpad(to_hex(w * 100 + s), 12, '0'))::uuid,
       'on_success', CASE WHEN w <= {WORKFLOWS - 1000} THEN 'satisfied' ELSE 'waiting' END
FROM generate_series(1, {WORKFLOWS}) AS w, generate_series(1, {STEPS - 1}) AS s;
"""


def workflow_id(w: int) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-4000-8000-{w:012x}")


def step_id(w: int, s: int) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-4000-9000-{w * 100 + s:012x}")


@pytest.fixture(scope="module")
def million(service_urls: ServiceUrls, template_database: str) -> Iterator[str]:
    name = databases.create_database(service_urls.pg_admin_url, template=template_database)
    url = databases.with_database(service_urls.pg_admin_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in FILL.split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("VACUUM ANALYZE")
        yield url
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def explain(url: str, query: Query[Any], params: dict[str, Any]) -> tuple[int, str]:
    """The pages of its tables and indexes the statement read, run (and rolled back) as
    the pools run it (tests.support.plans), and its plan."""
    measured = plans.explain(url, query, params)
    return measured.blocks, measured.text


RUNNING = WORKFLOWS  # the newest workflow: running, its first step pending
FINISHED = 5


@pytest.mark.parametrize(
    ("query", "params", "index", "most"),
    [
        (sql.WORKFLOW_GET, {"id": workflow_id(RUNNING), "tenant": "t0"}, "workflows_pkey", 10),
        (sql.WORKFLOW_STEPS, {"id": workflow_id(RUNNING)}, "jobs_workflow_idx", 200),
        (
            sql.WORKFLOW_DEPENDENCY_RESULTS,
            {"job_id": step_id(FINISHED, 5)},
            "workflow_edges_downstream_idx",
            30,
        ),
        (
            sql.WORKFLOW_LIST_FOR_TENANT,
            {"tenant": "t7", "status": None, "limit": 50},
            "workflows_tenant_created_idx",
            200,
        ),
        (
            sql.WORKFLOW_LIST,
            {"status": None, "limit": 50},
            "workflows_created_idx",
            200,
        ),
        (
            sql.WORKFLOW_REQUEST_CANCEL,
            {"id": workflow_id(RUNNING), "tenant": None},
            "workflows_pkey",
            20,
        ),
        (
            sql.WORKFLOW_CANCEL_STEPS,
            {"id": workflow_id(RUNNING - 1), "cancel_channel": "jobcore_cancel"},
            "jobs_workflow_idx",
            2000,
        ),
        (
            sql.WORKFLOW_GET_BY_IDEMPOTENCY_KEY,
            {"tenant": "t0", "idempotency_key": f"key-{RUNNING}"},
            "workflows_idempotency_uidx",
            10,
        ),
        (
            sql.WORKFLOW_STEP_IDS,
            {"id": workflow_id(RUNNING)},
            "workflow_jobs_workflow_id_name_idx",
            20,
        ),
        (
            sql.WORKFLOW_PRUNE_BATCH,
            {"keep": 3600.0, "limit": 10},
            "workflows_finished_idx",
            3000,
        ),
    ],
    ids=lambda value: value.name if isinstance(value, Query) else None,
)
def test_each_statement_reads_an_index_not_a_table(
    million: str, query: Query[Any], params: dict[str, Any], index: str, most: int
) -> None:
    buffers, plan = explain(million, query, params)
    assert index in plan, plan
    assert "Seq Scan on jobs" not in plan, plan
    assert "Seq Scan on workflow" not in plan, plan
    assert buffers <= most, (buffers, plan)


def test_creating_a_workflow_reads_no_table_whole(million: str) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    params = {
        "id": uuid.uuid4(),
        "tenant": "t1",
        "name": "plan",
        "exchange": "jobcore.jobs",
        "key_id": None,
        "channel": "jobcore_outbox",
        "ids": ids,
        "names": ["a", "b", "c"],
        "types": ["noop"] * 3,
        "queues": ["default"] * 3,
        "routing_keys": ["default"] * 3,
        "payloads": [Jsonb({})] * 3,
        "fingerprints": ["f"] * 3,
        "entity_ids": [None] * 3,
        "max_attempts": [3] * 3,
        "priorities": [1] * 3,
        "finals": [False] * 3,
        "waiting": [0, 1, 1],
        "message_ids": [uuid.uuid4() for _ in ids],
        "bodies": [b"{}"] * 3,
        "concurrency_keys": [None] * 3,
        "concurrency_limits": [None] * 3,
        "rate_keys": [None] * 3,
        "rate_per_seconds": [None] * 3,
        "rate_bursts": [None] * 3,
        "traceparent": None,
        "tracestate": None,
        "headers": Jsonb({}),
        "edge_upstreams": [ids[0], ids[0]],
        "edge_downstreams": [ids[1], ids[2]],
        "edge_policies": ["on_success", "on_success"],
        "default_rate": 0.0,
        "default_burst": 1,
        "default_max_unfinished": 0,
        "default_max_long_polls": 0,
        "idempotency_key": f"key-{RUNNING}",
        "request_fingerprint": "f",
    }
    buffers, plan = explain(million, sql.WORKFLOW_INSERT, params)
    assert "Seq Scan on jobs" not in plan, plan
    # The key's holder is found by the unique index, not by reading the workflows.
    assert "Seq Scan on workflows" not in plan, plan
    assert "workflows_idempotency_uidx" in plan, plan
    # Three jobs, their steps, edges and message, a few index pages each.
    assert buffers <= 300, (buffers, plan)


def scans_of(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int]]:
    rows = conn.execute(
        "SELECT relname, seq_scan, coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables "
        "WHERE relname IN ('jobs', 'workflows', 'workflow_jobs', 'workflow_edges', 'outbox')"
    ).fetchall()
    return {name: (int(seq), int(idx)) for name, seq, idx in rows}


def test_a_settle_and_a_retry_count_readiness_through_indexes(million: str) -> None:
    """The trigger's work for one settle (and the retry that reopens it) scans no table:
    the statements of jobcore_workflow_* reach edges, steps, jobs and the workflow by key."""
    first, second = step_id(RUNNING - 2, 0), step_id(RUNNING - 2, 1)
    with psycopg.connect(million) as conn:
        conn.execute(
            "UPDATE jobcore.jobs SET status = 'running', attempts = 1 WHERE id = %s AND "
            "status = 'pending'",
            [first],
        )
        conn.execute(
            "UPDATE jobcore.jobs SET status = 'failed', finished_at = now() WHERE id = %s", [first]
        )
        scans = scans_of(conn)
        status = conn.execute(
            "SELECT status, last_error FROM jobcore.jobs WHERE id = %s", [second]
        ).fetchone()
        assert status is not None
        assert status[0] == "cancelled"  # the whole chain after it, transitively
        cancelled = conn.execute(
            "SELECT count(*) FROM jobcore.jobs WHERE workflow_id = %s AND status = 'cancelled'",
            [workflow_id(RUNNING - 2)],
        ).fetchone()
        assert cancelled == (STEPS - 1,)
        conn.execute(
            "UPDATE jobcore.jobs SET status = 'pending', finished_at = NULL WHERE id = %s", [first]
        )
        reopened = scans_of(conn)
        back = conn.execute(
            "SELECT count(*) FROM jobcore.jobs WHERE workflow_id = %s AND held_reason = "
            "'dependencies'",
            [workflow_id(RUNNING - 2)],
        ).fetchone()
        conn.rollback()
    assert back == (STEPS - 1,)
    for table, (seq, _) in {**scans, **reopened}.items():
        assert seq == 0, (table, scans, reopened)


FAN_OUT = 2000
FAN_OUT_FILL = f"""
INSERT INTO jobcore.workflows (id, tenant, jobs_total, unsettled, open_jobs, exchange)
VALUES ('00000000-0000-0000-0000-000000000001', 't', {FAN_OUT}, {FAN_OUT}, {FAN_OUT}, 'jobs');
INSERT INTO jobcore.jobs (id, tenant, type, queue, workflow_id, held_reason, held_since)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(g), 12, '0'))::uuid, 't', 'noop', 'default',
       '00000000-0000-0000-0000-000000000001',
       CASE WHEN g > 0 THEN 'dependencies' END, CASE WHEN g > 0 THEN now() END
FROM generate_series(0, {FAN_OUT - 1}) AS g;
INSERT INTO jobcore.workflow_jobs (job_id, workflow_id, name, waiting, routing_key)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(g), 12, '0'))::uuid,
       '00000000-0000-0000-0000-000000000001', 's' || g,
       CASE WHEN g = 0 THEN 0 WHEN g = {FAN_OUT - 1} THEN {FAN_OUT - 2} ELSE 1 END, 'default'
FROM generate_series(0, {FAN_OUT - 1}) AS g;
INSERT INTO jobcore.workflow_edges (workflow_id, upstream, downstream)
SELECT '00000000-0000-0000-0000-000000000001', '00000000-0000-4000-9000-000000000000',
       ('00000000-0000-4000-9000-' || lpad(to_hex(g), 12, '0'))::uuid
FROM generate_series(1, {FAN_OUT - 2}) AS g;
INSERT INTO jobcore.workflow_edges (workflow_id, upstream, downstream)
SELECT '00000000-0000-0000-0000-000000000001',
       ('00000000-0000-4000-9000-' || lpad(to_hex(g), 12, '0'))::uuid,
       ('00000000-0000-4000-9000-' || lpad(to_hex({FAN_OUT - 1}), 12, '0'))::uuid
FROM generate_series(1, {FAN_OUT - 2}) AS g
"""


def test_a_fan_out_on_tables_never_analyzed_is_reached_by_keys(settings: Any) -> None:
    """A workflow's jobs are mostly written between two runs of ANALYZE (and before the
    first, on a new database). With generic plans and no statistics, the trigger's
    statements read the jobs table once per element of a 2,000-id array (a settle took
    seconds, a reopen of 10,000 minutes); each row is reached by its key now."""
    root = step_id_of(0)
    with psycopg.connect(settings.database_url) as conn:
        for statement in FAN_OUT_FILL.split(";\n"):
            conn.execute(statement)
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as the pools
        conn.execute(
            "UPDATE jobcore.jobs SET status = 'running', attempts = 1 WHERE id = %s", [root]
        )
        conn.execute(
            "UPDATE jobcore.jobs SET status = 'failed', finished_at = now() WHERE id = %s", [root]
        )
        cancelled = conn.execute(
            "SELECT count(*) FROM jobcore.jobs WHERE status = 'cancelled'"
        ).fetchone()
        conn.execute(
            "UPDATE jobcore.jobs SET status = 'pending', finished_at = NULL WHERE id = %s", [root]
        )
        conn.execute("UPDATE jobcore.jobs SET status = 'running' WHERE id = %s", [root])
        conn.execute(
            "UPDATE jobcore.jobs SET status = 'succeeded', finished_at = now() WHERE id = %s",
            [root],
        )
        published = conn.execute("SELECT count(*) FROM jobcore.outbox").fetchone()
        scans = scans_of(conn)
        conn.rollback()
    assert cancelled == (FAN_OUT - 1,)
    assert published == (FAN_OUT - 2,)
    for table in ("workflows", "workflow_jobs", "workflow_edges"):
        assert scans.get(table, (0, 0))[0] == 0, scans
    # The test's own count(*) reads of jobs and outbox are its only sequential scans.
    assert scans["jobs"][0] <= 1, scans


def step_id_of(n: int) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-4000-9000-{n:012x}")
