"""`jobcore jobs list|show|timeline|edit|cancel|retry|unblock|held|republish-stale`:
operators' view of jobs, across tenants.

Each verb calls its use case (:mod:`jobcore.usecases.jobs`, :mod:`jobcore.usecases.job_edits`);
cancel is the same function as `POST /jobs/{id}/cancel`, edit as `PATCH /jobs/{id}` (the
version it names is the one `jobcore jobs show` prints). Retry prints the new job's id.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import typer

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.priorities import LABELS, Priority
from jobcore.kernel.settings import Settings
from jobcore.kernel.states import JobStatus
from jobcore.usecases import job_edits
from jobcore.usecases import jobs as job_usecases
from jobcore.usecases.timeline import job_timeline
from services.cli.common import JSON_OPTION, actor, emit, example, fail, run, settings, with_db

jobs_app = typer.Typer(
    help="List, inspect, cancel, retry and republish jobs (operators, all tenants).",
    epilog=example("jobcore jobs list --status failed --tenant acme"),
)

T = TypeVar("T")

LIST_COLUMNS = (
    "id",
    "tenant",
    "type",
    "status",
    "held_reason",
    "attempts",
    "created_at",
    "last_error",
)
TIMELINE_COLUMNS = ("at", "kind", "attempt", "detail")


def parse_job_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"not a job id: {value!r}", code=2)


async def _with_db(config: Settings, action: Callable[[Database], Awaitable[T]]) -> T:
    return await with_db(config, action, name="jobcore-admin")


@jobs_app.command(
    "list",
    epilog=example("jobcore jobs list --tenant acme --status failed --type send_email --limit 20"),
)
def list_(
    tenant: str | None = typer.Option(None, help="Only this tenant's jobs."),
    status: JobStatus | None = typer.Option(None, help="Only jobs in this status."),
    job_type: str | None = typer.Option(None, "--type", help="Only jobs of this type."),
    limit: int = typer.Option(50, min=1, max=10_000, help="At most this many, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The newest jobs, newest first."""
    where = job_usecases.AdminJobFilter(tenant=tenant, status=status, type=job_type)
    rows = run(_with_db(settings(), lambda db: job_usecases.list_jobs(db, where, limit=limit)))
    emit(rows, as_json=as_json, columns=LIST_COLUMNS)


@jobs_app.command("show", epilog=example("jobcore jobs show 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a"))
def show(
    job_id: str = typer.Argument(..., help="The job's id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Everything the database knows about one job, and where it is now."""
    ident = parse_job_id(job_id)
    emit(run(_with_db(settings(), lambda db: job_usecases.show_job(db, ident))), as_json=as_json)


@jobs_app.command(
    "timeline", epilog=example("jobcore jobs timeline 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a --json")
)
def timeline(
    job_id: str = typer.Argument(..., help="The job's id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """A job's events, oldest first, and where it is now (what it waits for)."""
    ident = parse_job_id(job_id)
    found = run(_with_db(settings(), lambda db: job_timeline(db, ident, tenant=None)))
    if found is None:
        fail(f"no job {ident}")
    if as_json:
        emit(found.as_dict(), as_json=True)
        return
    typer.echo(f"{found.job_id}  {found.type}  {found.status}  (tenant {found.tenant})")
    typer.echo(f"where: {found.where}")
    if not found.events_recorded:
        typer.echo("events: not being recorded (JOBCORE_JOB_EVENTS=false); older ones only")
    rows = [{**event.as_dict(), "detail": _detail_text(event.detail)} for event in found.events]
    emit(rows, as_json=False, columns=TIMELINE_COLUMNS)


def _detail_text(detail: dict[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in detail.items())


@jobs_app.command(
    "edit",
    epilog=example(
        "jobcore jobs edit 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a --version 48213 "
        '--run-at 2026-12-24T09:00:00+00:00 --priority high --payload \'{"to": "a@b.c"}\''
    ),
)
def edit(
    job_id: str = typer.Argument(..., help="The id of a pending job."),
    version: str = typer.Option(
        ...,
        help="The job's version as `jobcore jobs show` printed it: the edit applies only "
        "if the job is still that version.",
    ),
    run_at: datetime | None = typer.Option(
        None, help="When it may run, with a time zone offset (ISO 8601)."
    ),
    priority: str | None = typer.Option(None, help=f"One of {', '.join(LABELS)}."),
    payload: str | None = typer.Option(
        None, help="The whole new payload as JSON, or @FILE to read it from a file."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Change a pending job's run_at, priority or payload in place (audited)."""
    ident = parse_job_id(job_id)
    level = None
    if priority is not None:
        try:
            level = Priority.parse(priority)
        except ValueError:
            fail(f"--priority must be one of {', '.join(LABELS)}", code=2)
    changes = job_edits.JobChanges(run_at=run_at, priority=level, payload=_json_option(payload))
    config = settings()
    registry = load_job_modules(config.job_modules)
    outcome = run(
        _with_db(
            config,
            lambda db: job_edits.edit_job(
                db, config, registry, ident, version=version, changes=changes, actor=actor()
            ),
        )
    )
    shown = {
        "job_id": outcome.job_id,
        "version": outcome.version,
        "changed": ",".join(outcome.fields),
        "message": outcome.message,
    }
    emit(shown, as_json=as_json)


def _json_option(value: str | None) -> Any:
    if value is None:
        return None
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        fail(f"--payload is not JSON: {exc}", code=2)


@jobs_app.command(
    "cancel", epilog=example("jobcore jobs cancel 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def cancel(
    job_id: str = typer.Argument(..., help="The job's id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Cancel a pending job now, or ask the worker running it to stop."""
    ident = parse_job_id(job_id)
    config = settings()
    outcome = run(
        _with_db(config, lambda db: job_usecases.cancel_any_job(db, config, ident, actor=actor()))
    )
    shown = {
        "job_id": outcome.job_id,
        "status": outcome.status.value,
        "cancel_requested_at": outcome.cancel_requested_at,
    }
    emit(shown, as_json=as_json)


@jobs_app.command(
    "retry", epilog=example("jobcore jobs retry 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def retry(
    job_id: str = typer.Argument(..., help="The id of a failed or cancelled job."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Enqueue a copy of a failed or cancelled job (same type, payload and entity)."""
    ident = parse_job_id(job_id)
    config = settings()
    registry = load_job_modules(config.job_modules)
    outcome = run(
        _with_db(
            config,
            lambda db: job_usecases.retry_job(db, config, registry, ident, actor=actor()),
        )
    )
    shown = {"retried": outcome.retried, "job_id": outcome.job_id, "status": outcome.status.value}
    emit(shown, as_json=as_json)


@jobs_app.command(
    "unblock", epilog=example("jobcore jobs unblock 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def unblock(
    job_id: str = typer.Argument(..., help="The id of a failed job of an ordering key."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Let the jobs after a failed job in its ordering key go on, without running it again."""
    ident = parse_job_id(job_id)
    shown = run(_with_db(settings(), lambda db: job_usecases.unblock_job(db, ident, actor=actor())))
    emit(shown, as_json=as_json)


@jobs_app.command("held", epilog=example("jobcore jobs held --json"))
def held(as_json: bool = JSON_OPTION) -> None:
    """Pending jobs waiting on a gate (concurrency, rate_limit, ordering), per type."""
    rows = run(_with_db(settings(), job_usecases.held_jobs))
    emit(rows, as_json=as_json, columns=["held_reason", "type", "held"])


@jobs_app.command(
    "republish-stale", epilog=example("jobcore jobs republish-stale --stale-after 300")
)
def republish_stale(
    stale_after: float | None = typer.Option(
        None,
        "--stale-after",
        min=0,
        help="Seconds a pending job must have been due with no sign of its message "
        "(default: JOBCORE_SWEEPER_STALE_AFTER).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Publish again now what the sweeper would: pending jobs whose message may be gone.

    For after a purged queue or lost broker data; a copy of a message that still exists is
    harmless (the worker acknowledges it with no effect).
    """
    config = settings()
    topology = Topology.from_settings(config)
    staleness = config.sweeper_stale_after if stale_after is None else stale_after

    async def action(database: Database) -> list[dict[str, Any]]:
        republished = await job_usecases.republish_stale_jobs(
            database, topology, stale_after=staleness, actor=actor()
        )
        return [
            {"job_id": r.job_id, "attempt": r.attempt, "reason": r.reason, "count": r.count}
            for r in republished
        ]

    rows = run(_with_db(config, action))
    if as_json:
        emit(rows, as_json=True)
        return
    typer.echo(f"published {len(rows)} job(s) again")
    if rows:
        emit(rows, as_json=False, columns=["job_id", "attempt", "reason", "count"])


def register(app: typer.Typer) -> None:
    app.add_typer(jobs_app, name="jobs")
