"""The loop every queue consumer shares (jobcore.amqp.consuming): a start retried while the
broker is away, a task per delivery, and a stop that drains within the grace period."""

from __future__ import annotations

import asyncio
from typing import Any

from jobcore.amqp.consuming import DeliveryConsumer
from jobcore.amqp.deliveries import Delivery
from jobcore.kernel.errors import BrokerUnavailable
from jobcore.testing.waiting import eventually


class FakeBroker:
    def __init__(self, refusals: int = 0) -> None:
        self.refusals = refusals
        self.calls: list[str] = []
        self.on_delivery: Any = None

    async def start(self, on_delivery: Any, *, prefetch: int, priority: int | None) -> None:
        self.calls.append(f"start {prefetch} {priority}")
        if self.refusals:
            self.refusals -= 1
            raise BrokerUnavailable("connection refused")
        self.on_delivery = on_delivery

    async def stop_consuming(self) -> None:
        self.calls.append("stop_consuming")

    async def close(self) -> None:
        self.calls.append("close")


class Recorder(DeliveryConsumer):
    name = "test-consumer"

    def __init__(self, broker: FakeBroker, grace: float = 5.0) -> None:
        super().__init__(broker, prefetch=3, grace=grace, priority=7)  # type: ignore[arg-type]
        self.release = asyncio.Event()
        self.handled: list[str] = []
        self.hooks: list[str] = []

    async def handle(self, message: Delivery) -> None:
        try:
            await self.release.wait()
            self.handled.append(str(message.message_id))
        except asyncio.CancelledError:
            self.handled.append(f"cancelled {message.message_id}")
            raise

    async def started(self) -> None:
        self.hooks.append("started")

    async def stop_taking(self) -> None:
        self.hooks.append("stop_taking")

    async def grace_over(self) -> None:
        self.hooks.append(f"grace_over {self.in_flight}")

    async def closed(self) -> None:
        self.hooks.append("closed")


def delivery(message_id: str) -> Any:
    class Message:
        pass

    message = Message()
    message.message_id = message_id  # type: ignore[attr-defined]
    return message


async def test_a_start_refused_by_the_broker_is_tried_again_until_it_consumes() -> None:
    broker = FakeBroker(refusals=1)
    consumer = Recorder(broker)
    await consumer.start()
    await eventually(lambda: _true(consumer.consuming), timeout=5, what="consuming")
    assert broker.calls == ["start 3 7", "start 3 7"]
    assert consumer.hooks == ["started"]
    await consumer.stop(5)
    assert broker.calls[-2:] == ["stop_consuming", "close"]
    assert consumer.hooks == ["started", "stop_taking", "stop_taking", "closed"]


async def test_stopping_lets_deliveries_in_flight_finish_and_refuses_new_ones() -> None:
    broker = FakeBroker()
    consumer = Recorder(broker)
    await consumer.start()
    await eventually(lambda: _true(consumer.consuming), timeout=5, what="consuming")
    await broker.on_delivery(delivery("a"))
    assert consumer.in_flight == 1
    stopping = asyncio.create_task(consumer.stop(10))
    await eventually(lambda: _true(not consumer.consuming), timeout=5, what="stopping")
    await broker.on_delivery(delivery("late"))  # left to the broker to requeue
    assert consumer.in_flight == 1
    consumer.release.set()
    await stopping
    assert consumer.handled == ["a"]
    assert "grace_over 1" not in consumer.hooks


async def test_deliveries_still_running_after_the_grace_period_are_cancelled() -> None:
    broker = FakeBroker()
    consumer = Recorder(broker, grace=0.05)
    await consumer.start()
    await eventually(lambda: _true(consumer.consuming), timeout=5, what="consuming")
    await broker.on_delivery(delivery("slow"))
    await consumer.stop(10)
    assert consumer.handled == ["cancelled slow"]
    assert consumer.hooks == ["started", "stop_taking", "grace_over 1", "stop_taking", "closed"]
    assert consumer.in_flight == 0


async def _true(value: bool) -> bool:
    return value
