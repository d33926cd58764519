"""Statements about the transaction they run in, not about a table."""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class TransactionLockTimeoutParams(TypedDict):
    milliseconds: int


# set_config(..., true) is SET LOCAL: it ends with the transaction, so it holds behind
# PgBouncer in transaction mode too, and the connection goes back to its pool unchanged.
TRANSACTION_LOCK_TIMEOUT = Query[TransactionLockTimeoutParams](
    "transaction_lock_timeout",
    "Bound how long the rest of this transaction's statements wait for a lock.",
    "SELECT set_config('lock_timeout', %(milliseconds)s::int::text, true) AS lock_timeout",
)
