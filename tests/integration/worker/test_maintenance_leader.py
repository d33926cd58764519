"""Maintenance under one leader per database: two workers elect exactly one, every service
works under it, a successor takes over once the leader's lease expires, and a leader whose
lease was taken does no more work (docs/design.md, "Maintenance")."""

from __future__ import annotations

import httpx

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql import Query
from jobcore.kernel.settings import Settings
from jobcore.maintenance import LEADER_LEASE
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import job_row, submit, worker_settings

LEASES = Query(
    "test_maintenance_leases",
    "Every maintenance lease row, live or not.",
    "SELECT name, owner, token, expires_at > now() AS live FROM maintenance_leases ORDER BY name",
)
EXPIRE_LEADER = Query(
    "test_maintenance_expire_leader",
    "The leader stalled: its lease ran out (and, as if another had taken it, its token changed).",
    """
    UPDATE maintenance_leases SET expires_at = now() - interval '1 second',
                                  token = gen_random_uuid()
    WHERE name = 'maintenance'
    """,
)
EXPIRED_RUNNING = """
    UPDATE jobs SET status = 'running', attempts = 1, lease_token = gen_random_uuid(),
                    lease_expires_at = now() - interval '1 second', worker_id = 'gone',
                    started_at = now()
    WHERE id = %s
"""
SERVICES = {"reaper", "rescuer", "pruner", "sweeper", "gate_releaser", "scheduler", "usage_folder"}


async def leases(db: Database) -> list[dict[str, object]]:
    async with db.unit_of_work() as uow:
        return [dict(row) for row in await fetch_all(uow, LEASES({}))]


async def _not(value: bool) -> bool:
    return not value


async def health(worker: Worker) -> dict[str, object]:
    assert worker.health is not None
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{worker.health.port}", timeout=5
    ) as client:
        body: dict[str, object] = (await client.get("/healthz")).json()
        return body


async def test_two_workers_elect_one_leader_whose_services_all_run_and_a_successor_takes_over(
    db: Database, topology: Topology, settings: Settings, start_worker: StartWorker
) -> None:
    wsettings = worker_settings(
        settings,
        pruner_interval=0.2,
        gate_release_interval=0.2,
        scheduler_interval=0.2,
        schedules={"tick": {"job_type": "noop", "cron": "* * * * * *"}},
    )
    first = await start_worker(wsettings)
    second = await start_worker(wsettings)
    workers = {first.worker_id: first, second.worker_id: second}

    async def one_leader_with_every_service() -> str | None:
        rows = await leases(db)
        by_name = {row["name"]: row for row in rows}
        leader = by_name.get(LEADER_LEASE)
        if leader is None or not leader["live"] or set(by_name) != {LEADER_LEASE, *SERVICES}:
            return None
        # Every service's own row was taken by its working transaction, under the term's
        # token: all seven ran under the one leader.
        if any(row["owner"] != leader["owner"] or row["token"] != leader["token"] for row in rows):
            return None
        return str(leader["owner"])

    leader_id = await eventually(one_leader_with_every_service, what="one leader, seven services")
    leader = workers[leader_id]
    [standby] = [w for w in workers.values() if w is not leader]
    assert leader.maintainer.is_leader
    assert not standby.maintainer.is_leader
    assert (await health(leader))["maintenance_leader"] is True
    assert (await health(standby))["maintenance_leader"] is False
    assert (await health(standby))["reaper_leader"] is False

    # The leader stalls (its maintenance connection taken from under it: no statement of
    # its goes out), so its lease expires; the standby takes it over.
    stalled = leader.maintainer.db._turn
    await stalled.acquire()
    try:

        async def taken_over() -> bool:
            rows = {row["name"]: row for row in await leases(db)}
            held = rows.get(LEADER_LEASE)
            return bool(held and held["owner"] == standby.worker_id)

        await eventually(taken_over, timeout=30, what="the standby taking the expired lease")
        assert standby.maintainer.is_leader
    finally:
        stalled.release()
    # Back, the old leader's next working transaction finds the lease gone: it rolls back
    # and steps down.
    await eventually(
        lambda: _not(leader.maintainer.is_leader), what="the stalled leader stepping down"
    )
    assert standby.maintainer.is_leader

    # The successor's reaper does the work now.
    job_id = await submit(db, topology, "wt_gate", GatePayload(), max_attempts=3)
    async with db.connection() as conn:
        await conn.execute("DELETE FROM outbox WHERE job_id = %s", (job_id,))
        await conn.execute(EXPIRED_RUNNING, (job_id,))

    async def reaped() -> bool:
        return (await job_row(db, job_id))["last_error"] == "lease expired"

    await eventually(reaped, what="the successor's reaper")
    assert standby.metrics.counts["reaped.pending"] >= 1
    assert leader.metrics.counts.get("reaped.pending", 0) == 0
