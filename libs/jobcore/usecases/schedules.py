"""Schedule use cases (`jobcore schedules list|pause|resume|trigger`): periodic jobs seen
and steered by operators.

Pausing stops a schedule's ticks on every worker from their next round; resuming starts
again from the next tick after now (the ticks that passed while paused are not made up,
whatever the missed-tick policy: a pause is deliberate). Triggering enqueues one job of
the schedule now, outside its ticks, paused or not. All three are admin actions, audited
(:mod:`jobcore.audit`) under ``schedule:<name>`` with the schedule's tenant; an unknown
name is refused (:class:`~jobcore.schedules.ScheduleNotFound`) and audited as refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from jobcore.amqp.topology import Topology
from jobcore.audit import AuditAction, Target, audited
from jobcore.db import Database
from jobcore.maintenance.scheduling import ScheduleState, enqueue_now, ensure_states, read_states
from jobcore.schedules import Schedule, find
from jobcore.settings import Settings
from jobcore.store import schedule_store


@dataclass(frozen=True, slots=True)
class ScheduleStatus:
    name: str
    job_type: str | None
    cron: str | None
    timezone: str | None
    missed: str | None
    jitter: float | None
    tenant: str | None
    paused: bool
    # The latest tick enqueued (or, before the first, when the schedule was first seen).
    last_tick: datetime | None
    # The next tick after now and after last_tick (None: paused, or not declared).
    next_tick: datetime | None
    last_job_id: uuid.UUID | None
    last_enqueued_at: datetime | None
    # False: a state row left by a schedule no longer declared (it is ignored).
    declared: bool
    # The latest tick the enqueue refused (passed, not tried again), when and why
    # (jobcore.maintenance.scheduling.Refusal: unique_key, enqueue_rate, max_unfinished).
    last_refusal_at: datetime | None = None
    last_refused_tick: datetime | None = None
    last_refusal_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _status(
    schedule: Schedule | None, state: ScheduleState | None, now: datetime, name: str
) -> ScheduleStatus:
    paused = state.paused if state else False
    next_tick = None
    if schedule is not None and not paused:
        next_tick = schedule.next_tick(max(state.last_tick, now) if state else now)
    return ScheduleStatus(
        name=name,
        job_type=schedule.job_type.name if schedule else None,
        cron=schedule.cron if schedule else None,
        timezone=schedule.timezone if schedule else None,
        missed=schedule.missed if schedule else None,
        jitter=schedule.jitter if schedule else None,
        tenant=schedule.tenant if schedule else None,
        paused=paused,
        last_tick=state.last_tick if state else None,
        next_tick=next_tick,
        last_job_id=state.last_job_id if state else None,
        last_enqueued_at=state.last_enqueued_at if state else None,
        declared=schedule is not None,
        last_refusal_at=state.last_refusal_at if state else None,
        last_refused_tick=state.last_refused_tick if state else None,
        last_refusal_reason=state.last_refusal_reason if state else None,
    )


async def list_schedules(
    db: Database, schedules: Sequence[Schedule], *, now: datetime
) -> list[ScheduleStatus]:
    """Every declared schedule with its state, then state rows no longer declared."""
    async with db.unit_of_work() as uow:
        states = await read_states(uow)
    declared = {s.name: s for s in schedules}
    names = sorted(set(declared) | set(states))
    return [_status(declared.get(name), states.get(name), now, name) for name in names]


async def _set_paused(
    db: Database,
    schedules: Sequence[Schedule],
    name: str,
    *,
    paused: bool,
    actor: str,
    now: datetime,
) -> ScheduleStatus:
    action = AuditAction.SCHEDULE_PAUSE if paused else AuditAction.SCHEDULE_RESUME
    async with audited(db, actor=actor, action=action, target=Target("schedule", name)) as work:
        schedule = find(tuple(schedules), name)
        work.entry.tenant = schedule.tenant
        await ensure_states(work.uow, [schedule], now)
        before = await schedule_store.lock(work.uow, {"name": name})
        assert before is not None  # ensured just above, in this transaction
        row = await schedule_store.set_paused(
            work.uow, {"name": name, "paused": paused, "now": now}
        )
        assert row is not None
        work.entry.details = {"was_paused": before["paused"], "last_tick": row["last_tick"]}
        await work.commit()
    return _status(schedule, ScheduleState.from_row(row), now, name)


async def pause_schedule(
    db: Database, schedules: Sequence[Schedule], name: str, *, actor: str, now: datetime
) -> ScheduleStatus:
    """Stop enqueueing the schedule's ticks until it is resumed (pausing twice is one)."""
    return await _set_paused(db, schedules, name, paused=True, actor=actor, now=now)


async def resume_schedule(
    db: Database, schedules: Sequence[Schedule], name: str, *, actor: str, now: datetime
) -> ScheduleStatus:
    """Enqueue the schedule's ticks again, from the first after ``now``."""
    return await _set_paused(db, schedules, name, paused=False, actor=actor, now=now)


@dataclass(frozen=True, slots=True)
class TriggerOutcome:
    name: str
    job_id: uuid.UUID
    tenant: str
    job_type: str


async def trigger_schedule(
    db: Database, settings: Settings, schedules: Sequence[Schedule], name: str, *, actor: str
) -> TriggerOutcome:
    """Enqueue one job of the schedule now (its tenant's quotas apply)."""
    topology = Topology.from_settings(settings)
    target = Target("schedule", name)
    async with audited(db, actor=actor, action=AuditAction.SCHEDULE_TRIGGER, target=target) as work:
        schedule = find(tuple(schedules), name)
        work.entry.tenant = schedule.tenant
        result = await enqueue_now(work.uow, topology, schedule, quotas=settings.quota_defaults)
        work.entry.details = {"job_id": result.job_id, "type": schedule.job_type.name}
        await work.commit()
    return TriggerOutcome(name, result.job_id, schedule.tenant, schedule.job_type.name)
