"""`jobcore jobs list|show|cancel|retry|republish-stale`: operators' view of jobs, across
tenants.

Cancel goes through the same operation as `POST /jobs/{id}/cancel`. Retry never revives
a finished job (terminal states are final, DESIGN.md): it enqueues a copy with the same
type, payload and entity, and prints the new job's id.
"""

from __future__ import annotations

import uuid
from typing import Any

import typer

from jobcore.amqp.topology import Topology
from jobcore.db import Database, fetch_all, fetch_one
from jobcore.enqueue import enqueue
from jobcore.errors import JobcoreError, JobNotFound
from jobcore.registry import load_job_modules
from jobcore.settings import Settings
from jobcore.sql.jobs import JOB_GET_ANY_TENANT, JOB_LIST_ALL_TENANTS, JobListAllTenantsParams
from jobcore.states import JobStatus
from jobcore.stranded import republish_all_stale
from jobcore.webhooks import completion_params
from services.api import operations
from services.cli.common import emit, fail, run, settings

jobs_app = typer.Typer(
    help="List, inspect, cancel, retry and republish jobs (operators, all tenants)."
)

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")
LIST_COLUMNS = ("id", "tenant", "type", "status", "attempts", "created_at", "last_error")


class JobNotRetryable(JobcoreError):
    """Only a failed or cancelled job can be retried."""


def parse_job_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"not a job id: {value!r}", code=2)


async def _with_db(config: Settings, action: Any) -> Any:
    database = Database(config, min_size=0, max_size=1, name="jobcore-admin")
    await database.open(wait=True)
    try:
        return await action(database)
    finally:
        await database.close()


async def _job(database: Database, job_id: uuid.UUID) -> dict[str, Any]:
    async with database.unit_of_work() as uow:
        row = await fetch_one(uow, JOB_GET_ANY_TENANT({"id": job_id}))
    if row is None:
        raise JobNotFound(f"no job {job_id}")
    return dict(row)


@jobs_app.command("list")
def list_(
    tenant: str | None = typer.Option(None, help="Only this tenant's jobs."),
    status: JobStatus | None = typer.Option(None, help="Only jobs in this status."),
    job_type: str | None = typer.Option(None, "--type", help="Only jobs of this type."),
    limit: int = typer.Option(50, min=1, max=10_000, help="At most this many, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The newest jobs, newest first."""

    async def action(database: Database) -> list[dict[str, Any]]:
        params: JobListAllTenantsParams = {
            "tenant": tenant,
            "status": status.value if status else None,
            "type": job_type,
            "limit": limit,
        }
        async with database.unit_of_work() as uow:
            return [dict(r) for r in await fetch_all(uow, JOB_LIST_ALL_TENANTS(params))]

    emit(run(_with_db(settings(), action)), as_json=as_json, columns=LIST_COLUMNS)


@jobs_app.command("show")
def show(
    job_id: str = typer.Argument(..., help="The job's id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Everything the database knows about one job."""
    ident = parse_job_id(job_id)

    async def action(database: Database) -> dict[str, Any]:
        return await _job(database, ident)

    emit(run(_with_db(settings(), action)), as_json=as_json)


@jobs_app.command("cancel")
def cancel(
    job_id: str = typer.Argument(..., help="The job's id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Cancel a pending job now, or ask the worker running it to stop."""
    ident = parse_job_id(job_id)
    config = settings()
    topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)

    async def action(database: Database) -> dict[str, Any]:
        tenant = (await _job(database, ident))["tenant"]
        async with database.unit_of_work() as uow:
            outcome = await operations.cancel_job(
                uow, tenant, ident, completion=completion_params(topology, config)
            )
            await uow.commit()
        return {
            "job_id": outcome.job_id,
            "status": outcome.status.value,
            "cancel_requested_at": outcome.cancel_requested_at,
        }

    emit(run(_with_db(config, action)), as_json=as_json)


@jobs_app.command("retry")
def retry(
    job_id: str = typer.Argument(..., help="The id of a failed or cancelled job."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Enqueue a copy of a failed or cancelled job (same type, payload and entity)."""
    ident = parse_job_id(job_id)
    config = settings()
    topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)
    registry = load_job_modules(config.job_modules)

    async def action(database: Database) -> dict[str, Any]:
        job = await _job(database, ident)
        if job["status"] not in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise JobNotRetryable(f"job {ident} is {job['status']}; only failed or cancelled jobs")
        job_type = registry.get(job["type"])
        async with database.unit_of_work() as uow:
            result = await enqueue(
                uow,
                topology,
                tenant=job["tenant"],
                job_type=job_type,
                payload=job_type.validate_payload(job["payload"]),
                entity_id=job["entity_id"],
                max_attempts=job["max_attempts"],
            )
            await uow.commit()
        return {"retried": ident, "job_id": result.job_id, "status": result.status.value}

    emit(run(_with_db(config, action)), as_json=as_json)


@jobs_app.command("republish-stale")
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
    topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)
    staleness = config.sweeper_stale_after if stale_after is None else stale_after

    async def action(database: Database) -> list[dict[str, Any]]:
        republished = await republish_all_stale(database, topology, stale_after=staleness)
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
