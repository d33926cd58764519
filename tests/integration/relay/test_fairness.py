"""The relay in this process with a tenant's backlog: the broker queue is kept at most at
its depth limit, and another tenant's new message goes out ahead of that backlog."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable

import aio_pika

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from services.relay.relay import Relay
from services.relay.room import REFILL_FRACTION
from services.worker.app import Worker
from tests.integration.relay.helpers import fill_outbox, outbox_count, running_relay
from tests.integration.worker.support import worker_settings

LIMIT = 100
BACKLOG = 1500


class QueueDepth:
    """Ready messages in the test queue, by passive declare; every reading is kept."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel, topology: Topology) -> None:
        self.channel = channel
        self.name = topology.queue_name("testq")
        self.readings: list[int] = []

    async def read(self) -> int:
        queue = await self.channel.declare_queue(self.name, passive=True)
        depth = int(queue.declaration_result.message_count or 0)
        self.readings.append(depth)
        return depth


async def take(
    channel: aio_pika.abc.AbstractChannel, topology: Topology, n: int
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Consume ``n`` messages from the test queue, one basic.get each, in queue order
    (waiting for the relay to refill it when it is empty)."""
    queue = await channel.get_queue(topology.queue_name("testq"), ensure=False)
    taken: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def one_more() -> bool:
        message = await queue.get(no_ack=True, fail=False, timeout=5)
        if message is not None:
            taken.append(message)
        return message is not None

    for _ in range(n):
        await eventually(one_more, timeout=20, what=f"message {len(taken) + 1} of {n}")
    return taken


async def test_the_relay_never_fills_a_queue_past_its_depth_limit(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    await topology.declare(amqp_channel, default_registry.queues())
    await fill_outbox(db, topology, BACKLOG, tenant="a")
    depth = QueueDepth(amqp_channel, topology)

    async with running_relay(settings, db, queue_depth_limit=LIMIT) as relay:
        await eventually(
            lambda: _is(depth.read(), LIMIT), timeout=20, interval=0.01, what="a full queue"
        )
        # The relay keeps looking while rows wait; ten more looks that found the queue full
        # must publish nothing more.
        looks = _full_looks(relay)

        async def looked_again() -> bool:
            await depth.read()
            return _full_looks(relay) >= looks + 10

        await eventually(looked_again, timeout=20, interval=0.01, what="the relay to look again")
        assert await outbox_count(db) == BACKLOG - LIMIT

        # Workers take some: the relay refills towards the limit (it tops up once a
        # quarter of it is free, so how far depends on when it looks), never past it.
        await take(amqp_channel, topology, 60)

        async def refilled() -> bool:
            return await depth.read() > LIMIT - LIMIT // REFILL_FRACTION

        await eventually(refilled, timeout=20, interval=0.01, what="a refill")

        # Every published message is in the queue or was taken: none lost, none extra
        # (once the relay committed its last batch: rows go after their confirms).
        async def accounted() -> bool:
            return BACKLOG - await outbox_count(db) - 60 == await depth.read()

        await eventually(accounted, timeout=20, what="the published rows to be deleted")

    assert max(depth.readings) == LIMIT


async def test_a_quiet_tenants_message_goes_out_ahead_of_anothers_backlog(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    await topology.declare(amqp_channel, default_registry.queues())
    await fill_outbox(db, topology, BACKLOG, tenant="a")
    depth = QueueDepth(amqp_channel, topology)

    async with running_relay(settings, db, queue_depth_limit=LIMIT):
        await eventually(lambda: _is(depth.read(), LIMIT), timeout=20, what="a full queue")
        # Tenant b's message is written after all of a's: FIFO would publish it last.
        [quiet] = await fill_outbox(db, topology, 1, tenant="b")
        order = [str(m.message_id) for m in await take(amqp_channel, topology, 3 * LIMIT)]

    # Behind what the queue already held, within the next batch, not behind 1,400 rows.
    assert quiet["message_id"] in order
    assert order.index(quiet["message_id"]) <= LIMIT + 1


async def test_with_fairness_off_the_outbox_goes_out_oldest_first(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """The bench's baseline: the claim before fairness, which the test above beats."""
    await topology.declare(amqp_channel, default_registry.queues())
    backlog = await fill_outbox(db, topology, 300, tenant="a")
    [quiet] = await fill_outbox(db, topology, 1, tenant="b")

    async with running_relay(settings, db, fair_claim=False, queue_depth_limit=0):
        order = [str(m.message_id) for m in await _take_when_there(amqp_channel, topology, 301)]

    assert order == [r["message_id"] for r in backlog] + [quiet["message_id"]]


async def test_a_backlog_next_to_many_tenants_delayed_jobs_goes_out_in_whole_batches(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """Lanes whose rows are all for later take no share of a batch: 600 due rows of one
    tenant next to 100 tenants' delayed jobs go out in two batches (500 + 100), not in
    batches of ceil(500 / 101) = 5."""
    await topology.declare(amqp_channel, default_registry.queues())
    for n in range(100):
        await fill_outbox(db, topology, 1, tenant=f"later-{n}", delay=3600, notify=False)
    await fill_outbox(db, topology, 600, tenant="big")

    async with running_relay(settings, db, queue_depth_limit=0) as relay:

        async def only_later_rows_left() -> bool:
            return await outbox_count(db) == 100

        await eventually(only_later_rows_left, timeout=30, what="the due rows published")
        registry = relay.metrics.registry
        batches = registry.get_sample_value("jobcore_relay_batch_rows_count")
        rows = registry.get_sample_value("jobcore_relay_batch_rows_sum")

    assert relay.options.batch_size == 500
    assert rows == 600
    assert batches is not None
    assert batches <= 3, f"{batches} batches for 600 rows"


async def _take_when_there(
    channel: aio_pika.abc.AbstractChannel, topology: Topology, n: int
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    depth = QueueDepth(channel, topology)
    await eventually(lambda: _is(depth.read(), n), timeout=20, what=f"{n} messages queued")
    return await take(channel, topology, n)


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def _full_looks(relay: Relay) -> float:
    """How many times the relay found the test queue too full for a batch."""
    value = relay.metrics.registry.get_sample_value(
        "jobcore_relay_queue_full_total", {"queue": "testq"}
    )
    return value or 0.0


async def test_a_quiet_tenants_job_starts_before_most_of_anothers_backlog(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """Enqueue, relay and worker for real: tenant b's job, enqueued while tenant a's
    backlog drains, is started by the worker before most of that backlog."""
    wsettings = worker_settings(settings)
    await topology.declare(amqp_channel, default_registry.queues())
    backlog = 1000
    await _enqueue_echo(db, topology, "a", backlog)

    async with running_relay(wsettings, db, queue_depth_limit=50):
        worker = Worker(wsettings, queues=["testq"], concurrency=8, health=False, webhooks=False)
        await worker.start()
        try:
            await eventually(
                lambda: _at_least(_succeeded(db, "a"), 50), timeout=60, what="a's jobs to run"
            )
            [quiet] = await _enqueue_echo(db, topology, "b", 1)
            await eventually(
                lambda: _at_least(_succeeded(db, None), backlog + 1),
                timeout=120,
                what="every job to succeed",
            )
        finally:
            await worker.stop()

    async with db.connection() as conn:
        cur = await conn.execute(
            """
            SELECT count(*) FILTER (WHERE a.started_at > b.started_at) AS after,
                   count(*) FILTER (WHERE a.created_at < b.created_at) AS older
            FROM jobs AS a, jobs AS b
            WHERE b.id = %s AND a.tenant = 'a'
            """,
            (quiet,),
        )
        row = await cur.fetchone()
    assert row is not None
    # Every one of a's jobs was enqueued before b's; FIFO would start them all first.
    assert row["older"] == backlog
    assert row["after"] >= backlog // 2, row


async def _enqueue_echo(db: Database, topology: Topology, tenant: str, n: int) -> list[uuid.UUID]:
    ids = []
    async with db.unit_of_work() as uow:
        for i in range(n):
            result = await enqueue(
                uow,
                topology,
                EnqueueRequest(
                    tenant=tenant,
                    job_type=default_registry.get("echo"),
                    payload=EchoPayload(text=f"{tenant}{i}"),
                ),
            )
            ids.append(result.job_id)
        await uow.commit()
    return ids


async def _succeeded(db: Database, tenant: str | None) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE status = 'succeeded' "
            "AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)",
            {"tenant": tenant},
        )
        row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def _at_least(value: Awaitable[int], expected: int) -> bool:
    return await value >= expected
