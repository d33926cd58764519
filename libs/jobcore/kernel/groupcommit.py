"""Group commit in the application: what queued behind a write in flight goes out as one.

A commit waits for the WAL to reach the disk, so many small transactions wait on one
another's flushes; one transaction for many items pays that wait once. A
:class:`GroupCommit` keeps one write in flight per group: an item that comes while its
group is idle goes at once (no timer, no added latency when idle), and the items that
queued up behind a write go together as the next one, as soon as it finished. Each caller
gets its own answer, after the write that carried its item.

- A write fails as a whole (it raised: every item of it gets that error) or per item (its
  answer for an item is an exception: that item's caller gets it, the others their
  answers).
- A caller that stops waiting (cancelled) before its item is written is left out of the
  write; one cancelled while its write is in flight leaves the write to finish.
- The write runs in a task of the batcher's, so a caller that goes away never cuts a
  transaction short; only :meth:`GroupCommit.close` cancels it.

The worker batches its claims and its successes this way, and the API the single enqueues
of one tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")

# The answers of one write, in its items' order: an exception is that item's error.
WriteBatch = Callable[[Sequence[Item]], Awaitable[Sequence[Answer | Exception]]]
WriteAlone = Callable[[Item], Awaitable[Answer]]


@dataclass(slots=True)
class _Queued(Generic[Item, Answer]):
    item: Item
    answer: asyncio.Future[Answer]


@dataclass(slots=True)
class _Group(Generic[Item, Answer]):
    """A group with a write in flight, and the items queued behind it."""

    queued: list[_Queued[Item, Answer]] = field(default_factory=list)
    writing: asyncio.Task[None] | None = None


class GroupCommit(Generic[Item, Answer]):
    """``write_batch``: writes items in one transaction, answering each; ``max_items``:
    the most items one write takes.

    ``write_alone``: when given, an item that finds its group idle is written by it, alone
    and in the caller's task (its trace, its cancellation); the items queued meanwhile
    still go to ``write_batch``. ``exclusive``: keys two items of one write may not share
    (the later one waits for the next write, keeping its order). ``fresh_context``: the
    batch writes run in an empty context rather than a copy of the first caller's (their
    statements then belong to no one caller's trace).
    """

    def __init__(
        self,
        write_batch: WriteBatch[Item, Answer],
        *,
        max_items: int,
        write_alone: WriteAlone[Item, Answer] | None = None,
        exclusive: Callable[[Item], Iterable[Hashable]] | None = None,
        fresh_context: bool = False,
        name: str = "group-commit",
    ) -> None:
        self._write_batch = write_batch
        self._write_alone = write_alone
        self._exclusive = exclusive
        self._fresh_context = fresh_context
        self._name = name
        self.max_items = max_items
        self._groups: dict[Hashable, _Group[Item, Answer]] = {}

    def busy(self, group: Hashable = None) -> bool:
        """Whether ``group`` has a write in flight (an item submitted now would queue)."""
        return group in self._groups

    async def submit(self, item: Item, group: Hashable = None) -> Answer:
        """Write ``item`` with whatever of its ``group`` queued meanwhile; its answer once
        that write committed (raises its error)."""
        queue = self._groups.get(group)
        if queue is None and self._write_alone is not None:
            queue = self._groups[group] = _Group()
            try:
                return await self._write_alone(item)
            finally:
                self._after_alone(group, queue)
        if queue is None:
            queue = self._groups[group] = _Group()
        waiting = _Queued[Item, Answer](item, asyncio.get_running_loop().create_future())
        queue.queued.append(waiting)
        if queue.writing is None and self._write_alone is None:
            queue.writing = self._start_writing(group, queue)
        return await waiting.answer

    def _after_alone(self, group: Hashable, queue: _Group[Item, Answer]) -> None:
        """After an item written alone: what queued behind it goes next, or the group is
        idle."""
        if any(not waiting.answer.done() for waiting in queue.queued):
            queue.writing = self._start_writing(group, queue)
        else:
            del self._groups[group]

    def _start_writing(self, group: Hashable, queue: _Group[Item, Answer]) -> asyncio.Task[None]:
        context = contextvars.Context() if self._fresh_context else None
        writing = self._write_queued(group, queue)
        return asyncio.create_task(writing, name=self._name, context=context)

    async def _write_queued(self, group: Hashable, queue: _Group[Item, Answer]) -> None:
        try:
            while queue.queued:
                chosen = self._take(queue)
                if chosen:
                    await self._write(chosen)
        finally:
            for waiting in queue.queued:  # only left when this task was cancelled
                waiting.answer.cancel()
            queue.queued.clear()
            if self._groups.get(group) is queue:
                del self._groups[group]

    def _take(self, queue: _Group[Item, Answer]) -> list[_Queued[Item, Answer]]:
        """The next write's items, in arrival order: up to ``max_items``, none holding a
        key another of them holds. Items whose caller stopped waiting are dropped."""
        chosen: list[_Queued[Item, Answer]] = []
        left: list[_Queued[Item, Answer]] = []
        held: set[Hashable] = set()
        for waiting in queue.queued:
            if waiting.answer.done():
                continue
            keys = set(self._exclusive(waiting.item)) if self._exclusive is not None else set()
            if len(chosen) >= self.max_items or not held.isdisjoint(keys):
                left.append(waiting)
                continue
            held |= keys
            chosen.append(waiting)
        queue.queued = left
        return chosen

    async def _write(self, chosen: list[_Queued[Item, Answer]]) -> None:
        try:
            answers = await self._write_batch([waiting.item for waiting in chosen])
        except Exception as exc:
            for waiting in chosen:
                if not waiting.answer.done():
                    waiting.answer.set_exception(exc)
            return
        except BaseException:
            for waiting in chosen:
                waiting.answer.cancel()
            raise
        for waiting, answer in zip(chosen, answers, strict=True):
            if waiting.answer.done():
                continue
            if isinstance(answer, Exception):
                waiting.answer.set_exception(answer)
            else:
                waiting.answer.set_result(answer)

    async def close(self, timeout: float = 0.0) -> None:
        """Let the writes in flight finish (their items may be committing) within
        ``timeout`` seconds; then cancel what is left."""
        tasks = [queue.writing for queue in self._groups.values() if queue.writing is not None]
        if not tasks:
            return
        pending = set(tasks)
        if timeout > 0:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
