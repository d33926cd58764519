"""A schedule's jobs through the enqueue use case: one per tick (what the scheduler
enqueues, handed to it as its :class:`~jobcore.maintenance.schedule_ticks.EnqueueTick`), or
one now by hand (``jobcore schedules trigger``).
"""

from __future__ import annotations

from datetime import datetime

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import UnitOfWork
from jobcore.kernel.quotas import Quotas
from jobcore.maintenance.periodic import Schedule, tick_key
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from jobcore.usecases.enqueue.write_one import EnqueueResult


async def enqueue_schedule_job(
    uow: UnitOfWork,
    topology: Topology,
    schedule: Schedule,
    tick: datetime | None,
    *,
    quotas: Quotas,
) -> EnqueueResult:
    """One job of ``schedule`` in the caller's transaction: for ``tick``, with the tick as
    its idempotency key and run at the tick; with no tick, now and outside its ticks (no
    idempotency key, the schedule's state left as it is)."""
    if tick is None:
        request = EnqueueRequest(
            tenant=schedule.tenant,
            job_type=schedule.job_type,
            payload=schedule.payload,
            entity_id=schedule.entity_id,
            max_attempts=schedule.max_attempts,
            origin={"schedule": schedule.name, "triggered": "by hand"},
        )
    else:
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
