"""Statements on PostgreSQL's own statistics views: what keeps vacuum from reclaiming
jobcore's dead rows (the xmin horizon), and how many dead rows its busiest tables hold.
Read by the backlog gauges (:mod:`jobcore.usecases.backlog`) when /metrics is scraped."""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class NoParams(TypedDict):
    pass


class HotTablesParams(TypedDict):
    tables: list[str]


# What holds back the horizon of this database's tables (PostgreSQL 14+ counts a backend of
# another database only for the shared catalogs): a transaction of one of its backends
# that has a snapshot or an XID, a prepared transaction, or a replication slot. Seconds
# from the oldest such transaction's start (a slot has no start: its XID age tells), and
# the age in transactions of the oldest xmin of all three. This backend's own snapshot is
# left out: it is the statement asking.
XMIN_HORIZON = Query[NoParams](
    "database_xmin_horizon",
    "How long the oldest transaction holding this database's xmin horizon has been open, "
    "and the horizon's age in transactions.",
    """
    WITH holders AS (
        SELECT xact_start AS since, greatest(age(backend_xmin), age(backend_xid)) AS xids
        FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
        UNION ALL
        SELECT prepared, age(transaction)
        FROM pg_prepared_xacts WHERE database = current_database()
        UNION ALL
        SELECT NULL, greatest(age(xmin), age(catalog_xmin))
        FROM pg_replication_slots WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
    )
    SELECT coalesce(extract(epoch FROM clock_timestamp() - min(since)), 0)::float AS seconds,
           coalesce(max(xids), 0)::bigint AS xids
    FROM holders
    """,
)

HOT_TABLE_TUPLES = Query[HotTablesParams](
    "hot_table_tuples",
    "Live and dead rows of the hot tables, as the statistics collector last counted them.",
    """
    SELECT relname AS name, n_live_tup AS live, n_dead_tup AS dead
    FROM pg_stat_user_tables
    WHERE schemaname = 'jobcore' AND relname = ANY(%(tables)s::text[])
    ORDER BY relname
    """,
)
