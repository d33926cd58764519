"""`jobcore batches list|show|close|cancel`: operators' view of batches, across tenants.

Each verb calls its use case (:mod:`jobcore.usecases.batches`), the same functions as
`GET /batches/{id}`, `POST /batches/{id}/close` and `POST /batches/{id}/cancel`; close and
cancel are audited admin actions.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.usecases import batches as batch_usecases
from services.cli.common import JSON_OPTION, actor, emit, example, fail, run, settings, with_db

batches_app = typer.Typer(
    help="List, inspect, close and cancel batches of jobs (operators, all tenants).",
    no_args_is_help=True,
    epilog=example("jobcore batches list --tenant acme"),
)

T = TypeVar("T")

LIST_COLUMNS = (
    "id",
    "tenant",
    "status",
    "total",
    "pending",
    "succeeded",
    "failed",
    "cancelled",
    "created_at",
    "description",
)
BATCH_ARGUMENT = typer.Argument(..., help="The batch's id.")


def _batch_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"not a batch id: {value!r}", code=2)


async def _with_db(config: Settings, action: Callable[[Database], Awaitable[T]]) -> T:
    return await with_db(config, action, name="jobcore-admin")


def _shown(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch for people: its callbacks on one line each."""
    shown = {key: value for key, value in batch.items() if key != "callbacks"}
    for name, callback in batch["callbacks"].items():
        fired = callback["job_id"] or "not fired"
        shown[name] = f"{callback['type']} ({fired})"
    shown["failed_job_ids"] = ", ".join(str(i) for i in batch["failed_job_ids"]) or None
    return shown


@batches_app.command("list", epilog=example("jobcore batches list --tenant acme --limit 20"))
def list_(
    tenant: str | None = typer.Option(None, help="Only this tenant's batches."),
    limit: int = typer.Option(50, min=1, max=10_000, help="At most this many, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The newest batches, newest first, with their counts."""
    rows = run(
        _with_db(settings(), lambda db: batch_usecases.list_batches(db, tenant=tenant, limit=limit))
    )
    emit(rows, as_json=as_json, columns=LIST_COLUMNS)


@batches_app.command(
    "show", epilog=example("jobcore batches show 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def show(batch_id: str = BATCH_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """One batch: its counts, failed jobs (up to 1,000) and callbacks, fired or not."""
    ident = _batch_id(batch_id)
    batch = run(
        _with_db(settings(), lambda db: batch_usecases.get_batch(db, tenant=None, batch_id=ident))
    )
    emit(batch if as_json else _shown(batch), as_json=as_json)


@batches_app.command(
    "close", epilog=example("jobcore batches close 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def close(batch_id: str = BATCH_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Close an open batch: no job joins it any more, and its callbacks fire once their
    conditions hold (at once, if its jobs have all settled)."""
    ident = _batch_id(batch_id)
    batch = run(
        _with_db(settings(), lambda db: batch_usecases.close_any_batch(db, ident, actor=actor()))
    )
    emit(batch if as_json else _shown(batch), as_json=as_json)


@batches_app.command(
    "cancel", epilog=example("jobcore batches cancel 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
)
def cancel(batch_id: str = BATCH_ARGUMENT, as_json: bool = JSON_OPTION) -> None:
    """Close a batch and its child batches, cancel their pending jobs and ask the workers
    of their running ones to stop; on_complete fires once they have all settled."""
    ident = _batch_id(batch_id)
    config = settings()
    batch = run(
        _with_db(
            config, lambda db: batch_usecases.cancel_any_batch(db, config, ident, actor=actor())
        )
    )
    emit(batch if as_json else _shown(batch), as_json=as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(batches_app, name="batches")
