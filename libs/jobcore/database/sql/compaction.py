"""Statements on PostgreSQL's own catalog and statistics for the compactor
(:mod:`jobcore.maintenance.compactor`): whether the xmin horizon is pinned, and how far each
hot table's files are above what its live rows need. No extension is needed (pgstattuple
may not be installed): the sizes are the files', the need an estimate from the statistics.
"""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class NoParams(TypedDict):
    pass


class CompactionTablesParams(TypedDict):
    tables: list[str]


# What holds the horizon of this database's tables, split by what can date it. Any
# backend's transaction that holds an XID, in whichever database: every snapshot taken
# anywhere, ours included (the rewrite's own), keeps what that XID may not see yet. A
# backend of this database with a snapshot (PostgreSQL 14+ leaves other databases'
# snapshots out). A prepared transaction, of any database (its XID is still running).
# These are dated by their start (a transaction of another role, whose start this role
# may not see without pg_read_all_stats, by its XID's age instead). A replication slot's
# xmin and a walsender's (a standby's hot_standby_feedback) have no start: their age in
# XIDs, which the compactor compares with the XIDs the database used since its previous
# round. Autovacuum's workers are left out: a lazy VACUUM's xmin holds back no one's
# horizon. `next_xid` is the next XID to be assigned (read from a snapshot: this
# statement takes no XID).
COMPACTION_HORIZON = Query[NoParams](
    "compaction_horizon",
    "How long the oldest dated transaction holding this database's xmin horizon has been "
    "open, the XID age of the oldest undated holder (slot, standby feedback), and the next XID.",
    """
    WITH holders AS (
        SELECT xact_start AS since, greatest(age(backend_xid), age(backend_xmin)) AS xids
        FROM pg_stat_activity
        WHERE pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'
          AND (backend_xid IS NOT NULL
               OR (backend_xmin IS NOT NULL
                   AND (datname = current_database() OR backend_type = 'walsender')))
        UNION ALL
        SELECT prepared, age(transaction) FROM pg_prepared_xacts
        UNION ALL
        SELECT NULL, age(xmin) FROM pg_replication_slots WHERE xmin IS NOT NULL
    )
    SELECT coalesce(extract(epoch FROM clock_timestamp() - min(since)), 0)::float AS seconds,
           max(xids) FILTER (WHERE since IS NULL)::bigint AS undated_xids,
           txid_snapshot_xmax(txid_current_snapshot())::bigint AS next_xid
    FROM holders
    """,
)

# Each named table's files (main fork, indexes, and all of them with TOAST) against what
# its live rows need: `live` from the statistics collector, `row_width` the sum of its
# columns' average widths from the last ANALYZE, each weighed by how often it is not null
# (NULL: never analyzed, no estimate), its full and partial indexes, the
# primary key the rewrite orders by, and the index an operator marked for CLUSTER, if any
# (the rewrite then orders by it and leaves the mark).
COMPACTION_TABLES = Query[CompactionTablesParams](
    "compaction_tables",
    "The named tables' sizes on disk, live rows, average row width and primary key index.",
    """
    SELECT c.relname AS name,
           pg_relation_size(c.oid) AS heap_bytes,
           pg_indexes_size(c.oid) AS index_bytes,
           pg_total_relation_size(c.oid) AS total_bytes,
           greatest(s.n_live_tup, 0) AS live,
           (SELECT sum(st.avg_width * (1 - st.null_frac)) FROM pg_stats AS st
            WHERE st.schemaname = 'jobcore' AND st.tablename = c.relname)::bigint AS row_width,
           (SELECT count(*) FROM pg_index AS i
            WHERE i.indrelid = c.oid AND i.indpred IS NULL)::int AS indexes,
           (SELECT count(*) FROM pg_index AS i
            WHERE i.indrelid = c.oid AND i.indpred IS NOT NULL)::int AS partial_indexes,
           (SELECT k.relname FROM pg_index AS i JOIN pg_class AS k ON k.oid = i.indexrelid
            WHERE i.indrelid = c.oid AND i.indisprimary AND i.indisvalid) AS key_index,
           (SELECT k.relname FROM pg_index AS i JOIN pg_class AS k ON k.oid = i.indexrelid
            WHERE i.indrelid = c.oid AND i.indisclustered AND i.indisvalid) AS clustered_index
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    JOIN pg_stat_user_tables AS s ON s.relid = c.oid
    WHERE n.nspname = 'jobcore' AND c.relname = ANY(%(tables)s::text[])
    ORDER BY c.relname
    """,
)
