"""Statements on PostgreSQL's own catalog: which of jobcore's tables need their planner
statistics refreshed (:mod:`jobcore.maintenance.analyzer` runs the ANALYZE)."""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class StaleStatisticsParams(TypedDict):
    base: int
    pause: float
    scale: float
    tables: list[str]


# Autovacuum's own rule for when a table is due an ANALYZE (autovacuum_analyze_threshold
# + autovacuum_analyze_scale_factor × its rows, PostgreSQL's defaults as `base` and
# `scale`), asked of the tables autovacuum will not look at soon: one never analyzed at
# all (a new database, whose first autovacuum round may be a minute away), at once; and,
# where autovacuum is off (for the server, or for the table), one whose live rows doubled
# or halved since (the plans depend on its size), at once, else one last analyzed more
# than `pause` seconds ago, as autovacuum would come by once a naptime. Tables are named
# as the statements name them, through the search path.
TABLES_WITH_STALE_STATISTICS = Query[StaleStatisticsParams](
    "tables_with_stale_statistics",
    "The tables whose planner statistics are stale and which autovacuum will not analyze "
    "soon, with how many rows changed since their last ANALYZE.",
    """
    SELECT s.relname AS name, s.n_mod_since_analyze AS changed
    FROM pg_stat_user_tables AS s
    JOIN pg_class AS c ON c.oid = s.relid
    WHERE s.schemaname = 'jobcore' AND s.relname = ANY(%(tables)s::text[])
      AND s.n_mod_since_analyze > %(base)s + %(scale)s * greatest(c.reltuples, 0)
      AND (
          (s.last_analyze IS NULL AND s.last_autoanalyze IS NULL)
          OR ((NOT current_setting('autovacuum')::bool
               OR coalesce(c.reloptions, '{}') && ARRAY[
                   'autovacuum_enabled=false', 'autovacuum_enabled=off', 'autovacuum_enabled=0'])
              AND (s.n_live_tup > 2 * greatest(c.reltuples, 0) + %(base)s
                   OR s.n_live_tup < c.reltuples / 2 - %(base)s
                   OR greatest(s.last_analyze, s.last_autoanalyze)
                      < now() - make_interval(secs => %(pause)s))))
    ORDER BY s.relname
    """,
)
