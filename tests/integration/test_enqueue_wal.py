"""What an enqueue writes to the WAL for its job row: a job with neither an idempotency key
nor a unique key is a plain INSERT, not a speculative insertion (INSERT ... ON CONFLICT),
which writes one record more per job (issue 49); a job with a key still is one. Read with
pg_walinspect (PostgreSQL 15), the records of this database's `jobs` table only."""

from __future__ import annotations

from typing import Any

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.testing.jobtypes import EchoPayload
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue, enqueue_many

TENANT = "wal-per-job"

JOBS_RECORDS = """
    WITH records AS (
        SELECT record_type, (regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)'))[1:2] AS rel
        FROM pg_get_wal_records_info(
            %(a)s::pg_lsn, least(%(b)s::pg_lsn, pg_current_wal_flush_lsn())
        )
        WHERE resource_manager = 'Heap'
    )
    SELECT record_type, count(*) AS n FROM records
    WHERE rel[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND rel[2]::oid = pg_relation_filenode('jobcore.jobs')
    GROUP BY record_type
"""


async def _lsn(db: Database) -> str:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT pg_current_wal_lsn()::text AS lsn")
        row = await cur.fetchone()
    assert row is not None
    return str(row["lsn"])


async def _jobs_records(db: Database, a: str, b: str) -> dict[str, int]:
    async with db.connection() as conn:
        cur = await conn.execute(JOBS_RECORDS, {"a": a, "b": b})
        rows: list[Any] = await cur.fetchall()
    return {str(row["record_type"]): int(row["n"]) for row in rows}


def _request(**keys: str) -> EnqueueRequest:
    echo = default_registry.get("echo")
    return EnqueueRequest(tenant=TENANT, job_type=echo, payload=EchoPayload(text="x"), **keys)


async def test_a_job_without_keys_is_a_plain_insert_and_one_with_a_key_a_speculative_one(
    db: Database, topology: Topology
) -> None:
    async with db.connection() as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    start = await _lsn(db)
    async with db.session() as session:
        await enqueue(session, topology, _request())
    async with db.session() as session:
        await enqueue_many(session, topology, [_request(), _request()])
    plain = await _lsn(db)
    async with db.session() as session:
        await enqueue(session, topology, _request(idempotency_key="wal-1"))
    async with db.session() as session:
        await enqueue_many(session, topology, [_request(unique_key="wal-2"), _request()])
    end = await _lsn(db)

    written = await _jobs_records(db, start, plain)
    assert written.get("INSERT", 0) + written.get("INSERT+INIT", 0) == 3, written
    assert written.get("HEAP_CONFIRM", 0) == 0, written
    # With a key, ON CONFLICT's speculative insertion and its confirmation; the batch's
    # item without one is still a plain insert.
    keyed = await _jobs_records(db, plain, end)
    assert keyed.get("INSERT", 0) + keyed.get("INSERT+INIT", 0) == 3, keyed
    assert keyed.get("HEAP_CONFIRM", 0) == 2, keyed
