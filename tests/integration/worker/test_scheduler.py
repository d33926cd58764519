"""The scheduler against the real PostgreSQL, its clock driven by the test: one job per
tick, missed-tick policies, clock steps and restarts, pause/resume/trigger (audited),
quota refusals and the schedule gauges. Several schedulers at once, as processes, are in
test_scheduler_processes.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql import Query
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Scheduler
from jobcore.maintenance.periodic import (
    Schedule,
    ScheduleConfigError,
    ScheduleNotFound,
    load_schedules,
)
from jobcore.maintenance.scheduler import Clock as SchedulerClock
from jobcore.usecases import quotas as quota_usecases
from jobcore.usecases import schedules as schedule_usecases
from jobcore.usecases.enqueue.scheduled import enqueue_schedule_job
from jobcore.usecases.jobs import cancel_any_job
from jobcore.usecases.timeline import job_timeline
from services.worker.app import Worker
from services.worker.metrics import SchedulerMetrics
from tests.integration.worker.support import Maintenance

ACTOR = "test:scheduler"
SCHEDULE_JOBS = Query(
    "test_schedule_jobs",
    "The jobs schedules enqueued, in key order.",
    """
    SELECT idempotency_key, type, tenant, entity_id, payload, max_attempts, next_attempt_at,
           id
    FROM jobs WHERE entity_id LIKE 'schedule:%%' ORDER BY idempotency_key NULLS LAST, created_at
    """,
)
STATE = Query(
    "test_schedule_state",
    "Every schedule's state row.",
    """
    SELECT name, last_tick, paused, last_job_id, last_refused_tick, last_refusal_reason,
           last_refusal_at
    FROM schedules ORDER BY name
    """,
)
AUDIT = Query(
    "test_schedule_audit",
    "The audit entries of schedule actions.",
    """
    SELECT actor, action, target_type, target_id, tenant, outcome, details FROM audit_log
    WHERE target_type = 'schedule' ORDER BY id
    """,
)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def set(self, offset: float) -> None:
        self.now = T0 + timedelta(seconds=offset)


# A whole minute (every cron here ticks on it), in the recent past: created_at stays close.
T0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)


def declare(**declarations: dict[str, Any]) -> tuple[Schedule, ...]:
    specs = {
        name: {"job_type": "noop", "cron": "* * * * * *", **d} for name, d in declarations.items()
    }
    return load_schedules(specs, default_registry, in_code={})


class Scheduling(Maintenance):
    """A maintainer running only a scheduler, its instruments on ``registry``."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        schedules: Sequence[Schedule],
        clock: SchedulerClock,
        owner: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        metrics = SchedulerMetrics(self.registry)
        service = Scheduler.from_settings(
            settings,
            schedules=schedules,
            metrics=metrics,
            enqueue=enqueue_schedule_job,
            clock=clock,
        )
        super().__init__(db, owner, service)

    async def tick(self) -> int:
        return await self.round()


def scheduler(
    settings: Settings, db: Database, schedules: Sequence[Schedule], clock: Clock, owner: str = "a"
) -> Scheduling:
    return Scheduling(settings, db, schedules, clock, owner)


async def jobs(db: Database) -> list[dict[str, Any]]:
    async with db.unit_of_work() as uow:
        return [dict(r) for r in await fetch_all(uow, SCHEDULE_JOBS({}))]


async def keys(db: Database, name: str) -> list[str]:
    return [
        j["idempotency_key"].removeprefix(f"schedule:{name}:")
        for j in await jobs(db)
        if j["entity_id"] == f"schedule:{name}" and j["idempotency_key"]
    ]


def at(*offsets: int) -> list[str]:
    return [(T0 + timedelta(seconds=s)).isoformat() for s in offsets]


def sample(registry: CollectorRegistry, name: str, schedule: str) -> float | None:
    return registry.get_sample_value(f"jobcore_schedule_{name}", {"schedule": schedule})


async def states(db: Database) -> dict[str, dict[str, Any]]:
    async with db.unit_of_work() as uow:
        return {r["name"]: dict(r) for r in await fetch_all(uow, STATE({}))}


@pytest.fixture
async def second_db(settings: Settings) -> AsyncIterator[Database]:
    """Another pool on the same database: another scheduler's connections."""
    database = Database(settings, name="second-scheduler")
    await database.open(wait=True)
    try:
        yield database
    finally:
        await database.close()


async def test_each_tick_makes_one_job_once_and_the_state_follows(
    settings: Settings, db: Database
) -> None:
    schedules = declare(
        every=dict(payload={}, max_attempts=2),
        jittered=dict(cron="*/2 * * * * *", jitter=1.5, tenant="ops"),
    )
    clock = Clock(T0)
    worker = scheduler(settings, db, schedules, clock)
    assert await worker.tick() == 0  # first sight: the state starts now, nothing is made up
    clock.set(1.5)
    assert await worker.tick() == 1
    assert await worker.tick() == 0  # the same instant again: that tick is made
    clock.set(2.2)
    assert await worker.tick() == 2

    assert await keys(db, "every") == at(1, 2)
    assert await keys(db, "jittered") == at(2)
    made = {j["idempotency_key"]: j for j in await jobs(db)}
    every = made[f"schedule:every:{at(2)[0]}"]
    assert (every["type"], every["tenant"], every["max_attempts"]) == ("noop", "scheduler", 2)
    jittered = made[f"schedule:jittered:{at(2)[0]}"]
    assert jittered["tenant"] == "ops"
    delay = (jittered["next_attempt_at"] - (T0 + timedelta(seconds=2))).total_seconds()
    assert 0 <= delay < 1.5
    # PostgreSQL keeps microseconds.
    assert delay == pytest.approx(schedules[1].jitter_offset(T0 + timedelta(seconds=2)), abs=1e-5)
    state = (await states(db))["every"]
    assert state["last_tick"] == T0 + timedelta(seconds=2)
    assert state["last_job_id"] == every["id"]
    # Its timeline starts with `accepted`, naming the schedule.
    timeline = await job_timeline(db, every["id"], tenant="scheduler")
    assert timeline is not None
    [accepted] = timeline.events
    assert (accepted.kind, accepted.detail["schedule"]) == ("accepted", "every")


async def test_two_schedulers_on_separate_connections_make_each_tick_once(
    settings: Settings, db: Database, second_db: Database
) -> None:
    schedules = declare(every=dict(missed="catch_up:10"))
    clock = Clock(T0)
    first = scheduler(settings, db, schedules, clock, owner="first")
    second = scheduler(settings, second_db, schedules, clock, owner="second")
    made = await first.tick() + await second.tick()
    for step in range(1, 8):
        clock.set(step + 0.3)
        made += await first.tick() + await second.tick()
    assert first.is_leader
    assert not second.is_leader
    assert made == 7
    assert await keys(db, "every") == at(1, 2, 3, 4, 5, 6, 7)
    # The leader stops (its lease given back): the other takes over from the last tick.
    await first.maintainer.step_down()
    clock.set(10.3)
    assert await second.tick() == 3
    assert second.is_leader
    assert await keys(db, "every") == at(*range(1, 11))


async def test_missed_ticks_are_skipped_or_caught_up_to_n(settings: Settings, db: Database) -> None:
    schedules = declare(skipping=dict(), catching=dict(missed="catch_up:3"))
    clock = Clock(T0)
    worker = scheduler(settings, db, schedules, clock)
    await worker.tick()
    clock.set(10.5)  # ten ticks since: nine of them missed
    await worker.tick()
    assert await keys(db, "skipping") == at(10)
    assert await keys(db, "catching") == at(7, 8, 9, 10)
    assert {n: s["last_tick"] for n, s in (await states(db)).items()} == {
        "catching": T0 + timedelta(seconds=10),
        "skipping": T0 + timedelta(seconds=10),
    }


async def test_clock_steps_and_restarts_never_make_a_tick_twice(
    settings: Settings, db: Database
) -> None:
    schedules = declare(every=dict(missed="catch_up:10"))
    clock = Clock(T0)
    worker = scheduler(settings, db, schedules, clock)
    await worker.tick()
    clock.set(3.5)
    assert await worker.tick() == 3
    await worker.maintainer.step_down()

    # A restarted worker whose clock stepped back two seconds: nothing again.
    clock.set(1.5)
    restarted = scheduler(settings, db, schedules, clock, owner="restarted")
    assert await restarted.tick() == 0
    clock.set(3.9)
    assert await restarted.tick() == 0
    assert (await states(db))["every"]["last_tick"] == T0 + timedelta(seconds=3)
    # Forward again, past the last tick: only the ticks after it.
    clock.set(5.1)
    assert await restarted.tick() == 2
    # A step forward of a minute: the policy decides (catch_up:10 → ten missed + latest).
    clock.set(65.2)
    assert await restarted.tick() == 11
    assert await keys(db, "every") == at(1, 2, 3, 4, 5, *range(55, 66))


async def test_pause_resume_and_trigger_are_audited_and_do_what_they_say(
    settings: Settings, db: Database
) -> None:
    schedules = declare(every=dict(missed="catch_up:10", tenant="ops"))
    clock = Clock(T0)
    worker = scheduler(settings, db, schedules, clock)
    await worker.tick()

    paused = await schedule_usecases.pause_schedule(
        db, schedules, "every", actor=ACTOR, now=clock()
    )
    assert paused.paused
    assert paused.next_tick is None
    clock.set(3.5)
    assert await worker.tick() == 0

    trigger = await schedule_usecases.trigger_schedule(
        db, settings, schedules, "every", actor=ACTOR
    )
    made = await jobs(db)
    assert [(j["id"], j["idempotency_key"], j["tenant"]) for j in made] == [
        (trigger.job_id, None, "ops")
    ]
    assert (await states(db))["every"]["last_tick"] == T0  # a trigger is not a tick
    triggered = await job_timeline(db, trigger.job_id, tenant=None)
    assert triggered is not None
    assert triggered.events[0].detail == {"schedule": "every", "triggered": "by hand"}

    resumed = await schedule_usecases.resume_schedule(
        db, schedules, "every", actor=ACTOR, now=clock()
    )
    assert not resumed.paused
    assert resumed.next_tick == T0 + timedelta(seconds=4)
    clock.set(3.8)
    assert await worker.tick() == 0  # the ticks while paused are not made up
    clock.set(4.1)
    assert await worker.tick() == 1
    assert await keys(db, "every") == at(4)

    with pytest.raises(ScheduleNotFound):
        await schedule_usecases.pause_schedule(db, schedules, "evry", actor=ACTOR, now=clock())

    async with db.unit_of_work() as uow:
        entries = [dict(r) for r in await fetch_all(uow, AUDIT({}))]
    assert [(e["action"], e["target_id"], e["outcome"], e["actor"]) for e in entries] == [
        ("schedule.pause", "every", "succeeded", ACTOR),
        ("schedule.trigger", "every", "succeeded", ACTOR),
        ("schedule.resume", "every", "succeeded", ACTOR),
        ("schedule.pause", "evry", "refused", ACTOR),
    ]
    assert entries[0]["tenant"] == "ops"
    assert entries[0]["details"]["was_paused"] is False
    assert entries[1]["details"]["job_id"] == str(trigger.job_id)
    assert entries[3]["details"]["refused"] == "ScheduleNotFound"


async def test_list_shows_state_and_next_tick_and_undeclared_rows(
    settings: Settings, db: Database
) -> None:
    schedules = declare(every=dict(cron="*/5 * * * * *"), gone=dict())
    clock = Clock(T0)
    await scheduler(settings, db, schedules, clock).tick()
    listed = await schedule_usecases.list_schedules(
        db, schedules[:1], now=T0 + timedelta(seconds=1)
    )
    by_name = {s.name: s for s in listed}
    assert by_name["every"].next_tick == T0 + timedelta(seconds=5)
    assert by_name["every"].last_tick == T0
    assert by_name["every"].declared
    assert not by_name["gone"].declared
    assert by_name["gone"].next_tick is None


def counting_scheduler(
    settings: Settings, db: Database, schedules: Sequence[Schedule], clock: Clock
) -> tuple[Scheduling, CollectorRegistry]:
    worker = scheduler(settings, db, schedules, clock)
    return worker, worker.registry


def refusals(registry: CollectorRegistry, schedule: str, reason: str) -> float | None:
    return registry.get_sample_value(
        "jobcore_schedule_enqueue_refusals_total", {"schedule": schedule, "reason": reason}
    )


async def test_a_quota_refused_tick_is_recorded_and_passed_not_tried_every_round(
    settings: Settings, db: Database
) -> None:
    schedules = declare(capped=dict(tenant="capped"), free=dict())
    await quota_usecases.set_quotas(db, "capped", max_unfinished=1)
    clock = Clock(T0)
    worker, registry = counting_scheduler(settings, db, schedules, clock)
    await worker.tick()
    clock.set(1.2)
    assert await worker.tick() == 2
    clock.set(2.2)
    assert await worker.tick() == 1  # capped is at its limit: only free's tick
    # The same second again: `skip` passed the refused tick, it is not tried every round.
    clock.set(2.6)
    assert await worker.tick() == 0
    assert await keys(db, "capped") == at(1)
    capped = (await states(db))["capped"]
    assert capped["last_tick"] == T0 + timedelta(seconds=2)
    assert capped["last_refused_tick"] == T0 + timedelta(seconds=2)
    assert capped["last_refusal_reason"] == "max_unfinished"
    assert capped["last_refusal_at"] is not None
    assert (await states(db))["free"]["last_refusal_reason"] is None
    assert refusals(registry, "capped", "max_unfinished") == 1
    assert sample(registry, "jobs_enqueued_total", "free") == 2
    # The quota raised: the next tick is made; the refused one stays passed.
    await quota_usecases.set_quotas(db, "capped", max_unfinished=None)
    clock.set(3.4)
    assert await worker.tick() == 2
    assert await keys(db, "capped") == at(1, 3)
    assert sample(registry, "ticks_skipped_total", "capped") is None
    listed = await schedule_usecases.list_schedules(db, schedules, now=clock())
    shown = {status.name: status for status in listed}["capped"]
    assert shown.last_refused_tick == T0 + timedelta(seconds=2)
    assert shown.last_refusal_reason == "max_unfinished"


async def test_catch_up_of_a_unique_type_makes_the_first_tick_and_records_the_rest(
    settings: Settings, db: Database
) -> None:
    # Every tick's job holds the same unique key (the payload's account) while it is live.
    schedules = declare(
        syncing=dict(job_type="sync_account", payload={"account": "a1"}, missed="catch_up:3")
    )
    clock = Clock(T0)
    worker, registry = counting_scheduler(settings, db, schedules, clock)
    await worker.tick()
    clock.set(3.5)
    assert await worker.tick() == 1
    assert await keys(db, "syncing") == at(1)
    state = (await states(db))["syncing"]
    assert state["last_tick"] == T0 + timedelta(seconds=3)
    assert (state["last_refused_tick"], state["last_refusal_reason"]) == (
        T0 + timedelta(seconds=3),
        "unique_key",
    )
    assert refusals(registry, "syncing", "unique_key") == 2
    # Nothing is due again: the refused ticks are not tried every round.
    assert await worker.tick() == 0
    assert refusals(registry, "syncing", "unique_key") == 2


async def test_a_refused_tick_does_not_block_the_ticks_after_it(
    settings: Settings, db: Database
) -> None:
    schedules = declare(
        syncing=dict(job_type="sync_account", payload={"account": "a1"}, missed="catch_up:5")
    )
    clock = Clock(T0)
    worker, _ = counting_scheduler(settings, db, schedules, clock)
    await worker.tick()
    clock.set(1.2)
    assert await worker.tick() == 1
    clock.set(2.2)
    assert await worker.tick() == 0  # tick 1's job holds the key: tick 2 is refused
    # Tick 1's job ends (cancelled): it frees the key, and the next tick is made at once,
    # not held behind the refused one.
    [first] = await jobs(db)
    await cancel_any_job(db, settings, first["id"], actor=ACTOR)
    clock.set(3.2)
    assert await worker.tick() == 1
    assert await keys(db, "syncing") == at(1, 3)
    state = (await states(db))["syncing"]
    assert state["last_tick"] == T0 + timedelta(seconds=3)
    assert state["last_refused_tick"] == T0 + timedelta(seconds=2)


async def test_a_catch_up_larger_than_the_tenants_burst_makes_what_the_quota_admits(
    settings: Settings, db: Database
) -> None:
    schedules = declare(bursty=dict(tenant="bursty", missed="catch_up:5"))
    # A burst of 2 and a rate slow enough that no token comes back during the test.
    await quota_usecases.set_quotas(db, "bursty", enqueue_rate=0.01, enqueue_burst=2)
    clock = Clock(T0)
    worker, registry = counting_scheduler(settings, db, schedules, clock)
    await worker.tick()
    clock.set(6.5)  # six ticks due (five missed, caught up, and the latest)
    assert await worker.tick() == 2
    assert await keys(db, "bursty") == at(1, 2)
    state = (await states(db))["bursty"]
    assert state["last_tick"] == T0 + timedelta(seconds=6)
    assert (state["last_refused_tick"], state["last_refusal_reason"]) == (
        T0 + timedelta(seconds=6),
        "enqueue_rate",
    )
    assert refusals(registry, "bursty", "enqueue_rate") == 4
    assert await worker.tick() == 0


async def test_gauges_show_next_and_last_tick_and_pause_on_every_worker(
    settings: Settings, db: Database, second_db: Database
) -> None:
    schedules = declare(every=dict(cron="*/5 * * * * *"))
    clock = Clock(T0)
    leader = scheduler(settings, db, schedules, clock, owner="leader")
    follower = scheduler(settings, second_db, schedules, clock, owner="follower")
    registry = follower.registry
    await leader.tick()
    clock.set(5.5)
    await leader.tick()
    await follower.tick()
    assert not follower.is_leader

    def gauge(name: str) -> float | None:
        return registry.get_sample_value(f"jobcore_schedule_{name}", {"schedule": "every"})

    assert gauge("last_tick_timestamp_seconds") == (T0 + timedelta(seconds=5)).timestamp()
    assert gauge("next_tick_timestamp_seconds") == (T0 + timedelta(seconds=10)).timestamp()
    assert gauge("paused") == 0
    await schedule_usecases.pause_schedule(db, schedules, "every", actor=ACTOR, now=clock())
    await follower.tick()
    assert gauge("paused") == 1
    assert gauge("next_tick_timestamp_seconds") == 0


def test_a_worker_runs_a_scheduler_only_with_schedules_and_refuses_bad_ones(
    wsettings: Settings,
) -> None:
    plain = Worker(wsettings, health=False)
    assert plain.scheduler is None
    assert "scheduler" not in {service.name for service in plain.maintainer.services}
    declared = wsettings.model_copy(
        update={"schedules": {"s": {"job_type": "noop", "cron": "*/5 * * * *"}}}
    )
    scheduling = Worker(declared, health=False)
    assert scheduling.scheduler is not None
    assert scheduling.scheduler in scheduling.maintainer.services
    assert [s.name for s in scheduling.scheduler.schedules] == ["s"]
    bad = wsettings.model_copy(
        update={"schedules": {"s": {"job_type": "noop", "cron": "*/5 * * * *", "missed": "all"}}}
    )
    with pytest.raises(ScheduleConfigError, match="schedule 's': missed: 'all'"):
        Worker(bad, health=False)
