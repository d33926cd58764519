"""Enqueueing a schedule's due ticks, one job per tick, through the enqueue use case
(:func:`jobcore.submit.enqueue`).

One transaction per schedule: its state row locked (``schedules``), a job for each tick
the missed-tick policy keeps (:meth:`jobcore.schedules.Schedule.due`), with the tick as
the job's idempotency key (:func:`jobcore.schedules.tick_key`), and ``last_tick`` moved to
the latest due tick. Each tick is enqueued under a savepoint: a tick the enqueue refuses
(a live job holds the type's unique key, the tenant's quota) is undone alone, recorded on
the schedule (``last_refused_tick``, ``last_refusal_reason``) and passed: it is not tried
again, and it never holds back the ticks after it.

The worker's scheduler runs it under the ``scheduler`` maintenance lease, renewed in the
same transaction, so one scheduler works at a time; the row lock and the key would still
keep two from enqueueing a tick twice, and a tick at or before ``last_tick`` is never due
again, whatever the clock says.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from jobcore.amqp.topology import Topology
from jobcore.db import Session, UnitOfWork
from jobcore.enqueue import EnqueueResult
from jobcore.errors import IdempotencyConflict, QuotaExceeded, UniqueJobExists
from jobcore.quotas import Quotas
from jobcore.schedules import Schedule, tick_key
from jobcore.store import ScheduleAdvanceParams, schedule_store
from jobcore.submit import EnqueueRequest, enqueue


@dataclass(frozen=True, slots=True)
class ScheduleState:
    name: str
    last_tick: datetime
    paused: bool
    paused_at: datetime | None
    last_job_id: uuid.UUID | None
    last_enqueued_at: datetime | None
    # The latest tick refused, when, and why (a Refusal); None: never refused.
    last_refusal_at: datetime | None = None
    last_refused_tick: datetime | None = None
    last_refusal_reason: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> ScheduleState:
        return cls(
            row["name"],
            row["last_tick"],
            row["paused"],
            row["paused_at"],
            row["last_job_id"],
            row["last_enqueued_at"],
            row["last_refusal_at"],
            row["last_refused_tick"],
            row["last_refusal_reason"],
        )


class Refusal(StrEnum):
    """Why a tick made no job (``schedules.last_refusal_reason``, the refusal metric's
    ``reason``)."""

    # A pending or running job of the type holds the payload's unique key.
    UNIQUE_KEY = "unique_key"
    # The tenant's quotas (jobcore.quotas): its enqueue rate, its cap of unfinished jobs.
    ENQUEUE_RATE = "enqueue_rate"
    MAX_UNFINISHED = "max_unfinished"
    QUOTA = "quota"


@dataclass(frozen=True, slots=True)
class EnqueuedTick:
    tick: datetime
    # None: the tick's key was already taken by a job of another request (the
    # declaration changed since), or the tick was refused; nothing was written.
    job_id: uuid.UUID | None
    # The tick's job existed already (another scheduler made it): nothing was written.
    replayed: bool
    # Why the enqueue refused the tick (None: not refused), and its words for the log.
    refusal: Refusal | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleRound:
    """What one round did for one schedule."""

    name: str
    paused: bool = False
    enqueued: list[EnqueuedTick] = field(default_factory=list)
    # Missed ticks the policy left out (a lower bound after a long gap).
    skipped: int = 0
    last_tick: datetime | None = None


async def ensure_states(
    session: Session, schedules: Sequence[Schedule], now: datetime
) -> dict[str, ScheduleState]:
    """Every schedule's state, creating those seen for the first time (their first tick
    is the first after ``now``: a new schedule does not make up for its past)."""
    if schedules:
        await schedule_store.ensure_many(
            session, {"names": [s.name for s in schedules], "now": now}
        )
    return await read_states(session)


async def read_states(session: Session) -> dict[str, ScheduleState]:
    rows = await schedule_store.list_states(session)
    return {row["name"]: ScheduleState.from_row(row) for row in rows}


async def enqueue_due(
    uow: UnitOfWork, topology: Topology, schedule: Schedule, now: datetime, *, quotas: Quotas
) -> ScheduleRound:
    """Enqueue ``schedule``'s due ticks and advance its state, in the caller's transaction
    (it commits). A tick the enqueue refuses (its unique key held, the tenant's quotas)
    is undone alone and recorded (:class:`EnqueuedTick` ``refusal``, and on the
    schedule's row); the state moves past it all the same."""
    row = await schedule_store.lock(uow, {"name": schedule.name})
    if row is None:
        await ensure_states(uow, [schedule], now)
        return ScheduleRound(schedule.name)
    state = ScheduleState.from_row(row)
    if state.paused:
        return ScheduleRound(schedule.name, paused=True, last_tick=state.last_tick)
    due = schedule.due(state.last_tick, now)
    if due.latest is None:
        return ScheduleRound(schedule.name, last_tick=state.last_tick)
    enqueued = [await _enqueue_tick(uow, topology, schedule, tick, quotas) for tick in due.enqueue]
    made = [tick for tick in enqueued if tick.job_id is not None]
    refused = [tick for tick in enqueued if tick.refusal is not None]
    advance: ScheduleAdvanceParams = {
        "name": schedule.name,
        "tick": due.latest,
        "job_id": made[-1].job_id if made else None,
        "refused_tick": refused[-1].tick if refused else None,
        "refusal_reason": str(refused[-1].refusal) if refused else None,
    }
    await schedule_store.advance(uow, advance)
    return ScheduleRound(schedule.name, False, enqueued, due.skipped, due.latest)


async def _enqueue_tick(
    uow: UnitOfWork, topology: Topology, schedule: Schedule, tick: datetime, quotas: Quotas
) -> EnqueuedTick:
    # A savepoint per tick: a refusal undoes this tick's writes only, whatever the enqueue
    # wrote before it refused. Each is a subtransaction; a catch-up of more than 64 ticks
    # overflows PostgreSQL's per-backend cache of them, and other sessions then check
    # pg_subtrans while this round's transaction is open: a short, rare round.
    try:
        async with uow.savepoint():
            result = await _enqueue_tick_job(uow, topology, schedule, tick, quotas)
    except IdempotencyConflict:
        return EnqueuedTick(tick, None, True)
    except UniqueJobExists as exc:
        return EnqueuedTick(tick, None, False, Refusal.UNIQUE_KEY, str(exc))
    except QuotaExceeded as exc:
        reason = Refusal(exc.reason) if exc.reason in set(Refusal) else Refusal.QUOTA
        return EnqueuedTick(tick, None, False, reason, str(exc))
    return EnqueuedTick(tick, result.job_id, result.replayed)


async def _enqueue_tick_job(
    uow: UnitOfWork, topology: Topology, schedule: Schedule, tick: datetime, quotas: Quotas
) -> EnqueueResult:
    request = EnqueueRequest(
        tenant=schedule.tenant,
        job_type=schedule.job_type,
        payload=schedule.payload,
        idempotency_key=tick_key(schedule.name, tick),
        entity_id=schedule.entity_id,
        max_attempts=schedule.max_attempts,
        run_at=schedule.run_at(tick),
        origin={"schedule": schedule.name},
    )
    return await enqueue(uow, topology, request, quotas=quotas)


async def enqueue_now(
    uow: UnitOfWork, topology: Topology, schedule: Schedule, *, quotas: Quotas
) -> EnqueueResult:
    """One job of ``schedule`` now, outside its ticks (``jobcore schedules trigger``): no
    idempotency key, and the schedule's state is left as it is."""
    request = EnqueueRequest(
        tenant=schedule.tenant,
        job_type=schedule.job_type,
        payload=schedule.payload,
        entity_id=schedule.entity_id,
        max_attempts=schedule.max_attempts,
        origin={"schedule": schedule.name, "triggered": "by hand"},
    )
    return await enqueue(uow, topology, request, quotas=quotas)
