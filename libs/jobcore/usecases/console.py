"""What the operators' console (``jobcore ui``) reads that no other entry point does: the
overview (rates, backlog, relay lag, leases, what waits for an operator) and the job
search. Its actions are the other use cases (jobs, outbox, dlq, webhooks), called as the
commands call them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jobcore.db import Database, fetch_all, fetch_one
from jobcore.errors import JobcoreError
from jobcore.settings import Settings
from jobcore.sql.console import (
    CONSOLE_BACKLOG_BY_QUEUE,
    CONSOLE_FAILED_WEBHOOKS,
    CONSOLE_JOB_SEARCH,
    CONSOLE_LEASES,
    CONSOLE_NOW,
    CONSOLE_RATES,
)
from jobcore.sql.outbox import OUTBOX_STATUS
from jobcore.states import JobStatus
from jobcore.usecases.dlq import count_dead_letters

# The overview's rate window, one point a minute.
RATE_MINUTES = 30
# A running job whose lease ends within this is shown as expiring.
EXPIRING_WITHIN_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Rates:
    minutes: list[datetime]
    enqueued: list[int]
    succeeded: list[int]
    failed: list[int]


@dataclass(frozen=True, slots=True)
class Overview:
    at: datetime
    rates: Rates
    queues: list[dict[str, Any]]
    outbox: dict[str, Any]
    leases: dict[str, Any]
    failed_webhooks: int
    # None when the broker could not be asked (the reason is in dead_letters_error).
    dead_letters: int | None
    dead_letters_error: str | None = None
    notes: list[str] = field(default_factory=list)


async def overview(db: Database, settings: Settings) -> Overview:
    """One consistent snapshot of the database's side, and the dead-letter queue's depth
    from the broker (a broker that does not answer leaves it unknown, not the page)."""
    async with db.unit_of_work() as uow:
        rates = await fetch_all(uow, CONSOLE_RATES({"minutes": RATE_MINUTES}))
        queues = await fetch_all(uow, CONSOLE_BACKLOG_BY_QUEUE({}))
        outbox = await fetch_one(uow, OUTBOX_STATUS({}))
        leases = await fetch_one(
            uow, CONSOLE_LEASES({"expiring_within_seconds": EXPIRING_WITHIN_SECONDS})
        )
        webhooks = await fetch_one(uow, CONSOLE_FAILED_WEBHOOKS({}))
        now = await fetch_one(uow, CONSOLE_NOW({}))
    # Aggregates without GROUP BY, and now(), always return one row.
    assert outbox is not None
    assert leases is not None
    assert webhooks is not None
    assert now is not None
    dead_letters: int | None
    error: str | None = None
    try:
        dead_letters = await count_dead_letters(settings)
    except JobcoreError as exc:
        dead_letters, error = None, str(exc)
    return Overview(
        at=now["now"],
        rates=Rates(
            minutes=[r["minute"] for r in rates],
            enqueued=[r["enqueued"] for r in rates],
            succeeded=[r["succeeded"] for r in rates],
            failed=[r["failed"] for r in rates],
        ),
        queues=[dict(q) for q in queues],
        outbox=dict(outbox),
        leases=dict(leases),
        failed_webhooks=int(webhooks["failed"]),
        dead_letters=dead_letters,
        dead_letters_error=error,
    )


@dataclass(frozen=True, slots=True)
class JobSearch:
    tenant: str | None = None
    type: str | None = None
    status: JobStatus | None = None
    entity_id: str | None = None


async def search_jobs(db: Database, where: JobSearch, *, limit: int) -> list[dict[str, Any]]:
    """The newest jobs matching every given field, newest first (operators, all tenants)."""
    async with db.unit_of_work() as uow:
        rows = await fetch_all(
            uow,
            CONSOLE_JOB_SEARCH(
                {
                    "tenant": where.tenant,
                    "type": where.type,
                    "status": where.status.value if where.status else None,
                    "entity_id": where.entity_id,
                    "limit": limit,
                }
            ),
        )
    return [dict(r) for r in rows]


def parse_job_id(text: str) -> uuid.UUID | None:
    """``text`` as a job id, or None when it is not one."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None
