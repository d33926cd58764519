"""The relay's side of ``outbox``: :class:`OutboxStore`, a method per statement of its
claim / publish / settle cycle and of its wake-ups (:mod:`jobcore.sql.outbox`).

Outbox rows written with a job (enqueue, retries, the reaper, completion webhooks) are
written by the job's own statements, through :class:`jobcore.store.JobStore`.
"""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import AsyncConn, Executor, Session, execute, fetch_all, fetch_one
from jobcore.sql import NoParams
from jobcore.sql.outbox import (
    OUTBOX_ANY_DUE,
    OUTBOX_ANY_OVERDUE,
    OUTBOX_CLAIM_DUE,
    OUTBOX_CLAIM_FAIR,
    OUTBOX_CLAIM_FEW,
    OUTBOX_DELETE_PUBLISHED,
    OUTBOX_DROP_WAKE_LEASE,
    OUTBOX_LISTEN,
    OUTBOX_LISTENER_PING,
    OUTBOX_RECORD_FAILURES,
    OUTBOX_SECONDS_UNTIL_NEXT_DUE,
    OUTBOX_STATUS,
    OUTBOX_TAKE_WAKE_LEASE,
    OUTBOX_UNLISTEN,
    OutboxAnyOverdueParams,
    OutboxClaimDueParams,
    OutboxClaimFairParams,
    OutboxClaimFewParams,
    OutboxDeletePublishedParams,
    OutboxRecordFailuresParams,
)

__all__ = [
    "OutboxAnyOverdueParams",
    "OutboxClaimDueParams",
    "OutboxClaimFairParams",
    "OutboxClaimFewParams",
    "OutboxDeletePublishedParams",
    "OutboxRecordFailuresParams",
    "OutboxStore",
    "outbox_store",
]

_NO_PARAMS: NoParams = {}

Reader = Session | AsyncConn


class OutboxStore:
    """The relay's statements on the outbox, one method each."""

    __slots__ = ()

    async def claim_due(self, on: Reader, params: OutboxClaimDueParams) -> list[DictRow]:
        """Lock the oldest due rows (FIFO)."""
        return await fetch_all(on, OUTBOX_CLAIM_DUE(params))

    async def claim_few(self, on: Reader, params: OutboxClaimFewParams) -> list[DictRow] | None:
        """Lock every row due within the last ``window`` seconds if at most ``limit`` are
        (FIFO, the same rows the fair claim would take); None if more are."""
        rows = await fetch_all(on, OUTBOX_CLAIM_FEW(params))
        if not rows[0]["fits"]:
            return None
        return [row for row in rows if row["id"] is not None]

    async def claim_fair(self, on: Reader, params: OutboxClaimFairParams) -> list[DictRow]:
        """Lock due rows lane by lane, within each queue's budget."""
        return await fetch_all(on, OUTBOX_CLAIM_FAIR(params))

    async def delete_published(
        self, on: Reader, params: OutboxDeletePublishedParams
    ) -> DictRow | None:
        """Delete the confirmed rows: one row, with how many were deleted."""
        return await fetch_one(on, OUTBOX_DELETE_PUBLISHED(params))

    async def record_failures(
        self, on: Reader, params: OutboxRecordFailuresParams
    ) -> list[DictRow]:
        return await fetch_all(on, OUTBOX_RECORD_FAILURES(params))

    async def seconds_until_next_due(self, on: Reader) -> DictRow | None:
        return await fetch_one(on, OUTBOX_SECONDS_UNTIL_NEXT_DUE(_NO_PARAMS))

    async def any_due(self, on: Reader) -> DictRow | None:
        return await fetch_one(on, OUTBOX_ANY_DUE(_NO_PARAMS))

    async def any_overdue(self, on: Reader, params: OutboxAnyOverdueParams) -> DictRow | None:
        return await fetch_one(on, OUTBOX_ANY_OVERDUE(params))

    async def status(self, on: Reader) -> DictRow | None:
        return await fetch_one(on, OUTBOX_STATUS(_NO_PARAMS))

    async def take_wake_lease(self, on: Reader) -> DictRow | None:
        return await fetch_one(on, OUTBOX_TAKE_WAKE_LEASE(_NO_PARAMS))

    async def drop_wake_lease(self, on: Executor) -> None:
        await execute(on, OUTBOX_DROP_WAKE_LEASE(_NO_PARAMS))

    async def listen(self, on: Executor) -> None:
        await execute(on, OUTBOX_LISTEN(_NO_PARAMS))

    async def unlisten(self, on: Executor) -> None:
        await execute(on, OUTBOX_UNLISTEN(_NO_PARAMS))

    async def listener_ping(self, on: Executor) -> None:
        await execute(on, OUTBOX_LISTENER_PING(_NO_PARAMS))


outbox_store = OutboxStore()
