"""Dead letters are linked back to their jobs, and the sweeper recovers the job.

The queues here have a delivery limit of one, so a consumer that returns a message twice
makes RabbitMQ dead-letter it, as repeated requeues (worker restarts, nacks) would at the
default limit.
"""

from __future__ import annotations

import uuid

import aio_pika
import pytest

from jobcore.amqp.deadletters import DeadLetter, describe_parts
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.envelope import JobMessage
from jobcore.kernel.settings import Settings
from jobcore.maintenance.stranded import note_dead_letter
from jobcore.testing.jobtypes import EffectPayload
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.support import (
    OutboxPump,
    backdate,
    effects,
    job_row,
    outbox_rows,
    status_is,
    submit,
    worker_settings,
)


@pytest.fixture
def wsettings(settings: Settings) -> Settings:
    return worker_settings(settings, amqp_delivery_limit=1)


async def ready_messages(settings: Settings, name: str) -> int:
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, passive=True)
        return int(queue.declaration_result.message_count or 0)


async def requeue_until_dead_lettered(settings: Settings, topology: Topology) -> int:
    """Take the job queue's message and give it back (nack, requeue) until the broker
    dead-letters it; return how many times it was delivered."""
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    deliveries = 0
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.queue_name("testq"), passive=True)

        async def dead_lettered() -> bool:
            nonlocal deliveries
            message = await queue.get(no_ack=False, fail=False)
            if message is not None:
                deliveries += 1
                await message.nack(requeue=True)
            return await ready_messages(settings, topology.dead_letter_queue) == 1

        await eventually(dead_lettered, what="the broker to dead-letter the message")
    return deliveries


async def test_a_message_dead_lettered_at_the_delivery_limit_is_noted_and_its_job_recovered(
    db: Database,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    topology = Topology.from_settings(wsettings)
    job_id = await submit(db, topology, "effect", EffectPayload(n=7))

    async def published() -> bool:
        return not await outbox_rows(db, job_id)

    await eventually(published, what="the message to be published")
    assert await requeue_until_dead_lettered(wsettings, topology) == 2
    assert await ready_messages(wsettings, topology.queue_name("testq")) == 0

    worker = await start_worker()

    async def noted() -> dict[str, object] | None:
        note = (await job_row(db, job_id))["message_note"]
        return note if note and note["event"] == "dead_lettered" else None

    note = await eventually(noted, what="the dead letter to be noted on its job")
    assert note["attempt"] == 1
    assert note["reason"] == "delivery_limit"
    assert note["queue"] == topology.queue_name("testq")
    row = await job_row(db, job_id)
    assert (row["status"], row["last_error"], row["republish_count"]) == ("pending", None, 0)
    assert worker.metrics.counts["broker_dead_letters.delivery_limit"] == 1
    assert (
        'jobcore_worker_broker_dead_letters_total{reason="delivery_limit"} 1.0'
        in worker.metrics.render()
    )
    # The operators' dead-letter queue still holds the message.
    assert await ready_messages(wsettings, topology.dead_letter_queue) == 1

    # Once stale, the sweeper publishes it again, and the job runs once.
    await backdate(db, job_id)
    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="the job to run")
    assert [e["kind"] for e in await effects(db, job_id)] == ["effect"]
    assert row["republish_count"] == 1
    republished = row["message_note"]
    assert (republished["event"], republished["reason"]) == ("republished", "dead_lettered")
    assert republished["dead_letter"]["reason"] == "delivery_limit"
    assert worker.metrics.counts["republished.dead_lettered"] == 1
    assert worker.metrics.counts["republished.stale"] == 0


async def test_a_message_a_worker_rejected_is_counted_once_not_as_a_broker_dead_letter(
    db: Database,
    wsettings: Settings,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    topology = Topology.from_settings(wsettings)
    worker = await start_worker()
    channel = await outbox_pump.channel()
    exchange = await channel.get_exchange(topology.jobs_exchange)
    poison = JobMessage(job_id=uuid.uuid4(), attempt=1, type="nope")
    await exchange.publish(
        aio_pika.Message(poison.encode(), message_id=str(uuid.uuid4()), type="nope"),
        routing_key="testq",
        mandatory=True,
    )

    async def rejected() -> bool:
        return worker.metrics.counts["dead_lettered.unknown_type"] == 1

    await eventually(rejected, what="the worker to reject the poison message")

    async def dead_lettered() -> bool:
        return await ready_messages(wsettings, topology.dead_letter_queue) == 1

    await eventually(dead_lettered, what="the dead-letter queue to hold it")

    async def notes_taken() -> bool:
        return await ready_messages(wsettings, topology.dead_letter_notes_queue) == 0

    await eventually(notes_taken, what="the dead letter's copy to be delivered")
    await worker.stop()
    # Acknowledged (a copy left unsettled would be back in the queue once the worker
    # stopped), and not counted a second time.
    assert await ready_messages(wsettings, topology.dead_letter_notes_queue) == 0
    assert not [k for k in worker.metrics.counts if k.startswith("broker_dead_letters")]
    assert await ready_messages(wsettings, topology.dead_letter_queue) == 1


async def test_a_dead_letter_with_nul_in_its_properties_is_noted_without_them(
    db: Database, wsettings: Settings
) -> None:
    # PostgreSQL text cannot hold NUL; a foreign publisher's message id or headers can.
    topology = Topology.from_settings(wsettings)
    job_id = await submit(db, topology, "effect", EffectPayload(n=1))
    body = JobMessage(job_id=job_id, attempt=1, type="effect").encode()
    headers = {"x-first-death-reason": "expired\x00", "x-first-death-queue": "q\x00"}

    def letter(message_type: str) -> DeadLetter:
        return describe_parts(headers, body, message_id="m\x00", message_type=message_type)

    async with db.session() as session:
        assert not await note_dead_letter(session, letter("effect\x00"))
        assert await note_dead_letter(session, letter("effect"))
    note = (await job_row(db, job_id))["message_note"]
    assert (note["reason"], note["queue"], note["message_id"]) == (
        "expired\\x00",
        "q\\x00",
        "m\\x00",
    )
