"""Single enqueues of one tenant sent together: an application-level group commit.

Every enqueue statement locks its tenant's usage row until it commits (the quotas'
turns: :mod:`jobcore.database.sql.tenant_quotas`), so concurrent enqueues of one tenant commit
one WAL flush after another, each waiting for the lock of the one before. Instead, an
enqueue that arrives while one of its group (tenant, job type, API key:
:func:`jobcore.usecases.enqueue.submit.coalescing_key`) is in flight waits in this process, and
those that queued up are written together as soon as it finished: one transaction, one lock of the
usage row, one commit (:func:`jobcore.usecases.enqueue.submit.enqueue_coalesced`). As with the
worker's batches (both are a :class:`jobcore.kernel.groupcommit.GroupCommit`), one write per group
is in flight at a time, so an enqueue with nothing in flight goes at once, alone, through the
single enqueue (:func:`jobcore.usecases.enqueue.submit.enqueue`): no timer, no added latency when
idle.

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

import uuid
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass

from jobcore.kernel.errors import DatabaseUnavailable, JobcoreError
from jobcore.kernel.groupcommit import GroupCommit
from jobcore.telemetry.traces import capture_trace_headers
from jobcore.usecases.enqueue.submit import EnqueueRequest, coalescing_key
from jobcore.usecases.enqueue.write_one import EnqueueResult

WriteOne = Callable[[EnqueueRequest], Awaitable[EnqueueResult]]
WriteMany = Callable[
    [Sequence[EnqueueRequest], Sequence[dict[str, str]]],
    Awaitable[Sequence[EnqueueResult | JobcoreError]],
]
GroupKey = tuple[str, str, uuid.UUID | None]


class _GoAlone:
    """A queued request's answer when its group stopped coalescing: write it alone."""


GO_ALONE = _GoAlone()


@dataclass(frozen=True, slots=True)
class _Traced:
    """A request and the trace context it was made in (each job carries its own)."""

    request: EnqueueRequest
    trace: dict[str, str]


def _held_keys(traced: _Traced) -> list[Hashable]:
    """Two requests holding one of these must not share a write: the second one waits for
    the next, so it sees the first as its single enqueue would."""
    request = traced.request
    keys: list[Hashable] = []
    if request.idempotency_key is not None:
        keys.append(("idempotency", request.idempotency_key))
    if request.held_key is not None:
        keys.append(("unique", request.held_key))
    return keys


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
        # The group's statements belong to no one request's trace: an empty context.
        self._groups: GroupCommit[_Traced, EnqueueResult | _GoAlone] = GroupCommit(
            self._write_group,
            max_items=max_items,
            write_alone=self._write_leader,
            exclusive=_held_keys,
            fresh_context=True,
            name="enqueue-group",
        )
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
        if self._groups.busy(key) and not self._coalescable(request):
            return await self._write_one(request)
        # Cancelled (the client went away): this request's wait is, not the write.
        answer = await self._groups.submit(_Traced(request, capture_trace_headers()), key)
        if isinstance(answer, _GoAlone):
            return await self._write_alone(key, request)
        return answer

    async def _write_leader(self, traced: _Traced) -> EnqueueResult:
        """The first of an idle group: its single enqueue, in its own task and trace."""
        try:
            return await self._write_one(traced.request)
        except DatabaseUnavailable:
            self._alone.add(coalescing_key(traced.request))
            raise

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

    async def _write_group(
        self, queued: Sequence[_Traced]
    ) -> Sequence[EnqueueResult | _GoAlone | Exception]:
        key = coalescing_key(queued[0].request)
        if key in self._alone:
            return [GO_ALONE] * len(queued)
        try:
            answers = await self._write_many(
                [traced.request for traced in queued], [traced.trace for traced in queued]
            )
        except Exception:
            # What each one's single enqueue would have raised; the rest go alone.
            self._alone.add(key)
            raise
        self.groups_written += 1
        self.requests_coalesced += len(queued)
        return answers

    async def close(self, timeout: float) -> None:
        """Let the writes in flight finish (their jobs may be committing), within
        ``timeout`` seconds; then cancel what is left."""
        await self._groups.close(timeout)
