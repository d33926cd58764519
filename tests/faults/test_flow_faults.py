"""Flow control with relays and workers as separate processes, some SIGKILLed mid-run.

Ordering keys: jobs enqueued under many keys run, per key, one after another in enqueue
order (checked from the job rows: each job started after the one before it finished),
with three relays and three workers, one relay and one worker SIGKILLed mid-run. The
default suite runs 20 keys x 25 jobs; the 100 x 100 version runs on demand
(marked ``slow``: ``make test-slow``): about ten minutes on a shared 2-core machine.

Concurrency limits: a worker SIGKILLed while it holds slots does not leak them: the
reaper returns its jobs to pending, which frees the slots, and the jobs held behind them
run. Only processes these tests started are killed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Process, Stack
from jobcore.testing.waiting import eventually
from tests.conftest import TEST_JOB_MODULES
from tests.integration.worker.support import submit
from tests.support import flow_jobtypes
from tests.support.flow import order_violations
from tests.support.flow_jobtypes import AccountPayload, OrderedPayload

pytestmark = pytest.mark.timeout(1800)

FLOW_ENV = {
    "JOBCORE_GATE_RELEASE_INTERVAL": "0.1",
    "JOBCORE_WORKER_CONCURRENCY": "8",
}


@pytest.fixture
def flow_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"job_modules": (*TEST_JOB_MODULES, flow_jobtypes.MODULE)})


@pytest.fixture
async def broker_cleanup(flow_settings: Settings) -> Any:
    yield
    import aio_pika

    connection = await aio_pika.connect(flow_settings.amqp_url, timeout=10)
    async with connection:
        topology = Topology.from_settings(flow_settings)
        await topology.delete(await connection.channel(), default_registry.queues())


async def counts(db: Database, job_type: str) -> dict[str, int]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT status, count(*) AS n FROM jobcore.jobs WHERE type = %s GROUP BY status",
            (job_type,),
        )
        return {r["status"]: int(r["n"]) for r in await cur.fetchall()}


async def rows_of(db: Database, job_type: str) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM jobcore.jobs WHERE type = %s", (job_type,))
        return [dict(r) for r in await cur.fetchall()]


async def enqueue_ordered(db: Database, topology: Topology, keys: int, per_key: int) -> None:
    """Jobs in enqueue order n = 0.. per key, the keys interleaved, a few writers at once
    (each writer owns some keys, so each key's order is one writer's order)."""

    async def writer(owned: range) -> None:
        for n in range(per_key):
            for k in owned:
                payload = OrderedPayload(n=n, fail_times=1 if (n + k) % 17 == 5 else 0)
                await submit(db, topology, "flow_ordered", payload, ordering_key=f"key-{k}")

    step = max(1, keys // 4)
    await asyncio.gather(*(writer(range(s, min(keys, s + step))) for s in range(0, keys, step)))


async def run_ordered(
    flow_settings: Settings,
    db: Database,
    topology: Topology,
    tmp_path: Path,
    keys: int,
    per_key: int,
) -> None:
    total = keys * per_key
    async with Stack(flow_settings, tmp_path / "logs", relays=3, workers=3, env=FLOW_ENV) as stack:
        await enqueue_ordered(db, topology, keys, per_key)

        async def some_done() -> bool:
            return (await counts(db, "flow_ordered")).get("succeeded", 0) >= total // 5

        await eventually(some_done, timeout=600, interval=0.2, what="a fifth of the jobs")
        stack.relays[0].kill()
        stack.workers[0].kill()

        async def all_done() -> dict[str, int] | None:
            now = await counts(db, "flow_ordered")
            return now if now.get("succeeded", 0) == total else None

        await eventually(all_done, timeout=1500, interval=0.5, what="every ordered job")
        survivors = [p for p in stack.processes if p not in (stack.relays[0], stack.workers[0])]
        assert all(p.alive for p in survivors), _dead(survivors)

    rows = await rows_of(db, "flow_ordered")
    assert len(rows) == total
    assert order_violations(rows) == [], order_violations(rows)[:5]
    per_key_seen = {(r["ordering_key"], r["ordering_seq"]) for r in rows}
    assert len(per_key_seen) == total
    for row in rows:
        assert row["ordering_seq"] == row["payload"]["n"] + 1
    # A job held waiting for its turn used no attempt: one each, or two for the planned
    # failures; a few more only for jobs the killed worker was running.
    extra = [r for r in rows if r["attempts"] > 1 + r["payload"]["fail_times"]]
    assert len(extra) <= 8 * 2, [(r["id"], r["attempts"], r["last_error"]) for r in extra]


def _dead(processes: list[Process]) -> str:
    return "\n".join(f"{p.name}:\n{p.all_logs()[-2000:]}" for p in processes if not p.alive)


async def test_ordering_keys_hold_with_three_relays_and_workers_through_kills(
    flow_settings: Settings, db: Database, topology: Topology, tmp_path: Path, broker_cleanup: None
) -> None:
    await run_ordered(flow_settings, db, topology, tmp_path, keys=20, per_key=25)


@pytest.mark.slow  # deselected by `make test`; `make test-slow` runs it
async def test_ordering_keys_hold_at_100_keys_by_100_jobs(
    flow_settings: Settings, db: Database, topology: Topology, tmp_path: Path, broker_cleanup: None
) -> None:
    await run_ordered(flow_settings, db, topology, tmp_path, keys=100, per_key=100)


async def test_a_killed_workers_concurrency_slots_are_freed_by_the_reaper(
    flow_settings: Settings, db: Database, topology: Topology, tmp_path: Path, broker_cleanup: None
) -> None:
    gate = tmp_path / "gate"
    async with Stack(flow_settings, tmp_path / "logs", relays=1, workers=2, env=FLOW_ENV) as stack:
        blocking = [
            await submit(db, topology, "flow_limited", AccountPayload(account="a", gate=str(gate)))
            for _ in range(flow_jobtypes.LIMIT)
        ]

        async def both_running() -> list[dict[str, Any]] | None:
            rows = [r for r in await rows_of(db, "flow_limited") if r["id"] in blocking]
            return rows if all(r["status"] == "running" for r in rows) else None

        running = await eventually(both_running, timeout=60, what="the slots to be taken")
        waiting = [
            await submit(db, topology, "flow_limited", AccountPayload(account="a"))
            for _ in range(3)
        ]

        async def all_held() -> bool:
            rows = [r for r in await rows_of(db, "flow_limited") if r["id"] in waiting]
            return all(r["held_reason"] == "concurrency" for r in rows)

        await eventually(all_held, timeout=60, what="the other jobs to be held")
        # SIGKILL every worker holding a slot; start one again if none is left.
        holders = {int(str(r["worker_id"]).split(":")[1]) for r in running}
        killed = [w for w in stack.workers if w.pid in holders]
        for worker in killed:
            worker.kill()
        if len(killed) == len(stack.workers):
            await stack.restart(killed[0])
        # The jobs the dead worker ran are reaped (their slots freed) and run again.
        gate.touch()

        async def all_succeeded() -> list[dict[str, Any]] | None:
            rows = await rows_of(db, "flow_limited")
            return rows if all(r["status"] == "succeeded" for r in rows) else None

        rows = await eventually(all_succeeded, timeout=120, interval=0.2, what="every job")

    by_id = {r["id"]: r for r in rows}
    for job_id in blocking:
        assert by_id[job_id]["attempts"] == 2  # the attempt the kill interrupted, and one more
        assert by_id[job_id]["last_error"] == "lease expired"
    for job_id in waiting:
        assert by_id[job_id]["attempts"] == 1  # held, never run, then run once
