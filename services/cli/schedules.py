"""`jobcore schedules list|pause|resume|trigger`: periodic jobs (jobcore.maintenance.periodic).

The schedules are the ones this command's configuration declares (``JOBCORE_SCHEDULES``
and ``periodic()`` in ``JOBCORE_JOB_MODULES``), checked like a worker checks them: a bad
declaration stops the command with one line naming it. Pause, resume and trigger are
audited admin actions.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import typer

from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.maintenance.periodic import NAME_PATTERN, Schedule, load_schedules
from jobcore.usecases import schedules as schedule_usecases
from services.cli.common import JSON_OPTION, actor, emit, example, fail, run, settings, with_db

schedules_app = typer.Typer(
    name="schedules",
    help="Periodic jobs: list them, pause, resume or trigger one.",
    no_args_is_help=True,
    epilog=example("jobcore schedules list"),
)

NAME_ARGUMENT = typer.Argument(..., help="The schedule's name (`jobcore schedules list`).")


def _loaded() -> tuple[Settings, tuple[Schedule, ...]]:
    config = settings()
    return config, load_schedules(config.schedules, load_job_modules(config.job_modules))


def _check_name(name: str) -> None:
    if not re.match(NAME_PATTERN, name):
        fail(f"bad schedule name {name!r}: 1-63 lower-case letters, digits, '_', '.' or '-'", 2)


def _shown(status: schedule_usecases.ScheduleStatus) -> dict[str, Any]:
    row = status.as_dict()
    row["state"] = "paused" if status.paused else ("active" if status.declared else "undeclared")
    return row


@schedules_app.command("list", epilog=example("jobcore schedules list --json"))
def list_(as_json: bool = JSON_OPTION) -> None:
    """Every schedule: its cron, time zone and policy, whether it is paused, its last tick
    enqueued and its next tick, and the last tick refused (when, and why: unique_key,
    enqueue_rate, max_unfinished). A state left by a schedule no longer declared is listed
    as `undeclared` (ignored by the workers)."""
    config, schedules = _loaded()
    now = datetime.now(UTC)
    rows = run(with_db(config, lambda db: schedule_usecases.list_schedules(db, schedules, now=now)))
    emit(
        [row.as_dict() if as_json else _shown(row) for row in rows],
        as_json=as_json,
        columns=[
            "name",
            "state",
            "job_type",
            "cron",
            "timezone",
            "missed",
            "jitter",
            "tenant",
            "last_tick",
            "next_tick",
            "last_job_id",
            "last_refusal_at",
            "last_refusal_reason",
        ],
    )


@schedules_app.command("pause", epilog=example("jobcore schedules pause nightly_export"))
def pause(name: str = NAME_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Stop enqueueing the schedule's ticks, on every worker, until it is resumed."""
    _check_name(name)
    config, schedules = _loaded()
    now = datetime.now(UTC)
    status = run(
        with_db(
            config,
            lambda db: schedule_usecases.pause_schedule(
                db, schedules, name, actor=actor(), now=now
            ),
        )
    )
    emit(status.as_dict() if as_json else _shown(status), as_json=as_json)


@schedules_app.command("resume", epilog=example("jobcore schedules resume nightly_export"))
def resume(name: str = NAME_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Enqueue the schedule's ticks again, from the first after now (the ticks that passed
    while it was paused are not made up)."""
    _check_name(name)
    config, schedules = _loaded()
    now = datetime.now(UTC)
    status = run(
        with_db(
            config,
            lambda db: schedule_usecases.resume_schedule(
                db, schedules, name, actor=actor(), now=now
            ),
        )
    )
    emit(status.as_dict() if as_json else _shown(status), as_json=as_json)


@schedules_app.command("trigger", epilog=example("jobcore schedules trigger nightly_export"))
def trigger(name: str = NAME_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Enqueue one job of the schedule now, outside its ticks (paused or not)."""
    _check_name(name)
    config, schedules = _loaded()
    outcome = run(
        with_db(
            config,
            lambda db: schedule_usecases.trigger_schedule(
                db, config, schedules, name, actor=actor()
            ),
        )
    )
    if as_json:
        emit(
            {
                "schedule": outcome.name,
                "job_id": outcome.job_id,
                "tenant": outcome.tenant,
                "type": outcome.job_type,
            },
            as_json=True,
        )
    else:
        typer.echo(f"{outcome.job_id}")


def register(app: typer.Typer) -> None:
    app.add_typer(schedules_app)
