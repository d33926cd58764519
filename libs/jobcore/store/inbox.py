"""The ``inbox`` table (the consumers' record of the messages they took):
:class:`InboxStore`, its retention (:mod:`jobcore.sql.inbox`). Rows are written by the
claims, through :class:`jobcore.store.JobStore` and :class:`jobcore.store.WebhookDeliveryStore`.
"""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, Session, execute, fetch_one
from jobcore.sql.inbox import (
    INBOX_PRUNE_BATCH,
    INBOX_PRUNE_COUNT,
    JOBS_CONSUMER,
    WEBHOOKS_CONSUMER,
    InboxPruneBatchParams,
    InboxPruneCountParams,
)

__all__ = [
    "JOBS_CONSUMER",
    "WEBHOOKS_CONSUMER",
    "InboxPruneBatchParams",
    "InboxPruneCountParams",
    "InboxStore",
    "inbox_store",
]


class InboxStore:
    __slots__ = ()

    async def prune_count(self, on: Reader, params: InboxPruneCountParams) -> DictRow | None:
        """How many rows are past their retention (``inbox``)."""
        return await fetch_one(on, INBOX_PRUNE_COUNT(params))

    async def prune_batch(self, on: Session, params: InboxPruneBatchParams) -> int:
        """Delete up to ``limit`` rows past their retention; how many."""
        return await execute(on, INBOX_PRUNE_BATCH(params))


inbox_store = InboxStore()
