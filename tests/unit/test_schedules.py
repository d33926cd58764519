"""Schedules as pure logic: declarations checked into one clear error, the ticks due in a
window by the missed-tick policy, time zones across DST, and jitter."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import load_settings
from jobcore.maintenance import periodic as schedules_module
from jobcore.maintenance.periodic import (
    Schedule,
    ScheduleConfigError,
    ScheduleNotFound,
    ScheduleSpec,
    find,
    load_schedules,
    periodic,
    tick_key,
)

REGISTRY = load_job_modules(["jobcore.examples.jobtypes"])
T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def one(**declaration: Any) -> Schedule:
    spec: dict[str, Any] = {"job_type": "noop", "cron": "* * * * *", **declaration}
    (schedule,) = load_schedules({"s": spec}, REGISTRY, in_code={})
    return schedule


def refused(declarations: Mapping[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ScheduleConfigError) as caught:
        load_schedules(declarations, REGISTRY, **{"in_code": {}, **kwargs})
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- declarations -------------------------------------------------------------------------


def test_a_declaration_from_the_setting_is_checked_and_complete() -> None:
    settings = load_settings(
        schedules='{"nightly": {"job_type": "export_csv", "cron": "0 3 * * *", '
        '"timezone": "Europe/Paris", "jitter": 30, "missed": "catch_up:4", '
        '"payload": {"rows": 10}, "tenant": "ops", "max_attempts": 2}}'
    )
    (schedule,) = load_schedules(settings.schedules, REGISTRY, in_code={})
    assert schedule.name == "nightly"
    assert schedule.job_type.name == "export_csv"
    assert schedule.payload.model_dump()["rows"] == 10
    assert (schedule.catch_up, schedule.missed) == (4, "catch_up:4")
    assert (schedule.tenant, schedule.max_attempts, schedule.jitter) == ("ops", 2, 30.0)
    assert schedule.entity_id == "schedule:nightly"
    assert find((schedule,), "nightly") is schedule
    with pytest.raises(ScheduleNotFound):
        find((schedule,), "daily")


@pytest.mark.parametrize(
    ("declaration", "expected"),
    [
        ({"cron": "61 * * * *"}, "schedule 's': cron: '61 * * * *' is not a cron expression"),
        ({"cron": "* * *"}, "cron: '* * *' is not a cron expression"),
        ({"cron": "0 0 31 2 *"}, "cron: '0 0 31 2 *'"),
        ({"timezone": "Mars/Olympus"}, "timezone: unknown time zone 'Mars/Olympus'"),
        ({"job_type": "nope"}, "job_type: 'nope' is not a registered job type"),
        ({"job_type": "export_csv", "payload": {"rows": 0}}, "payload.rows: Input should be"),
        ({"payload": {"extra": 1}}, "payload.extra: Extra inputs are not permitted"),
        (
            {
                "job_type": "send_email",
                "payload": {"to": "a@example.com", "subject": "x", "body": "\x00"},
            },
            "payload: cannot contain NUL characters",
        ),
        ({"missed": "catch_up"}, "missed: 'catch_up' is not 'skip' or 'catch_up:N'"),
        ({"missed": "catch_up:0"}, "missed: 'catch_up:0'"),
        ({"missed": "catch_up:1001"}, "missed: 'catch_up:1001'"),
        ({"jitter": -1}, "jitter: Input should be greater than or equal to 0"),
        ({"jitter": 86_401}, "jitter: Input should be less than or equal to 86400"),
        ({"tenant": "no spaces"}, "tenant: A tenant name is"),
        ({"max_attempts": 0}, "max_attempts: Input should be greater than or equal to 1"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_schedule_and_field(
    declaration: dict[str, Any], expected: str
) -> None:
    spec = {"job_type": "noop", "cron": "* * * * *", **declaration}
    message = refused({"s": spec})
    assert message.startswith("JOBCORE_SCHEDULES: schedule 's'")
    assert expected in message


def test_bad_names_shapes_and_duplicates_are_refused() -> None:
    assert "a schedule name is" in refused({"Nightly": {"job_type": "noop", "cron": "* * * * *"}})
    assert "must be a JSON object" in refused({"s": ["noop"]})
    spec = ScheduleSpec(job_type="noop", cron="* * * * *")
    assert "also declared in code" in refused(
        {"s": {"job_type": "noop", "cron": "* * * * *"}}, in_code={"s": spec}
    )
    with pytest.raises(Exception, match="JOBCORE_SCHEDULES: must be a JSON object"):
        load_settings(schedules="{not json")
    with pytest.raises(Exception, match="JOBCORE_SCHEDULES: must map schedule names"):
        load_settings(schedules='{"s": 3}')


def test_periodic_declares_in_code_and_refuses_a_conflicting_redeclaration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Declared on a registry of its own: a worker built later in this process must not
    # find this test's schedule.
    monkeypatch.setattr(schedules_module, "_declared", {})
    periodic("unit_test_periodic", job_type="noop", cron="*/5 * * * *", missed="catch_up:2")
    periodic("unit_test_periodic", job_type="noop", cron="*/5 * * * *", missed="catch_up:2")
    loaded = {s.name: s for s in load_schedules({}, REGISTRY)}
    assert loaded["unit_test_periodic"].catch_up == 2
    with pytest.raises(ScheduleConfigError, match="a different schedule is declared"):
        periodic("unit_test_periodic", job_type="noop", cron="* * * * *")
    with pytest.raises(ScheduleConfigError, match=r"periodic\('x'\): jitter"):
        periodic("x", job_type="noop", cron="* * * * *", jitter=-5)


# --- which ticks are due --------------------------------------------------------------------


def test_the_latest_due_tick_only_when_skipping_missed_ones() -> None:
    schedule = one(cron="*/10 * * * * *")
    # On time: the one tick since the last.
    due = schedule.due(T0, T0 + timedelta(seconds=10.5))
    assert due.enqueue == (T0 + timedelta(seconds=10),)
    assert (due.latest, due.skipped) == (T0 + timedelta(seconds=10), 0)
    # Five ticks passed (the workers were down): only the latest, four skipped.
    due = schedule.due(T0, T0 + timedelta(seconds=55))
    assert due.enqueue == (T0 + timedelta(seconds=50),)
    assert due.skipped == 4
    # Nothing due yet.
    assert schedule.due(T0, T0 + timedelta(seconds=9)).latest is None


def test_catch_up_enqueues_up_to_n_missed_ticks_oldest_first() -> None:
    schedule = one(cron="*/10 * * * * *", missed="catch_up:3")
    due = schedule.due(T0, T0 + timedelta(seconds=55))
    assert due.enqueue == tuple(T0 + timedelta(seconds=s) for s in (20, 30, 40, 50))
    assert due.skipped == 1
    # Fewer missed than N: all of them.
    due = schedule.due(T0, T0 + timedelta(seconds=25))
    assert due.enqueue == (T0 + timedelta(seconds=10), T0 + timedelta(seconds=20))
    assert due.skipped == 0


def test_a_clock_stepped_back_finds_nothing_due_until_it_passes_the_last_tick() -> None:
    schedule = one(cron="* * * * * *", missed="catch_up:5")
    last = T0 + timedelta(seconds=30)
    assert schedule.due(last, T0).latest is None
    assert schedule.due(last, last).latest is None
    assert schedule.due(last, last + timedelta(seconds=1)).enqueue == (last + timedelta(seconds=1),)


def test_a_long_gap_is_counted_from_the_end_and_agrees_with_counting_forward() -> None:
    schedule = one(cron="* * * * * *", missed="catch_up:2")
    now = T0 + timedelta(days=7, seconds=0.4)
    due = schedule.due(T0, now)
    expected = tuple(T0 + timedelta(days=7, seconds=s) for s in (-2, -1, 0))
    assert due.enqueue == expected
    assert due.skipped >= 1
    daily = one(cron="30 2 * * *", timezone="America/New_York", missed="catch_up:3")
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)
    forward = [t for t in itertools.takewhile(lambda t: t <= end, daily.ticks_after(start))]
    assert daily.due(start, end).enqueue == tuple(forward[-4:])


# --- time zones and DST --------------------------------------------------------------------


def local(schedule: Schedule, after: datetime, count: int) -> list[str]:
    ticks = itertools.islice(schedule.ticks_after(after), count)
    return [t.astimezone(schedule.zone).isoformat() for t in ticks]


def test_a_daily_tick_is_wall_clock_time_in_its_zone_across_dst() -> None:
    schedule = one(cron="0 9 * * *", timezone="Europe/Paris")
    after = datetime(2026, 3, 27, tzinfo=UTC)
    assert local(schedule, after, 3) == [
        "2026-03-27T09:00:00+01:00",
        "2026-03-28T09:00:00+01:00",
        "2026-03-29T09:00:00+02:00",  # summer time from the 29th: 07:00 UTC, not 08:00
    ]


def test_a_tick_in_the_skipped_hour_runs_right_after_the_change_and_once_in_the_repeated_one() -> (
    None
):
    spring = one(cron="30 2 * * *", timezone="America/New_York")
    assert local(spring, datetime(2026, 3, 7, 12, tzinfo=UTC), 2) == [
        "2026-03-08T03:00:00-04:00",  # 02:30 does not exist that night
        "2026-03-09T02:30:00-04:00",
    ]
    autumn = one(cron="30 1 * * *", timezone="America/New_York")
    assert local(autumn, datetime(2026, 10, 31, 12, tzinfo=UTC), 2) == [
        "2026-11-01T01:30:00-04:00",  # 01:30 happens twice: one tick
        "2026-11-02T01:30:00-05:00",
    ]
    hourly = one(cron="0 * * * *", timezone="America/New_York")
    assert local(hourly, datetime(2026, 11, 1, 4, tzinfo=UTC), 3) == [
        "2026-11-01T01:00:00-04:00",  # an hourly schedule runs every real hour
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]


# --- jitter and keys ------------------------------------------------------------------------


def test_jitter_stays_within_its_bound_is_fixed_per_tick_and_spreads() -> None:
    schedule = one(cron="* * * * * *", jitter=5)
    ticks = [T0 + timedelta(seconds=s) for s in range(500)]
    offsets = [schedule.jitter_offset(t) for t in ticks]
    assert all(0 <= o < 5 for o in offsets)
    assert offsets == [schedule.jitter_offset(t) for t in ticks]
    assert min(offsets) < 0.5
    assert max(offsets) > 4.5
    run_at = schedule.run_at(ticks[0])
    assert run_at is not None
    assert run_at - ticks[0] == timedelta(seconds=offsets[0])
    assert one().run_at(T0) is None


def test_the_tick_key_names_the_schedule_and_the_instant() -> None:
    paris = datetime(2026, 12, 1, 13, 0, tzinfo=one(timezone="Europe/Paris").zone)
    assert tick_key("nightly", paris) == "schedule:nightly:2026-12-01T12:00:00+00:00"
    assert tick_key("nightly", paris).isascii()
    assert len(tick_key("n" * 63, paris)) < 255
