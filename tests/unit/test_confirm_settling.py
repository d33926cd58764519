"""The publisher's replacement for aiormq's handling of a *multiple* ack: it settles the
same tags, each once, without scanning every confirmation in flight."""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp.commands import Basic

from jobcore.amqp.publisher import settle_confirms_in_order


class FakeChannel:
    """The three members of aiormq.Channel that the replacement uses."""

    def __init__(self, tags: range) -> None:
        self.confirmations: dict[int, str] = {tag: "waiting" for tag in tags}
        self.settled: list[tuple[int, str]] = []

    def _confirm_delivery(self, tag: int, frame: Any) -> None:
        if tag in self.confirmations:
            del self.confirmations[tag]
            self.settled.append((tag, type(frame).__name__))

    async def _on_confirm_frame(self, frame: Any) -> None:
        raise AssertionError("aiormq's own handler was called")


def test_multiple_frames_settle_every_tag_up_to_theirs_once_and_single_frames_one() -> None:
    channel = FakeChannel(range(1, 11))
    assert settle_confirms_in_order(channel)  # type: ignore[arg-type]

    async def feed() -> None:
        await channel._on_confirm_frame(Basic.Ack(delivery_tag=3, multiple=True))
        await channel._on_confirm_frame(Basic.Nack(delivery_tag=5, multiple=False))
        await channel._on_confirm_frame(Basic.Ack(delivery_tag=7, multiple=True))
        # A tag no longer awaited (settled, or forgotten after a timeout) changes nothing.
        await channel._on_confirm_frame(Basic.Ack(delivery_tag=7, multiple=True))
        await channel._on_confirm_frame(Basic.Ack(delivery_tag=10, multiple=True))

    asyncio.run(feed())
    assert channel.settled == [
        (1, "Ack"),
        (2, "Ack"),
        (3, "Ack"),
        (5, "Nack"),
        (4, "Ack"),
        (6, "Ack"),
        (7, "Ack"),
        (8, "Ack"),
        (9, "Ack"),
        (10, "Ack"),
    ]
    assert channel.confirmations == {}


def test_a_multiple_frame_leaves_later_tags_waiting() -> None:
    channel = FakeChannel(range(1, 2001))
    assert settle_confirms_in_order(channel)  # type: ignore[arg-type]
    asyncio.run(channel._on_confirm_frame(Basic.Ack(delivery_tag=1500, multiple=True)))
    assert len(channel.settled) == 1500
    assert sorted(channel.confirmations) == list(range(1501, 2001))


def test_a_channel_without_the_expected_internals_is_left_alone() -> None:
    assert not settle_confirms_in_order(object())  # type: ignore[arg-type]
