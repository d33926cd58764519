"""Consuming job queues: a robust connection, prefetch, and deliveries the worker settles.

The connection reconnects by itself (aio-pika's robust connection re-declares the
topology and restarts the consumers), so a broker restart costs the worker nothing but
the deliveries that were in flight: their acknowledgements fail, RabbitMQ redelivers
them, and the inbox recognises them. Settling a delivery never raises for a broken
connection; it reports whether the broker took the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from jobcore.amqp.connection import BROKER_ERRORS, connect_robust
from jobcore.amqp.topology import Topology
from jobcore.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as the worker sees it, and the two ways to settle it."""

    message_id: str | None
    message_type: str | None
    body: bytes
    headers: Mapping[str, Any]
    redelivered: bool
    _message: AbstractIncomingMessage

    async def ack(self) -> bool:
        try:
            await self._message.ack()
        except BROKER_ERRORS:
            return False
        return True

    async def dead_letter(self) -> bool:
        """Reject without requeue: the queue's dead-letter exchange takes the message."""
        try:
            await self._message.reject(requeue=False)
        except BROKER_ERRORS:
            return False
        return True


OnDelivery = Callable[[Delivery], Awaitable[None]]


class JobQueueConsumer:
    """Consumes a set of job queues on one robust connection with a shared prefetch."""

    def __init__(self, settings: Settings, queues: Iterable[str]) -> None:
        self.settings = settings
        self.topology = Topology(settings.amqp_prefix, settings.amqp_delivery_limit)
        self.queues = sorted(set(queues))
        self._connection: AbstractRobustConnection | None = None
        self._consumers: list[tuple[AbstractQueue, str]] = []
        self._lost = False

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.connected.is_set()

    async def start(self, on_delivery: OnDelivery, *, prefetch: int) -> None:
        """Connect, declare the topology (idempotent) and start consuming.

        Raises :class:`~jobcore.errors.BrokerUnavailable` if the broker cannot be reached.
        """
        connection = await connect_robust(self.settings)
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=prefetch)
            declared = await self.declare_queues(channel)

            async def deliver(message: AbstractIncomingMessage) -> None:
                await on_delivery(
                    Delivery(
                        message_id=message.message_id,
                        message_type=message.type,
                        body=message.body,
                        headers=message.headers or {},
                        redelivered=bool(message.redelivered),
                        _message=message,
                    )
                )

            for queue in declared:
                self._consumers.append((queue, await queue.consume(deliver)))
        except BaseException:
            await connection.close()
            raise
        connection.close_callbacks.add(self._on_lost)
        connection.reconnect_callbacks.add(self._on_reconnected)
        self._connection = connection

    async def declare_queues(self, channel: AbstractChannel) -> list[AbstractQueue]:
        """Declare the topology (idempotent) and return the queues to consume."""
        return list((await self.topology.declare(channel, self.queues)).values())

    def _on_lost(self, _: object, exc: BaseException | None = None) -> None:
        if self._connection is None or self._lost:
            return  # closed by us, or already reported
        self._lost = True
        log.warning(
            "broker connection lost; reconnecting (deliveries in flight will be redelivered)",
            extra={"error": f"{type(exc).__name__}: {exc}" if exc else "closed"},
        )

    def _on_reconnected(self, _: object) -> None:
        if self._lost:
            self._lost = False
            log.info("broker connected again; consuming")

    async def stop_consuming(self) -> None:
        """Ask the broker for no more deliveries; unsettled ones stay ours until close."""
        consumers, self._consumers = self._consumers, []
        for queue, tag in consumers:
            try:
                await queue.cancel(tag)
            except BROKER_ERRORS:
                log.debug("could not cancel a consumer; closing the channel ends it anyway")

    async def close(self) -> None:
        """Close the connection; the broker requeues every delivery not yet settled."""
        connection, self._connection = self._connection, None
        self._consumers = []
        if connection is not None:
            try:
                await connection.close()
            except BROKER_ERRORS:
                log.debug("closing the broker connection failed; it is gone anyway")
