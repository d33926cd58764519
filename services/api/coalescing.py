"""Single enqueues of one tenant sent together: an application-level group commit.

Every enqueue statement locks its tenant's usage row until it commits (the quotas'
turns: :mod:`jobcore.sql.tenant_quotas`), so concurrent enqueues of one tenant commit
one WAL flush after another, each waiting for the lock of the one before. Instead, an
enqueue that arrives while one of its group (tenant, job type, API key:
:func:`jobcore.submit.coalescing_key`) is in flight waits in this process, and those that
queued up are written together as soon as it finished: one transaction, one lock of the
usage row, one commit (:func:`jobcore.submit.enqueue_coalesced`). As with the worker's
:class:`services.worker.batching.Batcher`, one write per group is in flight at a time, so
an enqueue with nothing in flight goes at once, alone, through the single enqueue
(:func:`jobcore.submit.enqueue`): no timer, no added latency when idle.

Each request keeps its own answer, the one its single enqueue would have given had the
group's requests come one after another (docs/design.md, "Coalesced enqueues"), and the
202 goes out only after its job committed. The group's write runs in a task of its own: a
client that goes away stops waiting for its answer, not its group's statement. An error of
the group's transaction is every member's answer. Requests the multi-row statement does
not write exactly as the single one (an ordering key, a payload stored by reference), and
two requests with the same idempotency or unique key (the second waits for the next
write, so it sees the first as its single enqueue would), are not put together.

After a group's write failed, its group goes alone until a single enqueue of it works
again: the requests queued behind the failure, and those that come meanwhile, each take
their own write. A connection left dead by a silent network cut fails only after the
operation timeout; written one group after another, every such connection in the pool
would cost the whole group that timeout in turn, while single writes find the live
connections at once, side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from jobcore.enqueue import EnqueueResult
from jobcore.errors import DatabaseUnavailable, JobcoreError
from jobcore.submit import EnqueueRequest, coalescing_key
from jobcore.telemetry import capture_trace_headers

WriteOne = Callable[[EnqueueRequest], Awaitable[EnqueueResult]]
WriteMany = Callable[
    [Sequence[EnqueueRequest], Sequence[dict[str, str]]],
    Awaitable[Sequence[EnqueueResult | JobcoreError]],
]
GroupKey = tuple[str, str, uuid.UUID | None]


class _GoAlone:
    """A queued request's answer when its group stopped coalescing: write it alone."""


GO_ALONE = _GoAlone()


@dataclass(slots=True)
class _Waiting:
    request: EnqueueRequest
    trace: dict[str, str]
    answer: asyncio.Future[EnqueueResult | _GoAlone]


@dataclass(slots=True)
class _Group:
    """A group with a write in flight, and the requests queued behind it."""

    queued: list[_Waiting] = field(default_factory=list)
    writing: asyncio.Task[None] | None = None


class EnqueueCoalescer:
    """``write_one``: the single enqueue, run in the caller's task; ``write_many``: the
    coalesced one (the answers in the requests' order); ``coalescable``: whether a request
    may be written by ``write_many``; ``max_items``: the most requests one write takes
    (1: never coalesce)."""

    def __init__(
        self,
        write_one: WriteOne,
        write_many: WriteMany,
        *,
        coalescable: Callable[[EnqueueRequest], bool],
        max_items: int,
    ) -> None:
        self._write_one = write_one
        self._write_many = write_many
        self._coalescable = coalescable
        self.max_items = max_items
        self._groups: dict[GroupKey, _Group] = {}
        # Groups whose last group write failed: written alone until one single write works.
        self._alone: set[GroupKey] = set()
        # Coalesced writes made, and the requests they answered.
        self.groups_written = 0
        self.requests_coalesced = 0

    async def enqueue(self, request: EnqueueRequest) -> EnqueueResult:
        """Write ``request``'s job (alone, or with others of its group queued meanwhile)
        and answer as its single enqueue would; must be called in the request's trace
        context (each job carries its own)."""
        if self.max_items <= 1:
            return await self._write_one(request)
        key = coalescing_key(request)
        if key in self._alone:
            return await self._write_alone(key, request)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
            try:
                return await self._write_one(request)
            except DatabaseUnavailable:
                self._alone.add(key)
                raise
            finally:
                self._next(key, group)
        if not self._coalescable(request):
            return await self._write_one(request)
        waiting = _Waiting(
            request, capture_trace_headers(), asyncio.get_running_loop().create_future()
        )
        group.queued.append(waiting)
        # Cancelled (the client went away): this request's future is, not the write.
        answer = await waiting.answer
        if isinstance(answer, _GoAlone):
            return await self._write_alone(key, request)
        return answer

    async def _write_alone(self, key: GroupKey, request: EnqueueRequest) -> EnqueueResult:
        try:
            result = await self._write_one(request)
        except DatabaseUnavailable:
            raise
        except JobcoreError:
            self._alone.discard(key)  # an answer (a quota, a key taken): the database works
            raise
        self._alone.discard(key)  # the database answers again: coalesce from now on
        return result

    def _next(self, key: GroupKey, group: _Group) -> None:
        """After a write of the group: the queued requests go next, or the group is idle."""
        group.writing = None
        if any(not waiting.answer.done() for waiting in group.queued):
            # In a context of its own, not the finished request's: the group's statements
            # belong to no one request's trace (each job carries its request's own).
            group.writing = asyncio.create_task(
                self._write_queued(key, group), name="enqueue-group", context=contextvars.Context()
            )
        else:
            group.queued.clear()
            del self._groups[key]

    async def _write_queued(self, key: GroupKey, group: _Group) -> None:
        try:
            while True:
                if key in self._alone:
                    for waiting in group.queued:
                        if not waiting.answer.done():
                            waiting.answer.set_result(GO_ALONE)
                    group.queued.clear()
                    break
                chosen = self._take(group)
                if chosen:
                    await self._write(key, chosen)
                if not group.queued:
                    break
        finally:
            for waiting in group.queued:  # only left when this task was cancelled
                waiting.answer.cancel()
            group.queued.clear()
            if self._groups.get(key) is group:
                del self._groups[key]

    def _take(self, group: _Group) -> list[_Waiting]:
        """The next write's requests, in arrival order: up to ``max_items``, none with an
        idempotency or unique key another of them holds (those wait for the write after,
        keeping their order). Requests whose caller stopped waiting are dropped."""
        chosen: list[_Waiting] = []
        left: list[_Waiting] = []
        idempotency_keys: set[str] = set()
        unique_keys: set[str] = set()
        for waiting in group.queued:
            if waiting.answer.done():
                continue
            request = waiting.request
            if (
                len(chosen) >= self.max_items
                or request.idempotency_key in idempotency_keys
                or request.held_key in unique_keys
            ):
                left.append(waiting)
                continue
            if request.idempotency_key is not None:
                idempotency_keys.add(request.idempotency_key)
            if request.held_key is not None:
                unique_keys.add(request.held_key)
            chosen.append(waiting)
        group.queued = left
        return chosen

    async def _write(self, key: GroupKey, chosen: list[_Waiting]) -> None:
        try:
            answers = await self._write_many(
                [waiting.request for waiting in chosen], [waiting.trace for waiting in chosen]
            )
        except asyncio.CancelledError:
            for waiting in chosen:
                waiting.answer.cancel()
            raise
        except Exception as exc:
            # What each one's single enqueue would have raised.
            self._alone.add(key)
            for waiting in chosen:
                if not waiting.answer.done():
                    waiting.answer.set_exception(exc)
            return
        self.groups_written += 1
        self.requests_coalesced += len(chosen)
        for waiting, answer in zip(chosen, answers, strict=True):
            if waiting.answer.done():
                continue
            if isinstance(answer, JobcoreError):
                waiting.answer.set_exception(answer)
            else:
                waiting.answer.set_result(answer)

    async def close(self, timeout: float) -> None:
        """Let the writes in flight finish (their jobs may be committing), within
        ``timeout`` seconds; then cancel what is left."""
        tasks = [group.writing for group in self._groups.values() if group.writing is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
