"""The relay's room per broker queue: reservations keep concurrent lanes under the limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractConnection

from jobcore.amqp.topology import Topology
from services.relay.room import QueueRoom


def room_with_depths(depths: dict[str, int], *, limit: int = 100) -> QueueRoom:
    room = QueueRoom(Topology("p"), ["q"], limit=limit, batch_size=500, timeout=1.0)

    async def read(connection: AbstractConnection | None) -> dict[str, int]:
        return dict(depths)

    room._depths = read  # type: ignore[method-assign]  # the broker's answer, without one
    return room


async def test_room_in_flight_is_not_granted_twice_until_it_is_settled() -> None:
    depths = {"q": 30, "webhooks": 0}
    room = room_with_depths(depths)

    first = await room.grant(None)
    assert first.budgets == {"q": 70, "webhooks": 100}
    await room.keep(first, {"q": 50})  # the claim found 50 rows for q, none for webhooks

    # Another lane meanwhile: q holds 30 and 50 are on their way; 20 is under a quarter of
    # the limit, not worth a batch.
    second = await room.grant(None)
    assert second.budgets == {"q": 0, "webhooks": 100}
    assert second.withheld
    assert room.throttled

    # Confirmed: the 50 are in the queue's count now, and no longer in flight.
    await room.release(first)
    await room.release(second)
    depths["q"] = 80
    third = await room.grant(None)
    assert third.budgets["q"] == 0
    await room.release(third)
    depths["q"] = 10
    fourth = await room.grant(None)
    assert fourth.budgets["q"] == 90
    assert not room.throttled


async def test_without_a_limit_every_queue_gets_a_whole_batch_and_no_depth_is_read() -> None:
    room = QueueRoom(Topology("p"), ["q"], limit=0, batch_size=500, timeout=1.0)
    grant = await room.grant(None)  # no connection needed: nothing is read
    assert grant.budgets == {"q": 500, "webhooks": 500}
    assert grant.other_budget == 500


class _SilentChannel:
    """A channel on a connection cut without a FIN or RST: nothing it asks is answered."""

    is_closed = False

    async def declare_queue(self, name: str, *, passive: bool) -> None:
        await asyncio.Event().wait()


class _Connection:
    def __init__(self, channel: Callable[[], Awaitable[object]]) -> None:
        self._channel = channel

    async def channel(self, *, publisher_confirms: bool) -> object:
        return await self._channel()


async def test_a_depth_read_on_a_silent_connection_gives_up_after_the_timeout() -> None:
    room = QueueRoom(Topology("p"), ["q"], limit=100, batch_size=500, timeout=0.05)

    async def silent() -> object:
        return _SilentChannel()

    grant = await asyncio.wait_for(room.grant(cast(Any, _Connection(silent))), timeout=5)
    assert grant.broker_error is not None
    assert "no answer within" in grant.broker_error
    assert not any(grant.budgets.values())
    assert room.throttled


async def test_a_channel_on_a_connection_closed_by_another_lane_is_a_broker_error() -> None:
    room = QueueRoom(Topology("p"), ["q"], limit=100, batch_size=500, timeout=1.0)

    async def closed() -> object:
        raise aiormq.exceptions.ChannelInvalidStateError("No active transport in channel")

    grant = await room.grant(cast(Any, _Connection(closed)))
    assert grant.broker_error is not None
    assert "No active transport" in grant.broker_error
    assert not any(grant.budgets.values())
