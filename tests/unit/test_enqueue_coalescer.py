"""The API's enqueue coalescer: an enqueue with none of its group in flight goes alone, at
once; those that queue behind it go together, each with its own answer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from jobcore.execution.registry import default_registry
from jobcore.kernel.errors import DatabaseUnavailable, JobcoreError, UniqueJobExists
from jobcore.kernel.states import JobStatus
from jobcore.testing.jobtypes import EchoPayload
from jobcore.usecases.enqueue.submit import EnqueueRequest
from jobcore.usecases.enqueue.write_one import EnqueueResult
from services.api.coalescing import EnqueueCoalescer


def request(text: str, tenant: str = "acme", **fields: Any) -> EnqueueRequest:
    return EnqueueRequest(
        tenant=tenant,
        job_type=default_registry.get("echo"),
        payload=EchoPayload(text=text),
        **fields,
    )


def answer(req: EnqueueRequest) -> EnqueueResult:
    return EnqueueResult(req.tenant, uuid.uuid4(), JobStatus.PENDING, datetime.now(UTC), False)


class Writes:
    """Fake writes that record what went out, held at a gate until released."""

    def __init__(self) -> None:
        self.log: list[tuple[str, list[str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        # Holds the coalesced writes only.
        self.many_gate = asyncio.Event()
        self.many_gate.set()
        self.fail_with: BaseException | None = None
        self.answers: dict[str, EnqueueResult] = {}

    def text(self, req: EnqueueRequest) -> str:
        return str(req.document["text"])

    async def one(self, req: EnqueueRequest) -> EnqueueResult:
        self.log.append(("one", [self.text(req)]))
        await self.gate.wait()
        result = self.answers[self.text(req)] = answer(req)
        return result

    async def many(
        self, reqs: Sequence[EnqueueRequest], traces: Sequence[dict[str, str]]
    ) -> list[EnqueueResult | JobcoreError]:
        assert len(traces) == len(reqs)
        self.log.append(("many", [self.text(r) for r in reqs]))
        await self.gate.wait()
        await self.many_gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        answers: list[EnqueueResult | JobcoreError] = []
        for req in reqs:
            if self.text(req) == "taken":
                answers.append(UniqueJobExists(uuid.uuid4(), "pending"))
            else:
                answers.append(answer(req))
                self.answers[self.text(req)] = answers[-1]  # type: ignore[assignment]
        return answers


def coalescer(writes: Writes, max_items: int = 64, **kwargs: Any) -> EnqueueCoalescer:
    return EnqueueCoalescer(
        writes.one,
        writes.many,
        coalescable=kwargs.get("coalescable", lambda _: True),
        max_items=max_items,
    )


async def in_flight(writes: Writes, subject: EnqueueCoalescer, text: str) -> asyncio.Task[Any]:
    """Start an enqueue that is held in its write."""
    writes.gate.clear()
    task = asyncio.create_task(subject.enqueue(request(text)))
    await asyncio.sleep(0)
    assert writes.log[-1] == ("one", [text])
    return task


async def queued(subject: EnqueueCoalescer, *reqs: EnqueueRequest) -> list[asyncio.Task[Any]]:
    tasks = [asyncio.create_task(subject.enqueue(r)) for r in reqs]
    await asyncio.sleep(0)
    return tasks


async def test_an_enqueue_alone_goes_at_once_through_the_single_write() -> None:
    writes = Writes()
    subject = coalescer(writes)
    result = await subject.enqueue(request("a"))
    assert result is writes.answers["a"]
    assert writes.log == [("one", ["a"])]
    assert subject.groups_written == 0


async def test_enqueues_queued_behind_one_in_flight_are_written_together() -> None:
    writes = Writes()
    subject = coalescer(writes)
    first = await in_flight(writes, subject, "a")
    later = await queued(subject, request("b"), request("c"), request("taken"))
    writes.gate.set()
    assert await first is writes.answers["a"]
    assert await later[0] is writes.answers["b"]
    assert await later[1] is writes.answers["c"]
    with pytest.raises(UniqueJobExists):
        await later[2]
    assert writes.log == [("one", ["a"]), ("many", ["b", "c", "taken"])]
    assert (subject.groups_written, subject.requests_coalesced) == (1, 3)
    # Idle again: the next one goes alone.
    await subject.enqueue(request("d"))
    assert writes.log[-1] == ("one", ["d"])


async def test_groups_are_bounded_and_keys_held_twice_wait_for_the_next_write() -> None:
    writes = Writes()
    subject = coalescer(writes, max_items=3)
    first = await in_flight(writes, subject, "a")
    later = await queued(
        subject,
        request("b", idempotency_key="k"),
        request("c", idempotency_key="k"),
        request("d", unique_key="u"),
        request("e", unique_key="u"),
        request("f"),
        request("g"),
    )
    writes.gate.set()
    await asyncio.gather(first, *later)
    assert writes.log == [
        ("one", ["a"]),
        ("many", ["b", "d", "f"]),
        ("many", ["c", "e", "g"]),
    ]


async def test_other_tenants_and_keys_are_not_put_together() -> None:
    writes = Writes()
    subject = coalescer(writes)
    first = await in_flight(writes, subject, "a")
    key = uuid.uuid4()
    others = await queued(subject, request("x", tenant="globex"), request("y", key_id=key))
    assert writes.log[1:] == [("one", ["x"]), ("one", ["y"])]
    writes.gate.set()
    await asyncio.gather(first, *others)


async def test_what_cannot_be_coalesced_goes_alone_at_once() -> None:
    writes = Writes()
    subject = coalescer(writes, coalescable=lambda r: r.ordering_key is None)
    first = await in_flight(writes, subject, "a")
    ordered = await queued(subject, request("o", ordering_key="account-1"))
    assert writes.log[-1] == ("one", ["o"])
    writes.gate.set()
    await asyncio.gather(first, *ordered)


async def test_a_maximum_of_one_never_coalesces() -> None:
    writes = Writes()
    subject = coalescer(writes, max_items=1)
    first = await in_flight(writes, subject, "a")
    later = await queued(subject, request("b"), request("c"))
    assert writes.log == [("one", ["a"]), ("one", ["b"]), ("one", ["c"])]
    writes.gate.set()
    await asyncio.gather(first, *later)


async def test_a_failed_group_write_is_every_members_answer() -> None:
    writes = Writes()
    subject = coalescer(writes)
    first = await in_flight(writes, subject, "a")
    later = await queued(subject, request("b"), request("c"))
    writes.fail_with = DatabaseUnavailable("the database is not reachable")
    writes.gate.set()
    await first
    for task in later:
        with pytest.raises(DatabaseUnavailable):
            await task
    # The group is idle again.
    writes.fail_with = None
    await subject.enqueue(request("d"))
    assert writes.log[-1] == ("one", ["d"])


async def test_a_caller_that_goes_away_does_not_stop_its_groups_write() -> None:
    writes = Writes()
    subject = coalescer(writes)
    first = await in_flight(writes, subject, "a")
    later = await queued(subject, request("b"), request("c"))
    assert writes.log[-1] == ("one", ["a"])  # the group's write starts when "a" finished
    writes.many_gate.clear()
    writes.gate.set()
    await first
    await asyncio.sleep(0)  # the group's write is in flight now
    assert writes.log[-1] == ("many", ["b", "c"])
    later[0].cancel()
    await asyncio.sleep(0)
    writes.many_gate.set()
    assert await later[1] is writes.answers["c"]
    with pytest.raises(asyncio.CancelledError):
        await later[0]
    # Written all the same: its job committed with its sibling's.
    assert "b" in writes.answers


async def test_a_caller_gone_before_its_group_is_written_is_left_out() -> None:
    writes = Writes()
    subject = coalescer(writes)
    first = await in_flight(writes, subject, "a")
    later = await queued(subject, request("b"), request("c"))
    later[0].cancel()
    await asyncio.sleep(0)
    writes.gate.set()
    await first
    assert await later[1] is writes.answers["c"]
    assert writes.log[-1] == ("many", ["c"])


async def test_close_lets_a_write_in_flight_finish() -> None:
    writes = Writes()
    subject = coalescer(writes)
    first = await in_flight(writes, subject, "a")
    later = await queued(subject, request("b"))
    # "a" finishes; "b"'s group write starts and is held.
    writes.many_gate.clear()
    writes.gate.set()
    await first
    await asyncio.sleep(0)
    assert writes.log[-1] == ("many", ["b"])
    closing = asyncio.create_task(subject.close(5.0))
    await asyncio.sleep(0)
    assert not closing.done()
    writes.many_gate.set()
    await closing
    assert await later[0] is writes.answers["b"]


async def test_after_a_failed_group_write_its_group_goes_alone_until_a_write_works() -> None:
    # A silent network cut leaves dead connections in the pool, each failing only after
    # the operation timeout: the requests must then find the live ones side by side, not
    # wait for one group write after another.
    writes = Writes()
    subject = coalescer(writes)
    first = await in_flight(writes, subject, "a")
    failed = await queued(subject, request("b"), request("c"))
    writes.many_gate.clear()
    writes.gate.set()
    await first
    await asyncio.sleep(0)
    assert writes.log[-1] == ("many", ["b", "c"])
    later = await queued(subject, request("d"), request("e"))
    writes.fail_with = DatabaseUnavailable("wait timeout expired")
    writes.gate.clear()  # the single writes that follow are held, to see them side by side
    writes.many_gate.set()
    for task in failed:
        with pytest.raises(DatabaseUnavailable):
            await task
    await asyncio.sleep(0)
    # Queued behind the failure: each in its own write, both in flight at once.
    assert writes.log[-2:] == [("one", ["d"]), ("one", ["e"])]
    writes.fail_with = None
    writes.gate.set()
    await asyncio.gather(*later)
    # A write worked: the group coalesces again.
    writes.gate.clear()
    leader = asyncio.create_task(subject.enqueue(request("f")))
    await asyncio.sleep(0)
    behind = await queued(subject, request("g"), request("h"))
    writes.gate.set()
    await asyncio.gather(leader, *behind)
    assert writes.log[-2:] == [("one", ["f"]), ("many", ["g", "h"])]


async def test_a_leader_that_meets_an_outage_sends_its_queue_alone() -> None:
    writes = Writes()

    async def unavailable(req: EnqueueRequest) -> EnqueueResult:
        writes.log.append(("one", [writes.text(req)]))
        await writes.gate.wait()
        if writes.text(req) == "a":
            raise DatabaseUnavailable("wait timeout expired")
        return answer(req)

    # The leader's single write meets the outage; the single writes after it work.
    subject = EnqueueCoalescer(unavailable, writes.many, coalescable=lambda _: True, max_items=64)
    writes.gate.clear()
    first = asyncio.create_task(subject.enqueue(request("a")))
    await asyncio.sleep(0)
    later = await queued(subject, request("b"), request("c"))
    writes.gate.set()
    with pytest.raises(DatabaseUnavailable):
        await first
    await asyncio.gather(*later)
    assert [entry for entry in writes.log if entry[0] == "many"] == []
    assert writes.log[-2:] == [("one", ["b"]), ("one", ["c"])]
