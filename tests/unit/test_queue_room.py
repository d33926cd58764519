"""The relay's room per broker queue: reservations keep concurrent lanes under the limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractConnection

from jobcore.amqp.topology import Topology
from services.relay.room import DEPTH_REUSE_SECONDS, QueueRoom


def room_with_depths(
    depths: dict[str, int], *, limit: int = 100, reads: list[int] | None = None
) -> QueueRoom:
    room = QueueRoom(Topology("p"), ["q"], limit=limit, batch_size=500, timeout=1.0)

    async def read(connection: AbstractConnection | None) -> dict[str, int]:
        if reads is not None:
            reads.append(1)
        return dict(depths)

    room._depths_of = read  # type: ignore[method-assign]  # the broker's answer, without one
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


async def test_recent_depths_are_reused_while_far_from_the_limit() -> None:
    depths = {"q": 0, "webhooks": 0}
    reads: list[int] = []
    room = room_with_depths(depths, reads=reads)

    first = await room.grant(None)
    await room.keep(first, {"q": 5})
    await room.release(first)
    # Just read, and 5 claimed since: 95 left, without asking the broker again.
    second = await room.grant(None)
    assert len(reads) == 1
    assert second.budgets["q"] == 95
    await room.keep(second, {"q": 60})
    await room.release(second)

    # 65 may be in the queue now, past half the limit: the broker is asked.
    depths["q"] = 40
    third = await room.grant(None)
    assert len(reads) == 2
    assert third.budgets["q"] == 60


async def test_depths_older_than_the_reuse_window_are_read_again(monkeypatch: Any) -> None:
    reads: list[int] = []
    room = room_with_depths({"q": 0, "webhooks": 0}, reads=reads)
    await room.release(await room.grant(None))
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + DEPTH_REUSE_SECONDS + 0.1)
    await room.release(await room.grant(None))
    assert len(reads) == 2


async def test_depths_a_grant_used_are_read_ahead_of_going_stale_and_idle_ones_are_not(
    monkeypatch: Any,
) -> None:
    reads: list[int] = []
    depths = {"q": 0, "webhooks": 0}
    room = room_with_depths(depths, reads=reads)
    # Never read: nothing to read ahead (the first grant reads them).
    await room.read_ahead(None, time.monotonic() + 2 * DEPTH_REUSE_SECONDS)
    assert reads == []

    await room.release(await room.grant(None))
    assert len(reads) == 1
    now = time.monotonic()
    # Still fresh by then: not read.
    await room.read_ahead(None, now)
    assert len(reads) == 1
    # Too old to reuse by then, and a grant used them: read now, while the relay waits...
    depths["q"] = 7
    await room.read_ahead(None, now + DEPTH_REUSE_SECONDS + 0.1)
    assert len(reads) == 2
    # ...and no grant since: not read again however old they get.
    await room.read_ahead(None, now + 10 * DEPTH_REUSE_SECONDS)
    assert len(reads) == 2
    # The grant that comes within the reuse window reuses what was read ahead.
    monkeypatch.setattr(time, "monotonic", lambda: now + DEPTH_REUSE_SECONDS / 2)
    grant = await room.grant(None)
    assert len(reads) == 2
    assert grant.budgets["q"] == 93
