"""Acknowledgements coalesced per channel, against the real broker.

The acks asked for in one turn of the event loop (a claim batch's commit) go out as one
``basic.ack`` with ``multiple`` where that settles nothing else, one each otherwise
(jobcore.amqp.deliveries.ChannelAcks). A multiple ack settles every unsettled delivery
of the channel up to its tag: one must never cover a delivery whose claim has not
committed, or one being requeued. What the broker did is read back from it: a freed
prefetch slot brings the next message, and closing the channel requeues exactly what
was not settled.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import aiormq
import pytest

from jobcore.amqp.deliveries import Delivery, JobQueueConsumer
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import OutboxPump, effects, status_is, submit

QUEUE = "testq"

# (delivery tag, multiple) of every basic.ack sent.
Acks = list[tuple[int, bool]]


class Held:
    """A consumer of the test queue that keeps its deliveries for the test to settle."""

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self.deliveries: list[Delivery] = []
        self.consumer = JobQueueConsumer(settings, [QUEUE])

    async def hold(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    async def start(self, prefetch: int) -> None:
        await self.consumer.start(self.hold, prefetch=prefetch)

    async def count_is(self, n: int) -> bool:
        return len(self.deliveries) == n

    def by_body(self) -> dict[bytes, Delivery]:
        return {d.body: d for d in self.deliveries}


@pytest.fixture
async def held(
    wsettings: Settings, topology: Topology, broker_cleanup: None
) -> AsyncIterator[Held]:
    held = Held(wsettings, topology)
    try:
        yield held
    finally:
        await held.consumer.close()


async def publish(settings: Settings, topology: Topology, bodies: list[bytes]) -> None:
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for body in bodies:
            await channel.default_exchange.publish(
                aio_pika.Message(body, message_id=str(uuid.uuid4())),
                routing_key=topology.queue_name(QUEUE),
            )


async def ready(settings: Settings, topology: Topology) -> int:
    """Messages of the test queue delivered to no consumer."""
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.queue_name(QUEUE), passive=True)
    count = queue.declaration_result.message_count
    assert count is not None
    return count


def ready_is(settings: Settings, topology: Topology, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await ready(settings, topology) == n

    return check


def record_acks(delivery: Delivery, acks: Acks) -> aiormq.abc.AbstractChannel:
    """Record the basic.ack frames sent on ``delivery``'s channel (then sent as usual)."""
    channel = delivery._message.channel
    send = channel.basic_ack

    async def basic_ack(delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        acks.append((delivery_tag, multiple))
        await send(delivery_tag, multiple=multiple, wait=wait)

    channel.basic_ack = basic_ack  # type: ignore[method-assign]
    return channel


def settled(delivery: Delivery) -> bool:
    return delivery.settled


def succeeded(db: Database, job_id: uuid.UUID) -> Callable[[], Awaitable[object]]:
    return lambda: status_is(db, job_id, "succeeded")


def bodies(n: int) -> list[bytes]:
    return [f"m{i}".encode() for i in range(1, n + 1)]


async def test_acks_asked_for_together_go_out_as_one_frame_the_broker_settles(
    wsettings: Settings, topology: Topology, held: Held
) -> None:
    """Five acks in one turn of the loop: one multiple ack, every delivery settled (the
    broker fills the five prefetch slots again), and none of them answered again."""
    await held.start(prefetch=5)
    await publish(wsettings, topology, bodies(10))
    await eventually(lambda: held.count_is(5), what="five deliveries held")
    first = list(held.deliveries)
    acks: Acks = []
    record_acks(first[0], acks)

    assert await asyncio.gather(*(d.ack() for d in first)) == [True] * 5
    assert acks == [(max(d.delivery_tag or 0 for d in first), True)]
    assert all(d.settled for d in first)
    # Covered by the frame of another one: settled, so never answered twice (a second
    # ack of a tag is a channel error that would cost the channel all it holds).
    assert not first[0]._message.processed
    assert await first[0].ack() is False
    assert await first[0].requeue() is False
    assert acks == [(max(d.delivery_tag or 0 for d in first), True)]

    # The broker took it for all five: their slots went to the next five messages.
    await eventually(lambda: held.count_is(10), what="the next five deliveries")
    assert await ready(wsettings, topology) == 0


async def test_a_multiple_ack_never_covers_a_delivery_still_waiting(
    wsettings: Settings, topology: Topology, held: Held
) -> None:
    """The third delivery waits (its claim has not committed) while the others are acked:
    one frame for the two below it, one each above it, and when the channel closes the
    broker gives back the third message, and only it."""
    await held.start(prefetch=6)
    await publish(wsettings, topology, bodies(6))
    await eventually(lambda: held.count_is(6), what="six deliveries held")
    by_body = held.by_body()
    tags = {body: d.delivery_tag or 0 for body, d in by_body.items()}
    assert sorted(tags.values()) == [1, 2, 3, 4, 5, 6]  # a fresh channel
    waiting = by_body[b"m3"]
    acks: Acks = []
    record_acks(waiting, acks)

    others = [d for d in held.deliveries if d is not waiting]
    assert await asyncio.gather(*(d.ack() for d in others)) == [True] * 5
    assert acks == [(tags[b"m2"], True), (tags[b"m4"], False), (tags[b"m5"], False),
                    (tags[b"m6"], False)]  # fmt: skip
    assert all(d.settled for d in others)
    assert not waiting.settled

    await held.consumer.close()
    await eventually(ready_is(wsettings, topology, 1), what="the waiting message requeued")
    again = Held(wsettings, topology)
    await again.start(prefetch=6)
    try:
        await eventually(lambda: again.count_is(1), what="the waiting message redelivered")
        assert again.deliveries[0].body == b"m3"
        assert again.deliveries[0].redelivered
    finally:
        await again.consumer.close()


async def test_a_multiple_ack_never_covers_a_requeue_under_way(
    wsettings: Settings, topology: Topology, held: Held
) -> None:
    """While the third delivery's requeue is on its way, the acks of the others do not
    pass over it: the broker requeues that message, and settles the other four."""
    await held.start(prefetch=5)
    await publish(wsettings, topology, bodies(5))
    await eventually(lambda: held.count_is(5), what="five deliveries held")
    by_body = held.by_body()
    requeued = by_body[b"m3"]
    acks: Acks = []
    channel = record_acks(requeued, acks)
    # The reject frame is held back until the acks went out.
    rejecting, release = asyncio.Event(), asyncio.Event()
    reject = channel.basic_reject

    async def basic_reject(delivery_tag: int, *, requeue: bool = True, wait: bool = True) -> None:
        rejecting.set()
        await release.wait()
        await reject(delivery_tag, requeue=requeue, wait=wait)

    channel.basic_reject = basic_reject  # type: ignore[method-assign]

    requeueing = asyncio.create_task(requeued.requeue())
    await asyncio.wait_for(rejecting.wait(), timeout=5)
    others = [d for d in held.deliveries if d is not requeued]
    assert await asyncio.gather(*(d.ack() for d in others)) == [True] * 4
    tag = {body: d.delivery_tag for body, d in by_body.items()}
    assert acks == [(tag[b"m2"], True), (tag[b"m4"], False), (tag[b"m5"], False)]
    assert not settled(requeued)
    release.set()
    assert await requeueing is True
    assert settled(requeued)

    # Its prefetch slot free again, the consumer may be sent the message anew: closed,
    # the broker holds that one message and no other.
    await held.consumer.close()
    await eventually(ready_is(wsettings, topology, 1), what="the requeued message ready")


async def test_a_reopened_channel_starts_its_tags_again_and_old_deliveries_fail_to_settle(
    wsettings: Settings, topology: Topology, held: Held
) -> None:
    """The broker closes the channel (an ack of a tag it never sent): the deliveries it
    held come again on the reopened channel, tags from 1, and are acked with one frame;
    the old deliveries' acks fail and leave them unsettled."""
    await held.start(prefetch=3)
    await publish(wsettings, topology, bodies(3))
    await eventually(lambda: held.count_is(3), what="three deliveries held")
    old = list(held.deliveries)
    broken = old[0]._message.channel
    await broken.basic_ack(99)  # PRECONDITION_FAILED: the broker closes the channel

    await eventually(lambda: held.count_is(6), timeout=30, what="the three delivered again")
    new = held.deliveries[3:]
    assert sorted(d.delivery_tag or 0 for d in new) == [1, 2, 3]
    assert all(d.redelivered for d in new)
    assert await asyncio.gather(*(d.ack() for d in old)) == [False] * 3
    assert not any(d.settled for d in old)

    acks: Acks = []
    record_acks(new[0], acks)
    assert await asyncio.gather(*(d.ack() for d in new)) == [True] * 3
    assert acks == [(3, True)]
    await held.consumer.close()
    assert await ready(wsettings, topology) == 0


async def test_a_worker_acknowledges_a_claim_batch_with_fewer_frames_than_deliveries(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs waiting when the worker starts are claimed in batches; each batch's acks go
    out in fewer frames than deliveries, and every job still runs exactly once."""
    frames: Acks = []
    send = aiormq.Channel.basic_ack

    async def basic_ack(self: aiormq.Channel, delivery_tag: int, *args: Any, **kw: Any) -> None:
        frames.append((delivery_tag, bool(kw.get("multiple"))))
        await send(self, delivery_tag, *args, **kw)

    monkeypatch.setattr(aiormq.Channel, "basic_ack", basic_ack)
    jobs = 40
    ids = [await submit(db, topology, "wt_gate", GatePayload()) for _ in range(jobs)]

    async def queued() -> bool:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM outbox WHERE job_id = ANY(%s)", (ids,)
            )
            row = await cur.fetchone()
        return row is not None and row["n"] == 0

    await eventually(queued, what="every message to be published")
    await start_worker(queues=[QUEUE], concurrency=10)
    for job_id in ids:
        await eventually(succeeded(db, job_id), timeout=30, what="each job to succeed")
        assert len(await effects(db, job_id)) == 1
    assert any(multiple for _, multiple in frames)
    assert len(frames) <= jobs // 2
