"""The dead-letter queue: look at what is in it without losing anything, and replay it.

Peeking (``jobcore dlq list``) does not requeue. A quorum queue counts every requeue
(nack, reject, or a channel closing on unacknowledged messages) against its delivery
limit, and from RabbitMQ 4.0 every quorum queue has one by default; our dead-letter
queue has no dead-letter exchange of its own, so a message over the limit would simply
be dropped — a "get and nack" peek would destroy dead letters a few listings later.
Instead each message is taken, a copy (same body, properties and headers) is published
to the tail of the same queue and confirmed, and only then is the original
acknowledged. Nothing is ever counted as redelivered; a crash between the confirm and
the ack leaves a duplicate (harmless: the inbox deduplicates replays), never a loss.
Listing every message keeps their order; listing fewer rotates those to the tail.

Replay (``jobcore dlq replay``) publishes each message back to the jobs exchange with the
routing key it was first published with (from the ``x-death`` header RabbitMQ added),
``mandatory`` and confirmed, and acknowledges it from the dead-letter queue only after
the broker confirmed the publish. Messages that cannot be routed go back to the tail.
Replaying one job's dead letters (``jobcore dlq replay-job``) takes every message once,
replays that job's and puts the others back at the tail, so they keep their order.

The dead-letter exchange is a fanout: it also feeds the notes queue, whose copies the
workers consume (:class:`DeadLetterNotesFeed`) to note each dead letter on its job
(:mod:`jobcore.maintenance.stranded`). Neither listing nor replaying goes through the exchange, so
neither adds notes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)

from jobcore.amqp.connection import BROKER_ERRORS, connect
from jobcore.amqp.deliveries import JobQueueConsumer
from jobcore.amqp.topology import Topology
from jobcore.kernel.envelope import decode
from jobcore.kernel.errors import BrokerUnavailable, PoisonMessage
from jobcore.kernel.settings import Settings

# Headers RabbitMQ adds when it dead-letters; a replayed message starts without them.
_DEATH_HEADER_PREFIXES = ("x-death", "x-first-death-", "x-last-death-", "x-delivery-count")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    message_id: str | None
    message_type: str | None
    job_id: str | None
    attempt: int | None
    reason: str | None
    queue: str | None
    routing_key: str | None
    deaths: int
    dead_lettered_at: str | None
    body_bytes: int
    body_error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ReplayReport:
    replayed: list[DeadLetter]
    skipped: list[tuple[DeadLetter, str]]


def _first_death(headers: Mapping[str, Any]) -> Mapping[str, Any]:
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[-1], Mapping):
        # x-death lists the most recent death first; the last entry is the first one.
        return deaths[-1]
    return {}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(message: AbstractIncomingMessage) -> DeadLetter:
    return describe_parts(
        message.headers or {},
        message.body,
        message_id=message.message_id,
        message_type=message.type,
    )


def describe_parts(
    headers: Mapping[str, Any], body: bytes, *, message_id: str | None, message_type: str | None
) -> DeadLetter:
    death = _first_death(headers)
    routing_keys = death.get("routing-keys")
    routing_key = (
        _text(routing_keys[0]) if isinstance(routing_keys, list) and routing_keys else None
    )
    deaths = headers.get("x-death")
    count = (
        sum(int(d.get("count", 1)) for d in deaths if isinstance(d, Mapping))
        if isinstance(deaths, list)
        else 0
    )
    when = death.get("time")
    job_id: str | None = None
    attempt: int | None = None
    body_error: str | None = None
    try:
        envelope = decode(body)
        job_id, attempt = str(envelope.job_id), envelope.attempt
    except PoisonMessage as exc:
        body_error = str(exc)
    return DeadLetter(
        message_id=message_id,
        message_type=message_type,
        job_id=job_id,
        attempt=attempt,
        reason=_text(headers.get("x-first-death-reason") or death.get("reason")),
        queue=_text(headers.get("x-first-death-queue") or death.get("queue")),
        routing_key=routing_key,
        deaths=count,
        dead_lettered_at=when.isoformat() if isinstance(when, dt.datetime) else _text(when),
        body_bytes=len(body),
        body_error=body_error,
    )


def _copy(message: AbstractIncomingMessage, headers: Mapping[str, Any]) -> aio_pika.Message:
    return aio_pika.Message(
        message.body,
        headers=dict(headers),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=message.priority,
        correlation_id=message.correlation_id,
        message_id=message.message_id,
        timestamp=message.timestamp,
        type=message.type,
        app_id=message.app_id,
    )


class DeadLetterNotesFeed(JobQueueConsumer):
    """Consumes the dead-letter notes queue: a copy of every dead letter (the dead-letter
    exchange is a fanout), for workers to note on its job. The dead-letter queue keeps the
    originals for operators, untouched."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, [])

    def prefetch_shares(self, prefetch: int) -> dict[str, int]:
        return {"dead-letter notes": prefetch}

    async def declare_queue(self, channel: AbstractChannel, name: str) -> AbstractQueue:
        _, notes = await self.topology.declare_dead_letters(channel)
        return notes


class DeadLetterQueue:
    """A short-lived connection to the dead-letter queue (one per command)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topology = Topology.from_settings(settings)

    async def _open(self) -> tuple[aio_pika.abc.AbstractConnection, AbstractChannel, AbstractQueue]:
        connection = await connect(self.settings, timeout=self.settings.db_connect_timeout)
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await self.topology.declare_exchanges(channel)
            queue = await channel.declare_queue(self.topology.dead_letter_queue, passive=True)
        except BaseException:
            await connection.close()
            raise
        return connection, channel, queue

    async def _to_tail(self, channel: AbstractChannel, message: AbstractIncomingMessage) -> None:
        """Put a confirmed copy at the end of the queue, then drop the original."""
        await channel.default_exchange.publish(
            _copy(message, message.headers or {}),
            routing_key=self.topology.dead_letter_queue,
            mandatory=True,
        )
        await message.ack()

    async def depth(self) -> int:
        """How many messages wait in the dead-letter queue (a passive declare)."""
        try:
            connection, _, queue = await self._open()
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"cannot open the dead-letter queue: {exc}") from exc
        try:
            return int(queue.declaration_result.message_count or 0)
        finally:
            await connection.close()

    async def peek(self, limit: int) -> list[DeadLetter]:
        try:
            connection, channel, queue = await self._open()
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"cannot open the dead-letter queue: {exc}") from exc
        try:
            available = queue.declaration_result.message_count or 0
            seen: list[DeadLetter] = []
            # Only the messages there when we started: copies we add go behind them.
            for _ in range(min(limit, available)):
                message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    break
                seen.append(describe(message))
                await self._to_tail(channel, message)
            return seen
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"reading the dead-letter queue failed: {exc}") from exc
        finally:
            await connection.close()

    async def replay(self, limit: int) -> ReplayReport:
        """Replay the first ``limit`` dead letters."""
        return await self._replay_where(limit, lambda _: True)

    async def replay_job(self, job_id: str) -> ReplayReport:
        """Replay the dead letters of one job (every attempt's, if several died), and leave
        the others where they were. Every message there when it starts is taken once: the
        others go to the tail, so after the whole pass they are back in their order."""
        return await self._replay_where(None, lambda letter: letter.job_id == job_id)

    async def _replay_where(
        self, limit: int | None, wanted: Callable[[DeadLetter], bool]
    ) -> ReplayReport:
        """Take each message there when it starts (at most ``limit``), replay those
        ``wanted``, and put the rest back at the tail."""
        try:
            connection, channel, queue = await self._open()
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"cannot open the dead-letter queue: {exc}") from exc
        report = ReplayReport([], [])
        try:
            exchange = await channel.get_exchange(self.topology.jobs_exchange)
            available = queue.declaration_result.message_count or 0
            for _ in range(available if limit is None else min(limit, available)):
                message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    break
                letter = describe(message)
                if not wanted(letter):
                    await self._to_tail(channel, message)
                    continue
                why_not = await self._replay_one(exchange, message, letter)
                if why_not is None:
                    await message.ack()
                    report.replayed.append(letter)
                else:
                    report.skipped.append((letter, why_not))
                    await self._to_tail(channel, message)
            return report
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"replaying the dead-letter queue failed: {exc}") from exc
        finally:
            await connection.close()

    async def _replay_one(
        self, exchange: AbstractExchange, message: AbstractIncomingMessage, letter: DeadLetter
    ) -> str | None:
        """Publish ``message`` back to its job queue, confirmed; why not, if it was not."""
        if letter.routing_key is None:
            return "no x-death routing key to replay to"
        headers = {
            k: v
            for k, v in (message.headers or {}).items()
            if not k.startswith(_DEATH_HEADER_PREFIXES)
        }
        try:
            await exchange.publish(
                _copy(message, headers), routing_key=letter.routing_key, mandatory=True
            )
        except (aiormq.exceptions.PublishError, aiormq.exceptions.DeliveryError) as exc:
            return f"the broker refused it: {exc}"
        return None
