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
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.maintenance import GateReleaser, Maintainer, Pruner
from jobcore.maintenance.usage_folder import UsageFolder
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


async def _usage(db: Database, tenant: str) -> tuple[int, int]:
    """The tenant's row's count, and its deltas not yet folded."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT unfinished FROM tenant_usage WHERE tenant = %(t)s) AS row,"
            " (SELECT count(*) FROM tenant_usage_deltas WHERE tenant = %(t)s) AS deltas",
            {"t": tenant},
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["row"]), int(row["deltas"])


async def test_a_gate_release_does_not_wait_behind_a_usage_fold_of_a_busy_tenant(
    db: Database, topology: Topology, settings: Settings
) -> None:
    # An application transaction holds a tenant's usage row (an in-transaction enqueue of
    # a capped tenant, not yet committed) while the tenant and another have deltas.
    wsettings = worker_settings(
        settings, usage_fold_interval=0.2, gate_release_interval=0.2, db_operation_timeout=120.0
    )
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO tenant_usage (tenant, unfinished) VALUES ('busy', 5), ('free', 5)"
        )
        await conn.execute(
            "INSERT INTO tenant_usage_deltas (tenant, delta)"
            " SELECT t, d FROM (VALUES ('busy', 1), ('busy', 1), ('busy', -1),"
            " ('free', 1), ('free', -1), ('free', -1)) AS v(t, d)"
        )
    maintainer = Maintainer(
        db,
        [
            UsageFolder.from_settings(wsettings),
            GateReleaser.from_settings(wsettings, metrics=WorkerMetrics()),
        ],
        owner="w1",
    )
    locker = await psycopg.AsyncConnection.connect(settings.database_url)
    try:
        await locker.execute("SELECT 1 FROM tenant_usage WHERE tenant = 'busy' FOR UPDATE")
        await maintainer.start()
        try:

            async def free_folded() -> bool:
                return await _usage(db, "free") == (4, 0)

            # The other tenant is folded in the meantime.
            await eventually(free_folded, timeout=20, what="the free tenant's deltas folded")
            held = uuid.uuid4()
            async with db.connection() as conn:
                await conn.execute(HELD_BEHIND_A_FINISHED_ONE, {"held": held})
            await eventually(
                lambda: released(db, held),
                timeout=20,
                what="the gate releaser's round while a tenant's usage row is held",
            )
            # The busy tenant's deltas wait for its row.
            assert await _usage(db, "busy") == (5, 3)

            await locker.rollback()

            async def busy_folded() -> bool:
                return await _usage(db, "busy") == (6, 0)

            await eventually(busy_folded, timeout=20, what="the busy tenant's fold after")
        finally:
            await maintainer.stop(2.0)
    finally:
        await locker.close()
