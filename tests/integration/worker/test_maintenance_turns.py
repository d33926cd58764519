"""Maintenance's services share one connection, taken in turn: a pruner batch that waits
for a lock must not keep the others' turns, the gate releaser's (every 0.2 s) above all.

Another transaction locks the webhook delivery of a job past its retention, as a webhook
sender updating it would, so the pruner's batch deleting that job waits for the lock. While
it is held, a held job's turn in its ordering key comes: the gate releaser must release it
(no timing asserted: only that it happened while the pruner was blocked)."""

from __future__ import annotations

import uuid

import psycopg

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.maintenance import GateReleaser, Maintainer, Pruner
from jobcore.settings import Settings
from jobcore.testing.waiting import eventually
from services.worker.metrics import WorkerMetrics
from tests.integration.worker.support import worker_settings
from tests.support.retention import make_job, own_rows

# A job held behind the first of its ordering key, and that first job, just succeeded:
# the held one's turn has come.
HELD_BEHIND_A_FINISHED_ONE = """
    INSERT INTO jobs (id, tenant, type, queue, status, held_reason, held_since, created_at,
                      finished_at, ordering_key, ordering_seq)
    VALUES (%(held)s, 't', 'noop', 'default', 'pending', 'ordering', now(), now(), NULL, 'k', 2),
           (gen_random_uuid(), 't', 'noop', 'default', 'succeeded', NULL, NULL, now(), now(),
            'k', 1)
"""
BLOCKED_BY = """
    SELECT count(*) AS n FROM pg_stat_activity
    WHERE datname = current_database() AND %(locker)s = ANY(pg_blocking_pids(pid))
"""


async def released(db: Database, job_id: uuid.UUID) -> bool:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT held_reason IS NULL AND EXISTS (SELECT 1 FROM outbox WHERE job_id = %s) "
            "AS released FROM jobs WHERE id = %s",
            (job_id, job_id),
        )
        row = await cur.fetchone()
    return bool(row and row["released"])


async def test_a_gate_release_does_not_wait_behind_a_pruner_batch_blocked_on_a_lock(
    db: Database, topology: Topology, settings: Settings
) -> None:
    # Longer than the wait below: a blocked batch is not ended by the operation timeout.
    wsettings = worker_settings(
        settings, pruner_interval=0.2, gate_release_interval=0.2, db_operation_timeout=120.0
    )
    doomed = await make_job(db, topology)
    metrics = WorkerMetrics()
    maintainer = Maintainer(
        db,
        [
            Pruner.from_settings(wsettings, metrics=metrics),
            GateReleaser.from_settings(wsettings, metrics=metrics),
        ],
        owner="w1",
    )
    locker = await psycopg.AsyncConnection.connect(settings.database_url)
    try:
        await locker.execute(
            "SELECT 1 FROM webhook_deliveries WHERE job_id = %s FOR UPDATE", (doomed.id,)
        )
        locker_pid = locker.info.backend_pid
        await maintainer.start()
        try:

            async def pruner_blocked() -> bool:
                async with db.connection() as conn:
                    cur = await conn.execute(BLOCKED_BY, {"locker": locker_pid})
                    row = await cur.fetchone()
                return bool(row and row["n"])

            await eventually(pruner_blocked, timeout=20, what="the pruner waiting for the lock")

            held = uuid.uuid4()
            async with db.connection() as conn:
                await conn.execute(HELD_BEHIND_A_FINISHED_ONE, {"held": held})
            await eventually(
                lambda: released(db, held),
                timeout=20,
                what="the gate releaser's round while the pruner is blocked",
            )
            # Still blocked: the lock is held, and the job it guards is still there.
            assert not locker.closed
            assert (await own_rows(db, doomed.id))["webhook_deliveries"] == 1

            # Once the lock goes, the pruner deletes the job after all.
            await locker.rollback()

            async def pruned() -> bool:
                return (await own_rows(db, doomed.id))["jobs"] == 0

            await eventually(pruned, timeout=20, what="the pruner after the lock went")
        finally:
            await maintainer.stop(2.0)
    finally:
        await locker.close()
