"""`jobcore workflows list|show|cancel|retry`: operators' view of workflows, across
tenants. Each verb calls the use case the API calls (:mod:`jobcore.usecases.workflows`)."""

from __future__ import annotations

import uuid
from typing import Any

import typer

from jobcore.amqp.topology import Topology
from jobcore.usecases import workflows as workflow_usecases
from services.cli.common import (
    JSON_OPTION,
    actor,
    emit,
    example,
    fail,
    run,
    settings,
    with_db,
)

workflows_app = typer.Typer(
    help="List, inspect, cancel workflows and retry their jobs (operators, all tenants).",
    epilog=example("jobcore workflows list --status failed"),
)

LIST_COLUMNS = ("id", "tenant", "name", "status", "jobs_total", "open_jobs", "created_at")
JOB_COLUMNS = ("name", "status", "attempts", "depends_on", "last_error")


def parse_workflow_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"not a workflow id: {value!r}", code=2)


@workflows_app.command("list", epilog=example("jobcore workflows list --tenant acme"))
def list_(
    tenant: str | None = typer.Option(None, help="Only this tenant's workflows."),
    status: str | None = typer.Option(
        None, help="Only workflows in this status: running, succeeded, failed or cancelled."
    ),
    limit: int = typer.Option(50, min=1, max=10_000, help="At most this many, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The newest workflows, newest first."""

    async def action(db: Any) -> list[dict[str, Any]]:
        async with db.session() as session:
            return await workflow_usecases.list_workflows(
                session, tenant=tenant, status=status, limit=limit
            )

    emit(run(with_db(settings(), action)), as_json=as_json, columns=LIST_COLUMNS)


def _edges(job: dict[str, Any]) -> str:
    return ", ".join(
        edge["name"] if edge["policy"] == "on_success" else f"{edge['name']} ({edge['policy']})"
        for edge in job["depends_on"]
    )


@workflows_app.command(
    "show", epilog=example("jobcore workflows show 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def show(
    workflow_id: str = typer.Argument(..., help="The workflow's id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """A workflow's status, its graph in columns, and each job's state."""
    ident = parse_workflow_id(workflow_id)

    async def action(db: Any) -> dict[str, Any]:
        async with db.session() as session:
            return await workflow_usecases.get_workflow(session, ident, tenant=None)

    workflow = run(with_db(settings(), action))
    if as_json:
        emit(workflow, as_json=True)
        return
    counts = " ".join(f"{status}={n}" for status, n in sorted(workflow["counts"].items()))
    typer.echo(
        f"{workflow['id']}  {workflow['name'] or '-'}  {workflow['status']}  "
        f"(tenant {workflow['tenant']}; {counts})"
    )
    by_name = {job["name"]: job for job in workflow["jobs"]}
    for n, column in enumerate(workflow_usecases.graph_levels(workflow["jobs"])):
        shown = "  ".join(f"{name}[{by_name[name]['status']}]" for name in column)
        typer.echo(f"  {n}: {shown}")
    rows = [{**job, "depends_on": _edges(job)} for job in workflow["jobs"]]
    emit(rows, as_json=False, columns=JOB_COLUMNS)


@workflows_app.command(
    "cancel", epilog=example("jobcore workflows cancel 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def cancel(
    workflow_id: str = typer.Argument(..., help="The workflow's id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Cancel every job of the workflow that has not ended (running ones asked to stop)."""
    ident = parse_workflow_id(workflow_id)
    outcome = run(
        with_db(
            settings(),
            lambda db: workflow_usecases.cancel_workflow(db, ident, tenant=None, actor=actor()),
        )
    )
    emit(
        {"id": outcome.id, "cancelled": outcome.cancelled, "asked_to_stop": outcome.asked_to_stop},
        as_json=as_json,
    )


@workflows_app.command(
    "retry",
    epilog=example("jobcore workflows retry 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a extract"),
)
def retry(
    workflow_id: str = typer.Argument(..., help="The workflow's id."),
    name: str = typer.Argument(..., help="The name of a failed or cancelled job of it."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a failed job of the workflow again, in place; the jobs it made unreachable
    then wait for it."""
    ident = parse_workflow_id(workflow_id)
    config = settings()
    topology = Topology.from_settings(config)
    outcome = run(
        with_db(
            config,
            lambda db: workflow_usecases.retry_step(
                db, topology, ident, name, tenant=None, actor=actor()
            ),
        )
    )
    emit(
        {"workflow_id": outcome.workflow_id, "name": name, "job_id": outcome.job_id},
        as_json=as_json,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(workflows_app, name="workflows")
