"""Exchange and queue names, and their idempotent declaration.

One direct exchange for jobs, one durable quorum queue per job queue (routing key = the
queue name), and a dead-letter exchange and queue. Quorum queues take
``x-delivery-limit``, which with the dead-letter exchange stops a message that keeps
being returned from looping forever.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

# Completion webhooks travel on the jobs exchange like job messages; the worker consumes
# this queue. Declared with every topology, so the relay can always route them.
WEBHOOKS_QUEUE = "webhooks"


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str
    delivery_limit: int = 20

    @property
    def jobs_exchange(self) -> str:
        return f"{self.prefix}.jobs"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.prefix}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.prefix}.dead"

    def queue_name(self, queue: str) -> str:
        return f"{self.prefix}.q.{queue}"

    def routing_key(self, queue: str) -> str:
        return queue

    async def declare_exchanges(self, channel: AbstractChannel) -> AbstractExchange:
        dlx = await channel.declare_exchange(
            self.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        dead = await channel.declare_queue(
            self.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await dead.bind(dlx, routing_key="#")
        return await channel.declare_exchange(
            self.jobs_exchange, aio_pika.ExchangeType.DIRECT, durable=True
        )

    async def declare_queue(
        self, channel: AbstractChannel, exchange: AbstractExchange, queue: str
    ) -> AbstractQueue:
        declared = await channel.declare_queue(
            self.queue_name(queue),
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": self.dead_letter_exchange,
                "x-delivery-limit": self.delivery_limit,
            },
        )
        await declared.bind(exchange, routing_key=self.routing_key(queue))
        return declared

    async def declare(
        self, channel: AbstractChannel, queues: Iterable[str]
    ) -> dict[str, AbstractQueue]:
        """Declare everything (idempotent), the webhooks queue included; return the queues
        asked for by their short name."""
        exchange = await self.declare_exchanges(channel)
        wanted = set(queues)
        declared = {
            q: await self.declare_queue(channel, exchange, q)
            for q in sorted(wanted | {WEBHOOKS_QUEUE})
        }
        return {q: declared[q] for q in sorted(wanted)}

    async def delete(self, channel: AbstractChannel, queues: Iterable[str]) -> None:
        """Remove everything this topology declared (tests, and `jobcore topology --delete`)."""
        for q in sorted(set(queues) | {WEBHOOKS_QUEUE}):
            await channel.queue_delete(self.queue_name(q))
        await channel.queue_delete(self.dead_letter_queue)
        await channel.exchange_delete(self.jobs_exchange)
        await channel.exchange_delete(self.dead_letter_exchange)
