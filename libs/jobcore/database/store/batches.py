"""The ``batches`` table and its members' batch column: :class:`BatchStore`, a method per
statement of :mod:`jobcore.database.sql.batches`."""

from __future__ import annotations

import uuid

from psycopg.rows import DictRow

from jobcore.database.gateway import Reader, Session, execute, fetch_all, fetch_one
from jobcore.database.sql.batches import (
    BATCH_CANCEL_PENDING,
    BATCH_CLOSE,
    BATCH_CLOSE_IDLE,
    BATCH_FAILED_JOBS,
    BATCH_GET,
    BATCH_GROW,
    BATCH_IDLE_COUNT,
    BATCH_INSERT,
    BATCH_JOBS_OF,
    BATCH_LIST,
    BATCH_LIST_ALL,
    BATCH_LOCK,
    BATCH_MARK_CANCELLED,
    BATCH_MEMBER_DETACH,
    BATCH_MEMBER_REOPEN,
    BATCH_PRUNE,
    BATCH_PRUNE_COUNT,
    BATCH_REQUEST_CANCEL,
    BATCH_TREE,
    BatchCancelPendingParams,
    BatchFailedJobsParams,
    BatchGrowParams,
    BatchIdleParams,
    BatchIdParams,
    BatchInsertParams,
    BatchJobIdsParams,
    BatchListAllParams,
    BatchListParams,
    BatchLockParams,
    BatchMarkCancelledParams,
    BatchMemberDetachParams,
    BatchMemberReopenParams,
    BatchPruneCountParams,
    BatchPruneParams,
    BatchRequestCancelParams,
)

__all__ = [
    "BatchCancelPendingParams",
    "BatchIdleParams",
    "BatchInsertParams",
    "BatchPruneParams",
    "BatchStore",
    "batch_store",
]


class BatchStore:
    __slots__ = ()

    async def insert(self, on: Session, params: BatchInsertParams) -> bool:
        """Create an open, empty batch; False if its id is taken (a retry's, or another's)."""
        row = await fetch_one(on, BATCH_INSERT(params))
        return row is not None and bool(row["created"])

    async def jobs_of(
        self, on: Reader, params: BatchJobIdsParams
    ) -> dict[uuid.UUID, uuid.UUID | None]:
        """The batch of each of these jobs (None: in none)."""
        rows = await fetch_all(on, BATCH_JOBS_OF(params))
        return {row["id"]: row["batch_id"] for row in rows}

    async def lock(self, on: Reader, params: BatchLockParams) -> DictRow | None:
        """Lock a batch and read it; None if there is none (for that tenant)."""
        return await fetch_one(on, BATCH_LOCK(params))

    async def get(self, on: Reader, params: BatchLockParams) -> DictRow | None:
        return await fetch_one(on, BATCH_GET(params))

    async def list_newest(self, on: Reader, params: BatchListParams) -> list[DictRow]:
        return await fetch_all(on, BATCH_LIST(params))

    async def list_newest_all(self, on: Reader, params: BatchListAllParams) -> list[DictRow]:
        return await fetch_all(on, BATCH_LIST_ALL(params))

    async def grow(self, on: Session, params: BatchGrowParams) -> DictRow | None:
        """Count new members into a locked batch; None if it is closed."""
        return await fetch_one(on, BATCH_GROW(params))

    async def close(self, on: Session, params: BatchIdParams) -> None:
        """Close a batch and fire what now holds."""
        await execute(on, BATCH_CLOSE(params))

    async def failed_jobs(self, on: Reader, params: BatchFailedJobsParams) -> list[DictRow]:
        return await fetch_all(on, BATCH_FAILED_JOBS(params))

    async def tree(self, on: Reader, params: BatchIdParams) -> list[DictRow]:
        """A batch and its descendants, deepest first."""
        return await fetch_all(on, BATCH_TREE(params))

    async def mark_cancelled(self, on: Session, params: BatchMarkCancelledParams) -> int:
        return await execute(on, BATCH_MARK_CANCELLED(params))

    async def cancel_pending(self, on: Session, params: BatchCancelPendingParams) -> int:
        """Cancel up to ``limit`` pending members; how many."""
        row = await fetch_one(on, BATCH_CANCEL_PENDING(params))
        return 0 if row is None else int(row["cancelled"])

    async def request_cancel(self, on: Session, params: BatchRequestCancelParams) -> int:
        """Ask the workers of running members to stop them; how many."""
        row = await fetch_one(on, BATCH_REQUEST_CANCEL(params))
        return 0 if row is None else int(row["requested"])

    async def detach_member(self, on: Session, params: BatchMemberDetachParams) -> DictRow | None:
        """Take a finished job out of its batch: its batch and status, None if in none."""
        return await fetch_one(on, BATCH_MEMBER_DETACH(params))

    async def reopen_member(self, on: Session, params: BatchMemberReopenParams) -> None:
        await execute(on, BATCH_MEMBER_REOPEN(params))

    async def prune(self, on: Session, params: BatchPruneParams) -> DictRow | None:
        """Delete settled top-level batches with their trees and members: how many of each."""
        return await fetch_one(on, BATCH_PRUNE(params))

    async def close_idle(self, on: Session, params: BatchIdleParams) -> uuid.UUID | None:
        """Close one open batch idle past ``idle`` seconds (the oldest): its id, None if none."""
        row = await fetch_one(on, BATCH_CLOSE_IDLE(params))
        if row is None:
            return None
        batch_id: uuid.UUID = row["id"]
        return batch_id

    async def idle_count(self, on: Reader, params: BatchIdleParams) -> int:
        row = await fetch_one(on, BATCH_IDLE_COUNT(params))
        return 0 if row is None else int(row["batches"])

    async def prune_count(self, on: Reader, params: BatchPruneCountParams) -> int:
        row = await fetch_one(on, BATCH_PRUNE_COUNT(params))
        return 0 if row is None else int(row["batches"])


batch_store = BatchStore()
