"""The batch statements at 1,000,000 jobs (100,000 of them in 10,000 batches): each reads
a few pages of an index, never the table, as the pools plan it (a generic plan)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobcore.database.sql import Query
from jobcore.database.sql import batches as sql
from tests.support import databases, plans
from tests.support.services import ServiceUrls

MILLION = 1_000_000
BATCHES = 10_000
# Jobs 1..100,000 are members: job g of batch g % 10,000, ten a batch; one in ten pending,
# one in ten failed. Batches with an even number settled (half of them long ago), the
# odd ones closed and not settled; batch 1 has batch 0 as its parent.
FILL = """
    INSERT INTO jobcore.batches (id, tenant, parent_id, total, succeeded, failed, closed_at,
                         settled_at, created_at)
    SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(b), 12, '0'))::uuid, 't' || (b %% 100),
           CASE WHEN b = 1 THEN '00000000-0000-4000-9000-000000000000'::uuid END,
           10, 8, 1, now(),
           CASE WHEN b %% 2 = 0 THEN now() - (b %% 4) * interval '40 days' END,
           now() - (%(batches)s - b) * interval '1 s'
    FROM generate_series(0, %(batches)s - 1) AS b
"""
FILL_JOBS = """
    INSERT INTO jobcore.jobs (id, tenant, type, queue, status, attempts, created_at, finished_at,
                      batch_id)
    SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
           't' || (g %% 100), 'noop', 'default',
           CASE g %% 10 WHEN 0 THEN 'pending' WHEN 1 THEN 'failed' ELSE 'succeeded' END,
           1, now() - (%(n)s - g) * interval '10 ms',
           CASE WHEN g %% 10 <> 0 THEN now() - (%(n)s - g) * interval '10 ms' END,
           CASE WHEN g <= 100000
                THEN ('00000000-0000-4000-9000-' || lpad(to_hex(g %% %(batches)s), 12, '0'))::uuid
           END
    FROM generate_series(1, %(n)s) AS g
"""
A_BATCH = uuid.UUID("00000000-0000-4000-9000-000000000007")
COMPLETION = {
    "webhook_exchange": "jobcore.jobs",
    "webhook_routing_key": "webhooks",
    "webhook_max_attempts": 3,
    "webhook_outbox_channel": "jobcore_outbox",
}


@pytest.fixture(scope="module")
def million_jobs(service_urls: ServiceUrls, template_database: str) -> Iterator[str]:
    name = databases.create_database(service_urls.pg_admin_url, template=template_database)
    url = databases.with_database(service_urls.pg_admin_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FILL, {"batches": BATCHES})
            conn.execute(FILL_JOBS, {"n": MILLION, "batches": BATCHES})
            conn.execute("VACUUM ANALYZE jobcore.jobs")
            conn.execute("VACUUM ANALYZE jobcore.batches")
        yield url
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def _explain(url: str, query: Query[Any], params: dict[str, Any]) -> tuple[int, str]:
    """The pages of its tables and indexes the statement read, run (and rolled back) as
    the pools run it (tests.support.plans), and its plan."""
    measured = plans.explain(url, query, params)
    return measured.blocks, measured.text


CASES: list[tuple[Query[Any], dict[str, Any], str]] = [
    (sql.BATCH_GET, {"id": A_BATCH, "tenant": "t7"}, "batches_pkey"),
    (sql.BATCH_LOCK, {"id": A_BATCH, "tenant": None}, "batches_pkey"),
    (sql.BATCH_LIST, {"tenant": "t7", "limit": 50}, "batches_tenant_created_idx"),
    (sql.BATCH_LIST_ALL, {"limit": 50}, "batches_created_idx"),
    (sql.BATCH_GROW, {"id": A_BATCH, "members": 1}, "batches_pkey"),
    (sql.BATCH_FAILED_JOBS, {"id": A_BATCH, "limit": 1000}, "jobs_batch_idx"),
    (sql.BATCH_TREE, {"id": A_BATCH}, "batches_parent_idx"),
    (sql.BATCH_MARK_CANCELLED, {"ids": [A_BATCH]}, "batches_pkey"),
    (
        sql.BATCH_CANCEL_PENDING,
        {"ids": [A_BATCH], "limit": 1000, **COMPLETION},
        "jobs_batch_idx",
    ),
    (sql.BATCH_REQUEST_CANCEL, {"ids": [A_BATCH], "channel": "jobcore_cancel"}, "jobs_batch_idx"),
    (
        sql.BATCH_JOBS_OF,
        {"ids": [uuid.UUID("00000000-0000-4000-8000-000000000007")]},
        "jobs_pkey",
    ),
    (
        sql.BATCH_MEMBER_DETACH,
        {"id": uuid.UUID("00000000-0000-4000-8000-000000000007")},
        "jobs_pkey",
    ),
    (sql.BATCH_PRUNE_COUNT, {"keep": 30 * 86400.0}, "batches_settled_idx"),
    (sql.BATCH_PRUNE, {"keep": 30 * 86400.0, "limit": 100}, "batches_settled_idx"),
    (sql.BATCH_IDLE_COUNT, {"idle": 7 * 86400.0}, "batches_open_idx"),
    (sql.BATCH_CLOSE_IDLE, {"idle": 7 * 86400.0}, "batches_open_idx"),
    (
        sql.BATCH_INSERT,
        {
            "id": uuid.uuid4(),
            "tenant": "t7",
            "parent_id": None,
            "description": None,
            "events": ["complete"],
            "specs": [Jsonb({"type": "noop"})],
        },
        "",
    ),
]


@pytest.mark.parametrize(("query", "params", "index"), CASES, ids=[case[0].name for case in CASES])
def test_each_batch_statement_reads_an_index_at_a_million_jobs(
    million_jobs: str, query: Query[Any], params: dict[str, Any], index: str
) -> None:
    buffers, text = _explain(million_jobs, query, params)
    assert "Seq Scan on jobs" not in text, text
    assert "Seq Scan on batches" not in text, text
    assert index in text, text
    # The prune deletes up to 100 trees of ten jobs each (their events, cascades); every
    # other statement touches one batch.
    bound = 20_000 if query is sql.BATCH_PRUNE else 600
    assert buffers <= bound, (buffers, text)
