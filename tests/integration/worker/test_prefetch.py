"""Prefetch: a worker holds no more unstarted deliveries than it has handler slots, over
all the queues it consumes together.

A delivery is acknowledged once its claim commits, so the unacknowledged ones are those
waiting for a slot. When the worker stops or dies the broker requeues them, and each
requeue counts toward the quorum queue's delivery limit: more of them than the slots
that could take them at once only adds exposure.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import aio_pika

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.jobtypes import NoopPayload
from jobcore.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import OutboxPump, submit

JOBS = 8
CONCURRENCY = 2


async def test_a_worker_holds_at_most_its_concurrency_in_waiting_deliveries(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    worker = await start_worker(queues=["testq"], concurrency=CONCURRENCY)
    gate = tmp_path / "gate"
    ids = [await submit(db, topology, "wt_gate", GatePayload(gate=str(gate))) for _ in range(JOBS)]
    await eventually(lambda: _published(db, ids), what="every message to be published")
    await eventually(lambda: _running(db, ids, CONCURRENCY), what="the slots to fill")

    # Two running (acknowledged), two waiting for a slot, the rest still in the queue.
    waiting = JOBS - 2 * CONCURRENCY
    await eventually(
        lambda: _ready(wsettings, topology, waiting), what=f"{waiting} messages left ready"
    )
    assert worker.consumer.in_flight == 2 * CONCURRENCY

    gate.touch()
    await eventually(lambda: _succeeded(db, ids), what="every job to succeed")


async def test_the_prefetch_bounds_the_deliveries_of_all_queues_together(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    """Four handler slots, two queues: both queues keep deliveries waiting, and together
    no more than the worker's prefetch (four), not four per queue."""
    slots = 4
    worker = await start_worker(queues=["default", "testq"], concurrency=slots)
    assert worker.consumer.prefetch == slots
    gate = tmp_path / "gate"
    blockers = [
        await submit(db, topology, "wt_gate", GatePayload(gate=str(gate))) for _ in range(slots)
    ]
    await eventually(lambda: _running(db, blockers, slots), what="every slot to be blocked")
    extra = 6
    gated = [
        await submit(db, topology, "wt_gate", GatePayload(gate=str(gate))) for _ in range(extra)
    ]
    noops = [await submit(db, topology, "noop", NoopPayload()) for _ in range(extra)]
    await eventually(lambda: _published(db, gated + noops), what="every message published")

    # Half of the prefetch each; the rest of each queue stays with the broker.
    await eventually(lambda: _ready(wsettings, topology, extra - 2), what="testq's share")
    await eventually(
        lambda: _ready(wsettings, topology, extra - 2, "default"), what="default's share"
    )
    waiting = worker.consumer.in_flight - len(worker.runner.running)
    assert waiting == slots

    gate.touch()
    await eventually(lambda: _succeeded(db, blockers + gated + noops), what="every job")


async def _published(db: Database, ids: list[uuid.UUID]) -> bool:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM outbox WHERE job_id = ANY(%s)", (ids,))
        row = await cur.fetchone()
    return row is not None and row["n"] == 0


async def _count(db: Database, ids: list[uuid.UUID], status: str) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE status = %s AND id = ANY(%s)", (status, ids)
        )
        row = await cur.fetchone()
    return 0 if row is None else int(row["n"])


async def _running(db: Database, ids: list[uuid.UUID], expected: int) -> bool:
    return await _count(db, ids, "running") == expected


async def _succeeded(db: Database, ids: list[uuid.UUID]) -> bool:
    return await _count(db, ids, "succeeded") == len(ids)


async def _ready(
    settings: Settings, topology: Topology, expected: int, name: str = "testq"
) -> bool:
    """Whether the job queue holds ``expected`` messages not delivered to any consumer."""
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.queue_name(name), passive=True)
    return queue.declaration_result.message_count == expected
