"""Outbox use cases: its status, the rows the broker keeps refusing (failing) and those no
longer retried (quarantined), and what an operator does with a quarantined row: requeue it
(published again with a fresh set of attempts) or discard it (never published)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from psycopg.rows import DictRow

from jobcore.audit import AuditAction, Target, audited
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import Database, Session
from jobcore.errors import OutboxRowJobEnded, OutboxRowNotFound, OutboxRowNotQuarantined
from jobcore.store import OutboxRequeueParams, OutboxRowParams, outbox_store

# A store method that acts on a quarantined row (requeue, discard): the row, or None.
QuarantinedRowAction = Callable[[Session, OutboxRequeueParams], Awaitable[DictRow | None]]


@dataclass(frozen=True, slots=True)
class OutboxRowKey:
    """An operator names a row by its numeric id or by its message id (the other is None)."""

    id: int | None = None
    message_id: uuid.UUID | None = None
    # How the operator wrote it, for messages.
    named: str | None = None

    def __str__(self) -> str:
        if self.named is not None:
            return self.named
        return str(self.id if self.id is not None else self.message_id)

    def params(self) -> OutboxRowParams:
        return {"id": self.id, "message_id": self.message_id}


async def outbox_status(db: Database) -> dict[str, Any]:
    """Rows due, scheduled, failing and quarantined; the oldest due row's wait and the
    longest-failing row's time refused."""
    async with db.unit_of_work() as uow:
        row = await outbox_store.status(uow)
        await uow.commit()
    assert row is not None  # an aggregate without GROUP BY: one row
    return dict(row)


async def list_failing(db: Database, *, limit: int) -> list[dict[str, Any]]:
    """Rows the broker refused and that the relays keep retrying, longest failing first."""
    async with db.unit_of_work() as uow:
        rows = await outbox_store.list_failing(uow, {"limit": limit})
        await uow.commit()
    return [dict(row) for row in rows]


async def list_quarantined(db: Database, *, limit: int) -> list[dict[str, Any]]:
    """Rows that are no longer retried: their message can never be published as it is."""
    async with db.unit_of_work() as uow:
        rows = await outbox_store.list_quarantined(uow, {"limit": limit})
        await uow.commit()
    return [dict(row) for row in rows]


async def _act_on_quarantined(
    db: Database,
    key: OutboxRowKey,
    act: QuarantinedRowAction,
    verb: str,
    *,
    actor: str,
    action: AuditAction,
) -> dict[str, Any]:
    target = Target("outbox_row", str(key))
    async with audited(db, actor=actor, action=action, target=target) as work:
        acted = await act(work.uow, {**key.params(), "channel": OUTBOX_CHANNEL})
        if acted is not None:
            row = {k: v for k, v in acted.items() if k != "notified"}
            work.entry.details = {
                "id": row["id"],
                "message_id": row["message_id"],
                "job_id": row["job_id"],
            }
            await work.commit()
            return row
        found = await outbox_store.find(work.uow, key.params())
        if found is None:
            raise OutboxRowNotFound(f"no outbox row {key}")
        work.entry.details = {"id": found["id"], "job_id": found["job_id"]}
        if found["quarantined_at"] is not None and found["ended_job_status"] is not None:
            raise OutboxRowJobEnded(
                f"outbox row {key} is the message of job {found['job_id']}, which is "
                f"{found['ended_job_status']}: publishing it would do nothing; run "
                f"`jobcore jobs retry {found['job_id']}` for a new job instead"
            )
        raise OutboxRowNotQuarantined(
            f"outbox row {key} is not quarantined; only quarantined rows can be {verb}"
        )


async def requeue(db: Database, key: OutboxRowKey, *, actor: str) -> dict[str, Any]:
    """Publish a quarantined row again, now, with a fresh set of attempts (the relays are
    woken). A row whose job has ended is refused: retry the job instead."""
    return await _act_on_quarantined(
        db,
        key,
        outbox_store.requeue_quarantined,
        "requeued",
        actor=actor,
        action=AuditAction.OUTBOX_REQUEUE,
    )


async def discard(db: Database, key: OutboxRowKey, *, actor: str) -> dict[str, Any]:
    """Delete a quarantined row: its message is never published (its job stays as it is)."""
    return await _act_on_quarantined(
        db,
        key,
        outbox_store.discard_quarantined,
        "discarded",
        actor=actor,
        action=AuditAction.OUTBOX_DISCARD,
    )
