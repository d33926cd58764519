"""`jobcore webhooks`: list and redeliver completion webhooks, show or rotate a tenant's
signing secret, and manage tenants' default endpoints."""

from __future__ import annotations

import uuid
from typing import Any

import typer

from jobcore.execution.registry import load_job_modules
from jobcore.usecases import webhooks as records
from services.cli.common import JSON_OPTION, actor, emit, example, fail, run, settings, with_db

LIST_COLUMNS = (
    "id",
    "job_id",
    "tenant",
    "event",
    "status",
    "attempts",
    "max_attempts",
    "last_status_code",
    "next_attempt_at",
    "url",
)

webhooks_app = typer.Typer(
    name="webhooks",
    help="Completion webhooks: deliveries, signing secrets, default endpoints.",
    no_args_is_help=True,
    epilog=example("jobcore webhooks list --status failed"),
)
endpoint_app = typer.Typer(
    name="endpoint",
    help="Tenants' default webhook endpoints (used when a job names no callback_url).",
    no_args_is_help=True,
    epilog=example("jobcore webhooks endpoint list --tenant acme"),
)


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"{value!r} is not a {what} (a UUID)", code=2)


@webhooks_app.command(
    "list",
    epilog=example(
        "jobcore webhooks list --job 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a --status failed"
    ),
)
def list_(
    job: str | None = typer.Option(None, "--job", help="Only this job's deliveries."),
    status: str | None = typer.Option(
        None, "--status", help="Only deliveries in this status: pending, delivered or failed."
    ),
    limit: int = typer.Option(100, min=1, max=100_000, help="At most this many, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Webhook deliveries, newest first: status, attempts, last answer, next attempt."""
    if status is not None and status not in records.DELIVERY_STATUSES:
        fail(f"--status is one of {', '.join(records.DELIVERY_STATUSES)}", code=2)
    job_id = _uuid(job, "job id") if job is not None else None
    rows = run(
        with_db(
            settings(),
            lambda db: records.list_deliveries(db, job_id=job_id, status=status, limit=limit),
        )
    )
    shown: list[dict[str, Any]] = [dict(row) for row in rows]
    emit(shown, as_json=as_json, columns=None if as_json else LIST_COLUMNS)


@webhooks_app.command(
    "redeliver", epilog=example("jobcore webhooks redeliver 9d8e7f6a-1b2c-4d3e-8f4a-5b6c7d8e9f01")
)
def redeliver(
    delivery_id: str = typer.Argument(..., metavar="DELIVERY_ID", help="From `webhooks list`."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Send a delivery again, now (a failed one too), as a new attempt with the same id."""
    ident = _uuid(delivery_id, "delivery id")
    config = settings()
    row = run(with_db(config, lambda db: records.redeliver(db, config, ident, actor=actor())))
    if as_json:
        emit(dict(row), as_json=True)
    else:
        typer.echo(f"delivery {row['id']}: attempt {row['attempt']} queued")


@webhooks_app.command("secret", epilog=example("jobcore webhooks secret --tenant acme --rotate"))
def secret(
    tenant: str = typer.Option(..., "--tenant", help="The tenant whose webhooks it signs."),
    rotate: bool = typer.Option(
        False,
        "--rotate",
        help="Replace it: webhooks carry the new secret's signature from now on, and the "
        "old one's too for JOBCORE_WEBHOOK_SECRET_OVERLAP.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print the tenant's Standard Webhooks signing secret (created if it has none), or
    rotate it; with the rotation overlap and when the replaced secret stops signing."""
    config = settings()
    shown = run(
        with_db(
            config,
            lambda db: records.show_or_rotate_secret(
                db, config, tenant, rotate=rotate, actor=actor()
            ),
        )
    )
    emit(shown, as_json=as_json)


@endpoint_app.command(
    "set",
    epilog=example(
        "jobcore webhooks endpoint set --tenant acme"
        " --url http://127.0.0.1:9000/hooks --type export_csv"
    ),
)
def endpoint_set(
    tenant: str = typer.Option(..., "--tenant", help="The tenant."),
    url: str = typer.Option(..., "--url", help="Where its jobs' webhooks go (http or https)."),
    job_type: str = typer.Option(
        records.ANY_JOB_TYPE, "--type", help="Only jobs of this type ('*': every type)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Set the default endpoint for the tenant's jobs of a type (checked like callback_url)."""
    config = settings()
    registry = load_job_modules(config.job_modules)
    row = run(
        with_db(
            config,
            lambda db: records.set_endpoint(
                db, config, registry, tenant, job_type, url, actor=actor()
            ),
        )
    )
    emit(dict(row), as_json=as_json)


@endpoint_app.command("list", epilog=example("jobcore webhooks endpoint list --json"))
def endpoint_list(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Default endpoints by tenant and job type."""
    rows = run(with_db(settings(), lambda db: records.list_endpoints(db, tenant)))
    emit(
        [dict(r) for r in rows],
        as_json=as_json,
        columns=["tenant", "job_type", "url", "updated_at"],
    )


@endpoint_app.command(
    "remove", epilog=example("jobcore webhooks endpoint remove --tenant acme --type export_csv")
)
def endpoint_remove(
    tenant: str = typer.Option(..., "--tenant", help="The tenant."),
    job_type: str = typer.Option(records.ANY_JOB_TYPE, "--type", help="The job type ('*')."),
) -> None:
    """Remove a default endpoint (jobs already enqueued keep the URL they got)."""
    removed = run(
        with_db(settings(), lambda db: records.remove_endpoint(db, tenant, job_type, actor=actor()))
    )
    typer.echo(f"removed {removed['tenant']}/{removed['job_type']} → {removed['url']}")


def register(app: typer.Typer) -> None:
    """Add the `webhooks` commands to the `jobcore` program."""
    webhooks_app.add_typer(endpoint_app)
    app.add_typer(webhooks_app)
