"""Prefetch: a worker holds no more unstarted deliveries than it has handler slots, over
all the queues it consumes together, and none once every slot runs a handler.

A delivery is acknowledged once its claim commits, so the unacknowledged ones are those
waiting for a slot. When the worker stops or dies the broker requeues them, and each
requeue counts toward the quorum queue's delivery limit: more of them than the slots
that could take them at once only adds exposure.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import aio_pika

from jobcore.amqp.deliveries import Delivery, JobQueueConsumer
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
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
    """Once every slot runs a handler the worker also stops consuming (services.worker.
    intake), so at most the deliveries sent before it paused wait, never more than its
    prefetch; the rest stay ready in the queue."""
    worker = await start_worker(queues=["testq"], concurrency=CONCURRENCY)
    gate = tmp_path / "gate"
    ids = [await submit(db, topology, "wt_gate", GatePayload(gate=str(gate))) for _ in range(JOBS)]
    await eventually(lambda: _published(db, ids), what="every message to be published")
    await eventually(lambda: _running(db, ids, CONCURRENCY), what="the slots to fill")
    await eventually(lambda: _paused(worker), what="the worker to pause")

    # A cancelled consumer still holds what it was sent (RabbitMQ counts it until those
    # are settled) and gets nothing more: the queue keeps the rest.
    async def rest_ready() -> bool:
        return await _ready(wsettings, topology, JOBS - worker.consumer.in_flight)

    await eventually(rest_ready, what="the messages not sent to stay ready")
    waiting = worker.consumer.in_flight - len(worker.executor.running)
    assert 0 <= waiting <= CONCURRENCY

    gate.touch()
    await eventually(lambda: _succeeded(db, ids), what="every job to succeed")


async def test_the_prefetch_bounds_the_deliveries_of_all_queues_together(
    wsettings: Settings, topology: Topology, broker_cleanup: None
) -> None:
    """A prefetch of four over two queues: two deliveries of each are held unsettled, and
    the rest of each queue stays with the broker (not four per queue)."""
    held: list[Delivery] = []

    async def hold(delivery: Delivery) -> None:
        held.append(delivery)

    consumer = JobQueueConsumer(wsettings, ["default", "testq"])
    await consumer.start(hold, prefetch=4)
    try:
        connection = await aio_pika.connect(wsettings.amqp_url, timeout=5)
        async with connection:
            channel = await connection.channel()
            for name in ("default", "testq"):
                for _ in range(6):
                    await channel.default_exchange.publish(
                        aio_pika.Message(b"{}"), routing_key=topology.queue_name(name)
                    )
        await eventually(lambda: _ready(wsettings, topology, 4), what="testq's share")
        await eventually(lambda: _ready(wsettings, topology, 4, "default"), what="default's")
        await eventually(lambda: _count_is(held, 4), what="four deliveries held")
        assert sorted(d.queue for d in held) == sorted(
            [topology.queue_name("default")] * 2 + [topology.queue_name("testq")] * 2
        )
    finally:
        await consumer.close()


async def _count_is(held: list[Delivery], n: int) -> bool:
    return len(held) == n


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


async def _paused(worker: Worker) -> bool:
    return worker.consumer.intake.full and not worker.consumer.broker.consuming


async def _ready(
    settings: Settings, topology: Topology, expected: int, name: str = "testq"
) -> bool:
    """Whether the job queue holds ``expected`` messages not delivered to any consumer."""
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.queue_name(name), passive=True)
    return queue.declaration_result.message_count == expected
