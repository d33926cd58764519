"""`jobcore dlq list|replay|replay-job`: the dead-letter queue (poison messages)."""

from __future__ import annotations

import typer

from jobcore.usecases import dlq
from services.cli.common import JSON_OPTION, actor, emit, example, run, settings, with_db
from services.cli.jobs import parse_job_id

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
    epilog=example("jobcore dlq list --limit 10"),
)


@dlq_app.command("list", epilog=example("jobcore dlq list --limit 10 --json"))
def dlq_list(
    limit: int = typer.Option(50, min=1, max=100_000, help="At most this many messages."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show dead-lettered messages without removing them (each goes back to the tail)."""
    letters = run(dlq.list_dead_letters(settings(), limit=limit))
    emit([letter.as_dict() for letter in letters], as_json=as_json, columns=LIST_COLUMNS)


@dlq_app.command("replay", epilog=example("jobcore dlq replay --limit 100"))
def dlq_replay(
    limit: int = typer.Option(100, min=1, max=100_000, help="At most this many messages."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Publish dead letters back to their job queue; each leaves the DLQ once confirmed."""
    config = settings()
    report = run(
        with_db(config, lambda db: dlq.replay_dead_letters(db, config, limit=limit, actor=actor()))
    )
    _report(report, as_json=as_json)


@dlq_app.command(
    "replay-job", epilog=example("jobcore dlq replay-job 0b6f3c2e-5d7a-4c1e-9f3b-2a8d6e4f1c90")
)
def dlq_replay_job(
    job_id: str = typer.Argument(..., help="The job whose dead letters to replay."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Publish one job's dead letters back to its job queue; the other dead letters stay,
    in their order. Fails if none of that job's is in the queue."""
    ident = parse_job_id(job_id)
    config = settings()
    report = run(
        with_db(
            config,
            lambda db: dlq.replay_job_dead_letters(db, config, ident, actor=actor()),
        )
    )
    _report(report, as_json=as_json)


def _report(report: dlq.ReplayReport, *, as_json: bool) -> None:
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
    app.add_typer(dlq_app)
