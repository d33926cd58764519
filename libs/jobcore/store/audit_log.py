"""The ``audit_log`` table (who did which admin action): :class:`AuditLogStore`, a method
per statement of :mod:`jobcore.sql.audit_log`."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, Session, execute, fetch_all, fetch_one
from jobcore.sql.audit_log import (
    AUDIT_LOG_INSERT,
    AUDIT_LOG_LIST,
    AUDIT_LOG_PRUNE_BATCH,
    AUDIT_LOG_PRUNE_COUNT,
    AuditLogInsertParams,
    AuditLogListParams,
    AuditLogPruneBatchParams,
    AuditLogPruneCountParams,
)

__all__ = [
    "AuditLogInsertParams",
    "AuditLogListParams",
    "AuditLogPruneBatchParams",
    "AuditLogPruneCountParams",
    "AuditLogStore",
    "audit_log_store",
]


class AuditLogStore:
    __slots__ = ()

    async def insert(self, on: Reader, params: AuditLogInsertParams) -> DictRow | None:
        return await fetch_one(on, AUDIT_LOG_INSERT(params))

    async def list_entries(self, on: Reader, params: AuditLogListParams) -> list[DictRow]:
        """The entries matching every filter given, newest first."""
        return await fetch_all(on, AUDIT_LOG_LIST(params))

    async def prune_count(self, on: Reader, params: AuditLogPruneCountParams) -> DictRow | None:
        """How many entries are past their retention (``audit_log``)."""
        return await fetch_one(on, AUDIT_LOG_PRUNE_COUNT(params))

    async def prune_batch(self, on: Session, params: AuditLogPruneBatchParams) -> int:
        """Delete up to ``limit`` entries past their retention; how many."""
        return await execute(on, AUDIT_LOG_PRUNE_BATCH(params))


audit_log_store = AuditLogStore()
