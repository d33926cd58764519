"""Statements on the database itself rather than on a table: :class:`DatabaseStore`, for
its health (:mod:`jobcore.database.sql.database_health`: the xmin horizon, the hot tables' dead
rows), the compactor's look at its tables (:mod:`jobcore.database.sql.compaction`), its
planner statistics (:mod:`jobcore.database.sql.planner_statistics`) and the running
transaction (:mod:`jobcore.database.sql.transactions`)."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.database.gateway import Reader, fetch_all, fetch_one
from jobcore.database.sql.compaction import (
    COMPACTION_HORIZON,
    COMPACTION_TABLES,
    CompactionTablesParams,
)
from jobcore.database.sql.database_health import HOT_TABLE_TUPLES, XMIN_HORIZON, HotTablesParams
from jobcore.database.sql.database_health import NoParams as HealthNoParams
from jobcore.database.sql.planner_statistics import (
    TABLES_WITH_STALE_STATISTICS,
    StaleStatisticsParams,
)
from jobcore.database.sql.transactions import TRANSACTION_LOCK_TIMEOUT, TransactionLockTimeoutParams

__all__ = [
    "CompactionTablesParams",
    "DatabaseStore",
    "HotTablesParams",
    "StaleStatisticsParams",
    "TransactionLockTimeoutParams",
    "database_store",
]

_NO_PARAMS: HealthNoParams = {}


class DatabaseStore:
    __slots__ = ()

    async def xmin_horizon(self, on: Reader) -> DictRow | None:
        """How long the oldest transaction holding back vacuum has been open (``seconds``),
        and the horizon's age in transactions (``xids``)."""
        return await fetch_one(on, XMIN_HORIZON(_NO_PARAMS))

    async def hot_table_tuples(self, on: Reader, params: HotTablesParams) -> list[DictRow]:
        """Live and dead rows of the named tables, as last counted."""
        return await fetch_all(on, HOT_TABLE_TUPLES(params))

    async def compaction_horizon(self, on: Reader) -> DictRow | None:
        """The oldest dated holder of the horizon (``seconds`` open), the XID age of the
        oldest undated one (``undated_xids``: a slot, a standby's feedback; None: none),
        and the next XID (``next_xid``)."""
        return await fetch_one(on, COMPACTION_HORIZON(_NO_PARAMS))

    async def compaction_tables(self, on: Reader, params: CompactionTablesParams) -> list[DictRow]:
        """The named tables' sizes, live rows, row width and primary key index."""
        return await fetch_all(on, COMPACTION_TABLES(params))

    async def tables_with_stale_statistics(
        self, on: Reader, params: StaleStatisticsParams
    ) -> list[DictRow]:
        """The named tables due an ANALYZE that autovacuum will not run soon."""
        return await fetch_all(on, TABLES_WITH_STALE_STATISTICS(params))

    async def set_lock_timeout(
        self, on: Reader, params: TransactionLockTimeoutParams
    ) -> DictRow | None:
        """Bound how long the rest of this transaction waits for a lock."""
        return await fetch_one(on, TRANSACTION_LOCK_TIMEOUT(params))


database_store = DatabaseStore()
