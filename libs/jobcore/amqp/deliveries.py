"""Consuming job queues: a robust connection, prefetch, and deliveries the worker settles.

The connection reconnects by itself (aio-pika's robust connection re-declares the
topology and restarts the consumers; with several brokers configured, on the next one of
the list, see :mod:`jobcore.amqp.connection`), so a broker restart costs the worker nothing but
the deliveries that were in flight: their acknowledgements fail, RabbitMQ redelivers
them, and the inbox recognises them. Settling a delivery never raises for a broken
connection; it reports whether the broker took the answer. A delivery is settled once:
settling it again does nothing, so a catch-all can settle whatever is still unsettled.

Acknowledgements are coalesced per channel (:class:`ChannelAcks`): the acks asked for
while the event loop was busy (a claim batch's commit makes many deliveries ackable at
once) go out together, as one ``basic.ack`` with ``multiple`` up to the highest tag
below which every delivery of the channel is acked now or settled before, and singly for
the rest. A multiple ack settles every unsettled delivery up to its tag, so a delivery
still waiting for its claim, or being requeued or dead-lettered, ends the covered run:
nothing is acknowledged before its claim committed (docs/design.md, invariant 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
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
from jobcore.kernel.errors import BrokerUnavailable, ConfigurationError
from jobcore.kernel.retry import backoff_delay
from jobcore.kernel.settings import Settings

log = logging.getLogger(__name__)

# Seconds a consume or a cancel may wait for the broker's answer.
CONSUME_TIMEOUT = 10.0
_CONSUME_ERRORS: tuple[type[BaseException], ...] = (*BROKER_ERRORS, TimeoutError)
REQUEUE_PAUSE_BASE = 1.0
REQUEUE_PAUSE_CAP = 30.0


class _Answer(enum.Enum):
    WAITING = "waiting"  # no answer asked for yet
    QUEUED = "queued"  # an ack, waiting for the channel's next flush
    SENDING = "sending"  # an answer on its way (or cut off: its fate is unknown)


class ChannelAcks:
    """The deliveries of one channel that are not settled yet, and their acks, coalesced.

    A delivery is registered when it arrives and leaves once an answer for it was sent.
    :meth:`ack` queues the delivery's ack; a flush, started on the next turn of the event
    loop, sends every ack queued meanwhile: one ``basic.ack`` with ``multiple`` for the
    queued tags below the lowest unsettled tag that is not queued (RabbitMQ settles every
    unsettled tag up to the one given), one each for the others. A flush holds an ack for
    one turn of the loop, not longer: a held ack keeps a prefetch slot.

    Tags are those of one channel (they restart at 1 on a new one, so a reopened channel
    gets a new ``ChannelAcks``). A multiple ack also needs every tag below it to have been
    registered: a delivery the client dropped (aiormq drops one for a consumer it no
    longer knows) is unsettled on the broker but unknown here. So a tag that arrives out
    of sequence turns multiple acks off for the rest of the channel's life.
    """

    def __init__(self, channel: object = None) -> None:
        # The client's channel the tags belong to (compared by identity only).
        self.channel = channel
        # Every tag up to this one was registered, in sequence.
        self._seen_upto = 0
        self._in_sequence = True
        # Registered tags not settled yet: bounded by the prefetch while the channel lives.
        self._open: dict[int, _Answer] = {}
        self._queued: dict[int, tuple[AbstractIncomingMessage, asyncio.Future[bool]]] = {}
        self._flushing: asyncio.Task[None] | None = None

    def register(self, tag: int) -> None:
        """A delivery arrived with ``tag``."""
        if tag != self._seen_upto + 1:
            if self._in_sequence:
                log.debug(
                    "delivery tags out of sequence; acknowledging one by one on this channel",
                    extra={"tag": tag, "expected": self._seen_upto + 1},
                )
            self._in_sequence = False
        self._seen_upto = max(self._seen_upto, tag)
        self._open.setdefault(tag, _Answer.WAITING)

    def settled(self, tag: int) -> bool:
        """Whether an answer for ``tag`` was sent (alone or covered by a multiple ack)."""
        return tag not in self._open

    async def answer(self, tag: int, send: Callable[[], Awaitable[None]]) -> bool:
        """Send an answer other than an ack (a reject) for ``tag`` at once. Until it is
        sent, no multiple ack covers the tag (its frame would reach the broker first)."""
        if self._open.get(tag) is not _Answer.WAITING:
            return False
        self._open[tag] = _Answer.SENDING
        try:
            await send()
        except BROKER_ERRORS:
            # Not sent: the channel is gone, and with it every delivery it held.
            self._open[tag] = _Answer.WAITING
            return False
        # Cut off (cancelled) mid-send, it stays SENDING: sent or not, it is not
        # answered again, and no multiple ack passes over it.
        del self._open[tag]
        return True

    async def ack(self, message: AbstractIncomingMessage) -> bool:
        """Acknowledge ``message`` in the channel's next flush; whether the ack was sent."""
        tag = message.delivery_tag
        if tag is None or self._open.get(tag) is not _Answer.WAITING:
            return False
        self._open[tag] = _Answer.QUEUED
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queued[tag] = (message, future)
        if self._flushing is None:
            # A task starts after the callbacks already scheduled: the deliveries the same
            # commit woke up queue their acks before it runs.
            self._flushing = asyncio.create_task(self._flush(), name="acks")
        # A caller that gives up leaves its ack queued: the claim committed all the same.
        return await future

    async def _flush(self) -> None:
        batch: dict[int, tuple[AbstractIncomingMessage, asyncio.Future[bool]]] = {}
        try:
            while self._queued:
                batch, self._queued = self._queued, {}
                for tag in batch:
                    self._open[tag] = _Answer.SENDING
                for tags, multiple in self._frames(sorted(batch)):
                    await self._send(batch, tags, multiple=multiple)
                batch = {}
        finally:
            self._flushing = None
            # Only left if the flush was cancelled: what was not sent is answered no (what
            # was being sent stays SENDING), so no caller waits for ever.
            for tag, (_, future) in self._queued.items():
                self._open[tag] = _Answer.WAITING
                if not future.done():
                    future.set_result(False)
            self._queued.clear()
            for _, future in batch.values():
                if not future.done():
                    future.set_result(False)

    def _frames(self, tags: list[int]) -> list[tuple[list[int], bool]]:
        """The acks for the sorted ``tags``: one multiple ack for those below every other
        unsettled tag, one each for the rest."""
        covered: list[int] = []
        if self._in_sequence:
            # Every tag up to self._seen_upto was registered, so one not in self._open was
            # settled: those below the lowest unsettled tag of another delivery (waiting,
            # being rejected, or queued for the next flush) are all in ``tags``.
            batch = set(tags)
            bound = min((t for t in self._open if t not in batch), default=self._seen_upto + 1)
            covered = [t for t in tags if t < bound]
        frames: list[tuple[list[int], bool]] = []
        if len(covered) > 1:
            frames.append((covered, True))
        else:
            covered = []
        frames.extend(([t], False) for t in tags if t not in covered)
        return frames

    async def _send(
        self,
        batch: dict[int, tuple[AbstractIncomingMessage, asyncio.Future[bool]]],
        tags: list[int],
        *,
        multiple: bool,
    ) -> None:
        # The highest tag's message carries the frame; aio-pika marks only that message
        # processed: the others covered are settled by leaving self._open.
        message, _ = batch[tags[-1]]
        try:
            await message.ack(multiple=multiple)
            sent = True
        except BROKER_ERRORS:
            sent = False  # the channel is gone: the broker requeues what it held
        except Exception as exc:
            # Not the broker's doing: each caller gets the error, as from its own ack,
            # and the tags stay SENDING (whether the frame went out is unknown).
            for tag in tags:
                _, future = batch.pop(tag)
                if not future.done():
                    future.set_exception(exc)
            return
        for tag in tags:
            if sent:
                del self._open[tag]
            else:
                self._open[tag] = _Answer.WAITING
            _, future = batch.pop(tag)
            if not future.done():
                future.set_result(sent)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as the worker sees it, and the three ways to settle it."""

    message_id: str | None
    message_type: str | None
    body: bytes
    headers: Mapping[str, Any]
    redelivered: bool
    # Where it came from, for the process span's destination (jobcore.telemetry.semconv).
    exchange: str
    routing_key: str
    queue: str
    delivery_tag: int | None
    _message: AbstractIncomingMessage
    # Its channel's unsettled deliveries; None: each answer is sent on its own.
    _acks: ChannelAcks | None = None

    @property
    def settled(self) -> bool:
        """Whether an answer (ack, requeue, dead letter) was sent: for this delivery, or
        for a later one of its channel by a multiple ack that covered it."""
        if self._message.processed:
            return True
        tag = self.delivery_tag
        return self._acks is not None and tag is not None and self._acks.settled(tag)

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
        """Acknowledge, with the other acks of its channel asked for meanwhile (at most
        one turn of the event loop later; see :class:`ChannelAcks`)."""
        if self.settled:
            return False
        if self._acks is None:
            return await self._settle(self._message.ack)
        return await self._acks.ack(self._message)

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
        if self._acks is not None and self.delivery_tag is not None:
            return await self._acks.answer(self.delivery_tag, answer)
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

        Raises :class:`~jobcore.kernel.errors.BrokerUnavailable` if the broker cannot be reached,
        :class:`~jobcore.kernel.errors.ConfigurationError` if ``prefetch`` is below the queues.
        """
        shares = self.prefetch_shares(prefetch)
        self._arguments = {} if priority is None else {"x-priority": priority}
        connection = await connect_robust(self.settings)
        try:

            def deliverer(queue: str) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
                # The acks of the queue's channel; a new one when the channel was reopened
                # (its delivery tags start again at 1).
                acks = ChannelAcks()

                async def deliver(message: AbstractIncomingMessage) -> None:
                    nonlocal acks
                    tracked: ChannelAcks | None = None
                    if message.delivery_tag and not message.processed:
                        try:
                            channel = message.channel
                        except BROKER_ERRORS:
                            channel = None  # closed already: its answers fail, one by one
                        if channel is not None:
                            if acks.channel is not channel:
                                acks = ChannelAcks(channel)
                            acks.register(message.delivery_tag)
                            tracked = acks
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
                            _acks=tracked,
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
