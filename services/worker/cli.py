"""Commands of the worker service: `jobcore worker` and the `jobcore dlq` verbs."""

from __future__ import annotations

import typer

from jobcore.amqp.deadletters import DeadLetterQueue
from jobcore.logs import configure_logging
from jobcore.telemetry import setup_tracing
from services.cli.common import emit, run, settings

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")
LIST_COLUMNS = (
    "message_id",
    "message_type",
    "job_id",
    "attempt",
    "reason",
    "queue",
    "routing_key",
    "deaths",
    "dead_lettered_at",
)

dlq_app = typer.Typer(
    name="dlq",
    help="Look at and replay the dead-letter queue (poison messages).",
    no_args_is_help=True,
)


QUEUE_OPTION = typer.Option(
    None,
    "--queue",
    "-q",
    help="A job queue to consume (repeatable) (default: every queue of the job types).",
)


def worker(
    queue: list[str] | None = QUEUE_OPTION,
    concurrency: int | None = typer.Option(
        None, min=1, max=10_000, help="Handlers at once (default: JOBCORE_WORKER_CONCURRENCY)."
    ),
) -> None:
    """Consume job queues and run handlers until SIGTERM (then finish or give back work)."""
    from services.worker.app import Worker

    config = settings()  # a bad setting stops here with one line
    configure_logging("worker")
    setup_tracing("jobcore-worker")
    app = Worker(config, queues=queue or None, concurrency=concurrency)
    raise typer.Exit(run(app.serve()))


@dlq_app.command("list")
def dlq_list(
    limit: int = typer.Option(50, min=1, max=100_000, help="At most this many messages."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show dead-lettered messages without removing them (each goes back to the tail)."""
    letters = run(DeadLetterQueue(settings()).peek(limit))
    emit([letter.as_dict() for letter in letters], as_json=as_json, columns=LIST_COLUMNS)


@dlq_app.command("replay")
def dlq_replay(
    limit: int = typer.Option(100, min=1, max=100_000, help="At most this many messages."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Publish dead letters back to their job queue; each leaves the DLQ once confirmed."""
    report = run(DeadLetterQueue(settings()).replay(limit))
    summary = {
        "replayed": [letter.as_dict() for letter in report.replayed],
        "skipped": [{**letter.as_dict(), "why": why} for letter, why in report.skipped],
    }
    if as_json:
        emit(summary, as_json=True)
        return
    typer.echo(f"replayed {len(report.replayed)} message(s), skipped {len(report.skipped)}")
    for letter, why in report.skipped:
        typer.echo(f"skipped {letter.message_id}: {why}")


def register(app: typer.Typer) -> None:
    """Add this service's commands to the `jobcore` program."""
    app.command("worker")(worker)
    app.add_typer(dlq_app)
