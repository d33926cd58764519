"""The relay's room per broker queue: reservations keep concurrent lanes under the limit."""

from __future__ import annotations

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
