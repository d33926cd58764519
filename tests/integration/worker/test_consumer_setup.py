"""A broker that closes the connection while a consumer sets up (RabbitMQ 3.10 answers a
consume on a quorum queue whose replica has not started with 541 INTERNAL_ERROR) is a
transient outage: set-up raises BrokerUnavailable, which every consumer's start loop
retries, instead of an error that stops the worker. A channel error still fails."""

from __future__ import annotations

import aio_pika
import aiormq.exceptions
import pytest
from aio_pika.abc import AbstractChannel, AbstractQueue

from jobcore.amqp.deliveries import Delivery, JobQueueConsumer
from jobcore.kernel.errors import BrokerUnavailable
from jobcore.kernel.settings import Settings


class FailsFirstDeclare(JobQueueConsumer):
    def __init__(self, settings: Settings, error: Exception) -> None:
        super().__init__(settings, ["testq"])
        self.error: Exception | None = error

    async def declare_queue(self, channel: AbstractChannel, name: str) -> AbstractQueue:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return await super().declare_queue(channel, name)


async def ignore(delivery: Delivery) -> None:
    return None


async def test_a_connection_closed_during_set_up_is_a_broker_outage_and_a_retry_consumes(
    settings: Settings, amqp_channel: aio_pika.abc.AbstractChannel
) -> None:
    internal = aiormq.exceptions.ConnectionInternalError(541, "INTERNAL_ERROR")
    consumer = FailsFirstDeclare(settings, internal)
    with pytest.raises(BrokerUnavailable, match="closed the connection"):
        await consumer.start(ignore, prefetch=4)
    assert not consumer.connected
    try:
        await consumer.start(ignore, prefetch=4)
        assert consumer.connected
        queue = await amqp_channel.declare_queue(
            consumer.topology.queue_name("testq"), passive=True
        )
        assert queue.declaration_result.consumer_count == 1
    finally:
        await consumer.close()


async def test_a_channel_error_during_set_up_still_fails(
    settings: Settings, amqp_channel: aio_pika.abc.AbstractChannel
) -> None:
    refused = aiormq.exceptions.ChannelPreconditionFailed("PRECONDITION_FAILED")
    consumer = FailsFirstDeclare(settings, refused)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await consumer.start(ignore, prefetch=4)
    assert not consumer.connected
