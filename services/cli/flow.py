"""`jobcore queues list|pause|resume` and `jobcore types list|pause|resume`: flow control
(jobcore.usecases.pauses).

A paused queue or job type keeps accepting jobs (enqueue answers 202); relays leave its
outbox rows in PostgreSQL and workers do not start its jobs, until it is resumed. Pause
and resume are audited admin actions.
"""

from __future__ import annotations

import typer

from jobcore.usecases import pauses as pause_usecases
from services.cli.common import JSON_OPTION, actor, emit, example, fail, run, settings, with_db

queues_app = typer.Typer(
    name="queues",
    help="Job queues: list them (open jobs, paused or not), pause or resume one.",
    no_args_is_help=True,
    epilog=example("jobcore queues pause exports"),
)
types_app = typer.Typer(
    name="types",
    help="Job types: list the paused ones, pause or resume one (all its queues' jobs).",
    no_args_is_help=True,
    epilog=example("jobcore types pause send_email"),
)

QUEUE_ARGUMENT = typer.Argument(..., help="The queue's name (a job type's `queue=`).")
TYPE_ARGUMENT = typer.Argument(..., help="The job type's name.")


def _set(kind: pause_usecases.PauseKind, name: str, *, paused: bool, as_json: bool) -> None:
    problem = pause_usecases.bad_name(kind, name)
    if problem is not None:
        fail(problem, 2)
    who = actor()
    change = run(
        with_db(
            settings(),
            lambda db: pause_usecases.set_paused(db, kind, name, paused=paused, actor=who),
        )
    )
    emit(change.as_dict(), as_json=as_json)


@queues_app.command("list", epilog=example("jobcore queues list --json"))
def list_queues(as_json: bool = JSON_OPTION) -> None:
    """Each queue with pending or running jobs, or paused: its counts and whether (since
    when, by whom) it is paused."""
    rows = run(with_db(settings(), pause_usecases.list_queues))
    emit(
        [row.as_dict() for row in rows],
        as_json=as_json,
        columns=["queue", "paused", "pending", "running", "paused_at", "paused_by"],
    )


@queues_app.command("pause", epilog=example("jobcore queues pause exports"))
def pause_queue(name: str = QUEUE_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Stop starting the queue's jobs, on every relay and worker, until it is resumed
    (enqueueing still answers 202; running jobs finish)."""
    _set("queue", name, paused=True, as_json=as_json)


@queues_app.command("resume", epilog=example("jobcore queues resume exports"))
def resume_queue(name: str = QUEUE_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Start the queue's jobs again: the relays publish its waiting rows at once."""
    _set("queue", name, paused=False, as_json=as_json)


@types_app.command("list", epilog=example("jobcore types list --json"))
def list_types(as_json: bool = JSON_OPTION) -> None:
    """Every pause in force, of a queue or a job type."""
    rows = run(with_db(settings(), pause_usecases.list_pauses))
    emit(rows, as_json=as_json, columns=["kind", "name", "paused_at", "paused_by"])


@types_app.command("pause", epilog=example("jobcore types pause send_email"))
def pause_type(name: str = TYPE_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Stop starting jobs of this type, whatever their queue, until it is resumed."""
    _set("type", name, paused=True, as_json=as_json)


@types_app.command("resume", epilog=example("jobcore types resume send_email"))
def resume_type(name: str = TYPE_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Start jobs of this type again."""
    _set("type", name, paused=False, as_json=as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(queues_app)
    app.add_typer(types_app)
