"""`jobcore schedules list|pause|resume|trigger` as a separate process against the real
PostgreSQL: the state shown and changed, the actor audited, and every refusal one line
with a non-zero exit."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql import Query
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Maintainer, Scheduler
from jobcore.maintenance.periodic import load_schedules
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.usecases.enqueue.scheduled import enqueue_schedule_job
from services.worker.metrics import SchedulerMetrics

SCHEDULES = {
    "nightly": {
        "job_type": "export_csv",
        "cron": "0 3 * * *",
        "timezone": "Europe/Paris",
        "payload": {"rows": 10},
        "tenant": "ops",
    },
    "often": {"job_type": "noop", "cron": "*/5 * * * * *", "missed": "catch_up:2", "jitter": 1},
}
JOB = Query(
    "test_job_by_id",
    "A job's type, tenant, entity and payload.",
    "SELECT type, tenant, entity_id, payload, idempotency_key FROM jobs WHERE id = %(id)s",
)
AUDIT = Query(
    "test_schedule_audit",
    "Schedule actions in the audit log.",
    "SELECT actor, action, target_id, outcome FROM audit_log ORDER BY id",
)


def cli(
    settings: Settings, *args: str, schedules: Any = SCHEDULES
) -> subprocess.CompletedProcess[str]:
    env = settings_env(settings, JOBCORE_SCHEDULES=orjson.dumps(schedules).decode())
    return subprocess.run(
        jobcore_command(*args), env=env, capture_output=True, text=True, timeout=60
    )


def ok(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


async def test_list_pause_resume_and_trigger(settings: Settings, db: Database) -> None:
    listed = {row["name"]: row for row in ok(cli(settings, "schedules", "list", "--json"))}
    assert set(listed) == {"nightly", "often"}
    assert listed["nightly"]["timezone"] == "Europe/Paris"
    assert listed["often"]["missed"] == "catch_up:2"
    assert listed["nightly"]["next_tick"] is not None
    assert not listed["nightly"]["paused"]

    paused = ok(cli(settings, "--actor", "ops:alice", "schedules", "pause", "nightly", "--json"))
    assert paused["paused"] is True
    assert paused["next_tick"] is None
    table = cli(settings, "schedules", "list")
    assert table.returncode == 0, table.stderr
    nightly_line = next(line for line in table.stdout.splitlines() if line.startswith("nightly"))
    assert "paused" in nightly_line.split()

    triggered = ok(
        cli(settings, "--actor", "ops:alice", "schedules", "trigger", "nightly", "--json")
    )
    async with db.unit_of_work() as uow:
        (job,) = await fetch_all(uow, JOB({"id": triggered["job_id"]}))
    assert (job["type"], job["tenant"], job["entity_id"]) == (
        "export_csv",
        "ops",
        "schedule:nightly",
    )
    assert job["payload"]["rows"] == 10
    assert job["idempotency_key"] is None

    resumed = ok(cli(settings, "--actor", "ops:alice", "schedules", "resume", "nightly", "--json"))
    assert resumed["paused"] is False
    assert resumed["next_tick"] is not None

    async with db.unit_of_work() as uow:
        entries = [dict(r) for r in await fetch_all(uow, AUDIT({}))]
    assert [(e["actor"], e["action"], e["target_id"], e["outcome"]) for e in entries] == [
        ("ops:alice", "schedule.pause", "nightly", "succeeded"),
        ("ops:alice", "schedule.trigger", "nightly", "succeeded"),
        ("ops:alice", "schedule.resume", "nightly", "succeeded"),
    ]


@pytest.mark.parametrize(
    ("args", "schedules", "code", "message"),
    [
        (("pause", "weekly"), SCHEDULES, 1, "no schedule named 'weekly' is declared"),
        (("trigger", "Bad Name"), SCHEDULES, 2, "bad schedule name 'Bad Name'"),
        (
            ("list",),
            {"x": {"job_type": "noop", "cron": "* * 32 * *"}},
            1,
            "JOBCORE_SCHEDULES: schedule 'x': cron: '* * 32 * *' is not a cron expression",
        ),
        (
            ("list",),
            {"x": {"job_type": "noop", "cron": "* * * * *", "timezone": "Nowhere/City"}},
            1,
            "unknown time zone 'Nowhere/City'",
        ),
        (("list",), {"x": {"cron": "* * * * *"}}, 1, "schedule 'x': job_type: Field required"),
    ],
)
def test_refusals_are_one_line_and_a_non_zero_exit(
    settings: Settings, args: tuple[str, ...], schedules: Any, code: int, message: str
) -> None:
    result = cli(settings, "schedules", *args, schedules=schedules)
    assert result.returncode == code
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jobcore: ")
    assert message in lines[0]


async def test_list_shows_the_last_refused_tick_and_why(settings: Settings, db: Database) -> None:
    # Each tick's job holds the type's unique key while it is live: the second and third
    # ticks of a catch-up are refused, and the schedule moves past them.
    declared = {
        "syncing": {
            "job_type": "sync_account",
            "cron": "* * * * * *",
            "payload": {"account": "a1"},
            "missed": "catch_up:3",
        }
    }
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    clock = [start]
    scheduler = Scheduler.from_settings(
        settings,
        schedules=load_schedules(declared, default_registry, in_code={}),
        metrics=SchedulerMetrics(CollectorRegistry()),
        enqueue=enqueue_schedule_job,
        clock=lambda: clock[0],
    )
    maintainer = Maintainer(db, [scheduler], owner="a")
    await maintainer.tick()
    clock[0] = start + timedelta(seconds=3.5)
    assert (await maintainer.tick())["scheduler"] == 1

    [row] = ok(cli(settings, "schedules", "list", "--json", schedules=declared))
    assert row["last_refusal_reason"] == "unique_key"
    assert row["last_refused_tick"] == (start + timedelta(seconds=3)).isoformat()
    assert row["last_refusal_at"] is not None
    table = cli(settings, "schedules", "list", schedules=declared)
    assert table.returncode == 0, table.stderr
    header, line = table.stdout.splitlines()
    assert header.split()[-2:] == ["LAST_REFUSAL_AT", "LAST_REFUSAL_REASON"]
    assert line.split()[-1] == "unique_key"
