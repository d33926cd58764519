"""The coalesced acks of one channel as pure logic, on stand-in messages: the cases the
broker tests cannot stage (a delivery the client dropped, a frame that fails, a caller
that gives up). The real broker's side is in tests/integration/worker/test_acks.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aio_pika.abc import AbstractIncomingMessage
from aiormq.exceptions import ChannelInvalidStateError

from jobcore.amqp.deliveries import ChannelAcks, Delivery

# (delivery tag, multiple) of every basic.ack sent.
Frames = list[tuple[int, bool]]


class Gate:
    """Holds every ack frame on its way until released."""

    def __init__(self) -> None:
        self.sending = asyncio.Event()
        self.release = asyncio.Event()


class StandInMessage:
    """Sends its ack into ``frames`` (through ``gate``, if any); ``closed``: the channel
    is gone."""

    def __init__(
        self, tag: int, frames: Frames, *, closed: bool = False, gate: Gate | None = None
    ) -> None:
        self.delivery_tag = tag
        self.processed = False
        self.frames = frames
        self.closed = closed
        self.gate = gate

    async def ack(self, multiple: bool = False) -> None:
        if self.closed:
            raise ChannelInvalidStateError("closed")
        if self.gate is not None:
            self.gate.sending.set()
            await asyncio.wait_for(self.gate.release.wait(), timeout=5)
        self.frames.append((self.delivery_tag, multiple))
        self.processed = True

    async def reject(self, requeue: bool = False) -> None:
        if self.closed:
            raise ChannelInvalidStateError("closed")
        self.processed = True


def deliveries(acks: ChannelAcks, tags: list[int], frames: Frames, **kw: Any) -> list[Delivery]:
    out = []
    for tag in tags:
        acks.register(tag)
        message = cast(AbstractIncomingMessage, StandInMessage(tag, frames, **kw))
        out.append(
            Delivery(
                message_id=None,
                message_type=None,
                body=b"",
                headers={},
                redelivered=False,
                exchange="",
                routing_key="",
                queue="q",
                delivery_tag=tag,
                _message=message,
                _acks=acks,
            )
        )
    return out


async def test_a_tag_never_registered_turns_multiple_acks_off() -> None:
    """Tag 3 never reached the consumer (the client dropped it), so the broker still holds
    it: a multiple ack of 4 would settle it unprocessed."""
    frames: Frames = []
    acks = ChannelAcks()
    held = deliveries(acks, [1, 2, 4, 5], frames)
    assert await asyncio.gather(*(d.ack() for d in held)) == [True] * 4
    assert frames == [(1, False), (2, False), (4, False), (5, False)]
    assert all(d.settled for d in held)


async def test_acks_asked_for_during_a_flush_go_in_the_next_one() -> None:
    frames: Frames = []
    acks = ChannelAcks()
    gate = Gate()
    held = deliveries(acks, [1, 2, 3, 4], frames, gate=gate)
    first = asyncio.gather(held[0].ack(), held[1].ack())
    await asyncio.wait_for(gate.sending.wait(), timeout=5)
    later = asyncio.gather(held[2].ack(), held[3].ack())
    gate.release.set()
    assert list(await first) == [True, True]
    assert list(await later) == [True, True]
    assert frames == [(2, True), (4, True)]


async def test_a_frame_that_fails_leaves_every_delivery_it_covered_unsettled() -> None:
    """The channel is gone: the broker requeues what it held, as for an ack of its own."""
    frames: Frames = []
    acks = ChannelAcks()
    held = deliveries(acks, [1, 2, 3], frames, closed=True)
    assert await asyncio.gather(*(d.ack() for d in held)) == [False] * 3
    assert frames == []
    assert not any(d.settled for d in held)


async def test_a_caller_that_gives_up_still_has_its_delivery_acked() -> None:
    """The claim committed: the ack is owed whether or not its caller still waits."""
    frames: Frames = []
    acks = ChannelAcks()
    gate = Gate()
    held = deliveries(acks, [1, 2], frames, gate=gate)
    gave_up = asyncio.create_task(held[0].ack())
    waits = asyncio.create_task(held[1].ack())
    await asyncio.wait_for(gate.sending.wait(), timeout=5)
    gave_up.cancel()
    gate.release.set()
    assert await waits is True
    assert frames == [(2, True)]
    assert held[0].settled


async def test_a_delivery_answered_or_queued_is_not_answered_again() -> None:
    frames: Frames = []
    acks = ChannelAcks()
    gate = Gate()
    held = deliveries(acks, [1, 2], frames, gate=gate)
    acking = asyncio.create_task(held[0].ack())
    await asyncio.wait_for(gate.sending.wait(), timeout=5)
    assert await held[0].requeue() is False  # its ack is on its way
    gate.release.set()
    assert await acking is True
    assert await held[1].requeue() is True
    assert await held[1].ack() is False
    assert frames == [(1, False)]
