"""How many more messages each broker queue may take: the relay's depth limit.

The backlog stays in PostgreSQL, where the fair claim orders it round-robin between
tenants; a broker queue is FIFO, so whatever is in it when a quiet tenant's job arrives is
ahead of that job. The relay therefore publishes to a queue only while it holds fewer
than ``limit`` ready messages (a passive declare's count: what waits ahead of a new
message; the unacknowledged ones are bounded by the workers' prefetch) plus what this
relay has claimed for it and not yet seen confirmed.

A *grant* reserves room before a claim; the part the claim did not use is given back at
once, the rest once the batch is settled (its confirmed messages are then in the queue's
count). Reading the depths, computing the room and reserving it happen under one lock,
and so does giving room back: otherwise a lane could read a depth that does not include
another lane's just-confirmed messages after that lane gave their room back, and publish
past the limit. The limit holds per relay: N replicas may together queue up to N × limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from jobcore.amqp.connection import BROKER_ERRORS
from jobcore.amqp.topology import WEBHOOKS_QUEUE, Topology
from jobcore.kernel.errors import BrokerUnavailable

# Room below this fraction of the limit is not worth a claim of its own: a batch of a few
# rows costs the same round trips as a full one. A queue at the limit is looked at again
# after this long (the relay's wait while throttled); at 2,000 jobs/s workers take ~100
# messages meanwhile, well under the default limit of 1,000.
REFILL_FRACTION = 4
RECHECK_SECONDS = 0.05
# Depths read this recently are reused while every queue stays under half the limit by
# them, plus what this relay claimed for it since (workers only take messages out): no
# passive declares on the way of a trickle's message (two broker round trips:
# docs/bench/measurements.md, "The relay's queue depth limit"), nor per batch under load.
# Another relay's messages of the meantime go uncounted for that long: with one relay
# answering NOTIFYs (the wake lease) the others publish little, and the limit holds per
# relay anyway.
DEPTH_REUSE_SECONDS = 1.0


@dataclass(slots=True)
class Grant:
    """Room reserved for one batch: messages per routing key, and the budget of a routing
    key this relay does not declare (its depth is unknown: not limited)."""

    budgets: dict[str, int]
    other_budget: int
    # Whether a queue this relay limits was left out for want of room.
    withheld: bool = False
    reserved: Counter[str] = field(default_factory=Counter)
    # Why the depths could not be read (the connection is gone or silent): the relay
    # then drops the connection so that the publisher connects again.
    broker_error: str | None = None

    @property
    def empty(self) -> bool:
        return self.other_budget == 0 and not any(self.budgets.values())

    def takes_whole(self, batch: int) -> bool:
        """Whether every routing key, named or not, has room for ``batch`` messages."""
        return (
            not self.withheld
            and self.other_budget >= batch
            and all(budget >= batch for budget in self.budgets.values())
        )


class QueueRoom:
    """Room per broker queue under ``limit`` (0: no limit, every queue always has room)."""

    def __init__(
        self,
        topology: Topology,
        queues: Collection[str],
        *,
        limit: int,
        batch_size: int,
        timeout: float,
        on_full: Callable[[str], None] | None = None,
    ) -> None:
        self.topology = topology
        # A passive declare on a connection cut without a FIN or RST never answers: bounded
        # like a publish's confirm, or the relay would wait on it for ever.
        self.timeout = timeout
        self._on_full = on_full
        self.limit = limit
        self.batch_size = batch_size
        # routing key -> queue name, for every queue this relay declares.
        self._queues = {
            topology.routing_key(q): topology.queue_name(q) for q in {*queues, WEBHOOKS_QUEUE}
        }
        self._in_flight: Counter[str] = Counter()
        # The last depths read, when (monotonic), and what this relay settled since.
        self._depths: dict[str, int] | None = None
        self._depths_read_at = 0.0
        self._settled_since_read: Counter[str] = Counter()
        # Whether a grant used the last depths read (read_ahead refreshes only those).
        self._granted_since_read = False
        self._lock = asyncio.Lock()
        self._channel: AbstractChannel | None = None
        # The connection the channel was opened on: after a reconnect it is dropped.
        self._channel_connection: AbstractConnection | None = None
        # Set by a grant that withheld a queue; the relay then looks again soon.
        self.throttled = False

    async def grant(self, connection: AbstractConnection | None) -> Grant:
        if self.limit == 0:
            return Grant(dict.fromkeys(self._queues, self.batch_size), self.batch_size)
        async with self._lock:
            try:
                depths = self._recent_depths()
                if depths is None:
                    depths = await self._read_depths(connection)
                self._granted_since_read = True
            except BrokerUnavailable as exc:
                # Nothing is claimed for the limited queues until the publisher has
                # connected again (the relay drops the connection on broker_error).
                self.throttled = True
                return Grant(
                    dict.fromkeys(self._queues, 0),
                    self.batch_size,
                    withheld=True,
                    broker_error=str(exc),
                )
            budgets: dict[str, int] = {}
            withheld = False
            for routing_key, depth in depths.items():
                room = self.limit - depth - self._in_flight[routing_key]
                if room < max(1, self.limit // REFILL_FRACTION):
                    withheld = True
                    room = 0
                    if self._on_full is not None:
                        self._on_full(routing_key)
                budgets[routing_key] = min(room, self.batch_size)
            grant = Grant(budgets, self.batch_size, withheld, Counter(budgets))
            self._in_flight.update(grant.reserved)
            self.throttled = withheld
            return grant

    async def read_ahead(self, connection: AbstractConnection | None, by: float) -> None:
        """Read the depths now if a grant used the last ones read and they will be too old
        to reuse by ``by`` (monotonic time): called while the relay waits for work, so
        the grant of the next claim finds them fresh instead of asking the broker on that
        claim's way. A failure is left to that grant, which reads again."""
        if self.limit == 0 or self._depths is None or not self._granted_since_read:
            return
        if by - self._depths_read_at <= DEPTH_REUSE_SECONDS:
            return
        async with self._lock:
            with contextlib.suppress(BrokerUnavailable):
                await self._read_depths(connection)

    async def keep(self, grant: Grant, claimed: Mapping[str, int]) -> None:
        """Give back the room the claim did not use."""
        unused = Counter({rk: n - claimed.get(rk, 0) for rk, n in grant.reserved.items()})
        await self._give_back(grant, unused)

    async def release(self, grant: Grant) -> None:
        """The batch is settled: its confirmed messages count in the queues' depths now."""
        await self._give_back(grant, Counter(grant.reserved), settled=True)

    async def _give_back(
        self, grant: Grant, amounts: Counter[str], *, settled: bool = False
    ) -> None:
        if self.limit == 0:
            return
        async with self._lock:
            for routing_key, n in amounts.items():
                n = min(n, grant.reserved[routing_key])
                grant.reserved[routing_key] -= n
                self._in_flight[routing_key] -= n
                if settled:
                    # At most n of them were confirmed: an upper bound of what went in.
                    self._settled_since_read[routing_key] += n

    def _recent_depths(self) -> dict[str, int] | None:
        """The last depths read plus what this relay settled since, if recent and every
        queue is under half the limit by them (DEPTH_REUSE_SECONDS); else None."""
        if self._depths is None:
            return None
        if time.monotonic() - self._depths_read_at > DEPTH_REUSE_SECONDS:
            return None
        depths = {rk: d + self._settled_since_read[rk] for rk, d in self._depths.items()}
        if any(depth + self._in_flight[rk] >= self.limit // 2 for rk, depth in depths.items()):
            return None
        return depths

    async def _read_depths(self, connection: AbstractConnection | None) -> dict[str, int]:
        self._depths = None
        depths = await self._depths_of(connection)
        self._depths, self._depths_read_at = depths, time.monotonic()
        self._settled_since_read.clear()
        self._granted_since_read = False
        return depths

    async def _depths_of(self, connection: AbstractConnection | None) -> dict[str, int]:
        """Ready messages per routing key; a queue that is not there yet holds none."""
        if connection is None:
            raise BrokerUnavailable("no broker connection to read queue depths on")
        depths: dict[str, int] = {}
        try:
            for routing_key, name in self._queues.items():
                channel = await self._open_channel(connection)
                try:
                    declared = await asyncio.wait_for(
                        channel.declare_queue(name, passive=True), timeout=self.timeout
                    )
                except aiormq.exceptions.ChannelNotFoundEntity:
                    # The failed declare closed the channel; the publisher redeclares the
                    # queue when its messages come back.
                    self._channel = None
                    depths[routing_key] = 0
                    continue
                depths[routing_key] = int(declared.declaration_result.message_count or 0)
        except TimeoutError as exc:
            self._channel = None
            raise BrokerUnavailable(
                f"reading queue depths got no answer within {self.timeout:g}s"
            ) from exc
        except BROKER_ERRORS as exc:
            self._channel = None
            raise BrokerUnavailable(f"reading queue depths failed: {exc}") from exc
        return depths

    async def _open_channel(self, connection: AbstractConnection) -> AbstractChannel:
        if self._channel_connection is not connection:
            # A channel of a connection the publisher replaced: never used again, and not
            # closed either (on a silent connection the close would wait for nothing).
            self._channel = None
        if self._channel is None or self._channel.is_closed:
            self._channel = await asyncio.wait_for(
                connection.channel(publisher_confirms=False), timeout=self.timeout
            )
            self._channel_connection = connection
        return self._channel

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            with contextlib.suppress(TimeoutError, *BROKER_ERRORS):
                await asyncio.wait_for(self._channel.close(), timeout=self.timeout)
        self._channel = None
        self._channel_connection = None
