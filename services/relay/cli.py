"""Commands of the relay service: `relay`, `topology`, and the `outbox` admin verbs."""

from __future__ import annotations

import uuid
from typing import Any

import typer

from jobcore.amqp.publisher import declare_topology
from jobcore.db import Database, fetch_all
from jobcore.enqueue import OUTBOX_CHANNEL
from jobcore.logs import configure_logging
from jobcore.registry import load_job_modules
from jobcore.sql import Query, Statement
from jobcore.sql.outbox import (
    OUTBOX_DISCARD,
    OUTBOX_FIND,
    OUTBOX_LIST_FAILING,
    OUTBOX_LIST_QUARANTINED,
    OUTBOX_REQUEUE,
    OUTBOX_STATUS,
    OutboxRequeueParams,
    OutboxRowParams,
)
from jobcore.telemetry import setup_tracing
from services.cli.common import emit, fail, run, settings
from services.relay.options import load_relay_options

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")

outbox_app = typer.Typer(
    name="outbox",
    help="Inspect the outbox (failing and quarantined rows); requeue or discard quarantined ones.",
    no_args_is_help=True,
)


def relay(
    listen: bool = typer.Option(
        True,
        "--listen/--no-listen",
        help="Wake on NOTIFY (default) or find work by polling alone.",
    ),
) -> None:
    """Publish outbox rows to RabbitMQ with publisher confirms until SIGTERM."""
    # Imported here: the health server's web stack would slow every other command's start.
    from services.relay.relay import serve

    config = settings()
    options = load_relay_options(**({} if listen else {"listen": False}))
    configure_logging("relay")
    setup_tracing("jobcore-relay")
    raise typer.Exit(run(serve(config, options)))


def topology(as_json: bool = JSON_OPTION) -> None:
    """Declare the exchanges and queues (idempotent) and print what was declared."""
    config = settings()
    queues = load_job_modules(config.job_modules).queues()
    options = load_relay_options()
    declared = run(declare_topology(config, queues, connect_timeout=options.connect_timeout))
    if as_json:
        emit(declared, as_json=True)
        return
    emit(
        {
            "exchange": declared["exchange"],
            "dead_letter_exchange": declared["dead_letter_exchange"],
            "dead_letter_queue": declared["dead_letter_queue"],
            "dead_letter_notes_queue": declared["dead_letter_notes_queue"],
            "delivery_limit": declared["delivery_limit"],
        },
        as_json=False,
    )
    typer.echo("")
    # A queue that still dead-letters at most once was also named in a warning on stderr.
    emit(declared["queues"], as_json=False, columns=["queue", "routing_key", "dead_lettering"])


async def _one(statement: Statement) -> list[dict[str, Any]]:
    config = settings()
    db = Database(config, min_size=0, max_size=1, name="jobcore-cli")
    await db.open(wait=True)
    try:
        async with db.unit_of_work() as uow:
            rows = await fetch_all(uow, statement)
            await uow.commit()
        return [dict(row) for row in rows]
    finally:
        await db.close()


def _row_key(ident: str) -> OutboxRowParams:
    """An operator names a row by its numeric id or by its message id."""
    if ident.isdigit():
        return {"id": int(ident), "message_id": None}
    try:
        return {"id": None, "message_id": uuid.UUID(ident)}
    except ValueError:
        fail(f"{ident!r} is neither an outbox id nor a message id")


@outbox_app.command("status")
def status(as_json: bool = JSON_OPTION) -> None:
    """Rows due, scheduled, failing and quarantined; how long the oldest due row has waited
    and the longest-failing row has been refused."""
    rows = run(_one(OUTBOX_STATUS({})))
    emit(rows[0], as_json=as_json)


@outbox_app.command("list-failing")
def list_failing(
    as_json: bool = JSON_OPTION,
    limit: int = typer.Option(100, min=1, max=10_000, help="Show at most this many rows."),
) -> None:
    """Rows the broker refused and that the relays keep retrying, longest failing first."""
    rows = run(_one(OUTBOX_LIST_FAILING({"limit": limit})))
    emit(
        rows,
        as_json=as_json,
        columns=["id", "message_id", "routing_key", "attempts", "failing_since", "last_error"],
    )


@outbox_app.command("list-quarantined")
def list_quarantined(
    as_json: bool = JSON_OPTION,
    limit: int = typer.Option(100, min=1, max=10_000, help="Show at most this many rows."),
) -> None:
    """Rows that are no longer retried: their message can never be published as it is."""
    rows = run(_one(OUTBOX_LIST_QUARANTINED({"limit": limit})))
    emit(
        rows,
        as_json=as_json,
        columns=["id", "message_id", "routing_key", "attempts", "quarantined_at", "last_error"],
    )


def _act_on_quarantined(
    ident: str, query: Query[OutboxRequeueParams], verb: str, as_json: bool
) -> None:
    key = _row_key(ident)
    rows = run(_one(query({**key, "channel": OUTBOX_CHANNEL})))
    if not rows:
        found = run(_one(OUTBOX_FIND(key)))
        if not found:
            fail(f"no outbox row {ident}")
        row = found[0]
        if row["quarantined_at"] is not None and row["ended_job_status"] is not None:
            fail(
                f"outbox row {ident} is the message of job {row['job_id']}, which is "
                f"{row['ended_job_status']}: publishing it would do nothing; run "
                f"`jobcore jobs retry {row['job_id']}` for a new job instead"
            )
        fail(f"outbox row {ident} is not quarantined; only quarantined rows can be {verb}")
    row = {k: v for k, v in rows[0].items() if k != "notified"}
    if as_json:
        emit(row, as_json=True)
    else:
        job = f" (job {row['job_id']})" if row["job_id"] else ""
        typer.echo(f"{verb} outbox row {row['id']}, message {row['message_id']}{job}")


@outbox_app.command("requeue")
def requeue(
    ident: str = typer.Argument(..., metavar="ID", help="Outbox id or message id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Publish a quarantined row again, now, with a fresh set of attempts."""
    _act_on_quarantined(ident, OUTBOX_REQUEUE, "requeued", as_json)


@outbox_app.command("discard")
def discard(
    ident: str = typer.Argument(..., metavar="ID", help="Outbox id or message id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Delete a quarantined row: its message is never published (its job stays as it is)."""
    _act_on_quarantined(ident, OUTBOX_DISCARD, "discarded", as_json)


def register(app: typer.Typer) -> None:
    """Add this service's commands to the `jobcore` program."""
    app.command("relay")(relay)
    app.command("topology")(topology)
    app.add_typer(outbox_app)
