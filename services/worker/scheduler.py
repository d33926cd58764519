"""The scheduler: periodic jobs enqueued at their ticks, one scheduler at a time.

Every worker runs it when schedules are declared (:mod:`jobcore.schedules`); only the
holder of the ``scheduler`` maintenance lease (:mod:`services.worker.maintenance`)
enqueues. Every ``JOBCORE_SCHEDULER_INTERVAL`` it reads the schedules' state and, for each
schedule with a tick due, enqueues it in a transaction of its own that renews the lease
(:func:`jobcore.usecases.scheduling.enqueue_due`): one job per tick however many workers
run. A tick the enqueue refuses (its unique key held, its tenant's quota) is recorded and
passed, and holds up neither the schedule's later ticks nor the other schedules.

Every worker, leader or not, refreshes the schedule gauges from the database each round,
so each reports the same values (aggregate with ``max``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from jobcore.amqp.topology import Topology
from jobcore.db import Database, UnitOfWork
from jobcore.errors import DatabaseUnavailable, JobcoreError
from jobcore.schedules import Schedule
from jobcore.settings import Settings
from jobcore.usecases.scheduling import (
    ScheduleRound,
    ScheduleState,
    enqueue_due,
    ensure_states,
    read_states,
)
from services.worker.maintenance import MaintenanceService

log = logging.getLogger(__name__)

LEASE_NAME = "scheduler"

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


class SchedulerMetrics:
    """The scheduler's instruments, on the worker's collector registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._enqueued = Counter(
            "jobcore_schedule_jobs_enqueued",
            "Jobs enqueued for schedule ticks, by schedule (the scheduler lease's holder).",
            ["schedule"],
            registry=registry,
        )
        self._skipped = Counter(
            "jobcore_schedule_ticks_skipped",
            "Missed ticks the missed-tick policy left out, by schedule (at least).",
            ["schedule"],
            registry=registry,
        )
        self._refused = Counter(
            "jobcore_schedule_enqueue_refusals",
            "Schedule ticks the enqueue refused, by schedule and reason (unique_key, "
            "enqueue_rate, max_unfinished): each made no job and is not tried again.",
            ["schedule", "reason"],
            registry=registry,
        )
        self._next_tick = Gauge(
            "jobcore_schedule_next_tick_timestamp_seconds",
            "When the schedule's next tick is due (Unix time; 0 while paused).",
            ["schedule"],
            registry=registry,
        )
        self._last_tick = Gauge(
            "jobcore_schedule_last_tick_timestamp_seconds",
            "The latest tick enqueued (Unix time; before the first, when the schedule was "
            "first seen).",
            ["schedule"],
            registry=registry,
        )
        self._paused = Gauge(
            "jobcore_schedule_paused",
            "1 while the schedule is paused (jobcore schedules pause).",
            ["schedule"],
            registry=registry,
        )

    def round(self, done: ScheduleRound) -> None:
        made = sum(1 for tick in done.enqueued if tick.job_id is not None and not tick.replayed)
        if made:
            self._enqueued.labels(done.name).inc(made)
        if done.skipped:
            self._skipped.labels(done.name).inc(done.skipped)
        for tick in done.enqueued:
            if tick.refusal is not None:
                self._refused.labels(done.name, tick.refusal).inc()

    def states(
        self, schedules: Sequence[Schedule], states: dict[str, ScheduleState], now: datetime
    ) -> None:
        for schedule in schedules:
            state = states.get(schedule.name)
            if state is None:
                continue
            upcoming = None if state.paused else schedule.next_tick(max(state.last_tick, now))
            self._next_tick.labels(schedule.name).set(upcoming.timestamp() if upcoming else 0)
            self._last_tick.labels(schedule.name).set(state.last_tick.timestamp())
            self._paused.labels(schedule.name).set(1 if state.paused else 0)


class Scheduler(MaintenanceService):
    name = "worker-scheduler"
    lease_name = LEASE_NAME

    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        owner: str,
        schedules: Sequence[Schedule],
        metrics_registry: CollectorRegistry,
        interval: float | None = None,
        clock: Clock = system_clock,
    ) -> None:
        super().__init__(
            db,
            owner=owner,
            interval=interval if interval is not None else settings.scheduler_interval,
        )
        self.schedules = tuple(schedules)
        self.topology = Topology.from_settings(settings)
        self.quotas = settings.quota_defaults
        self.metrics = SchedulerMetrics(metrics_registry)
        self.clock = clock

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[Any]]:  # pragma: no cover
        raise NotImplementedError("the scheduler works per schedule (tick)")

    async def tick(self) -> int:
        """One round: refresh the gauges; as the lease's holder, enqueue every due tick.
        Returns the jobs enqueued."""
        now = self.clock()
        async with self.db.unit_of_work() as uow:
            states = await read_states(uow)
            if any(schedule.name not in states for schedule in self.schedules):
                states = await ensure_states(uow, self.schedules, now)
            await uow.commit()
        self.metrics.states(self.schedules, states, now)
        if not await self._hold_lease():
            return 0
        enqueued = 0
        for schedule in self.schedules:
            state = states.get(schedule.name)
            if state is None or state.paused or schedule.due(state.last_tick, now).latest is None:
                continue
            done = await self._enqueue(schedule, now)
            if done is None:
                if self.token is None:
                    return enqueued  # the lease went to another worker: it carries on
                continue
            enqueued += sum(1 for tick in done.enqueued if tick.refusal is None)
        return enqueued

    async def _enqueue(self, schedule: Schedule, now: datetime) -> ScheduleRound | None:
        try:
            async with self.db.unit_of_work() as uow:
                if not await self.renew_in(uow):
                    log.info("scheduler lease lost to another worker")
                    return None
                done = await enqueue_due(uow, self.topology, schedule, now, quotas=self.quotas)
                await uow.commit()
        except DatabaseUnavailable:
            raise  # the round ends; run() logs it once and keeps the token
        except JobcoreError as exc:
            log.error(
                "schedule tick failed; due again next round",
                extra={"schedule": schedule.name, "error": str(exc)},
            )
            return None
        self._report(done)
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
