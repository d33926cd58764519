"""The ``outbox`` table: :class:`OutboxStore`, a method per statement of
:mod:`jobcore.database.sql.outbox`: the relay's claim / publish / settle cycle, the relays'
wake-ups (LISTEN, the NOTIFY an API process sends after its enqueues, the wake lease),
the status every view shows, and the operator's statements on failing and quarantined rows.

Outbox rows written with a job (enqueue, retries, the reaper, completion webhooks) are
written by the job's own statements, through :class:`jobcore.database.store.JobStore`.
"""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.database.gateway import Executor, Reader, execute, fetch_all, fetch_one
from jobcore.database.sql import NoParams
from jobcore.database.sql.outbox import (
    OUTBOX_ANY_DUE,
    OUTBOX_ANY_OVERDUE,
    OUTBOX_CLAIM_DUE,
    OUTBOX_CLAIM_FAIR,
    OUTBOX_CLAIM_FEW,
    OUTBOX_DELETE_PUBLISHED,
    OUTBOX_DISCARD,
    OUTBOX_DROP_WAKE_LEASE,
    OUTBOX_FIND,
    OUTBOX_LIST_FAILING,
    OUTBOX_LIST_QUARANTINED,
    OUTBOX_LISTEN,
    OUTBOX_LISTENER_PING,
    OUTBOX_OLDEST_LIVE,
    OUTBOX_OLDEST_WRITER,
    OUTBOX_RECORD_FAILURES,
    OUTBOX_REQUEUE,
    OUTBOX_SECONDS_UNTIL_NEXT_DUE,
    OUTBOX_STATUS,
    OUTBOX_TAKE_WAKE_LEASE,
    OUTBOX_UNLISTEN,
    OUTBOX_WAKE,
    OutboxAnyDueParams,
    OutboxAnyOverdueParams,
    OutboxClaimDueParams,
    OutboxClaimFairParams,
    OutboxClaimFewParams,
    OutboxDeletePublishedParams,
    OutboxListFailingParams,
    OutboxListQuarantinedParams,
    OutboxOldestLiveParams,
    OutboxRecordFailuresParams,
    OutboxRequeueParams,
    OutboxRowParams,
)

__all__ = [
    "OutboxAnyDueParams",
    "OutboxAnyOverdueParams",
    "OutboxClaimDueParams",
    "OutboxClaimFairParams",
    "OutboxClaimFewParams",
    "OutboxDeletePublishedParams",
    "OutboxListFailingParams",
    "OutboxListQuarantinedParams",
    "OutboxOldestLiveParams",
    "OutboxRecordFailuresParams",
    "OutboxRequeueParams",
    "OutboxRowParams",
    "OutboxStore",
    "outbox_store",
]

_NO_PARAMS: NoParams = {}


class OutboxStore:
    """Every statement on the outbox, one method each (see the module's docstring)."""

    __slots__ = ()

    async def claim_due(self, on: Reader, params: OutboxClaimDueParams) -> list[DictRow]:
        """Lock the oldest rows due within the last ``window`` seconds (FIFO)."""
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

    async def oldest_writer(self, on: Reader) -> DictRow | None:
        return await fetch_one(on, OUTBOX_OLDEST_WRITER(_NO_PARAMS))

    async def oldest_live(self, on: Reader, params: OutboxOldestLiveParams) -> DictRow | None:
        return await fetch_one(on, OUTBOX_OLDEST_LIVE(params))

    async def any_due(self, on: Reader, params: OutboxAnyDueParams) -> DictRow | None:
        return await fetch_one(on, OUTBOX_ANY_DUE(params))

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

    async def wake(self, on: Executor) -> None:
        """NOTIFY the relays that rows were committed (an API process's batched wake-up)."""
        await execute(on, OUTBOX_WAKE(_NO_PARAMS))

    # --- the operator's statements -------------------------------------------------------

    async def list_failing(self, on: Reader, params: OutboxListFailingParams) -> list[DictRow]:
        """Rows the broker refused and that the relays keep retrying, longest failing first."""
        return await fetch_all(on, OUTBOX_LIST_FAILING(params))

    async def list_quarantined(
        self, on: Reader, params: OutboxListQuarantinedParams
    ) -> list[DictRow]:
        """Rows no longer retried."""
        return await fetch_all(on, OUTBOX_LIST_QUARANTINED(params))

    async def find(self, on: Reader, params: OutboxRowParams) -> DictRow | None:
        """One row by id or message id, with the status of its job if that has ended."""
        return await fetch_one(on, OUTBOX_FIND(params))

    async def requeue_quarantined(self, on: Reader, params: OutboxRequeueParams) -> DictRow | None:
        """Make a quarantined row due now with fresh attempts; None if it is no such row."""
        return await fetch_one(on, OUTBOX_REQUEUE(params))

    async def discard_quarantined(self, on: Reader, params: OutboxRowParams) -> DictRow | None:
        """Delete a quarantined row; None if it is no such row."""
        return await fetch_one(on, OUTBOX_DISCARD(params))


outbox_store = OutboxStore()
