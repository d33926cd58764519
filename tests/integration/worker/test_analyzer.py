"""The analyzer: the maintenance leader ANALYZEs jobcore's tables where autovacuum will not
soon (this machine's server runs without it), so plans cached on empty tables are made
again from real statistics (jobcore.maintenance.analyzer)."""

from __future__ import annotations

from datetime import datetime

import psycopg

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Analyzer, AnalyzerConfig
from jobcore.testing.waiting import eventually
from tests.integration.worker.support import Maintenance

# The shape of every statement that reaches a job by its id and checks its status (the
# claim, the outcomes), small enough to read its plan.
PREPARE_BY_ID = "PREPARE by_id(uuid) AS SELECT id FROM jobs WHERE id = $1 AND status = 'pending'"
PLAN_BY_ID = "EXPLAIN EXECUTE by_id(gen_random_uuid())"
ADD_PENDING_JOBS = """
    INSERT INTO jobs (id, tenant, type, queue)
    SELECT gen_random_uuid(), 'analyzed', 'noop', 'default' FROM generate_series(1, %(n)s)
"""
CHANGED_SINCE_ANALYZE = "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'jobs'"
LAST_ANALYZE = "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'jobs'"


async def plan(conn: psycopg.AsyncConnection[tuple[str]]) -> str:
    cur = await conn.execute(PLAN_BY_ID)
    return "\n".join(row[0] for row in await cur.fetchall())


async def add_pending_jobs(settings: Settings, n: int) -> None:
    # Its own connection, closed after: a backend reports its table counts when it ends,
    # where the analyzer reads them (pg_stat_user_tables).
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True
    ) as conn:
        await conn.execute(ADD_PENDING_JOBS, {"n": n})


async def last_analyze(db: Database) -> datetime | None:
    async with db.session() as session:
        cur = await session.connection.execute(LAST_ANALYZE)
        row = await cur.fetchone()
    assert row is not None
    when: datetime | None = row["last_analyze"]
    return when


async def autovacuum_is_off(db: Database) -> None:
    """This machine's server runs without autovacuum; where it runs, the analyzer leaves
    analyzed tables to it."""
    async with db.session() as session:
        cur = await session.connection.execute("SHOW autovacuum")
        row = await cur.fetchone()
    assert row is not None
    assert row["autovacuum"] == "off"


async def analyzed(maintenance: Maintenance) -> bool:
    return await maintenance.round() > 0


async def test_a_plan_cached_on_empty_tables_is_made_again_once_the_jobs_grew(
    db: Database, settings: Settings
) -> None:
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True
    ) as conn:
        # As every pool with generic plans does (jobcore.database.gateway), on a new database.
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(PREPARE_BY_ID)
        # The hazard: with no statistics, the status index looks as good as the key.
        assert "jobs_status_created_not_running_idx" in await plan(conn)

        await add_pending_jobs(settings, 2000)
        analyzer = Maintenance(db, "a", Analyzer.from_settings(settings))
        await eventually(
            lambda: analyzed(analyzer), timeout=30, what="the analyzer to ANALYZE the jobs"
        )

        # ANALYZE invalidated the cached plan: made again, it reaches a job by its key.
        by_id = await plan(conn)
        assert "jobs_pkey" in by_id, by_id
        cur = await conn.execute(LAST_ANALYZE)
        row = await cur.fetchone()
        assert row is not None
        assert row[0] is not None
        # Nothing is due any more: the next round only reads the catalog.
        assert await analyzer.round() == 0


async def test_where_autovacuum_is_off_a_table_whose_rows_doubled_is_analyzed_again(
    db: Database, settings: Settings
) -> None:
    await autovacuum_is_off(db)
    analyzer = Maintenance(db, "a", Analyzer.from_settings(settings))
    await add_pending_jobs(settings, 2000)
    await eventually(lambda: analyzed(analyzer), timeout=30, what="the first ANALYZE")
    first = await last_analyze(db)
    await add_pending_jobs(settings, 2500)  # 4,500 rows: more than twice the 2,000 seen
    await eventually(lambda: analyzed(analyzer), timeout=30, what="an ANALYZE of the grown table")
    again = await last_analyze(db)
    assert first is not None
    assert again is not None
    assert again > first


async def test_where_autovacuum_is_off_a_table_that_only_changed_waits_a_pause(
    db: Database, settings: Settings
) -> None:
    """A busy table passes the threshold every round: analyzed at once each time, it
    would make every connection plan its statements again every round."""
    await autovacuum_is_off(db)
    patient = Maintenance(db, "a", Analyzer.from_settings(settings))
    await add_pending_jobs(settings, 2000)
    await eventually(lambda: analyzed(patient), timeout=30, what="the first ANALYZE")
    first = await last_analyze(db)
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True
    ) as conn:
        await conn.execute("UPDATE jobs SET priority = priority")  # as many rows, all changed

    async def changed_again() -> bool:
        async with db.session() as session:
            cur = await session.connection.execute(CHANGED_SINCE_ANALYZE)
            row = await cur.fetchone()
        return row is not None and row["n_mod_since_analyze"] >= 2000

    await eventually(changed_again, timeout=30, what="the changes in pg_stat_user_tables")
    # Past the threshold again, the same size, analyzed less than PAUSE ago: left alone.
    assert await patient.round() == 0
    await patient.maintainer.step_down()
    eager = Analyzer(AnalyzerConfig(interval=1.0, pause=0.0), settings=settings)
    assert await Maintenance(db, "b", eager).round() > 0
    again = await last_analyze(db)
    assert first is not None
    assert again is not None
    assert again > first


async def test_tables_that_changed_little_are_left_alone(db: Database, settings: Settings) -> None:
    await add_pending_jobs(settings, 20)  # under autovacuum's threshold of 50 rows
    analyzer = Maintenance(db, "a", Analyzer.from_settings(settings))
    assert await analyzer.round() == 0
    assert await last_analyze(db) is None
