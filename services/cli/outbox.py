"""`jobcore outbox status|list-failing|list-quarantined|requeue|discard`: the outbox rows
the relays could not publish."""

from __future__ import annotations

import uuid
from typing import Any

import typer

from jobcore.usecases import outbox
from services.cli.common import JSON_OPTION, actor, emit, example, fail, run, settings, with_db

outbox_app = typer.Typer(
    name="outbox",
    help="Inspect the outbox (failing and quarantined rows); requeue or discard quarantined ones.",
    no_args_is_help=True,
    epilog=example("jobcore outbox list-quarantined"),
)


def _row_key(ident: str) -> outbox.OutboxRowKey:
    """An operator names a row by its numeric id or by its message id."""
    if ident.isdigit():
        return outbox.OutboxRowKey(id=int(ident), named=ident)
    try:
        return outbox.OutboxRowKey(message_id=uuid.UUID(ident), named=ident)
    except ValueError:
        fail(f"{ident!r} is neither an outbox id nor a message id")


@outbox_app.command("status", epilog=example("jobcore outbox status --json"))
def status(as_json: bool = JSON_OPTION) -> None:
    """Rows due, scheduled, failing and quarantined; how long the oldest due row has waited
    and the longest-failing row has been refused."""
    emit(run(with_db(settings(), outbox.outbox_status)), as_json=as_json)


@outbox_app.command("list-failing", epilog=example("jobcore outbox list-failing --limit 20"))
def list_failing(
    as_json: bool = JSON_OPTION,
    limit: int = typer.Option(100, min=1, max=10_000, help="Show at most this many rows."),
) -> None:
    """Rows the broker refused and that the relays keep retrying, longest failing first."""
    rows = run(with_db(settings(), lambda db: outbox.list_failing(db, limit=limit)))
    emit(
        rows,
        as_json=as_json,
        columns=["id", "message_id", "routing_key", "attempts", "failing_since", "last_error"],
    )


@outbox_app.command("list-quarantined", epilog=example("jobcore outbox list-quarantined --json"))
def list_quarantined(
    as_json: bool = JSON_OPTION,
    limit: int = typer.Option(100, min=1, max=10_000, help="Show at most this many rows."),
) -> None:
    """Rows that are no longer retried: their message can never be published as it is."""
    rows = run(with_db(settings(), lambda db: outbox.list_quarantined(db, limit=limit)))
    emit(
        rows,
        as_json=as_json,
        columns=["id", "message_id", "routing_key", "attempts", "quarantined_at", "last_error"],
    )


def _show_acted_on(row: dict[str, Any], verb: str, as_json: bool) -> None:
    if as_json:
        emit(row, as_json=True)
    else:
        job = f" (job {row['job_id']})" if row["job_id"] else ""
        typer.echo(f"{verb} outbox row {row['id']}, message {row['message_id']}{job}")


@outbox_app.command("requeue", epilog=example("jobcore outbox requeue 41"))
def requeue(
    ident: str = typer.Argument(..., metavar="ID", help="Outbox id or message id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Publish a quarantined row again, now, with a fresh set of attempts."""
    key = _row_key(ident)
    row = run(with_db(settings(), lambda db: outbox.requeue(db, key, actor=actor())))
    _show_acted_on(row, "requeued", as_json)


@outbox_app.command("discard", epilog=example("jobcore outbox discard 41"))
def discard(
    ident: str = typer.Argument(..., metavar="ID", help="Outbox id or message id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Delete a quarantined row: its message is never published (its job stays as it is)."""
    key = _row_key(ident)
    row = run(with_db(settings(), lambda db: outbox.discard(db, key, actor=actor())))
    _show_acted_on(row, "discarded", as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(outbox_app)
