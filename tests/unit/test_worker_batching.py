"""The worker's statement batcher: what queues behind a commit goes out together."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from services.worker.batching import Batcher


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def run(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the statement failed")
        return [i * 10 for i in items]


async def test_an_item_alone_goes_out_at_once() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.run)
    assert await batcher.submit(1) == 10
    assert recorder.batches == [[1]]


async def test_items_queued_behind_a_batch_in_flight_go_out_together() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.run)
    recorder.gate.clear()
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0)  # the first batch is in flight, held at the gate
    later = [asyncio.create_task(batcher.submit(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    recorder.gate.set()
    assert await first == 10
    assert [await t for t in later] == [20, 30, 40]
    assert recorder.batches == [[1], [2, 3, 4]]


async def test_batches_are_split_at_the_maximum_size() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.run, max_size=2)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(5)))
    assert results == [0, 10, 20, 30, 40]
    assert recorder.batches == [[0, 1], [2, 3], [4]]


async def test_a_failed_batch_fails_its_items_only() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.run)
    recorder.fail_next = True
    with pytest.raises(RuntimeError, match="the statement failed"):
        await batcher.submit(1)
    assert await batcher.submit(2) == 20


async def test_a_caller_that_gives_up_does_not_disturb_the_others() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.run)
    recorder.gate.clear()
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0)
    quitter = asyncio.create_task(batcher.submit(2))
    stayer = asyncio.create_task(batcher.submit(3))
    await asyncio.sleep(0)
    quitter.cancel()
    recorder.gate.set()
    assert await first == 10
    assert await stayer == 30
    assert quitter.cancelled()
    assert recorder.batches == [[1], [3]]
