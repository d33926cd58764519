"""Many jobs' statements in one commit: claims and successes are batched.

A commit waits for the WAL to reach the disk, and on a busy machine that wait, not the
CPU, is what bounds a worker (more connections did not raise its throughput:
docs/bench/measurements.md, "Batched commits"). So claims — and, separately, successes —
go through a :class:`Batcher`: whatever was submitted while the previous batch was
committing goes out as the next batch. One batch is in flight at a time, so at low load
an item goes out at once (no timer, no added latency), and under load a batch holds
everything that queued up behind the last commit. Each caller still gets its own answer,
after the commit.

One batch at a time also means this worker never runs two batches that could lock the
same rows in opposite orders; a deadlock with another process (duplicate messages in two
workers' batches at once) is reported as :class:`TransientConflict`, which callers retry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

RunBatch = Callable[[Sequence[In]], Awaitable[Sequence[Out]]]


class Batcher(Generic[In, Out]):
    def __init__(self, run: RunBatch[In, Out], *, max_size: int = 200) -> None:
        self._run = run
        self.max_size = max_size
        self._queued: list[tuple[In, asyncio.Future[Out]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def submit(self, item: In) -> Out:
        """Queue ``item`` for the next batch; return its answer once that batch committed."""
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._queued.append((item, future))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush(), name="batch")
        return await future

    async def _flush(self) -> None:
        try:
            while self._queued:
                batch = self._queued[: self.max_size]
                del self._queued[: self.max_size]
                # Callers that gave up (cancelled) no longer need an answer.
                batch = [(item, future) for item, future in batch if not future.done()]
                if not batch:
                    continue
                try:
                    answers = await self._run([item for item, _ in batch])
                except BaseException as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (_, future), answer in zip(batch, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)
        finally:
            self._flushing = None
            for _, future in self._queued:  # only left if we were cancelled
                if not future.done():
                    future.cancel()
            self._queued.clear()

    async def close(self) -> None:
        task = self._flushing
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
