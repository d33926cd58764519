"""A statement's plan and the pages it reads, run as the pools run it: a generic plan
(jobcore.database.gateway sets plan_cache_mode so), prepared once, in a transaction that
rolls back, so a shared test database stays as it was.

The pages counted are those of the database's own tables and indexes (relations past
FirstNormalObjectId, from pg_stat_get_xact_blocks_fetched), not EXPLAIN's shared buffers.
Those also count the system catalogs this backend reads when it rebuilds its caches, which
it must whenever other sessions on the shared server issue enough DDL (other tests'
CREATE DATABASE and migrations) to overflow the invalidation queue. A keyed enqueue that
reads 256 buffers read 641 after a burst of DDL in another database, and 1,819 in a CI
run; the pages of its own tables moved from 93 to 138 (its plan made again), far below
the thousands a scan would read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from jobcore.database.sql import Query, native_placeholders

# PostgreSQL's FirstNormalObjectId: every relation below it is a system catalog.
FIRST_NORMAL_OBJECT_ID = 16384
TABLE_BLOCKS = f"""
    SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(oid)), 0)::bigint
    FROM pg_class WHERE oid >= {FIRST_NORMAL_OBJECT_ID}
"""


@dataclass(frozen=True)
class Explained:
    text: str  # EXPLAIN (COSTS OFF), one line per node
    blocks: int  # pages of the database's own tables and indexes the run read


def _table_blocks(conn: psycopg.Connection[Any]) -> int:
    """Pages of the database's own relations read so far in the open transaction."""
    row = conn.execute(TABLE_BLOCKS).fetchone()
    assert row is not None
    return int(row[0])


async def table_blocks(conn: psycopg.AsyncConnection[Any]) -> int:
    """The same, on an async connection of any row factory: the difference of two calls
    in one transaction is what ran between them (its planning's index probes included)."""
    cur = await conn.execute(TABLE_BLOCKS)
    row = await cur.fetchone()
    assert row is not None
    return int(next(iter(row.values())) if isinstance(row, dict) else row[0])


def explain_in(conn: psycopg.Connection[Any], execute: str) -> Explained:
    """``execute`` (an EXECUTE of a prepared statement) explained, then run (EXPLAIN
    ANALYZE, its output unread) in the open transaction. Its generic plan is made first,
    so the pages counted are the run's, not the planner's."""
    text = "\n".join(line for (line,) in conn.execute(f"EXPLAIN (COSTS OFF) {execute}"))
    before = _table_blocks(conn)
    conn.execute(f"EXPLAIN (ANALYZE) {execute}")
    return Explained(text=text, blocks=_table_blocks(conn) - before)


def explain(
    url: str,
    query: Query[Any],
    params: dict[str, Any],
    *,
    setup: Sequence[tuple[str, Any]] = (),
) -> Explained:
    """``query`` with ``params``, run after ``setup`` in one transaction that rolls back."""
    sql, names = native_placeholders(query.sql)
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        try:
            for statement, args in setup:
                conn.execute(statement, args)
            cur = conn.cursor()
            values = ", ".join(cur.mogrify("%s", (params[name],)) for name in names)
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            conn.execute(f"PREPARE measured AS {sql}")
            return explain_in(conn, f"EXECUTE measured({values})" if names else "EXECUTE measured")
        finally:
            conn.rollback()
