"""The relay's low-water mark (services/relay/low_water.py) as arithmetic: where a look puts
it, how the window grows between looks, and that a writer it cannot date, or a failed
look, leaves it where it was (never later)."""

from __future__ import annotations

from typing import Any

import pytest

from services.relay import low_water
from services.relay.low_water import SLACK, UNBOUNDED_WINDOW, LowWaterMark


class FakeOutbox:
    """outbox_store's two statements of a look, answering what the test sets."""

    def __init__(self) -> None:
        self.writer: dict[str, Any] = {"seconds": None, "unknown": False}
        self.live: dict[str, Any] = {"seconds": None}
        self.live_windows: list[float] = []

    async def oldest_writer(self, conn: object) -> dict[str, Any]:
        return self.writer

    async def oldest_live(self, conn: object, params: dict[str, float]) -> dict[str, Any]:
        self.live_windows.append(params["window"])
        return self.live


@pytest.fixture
def outbox(monkeypatch: pytest.MonkeyPatch) -> FakeOutbox:
    fake = FakeOutbox()
    monkeypatch.setattr(low_water, "outbox_store", fake)
    return fake


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(low_water.time, "monotonic", lambda: now[0])
    return now


async def test_before_any_look_every_row_is_in_the_window(
    outbox: FakeOutbox, clock: list[float]
) -> None:
    mark = LowWaterMark()
    assert mark.window() == UNBOUNDED_WINDOW
    assert mark.due()
    await mark.look(object())
    # The first look reads from the index's head.
    assert outbox.live_windows == [UNBOUNDED_WINDOW]
    assert mark.window() == SLACK


async def test_the_mark_is_the_oldest_of_the_writers_the_live_rows_and_the_look(
    outbox: FakeOutbox, clock: list[float]
) -> None:
    mark = LowWaterMark()
    outbox.writer = {"seconds": 7.0, "unknown": False}
    outbox.live = {"seconds": 3.0}
    await mark.look(object())
    assert mark.window() == 7.0 + SLACK
    outbox.writer = {"seconds": None, "unknown": False}
    outbox.live = {"seconds": 12.0}
    clock[0] += low_water.LOOK_EVERY
    assert mark.due()
    await mark.look(object())
    # The second look reads from the first one's mark.
    assert outbox.live_windows[-1] == 7.0 + SLACK + low_water.LOOK_EVERY
    assert mark.window() == 12.0 + SLACK
    # Between looks the window grows with the time since the last one.
    clock[0] += 0.5
    assert not mark.due()
    assert mark.window() == 12.0 + SLACK + 0.5


async def test_a_writer_it_cannot_date_leaves_the_mark_where_it_was(
    outbox: FakeOutbox, clock: list[float]
) -> None:
    mark = LowWaterMark()
    await mark.look(object())
    clock[0] += 5.0
    outbox.writer = {"seconds": None, "unknown": True}
    await mark.look(object())
    assert mark.window() == SLACK + 5.0
    clock[0] += 5.0
    assert mark.window() == SLACK + 10.0


async def test_a_look_that_fails_leaves_the_mark_where_it_was(
    outbox: FakeOutbox, clock: list[float]
) -> None:
    mark = LowWaterMark()
    await mark.look(object())
    clock[0] += 3.0

    async def down(conn: object, params: dict[str, float]) -> dict[str, Any]:
        raise ConnectionError("the database went away")

    outbox.oldest_live = down  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await mark.look(object())
    assert mark.window() == SLACK + 3.0
