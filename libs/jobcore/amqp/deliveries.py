"""Consuming job queues: a robust connection, prefetch, and deliveries the worker settles.

The connection reconnects by itself (aio-pika's robust connection re-declares the
topology and restarts the consumers; with several brokers configured, on the next one of
the list, see :mod:`jobcore.amqp.connection`), so a broker restart costs the worker nothing but
the deliveries that were in flight: their acknowledgements fail, RabbitMQ redelivers
them, and the inbox recognises them. Settling a delivery never raises for a broken
connection; it reports whether the broker took the answer. A delivery is settled once:
settling it again does nothing, so a catch-all can settle whatever is still unsettled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
)

from jobcore.amqp.connection import BROKER_ERRORS, connect_robust, connected_to
from jobcore.amqp.topology import Topology
from jobcore.errors import BrokerUnavailable, ConfigurationError
from jobcore.retry import backoff_delay
from jobcore.settings import Settings

log = logging.getLogger(__name__)

# Seconds a consume or a cancel may wait for the broker's answer.
CONSUME_TIMEOUT = 10.0
_CONSUME_ERRORS: tuple[type[BaseException], ...] = (*BROKER_ERRORS, TimeoutError)
REQUEUE_PAUSE_BASE = 1.0
REQUEUE_PAUSE_CAP = 30.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as the worker sees it, and the three ways to settle it."""

    message_id: str | None
    message_type: str | None
    body: bytes
    headers: Mapping[str, Any]
    redelivered: bool
    # Where it came from, for the process span's destination (jobcore.semconv).
    exchange: str
    routing_key: str
    queue: str
    delivery_tag: int | None
    _message: AbstractIncomingMessage

    @property
    def settled(self) -> bool:
        """Whether an answer (ack, requeue, dead letter) was sent."""
        return self._message.processed

    @property
    def delivery_count(self) -> int:
        """How many times the broker handed this message out before (quorum queues count
        every return; a first delivery has no header)."""
        count = self.headers.get("x-delivery-count")
        return count if isinstance(count, int) and count >= 0 else 0

    def requeue_pause(self) -> float:
        """How long to hold this delivery before requeueing it after an unexpected error:
        a random time in [0, min(cap, base * 2**n)] on its n-th redelivery, so a broken
        path does not spin through the delivery limit within a second."""
        return backoff_delay(
            self.delivery_count + 1, base=REQUEUE_PAUSE_BASE, cap=REQUEUE_PAUSE_CAP
        )

    async def ack(self) -> bool:
        return await self._settle(self._message.ack)

    async def requeue(self) -> bool:
        """Give the message back to its queue, for this or another worker to take again.

        Each requeue counts toward the quorum queue's delivery limit, past which the
        broker dead-letters the message."""
        return await self._settle(lambda: self._message.reject(requeue=True))

    async def dead_letter(self) -> bool:
        """Reject without requeue: the queue's dead-letter exchange takes the message."""
        return await self._settle(lambda: self._message.reject(requeue=False))

    async def _settle(self, answer: Callable[[], Awaitable[None]]) -> bool:
        """Send ``answer``; False if it was not sent (settled before, or the channel is
        gone: the broker then requeues the message when it sees the channel close)."""
        if self.settled:
            return False
        try:
            await answer()
        except BROKER_ERRORS:
            return False
        return True


OnDelivery = Callable[[Delivery], Awaitable[None]]


def split_prefetch(prefetch: int, queues: Iterable[str]) -> dict[str, int]:
    """Each queue's share of a prefetch that bounds the deliveries of all of them together.

    RabbitMQ applies a prefetch per consumer (quorum queues refuse the channel-wide,
    "global" one: the consume fails with NOT_IMPLEMENTED), so with one consumer per queue
    the sum of the shares is the bound. Sorted queues take the remainder one each.
    """
    names = sorted(set(queues))
    if prefetch < len(names):
        raise ConfigurationError(
            f"JOBCORE_WORKER_PREFETCH: a prefetch of {prefetch} cannot be shared by the "
            f"{len(names)} queues consumed ({', '.join(names)}): each needs at least one; "
            "raise JOBCORE_WORKER_PREFETCH or JOBCORE_WORKER_CONCURRENCY (--concurrency), "
            "or consume fewer queues (--queue)"
        )
    share, extra = divmod(prefetch, len(names)) if names else (0, 0)
    return {name: share + (1 if i < extra else 0) for i, name in enumerate(names)}


class JobQueueConsumer:
    """Consumes a set of job queues on one robust connection; a prefetch bounds them all."""

    def __init__(self, settings: Settings, queues: Iterable[str]) -> None:
        self.settings = settings
        self.topology = Topology.from_settings(settings)
        self.queues = sorted(set(queues))
        self._connection: AbstractRobustConnection | None = None
        self._consumers: list[tuple[AbstractQueue, str]] = []
        # What resume() needs to consume again: each queue and its callback.
        self._consumable: list[tuple[AbstractQueue, Callable[[AbstractIncomingMessage], Any]]] = []
        self._arguments: dict[str, Any] = {}
        # Each paused queue's last consumer tag, and cancels sent again after a reopen.
        self._cancelled: dict[str, str] = {}
        self._recancels: set[asyncio.Task[None]] = set()
        self._lost = False

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.connected.is_set()

    async def start(
        self, on_delivery: OnDelivery, *, prefetch: int, priority: int | None = None
    ) -> None:
        """Connect, declare the topology (idempotent) and start consuming, with at most
        ``prefetch`` deliveries unsettled over all the queues together, as consumers of
        ``priority`` (RabbitMQ's ``x-priority``: a queue's messages go to its
        highest-priority consumer with room, round-robin among equals).

        Raises :class:`~jobcore.errors.BrokerUnavailable` if the broker cannot be reached,
        :class:`~jobcore.errors.ConfigurationError` if ``prefetch`` is below the queues.
        """
        shares = self.prefetch_shares(prefetch)
        self._arguments = {} if priority is None else {"x-priority": priority}
        connection = await connect_robust(self.settings)
        try:

            def deliverer(queue: str) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
                async def deliver(message: AbstractIncomingMessage) -> None:
                    await on_delivery(
                        Delivery(
                            message_id=message.message_id,
                            message_type=message.type,
                            body=message.body,
                            headers=message.headers or {},
                            redelivered=bool(message.redelivered),
                            exchange=message.exchange or "",
                            routing_key=message.routing_key or "",
                            queue=queue,
                            delivery_tag=message.delivery_tag,
                            _message=message,
                        )
                    )

                return deliver

            # A channel per queue: a robust channel re-applies its one prefetch to every
            # consumer it restores after a reconnect, so queues sharing a channel would
            # all come back with the last share set on it.
            for name, share in shares.items():
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=share)
                queue = await self.declare_queue(channel, name)
                self._consumable.append((queue, deliverer(queue.name)))
                if isinstance(channel, AbstractRobustChannel):
                    channel.reopen_callbacks.add(
                        lambda _, queue=queue: self._on_reopened(queue), weak=False
                    )
            await self.resume()
        except (TimeoutError, ConnectionError) as exc:
            # The broker closed the whole connection mid set-up. RabbitMQ 3.10 does that
            # (541 INTERNAL_ERROR) for a consume on a quorum queue whose replica has not
            # started yet: transient, so the caller's retry loop takes it, like a refused
            # connect. A channel error (a queue declared with other arguments) still fails.
            self._consumers, self._consumable = [], []
            with contextlib.suppress(*BROKER_ERRORS):
                await connection.close()
            raise BrokerUnavailable(f"the broker closed the connection: {exc!r}") from exc
        except BaseException:
            self._consumers, self._consumable = [], []
            await connection.close()
            raise
        connection.close_callbacks.add(self._on_lost)
        connection.reconnect_callbacks.add(self._on_reconnected)
        self._connection = connection

    def prefetch_shares(self, prefetch: int) -> dict[str, int]:
        """Each consumed queue's share of the prefetch."""
        return split_prefetch(prefetch, self.queues)

    async def declare_queue(self, channel: AbstractChannel, name: str) -> AbstractQueue:
        """Declare the topology (idempotent) and return the queue ``name`` to consume."""
        return (await self.topology.declare(channel, [name]))[name]

    def _on_lost(self, _: object, exc: BaseException | None = None) -> None:
        if self._connection is None or self._lost:
            return  # closed by us, or already reported
        self._lost = True
        log.warning(
            "broker connection lost; reconnecting (deliveries in flight will be redelivered)",
            extra={"error": f"{type(exc).__name__}: {exc}" if exc else "closed"},
        )

    def _on_reconnected(self, connection: object) -> None:
        if self._lost:
            self._lost = False
            log.info(
                "broker connected again; consuming", extra={"broker": connected_to(connection)}
            )

    @property
    def consuming(self) -> bool:
        """Whether the broker may send deliveries (started and not paused)."""
        return bool(self._consumers)

    async def resume(self) -> bool:
        """Consume every queue again after :meth:`pause` (at start: for the first time).
        False when the broker did not take it (it is away): nothing is restored by the
        connection then, so the caller tries again once it is back."""
        consuming = {queue.name for queue, _ in self._consumers}
        for queue, callback in self._consumable:
            if queue.name in consuming:
                continue
            try:
                tag = await queue.consume(
                    callback, arguments=self._arguments, timeout=CONSUME_TIMEOUT
                )
            except _CONSUME_ERRORS as exc:
                if not self._connection:
                    raise  # during start(): its own handling says what failed
                log.debug("could not consume again; retrying", extra={"error": repr(exc)})
                return False
            self._consumers.append((queue, tag))
        return True

    async def pause(self) -> None:
        """Ask the broker for no more deliveries until :meth:`resume`; those already sent
        stay ours to settle. A consumer whose cancel was interrupted stays listed, so the
        next pause (or :meth:`stop_consuming`) cancels it; one whose channel is gone ended
        with it."""
        for entry in list(self._consumers):
            queue, tag = entry
            self._cancelled[queue.name] = tag
            try:
                await queue.cancel(tag, timeout=CONSUME_TIMEOUT)
            except _CONSUME_ERRORS:
                log.debug("could not cancel a consumer; closing the channel ends it anyway")
            self._consumers.remove(entry)

    def _on_reopened(self, queue: AbstractQueue) -> None:
        """A channel came back (alone, or with the connection). aio-pika forgets a cancelled
        consumer, but a restore that had already listed it brings it back: if this queue is
        paused, cancel its last tag again (a tag the broker does not know is ignored)."""
        tag = self._cancelled.get(queue.name)
        if tag is None or any(q.name == queue.name for q, _ in self._consumers):
            return
        task = asyncio.create_task(self._cancel_again(queue, tag), name="consumer-recancel")
        self._recancels.add(task)
        task.add_done_callback(self._recancels.discard)

    async def _cancel_again(self, queue: AbstractQueue, tag: str) -> None:
        with contextlib.suppress(*_CONSUME_ERRORS):
            await queue.cancel(tag, timeout=CONSUME_TIMEOUT)

    async def stop_consuming(self) -> None:
        """Ask the broker for no more deliveries; unsettled ones stay ours until close."""
        self._consumable = []
        await self.pause()

    async def close(self) -> None:
        """Close the connection; the broker requeues every delivery not yet settled."""
        connection, self._connection = self._connection, None
        self._consumers, self._consumable = [], []
        for task in self._recancels:
            task.cancel()
        if connection is not None:
            try:
                await connection.close()
            except BROKER_ERRORS:
                log.debug("closing the broker connection failed; it is gone anyway")
