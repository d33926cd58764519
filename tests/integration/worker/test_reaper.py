"""The reaper: expired leases go back to pending (or fail); only the maintenance leader's
reaper works, fenced."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.sql.jobs.recovery import JOB_LOCK_EXPIRED
from jobcore.execution.registry import default_registry
from jobcore.kernel.envelope import decode
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Maintainer, Reaper
from jobcore.maintenance import reaper as reaper_module
from jobcore.maintenance.reaper import UNBOUNDED_EVERY, UNBOUNDED_WINDOW
from jobcore.testing.waiting import eventually
from services.worker.metrics import WorkerMetrics
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import job_row, outbox_rows, submit
from tests.support import plans

RUNNING_WITH_LEASE = """
    UPDATE jobs SET status = 'running', attempts = %(attempts)s, lease_token = gen_random_uuid(),
                    lease_expires_at = now() + make_interval(secs => %(seconds)s),
                    worker_id = 'gone', started_at = now()
    WHERE id = %(id)s
"""


def reaper(settings: Settings, db: Database, owner: str) -> Maintainer:
    """A maintainer running only a reaper."""
    service = Reaper.from_settings(settings, registry=default_registry, metrics=WorkerMetrics())
    return Maintainer(db, [service], owner=owner)


async def reap(maintainer: Maintainer) -> int:
    return (await maintainer.tick())["reaper"]


def counts(maintainer: Maintainer) -> dict[str, int]:
    metrics = maintainer.service("reaper").metrics  # type: ignore[attr-defined]
    return dict(metrics.counts)


async def running_job(
    db: Database, topology: Topology, *, attempts: int, lease_seconds: float
) -> uuid.UUID:
    job_id = await submit(db, topology, "wt_gate", GatePayload(), max_attempts=3)
    async with db.connection() as conn:
        await conn.execute("DELETE FROM outbox WHERE job_id = %s", (job_id,))
        await conn.execute(
            RUNNING_WITH_LEASE, {"id": job_id, "attempts": attempts, "seconds": lease_seconds}
        )
    return job_id


async def test_expired_leases_go_back_to_pending_or_fail_when_attempts_are_used_up(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    retry = await running_job(db, topology, attempts=1, lease_seconds=-1)
    exhausted = await running_job(db, topology, attempts=3, lease_seconds=-1)
    alive = await running_job(db, topology, attempts=1, lease_seconds=60)
    cancelled = await running_job(db, topology, attempts=1, lease_seconds=-1)
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET cancel_requested_at = now() WHERE id = %s", (cancelled,)
        )
    the_reaper = reaper(wsettings, db, "a")

    assert await reap(the_reaper) == 3

    row = await job_row(db, retry)
    assert (row["status"], row["last_error"], row["lease_token"]) == (
        "pending",
        "lease expired",
        None,
    )
    [message] = await outbox_rows(db, retry)
    envelope = decode(bytes(message["body"]))
    assert (envelope.job_id, envelope.attempt, envelope.type) == (retry, 2, "wt_gate")
    assert message["routing_key"] == "testq"
    assert message["exchange"] == topology.jobs_exchange
    assert message["tenant"] == "t"

    row = await job_row(db, exhausted)
    assert (row["status"], row["last_error"]) == ("failed", "lease expired")
    assert row["finished_at"] is not None
    assert await outbox_rows(db, exhausted) == []

    row = await job_row(db, cancelled)
    assert (row["status"], row["last_error"]) == ("cancelled", "lease expired")
    assert await outbox_rows(db, cancelled) == []

    assert (await job_row(db, alive))["status"] == "running"
    assert counts(the_reaper) == {
        "reaped.pending": 1,
        "reaped.failed": 1,
        "reaped.cancelled": 1,
    }
    assert await reap(the_reaper) == 0


async def test_only_the_leaders_reaper_works_and_a_stopped_leader_hands_over(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    first, second = reaper(wsettings, db, "first"), reaper(wsettings, db, "second")
    await first.tick()
    await second.tick()
    assert (first.is_leader, second.is_leader) == (True, False)
    job_id = await running_job(db, topology, attempts=1, lease_seconds=-1)
    assert await reap(second) == 0  # not the leader: reaps nothing
    assert (await job_row(db, job_id))["status"] == "running"
    assert (first.is_leader, second.is_leader) == (True, False)

    await first.start()
    await first.stop(5)  # gives the leases back on the way out
    await second.tick()
    assert second.is_leader
    async with db.connection() as conn:
        cur = await conn.execute("SELECT name, owner FROM maintenance_leases ORDER BY name")
        # The reaper's own row only once its first round worked, under the leader's token.
        assert await cur.fetchall() == [
            {"name": "maintenance", "owner": "second"},
            {"name": "reaper", "owner": "second"},
        ]
    assert (await job_row(db, job_id))["status"] == "pending"


async def test_a_reaper_that_lost_its_lease_reaps_nothing(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    stale = reaper(wsettings, db, "stale")
    await stale.elect()
    assert stale.is_leader
    # Its lease expires (it was paused, say) and another reaper takes it over.
    async with db.connection() as conn:
        await conn.execute("UPDATE maintenance_leases SET expires_at = now() - interval '1 s'")
    successor = reaper(wsettings, db, "successor")
    await successor.elect()
    assert successor.is_leader

    job_id = await running_job(db, topology, attempts=1, lease_seconds=-1)
    # Its term still open, it works: the fence in its transaction finds the lease gone.
    assert await stale.round(stale.service("reaper")) == 0
    assert not stale.is_leader
    assert (await job_row(db, job_id))["status"] == "running"
    assert await reap(successor) == 1
    assert (await job_row(db, job_id))["status"] == "pending"


async def test_a_round_looks_back_to_the_last_one_and_every_lease_every_so_often(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    """A lease that expired before the last round began, which that round did not see
    (the claim committed late), waits for the next unbounded round."""
    the_reaper = reaper(wsettings, db, "a")
    assert await reap(the_reaper) == 0  # the first round looks at every lease
    service = the_reaper.service("reaper")
    assert isinstance(service, Reaper)
    assert service.window == UNBOUNDED_WINDOW
    recent = await running_job(db, topology, attempts=1, lease_seconds=-0.1)
    late = await running_job(db, topology, attempts=1, lease_seconds=-600)
    assert await reap(the_reaper) == 1
    assert service.window < UNBOUNDED_WINDOW
    assert (await job_row(db, recent))["status"] == "pending"
    assert (await job_row(db, late))["status"] == "running"

    assert service._unbounded_at is not None
    service._unbounded_at -= UNBOUNDED_EVERY
    assert await reap(the_reaper) == 1
    assert service.window == UNBOUNDED_WINDOW
    assert (await job_row(db, late))["status"] == "pending"


async def test_a_lease_a_round_could_not_lock_is_reaped_by_the_next_bounded_round(
    settings: Settings,
    db: Database,
    topology: Topology,
    wsettings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round skips a job another transaction holds (a worker finishing it slowly, which
    then rolls back). The round's mark stays at that lease, so the next round, bounded,
    reaps it instead of leaving it to the unbounded round minutes later. (A short slack:
    the lease is then as far below the round's start as one that expired minutes before.)"""
    monkeypatch.setattr(reaper_module, "WINDOW_SLACK", 0.05)
    the_reaper = reaper(wsettings, db, "a")
    assert await reap(the_reaper) == 0  # the first round looks at every lease
    service = the_reaper.service("reaper")
    assert isinstance(service, Reaper)
    # A lease that expires after that round began, well before the next one.
    held = await running_job(db, topology, attempts=1, lease_seconds=0.2)

    async def expired() -> bool:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT lease_expires_at < now() - interval '0.2 s' AS expired FROM jobs"
                " WHERE id = %s",
                (held,),
            )
            row = await cur.fetchone()
        return row is not None and bool(row["expired"])

    await eventually(expired, timeout=10, interval=0.05, what="the lease to expire")
    async with await psycopg.AsyncConnection.connect(settings.database_url) as worker:
        await worker.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (held,))
        assert await reap(the_reaper) == 0
        assert service.window < UNBOUNDED_WINDOW
        await worker.rollback()
    # Rounds go on as their interval would space them; none of them unbounded.
    assert await reap(the_reaper) == 1
    assert service.window < UNBOUNDED_WINDOW
    assert (await job_row(db, held))["status"] == "pending"


EXPIRED = """
INSERT INTO jobs (id, tenant, type, queue, status, lease_token, lease_expires_at)
SELECT gen_random_uuid(), 't', 'wt_gate', 'testq', 'running', gen_random_uuid(),
       now() - interval '10 minutes'
FROM generate_series(1, %(n)s)
"""
DONE = """
UPDATE jobs SET status = 'succeeded', finished_at = now(), lease_token = NULL
WHERE status = 'running' AND tenant = 't'
"""


def _lock_expired_buffers(url: str, window: float) -> int:
    """Pages the reaper's lock of expired leases reads, as the pools run it
    (tests.support.plans)."""
    return plans.explain(url, JOB_LOCK_EXPIRED, {"limit": 100, "window": window}).blocks


async def test_jobs_run_behind_a_pinned_horizon_cost_the_bounded_scan_nothing(
    db: Database, wsettings: Settings
) -> None:
    """Under a pinned xmin horizon, every job that ran leaves its running version's entry
    in jobs_lease_expiry_idx; the unbounded scan visits them all, the bounded one those
    of its window."""
    url = wsettings.database_url
    with psycopg.connect(url) as pin:
        pin.execute("SELECT txid_current()")  # holds an XID: the horizon stays here
        async with db.connection() as conn:
            await conn.execute(EXPIRED, {"n": 5000})
            await conn.execute(DONE)
        unbounded = _lock_expired_buffers(url, UNBOUNDED_WINDOW)
        bounded = _lock_expired_buffers(url, 10)
        pin.rollback()
    # About a block per 50 of these narrow rows unbounded; bounded, an index page or two.
    assert unbounded >= 80, (unbounded, bounded)
    assert bounded <= 10, bounded
