"""The group-commit batcher the worker's batches and the API's coalescer share."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Hashable, Sequence

import pytest

from jobcore.kernel.groupcommit import GroupCommit

caller = contextvars.ContextVar("caller", default="none")


class Writes:
    def __init__(self) -> None:
        self.log: list[tuple[str, list[int]]] = []
        self.contexts: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def batch(self, items: Sequence[int]) -> list[int | Exception]:
        self.log.append(("batch", list(items)))
        self.contexts.append(caller.get())
        await self.gate.wait()
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]

    async def alone(self, item: int) -> int:
        self.log.append(("alone", [item]))
        self.contexts.append(caller.get())
        await self.gate.wait()
        return item * 10


async def submitted(batcher: GroupCommit[int, int], *items: int, group: Hashable = None) -> list:
    tasks = [asyncio.create_task(batcher.submit(i, group)) for i in items]
    await asyncio.sleep(0)
    return tasks


async def test_an_answer_that_is_an_exception_fails_its_item_alone() -> None:
    writes = Writes()
    batcher = GroupCommit(writes.batch, max_items=10)
    writes.gate.clear()
    tasks = await submitted(batcher, 2, 3, 4)
    writes.gate.set()
    assert await tasks[0] == 20
    with pytest.raises(ValueError, match="odd 3"):
        await tasks[1]
    assert await tasks[2] == 40


async def test_groups_are_written_apart_each_with_one_write_in_flight() -> None:
    writes = Writes()
    batcher = GroupCommit(writes.batch, max_items=10)
    writes.gate.clear()
    first = await submitted(batcher, 2, group="a")
    other = await submitted(batcher, 4, group="b")
    later = await submitted(batcher, 6, 8, group="a")
    assert batcher.busy("a")
    assert batcher.busy("b")
    writes.gate.set()
    await asyncio.gather(*first, *other, *later)
    assert writes.log == [("batch", [2]), ("batch", [4]), ("batch", [6, 8])]
    assert not batcher.busy("a")
    assert not batcher.busy("b")


async def test_items_holding_one_key_wait_for_the_next_write_in_order() -> None:
    writes = Writes()
    batcher = GroupCommit(writes.batch, max_items=10, exclusive=lambda i: [i % 4])
    writes.gate.clear()
    first = await submitted(batcher, 0)
    later = await submitted(batcher, 2, 6, 4, 10)
    writes.gate.set()
    await asyncio.gather(*first, *later)
    assert writes.log == [("batch", [0]), ("batch", [2, 4]), ("batch", [6]), ("batch", [10])]


async def test_an_idle_groups_item_is_written_alone_in_the_callers_context() -> None:
    writes = Writes()
    batcher = GroupCommit(writes.batch, max_items=10, write_alone=writes.alone, fresh_context=True)
    writes.gate.clear()
    caller.set("leader")
    leader = await submitted(batcher, 2)
    caller.set("follower")
    later = await submitted(batcher, 4, 6)
    writes.gate.set()
    assert [await t for t in (*leader, *later)] == [20, 40, 60]
    assert writes.log == [("alone", [2]), ("batch", [4, 6])]
    assert writes.contexts == ["leader", "none"]


async def test_close_waits_for_a_write_in_flight_then_cancels_it() -> None:
    writes = Writes()
    batcher = GroupCommit(writes.batch, max_items=10)
    writes.gate.clear()
    tasks = await submitted(batcher, 2)
    await batcher.close(0.05)
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    assert not batcher.busy()
