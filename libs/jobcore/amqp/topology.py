"""Exchange and queue names, and their idempotent declaration.

One direct exchange for jobs, one durable quorum queue per job queue (routing key = the
queue name), and a dead-letter exchange (fanout) feeding two queues: the dead-letter queue
that operators list and replay, and the dead-letter notes queue that workers consume to
note each dead letter on its job (:mod:`jobcore.maintenance.stranded`). Quorum queues take
``x-delivery-limit``, which with the dead-letter exchange stops a message that keeps
being returned from looping forever.

Job queues dead-letter *at least once* (``x-dead-letter-strategy``, RabbitMQ 3.10 and
later, which needs ``x-overflow: reject-publish``): the queue keeps a dead letter until
the dead-letter queues confirmed it, where the default (at most once) drops it if they
are unavailable. A queue declared before this (with
:attr:`Topology.at_most_once_arguments`) cannot change its arguments, and declaring it with
others fails (PRECONDITION_FAILED): it is then declared with its old arguments and named in
a warning, and docs/operations.md ("Queue arguments") says how to upgrade it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from jobcore.kernel.errors import ConfigurationError

if TYPE_CHECKING:
    from jobcore.kernel.settings import Settings

log = logging.getLogger(__name__)

# Completion webhooks travel on the jobs exchange like job messages; the worker consumes
# this queue. Declared with every topology, so the relay can always route them.
WEBHOOKS_QUEUE = "webhooks"

# The notes queue holds copies of dead letters until a worker noted them; with no worker
# consuming it (an old release still running) it keeps the newest this many, dropping the
# oldest: the dead-letter queue keeps every original, and the sweeper is the backstop.
DEAD_LETTER_NOTES_MAX = 100_000

UPGRADE_HINT = 'see docs/operations.md, "Queue arguments"'


@dataclass(frozen=True, slots=True)
class DeclaredTopology:
    """What a declaration found: the queues asked for (by short name), and the full names
    of the queues that exist with the older, at-most-once dead-lettering arguments."""

    queues: dict[str, AbstractQueue]
    at_most_once: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str
    delivery_limit: int = 20

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        """The topology a process with ``settings`` declares and uses
        (``JOBCORE_AMQP_PREFIX``, ``JOBCORE_AMQP_DELIVERY_LIMIT``)."""
        return cls(settings.amqp_prefix, settings.amqp_delivery_limit)

    @property
    def jobs_exchange(self) -> str:
        return f"{self.prefix}.jobs"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.prefix}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.prefix}.dead"

    @property
    def dead_letter_notes_queue(self) -> str:
        return f"{self.prefix}.dead.notes"

    def queue_name(self, queue: str) -> str:
        return f"{self.prefix}.q.{queue}"

    def routing_key(self, queue: str) -> str:
        return queue

    @property
    def at_most_once_arguments(self) -> dict[str, Any]:
        """The arguments job queues were declared with before at-least-once dead-lettering."""
        return {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": self.dead_letter_exchange,
            "x-delivery-limit": self.delivery_limit,
        }

    @property
    def queue_arguments(self) -> dict[str, Any]:
        return {
            **self.at_most_once_arguments,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    async def declare_dead_letters(
        self, channel: AbstractChannel
    ) -> tuple[AbstractQueue, AbstractQueue]:
        """The dead-letter exchange and the two queues it feeds: (dead letters, notes)."""
        dlx = await channel.declare_exchange(
            self.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        dead = await channel.declare_queue(
            self.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await dead.bind(dlx, routing_key="#")
        notes = await channel.declare_queue(
            self.dead_letter_notes_queue,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-max-length": DEAD_LETTER_NOTES_MAX},
        )
        await notes.bind(dlx, routing_key="#")
        return dead, notes

    async def declare_exchanges(self, channel: AbstractChannel) -> AbstractExchange:
        """The dead-letter exchange and queues, then the jobs exchange (returned)."""
        await self.declare_dead_letters(channel)
        return await channel.declare_exchange(
            self.jobs_exchange, aio_pika.ExchangeType.DIRECT, durable=True
        )

    async def queue_arguments_for(self, channel: AbstractChannel, name: str) -> dict[str, Any]:
        """The arguments to declare queue ``name`` with: ours, or the at-most-once ones of a
        queue declared before them (then it is declared so here, and the caller warns).

        Tried on throwaway channels of the same connection: a declaration that fails closes
        the channel it ran on, and ``channel`` may be the caller's consuming channel.
        Raises :class:`~jobcore.kernel.errors.ConfigurationError` when neither set matches.
        """
        connection = (await channel.get_underlay_channel()).connection
        refusal: aiormq.exceptions.ChannelPreconditionFailed | None = None
        for arguments in (self.queue_arguments, self.at_most_once_arguments):
            probe = await connection.channel()
            try:
                await probe.queue_declare(name, durable=True, arguments=arguments)
                return arguments
            except aiormq.exceptions.ChannelPreconditionFailed as exc:
                refusal = refusal or exc
            finally:
                if not probe.is_closed:
                    await probe.close()
        raise ConfigurationError(
            f"queue {name} exists with other arguments than this configuration declares "
            f"({refusal}); check JOBCORE_AMQP_DELIVERY_LIMIT, or {UPGRADE_HINT}"
        )

    async def declare_queue(
        self, channel: AbstractChannel, exchange: AbstractExchange, queue: str
    ) -> AbstractQueue:
        name = self.queue_name(queue)
        arguments = await self.queue_arguments_for(channel, name)
        declared = await channel.declare_queue(name, durable=True, arguments=arguments)
        await declared.bind(exchange, routing_key=self.routing_key(queue))
        return declared

    async def declare_all(
        self, channel: AbstractChannel, queues: Iterable[str]
    ) -> DeclaredTopology:
        """Declare everything (idempotent), the webhooks queue included; warn about each
        queue that still dead-letters at most once."""
        exchange = await self.declare_exchanges(channel)
        wanted = set(queues)
        declared: dict[str, AbstractQueue] = {}
        at_most_once: list[str] = []
        for q in sorted(wanted | {WEBHOOKS_QUEUE}):
            declared[q] = await self.declare_queue(channel, exchange, q)
            if declared[q].arguments == self.at_most_once_arguments:
                at_most_once.append(declared[q].name)
                log.warning(
                    "queue %s was declared before at-least-once dead-lettering: unless a "
                    "policy sets dead-letter-strategy on it, a dead letter can be lost; %s",
                    declared[q].name,
                    UPGRADE_HINT,
                    extra={"queue": declared[q].name},
                )
        return DeclaredTopology({q: declared[q] for q in sorted(wanted)}, at_most_once)

    async def declare(
        self, channel: AbstractChannel, queues: Iterable[str]
    ) -> dict[str, AbstractQueue]:
        """Declare everything (idempotent), the webhooks queue included; return the queues
        asked for by their short name."""
        return (await self.declare_all(channel, queues)).queues

    async def delete(self, channel: AbstractChannel, queues: Iterable[str]) -> None:
        """Remove everything this topology declared (tests, and `jobcore topology --delete`)."""
        for q in sorted(set(queues) | {WEBHOOKS_QUEUE}):
            await channel.queue_delete(self.queue_name(q))
        await channel.queue_delete(self.dead_letter_queue)
        await channel.queue_delete(self.dead_letter_notes_queue)
        await channel.exchange_delete(self.jobs_exchange)
        await channel.exchange_delete(self.dead_letter_exchange)
