"""The scheduler: periodic jobs enqueued at their ticks, by the maintenance leader.

It runs when schedules are declared (:mod:`jobcore.maintenance.periodic`). Every
``JOBCORE_SCHEDULER_INTERVAL`` the leader's scheduler reads the schedules' state and, for
each schedule with a tick due, enqueues it in a fenced transaction of its own
(:func:`jobcore.maintenance.schedule_ticks.enqueue_due`): one job per tick however many workers
run. A tick the enqueue refuses (its unique key held, its tenant's quota) is recorded and
passed, and holds up neither the schedule's later ticks nor the other schedules.

Every worker, leader or not, refreshes the schedule gauges from the database each round,
so each reports the same values (aggregate with ``max``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from jobcore.amqp.topology import Topology
from jobcore.kernel.errors import DatabaseUnavailable, JobcoreError
from jobcore.kernel.quotas import Quotas
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import MaintenanceService, ServiceConfig
from jobcore.maintenance.connection import Transactions
from jobcore.maintenance.lease import Term
from jobcore.maintenance.metrics import SchedulerMetrics
from jobcore.maintenance.periodic import Schedule
from jobcore.maintenance.schedule_ticks import (
    EnqueueTick,
    ScheduleRound,
    ScheduleState,
    enqueue_due,
    ensure_states,
    read_states,
)

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SchedulerConfig(ServiceConfig):
    variables: ClassVar = {"interval": "JOBCORE_SCHEDULER_INTERVAL"}

    @classmethod
    def from_settings(cls, settings: Settings) -> SchedulerConfig:
        return cls(interval=settings.scheduler_interval)


class Scheduler(MaintenanceService[SchedulerConfig]):
    name = "scheduler"
    follows = True

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        schedules: Sequence[Schedule],
        topology: Topology,
        quotas: Quotas,
        metrics: SchedulerMetrics,
        enqueue: EnqueueTick,
        clock: Clock = system_clock,
    ) -> None:
        super().__init__(config)
        self.enqueue = enqueue
        self.schedules = tuple(schedules)
        self.topology = topology
        self.quotas = quotas
        self.metrics = metrics
        self.clock = clock

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        schedules: Sequence[Schedule],
        metrics: SchedulerMetrics,
        enqueue: EnqueueTick,
        clock: Clock = system_clock,
    ) -> Scheduler:
        return cls(
            SchedulerConfig.from_settings(settings),
            schedules=schedules,
            topology=Topology.from_settings(settings),
            quotas=settings.quota_defaults,
            metrics=metrics,
            enqueue=enqueue,
            clock=clock,
        )

    async def _states(self, db: Transactions, now: datetime) -> dict[str, ScheduleState]:
        """The schedules' state (made for new ones), and the gauges refreshed from it."""
        async with db.unit_of_work() as uow:
            states = await read_states(uow)
            if any(schedule.name not in states for schedule in self.schedules):
                states = await ensure_states(uow, self.schedules, now)
            await uow.commit()
        self.metrics.states(self.schedules, states, now)
        return states

    async def follow(self, db: Transactions) -> None:
        await self._states(db, self.clock())

    async def lead(self, term: Term) -> int:
        """Refresh the gauges; enqueue every due tick. Returns the jobs enqueued."""
        now = self.clock()
        states = await self._states(term.db, now)
        enqueued = 0
        for schedule in self.schedules:
            state = states.get(schedule.name)
            if state is None or state.paused or schedule.due(state.last_tick, now).latest is None:
                continue
            try:
                done = await self._enqueue(term, schedule, now)
            except DatabaseUnavailable:
                raise  # the round ends; the maintainer logs it once
            except JobcoreError as exc:
                log.error(
                    "schedule tick failed; due again next round",
                    extra={"schedule": schedule.name, "error": str(exc)},
                )
                continue
            if done is None:
                return enqueued  # fenced: the lease went to another worker, or the row did
            self._report(done)
            enqueued += sum(1 for tick in done.enqueued if tick.refusal is None)
        return enqueued

    async def _enqueue(self, term: Term, schedule: Schedule, now: datetime) -> ScheduleRound | None:
        async with term.db.unit_of_work() as uow:
            if not await term.fence(uow, self):
                return None
            done = await enqueue_due(
                uow, self.topology, schedule, now, quotas=self.quotas, enqueue=self.enqueue
            )
            await uow.commit()
        return done

    def _report(self, done: ScheduleRound) -> None:
        self.metrics.round(done)
        for tick in done.enqueued:
            if tick.refusal is not None:
                log.warning(
                    "schedule tick refused; passed, not tried again",
                    extra={
                        "schedule": done.name,
                        "tick": tick.tick.isoformat(),
                        "reason": str(tick.refusal),
                        "error": tick.detail,
                    },
                )
            elif tick.replayed:
                log.warning(
                    "schedule tick already enqueued",
                    extra={"schedule": done.name, "tick": tick.tick.isoformat()},
                )
            else:
                log.info(
                    "schedule tick enqueued",
                    extra={
                        "schedule": done.name,
                        "tick": tick.tick.isoformat(),
                        "job_id": str(tick.job_id),
                    },
                )
        if done.skipped:
            log.warning(
                "missed schedule ticks skipped",
                extra={"schedule": done.name, "skipped": done.skipped},
            )
