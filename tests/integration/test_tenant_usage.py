"""A tenant's usage row is not written per job: jobs added and ended append deltas, and
the maintenance leader's usage folder folds them into the row (migration 0023).

Behind a pinned xmin horizon every version of a row updated per job stays, and every
reader of the row walks them: one tenant's row gathered tens of thousands in minutes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, lock_wait_ran_out
from jobcore.database.sql.tenant_quotas import TENANT_USAGE_FOLD
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Maintainer
from jobcore.maintenance.table_vacuum import TableVacuum
from jobcore.maintenance.usage_folder import (
    FOLD_BATCH,
    FOLD_START_ID,
    FOLD_VACUUM_EVERY,
    UsageFolder,
    UsageFolderConfig,
)
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue

TENANT = "usage-versions"
ADDED = 12
ENDED = 5


async def _row(db: Database) -> Any:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT ctid::text AS ctid, xmin::text AS xmin, unfinished FROM jobcore.tenant_usage "
            "WHERE tenant = %s",
            (TENANT,),
        )
        return await cur.fetchone()


async def _deltas(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT coalesce(sum(delta), 0) AS s FROM jobcore.tenant_usage_deltas WHERE"
            " tenant = %s",
            (TENANT,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["s"])


async def _add_and_end_jobs(db: Database, topology: Topology) -> None:
    noop = load_job_modules(("jobcore.examples.jobtypes",)).get("noop")
    for _ in range(ADDED):
        async with db.session() as session:
            await enqueue(
                session,
                topology,
                EnqueueRequest(tenant=TENANT, job_type=noop, payload=NoopPayload()),
            )
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.jobs SET status = 'cancelled', finished_at = now() WHERE id IN ("
            " SELECT id FROM jobcore.jobs WHERE tenant = %s ORDER BY created_at LIMIT %s)",
            (TENANT, ENDED),
        )


async def test_jobs_added_and_ended_write_no_version_of_their_tenants_usage_row(
    db: Database, topology: Topology
) -> None:
    async with db.connection() as conn:
        await conn.execute("INSERT INTO jobcore.tenant_usage (tenant) VALUES (%s)", (TENANT,))
    before = await _row(db)
    await _add_and_end_jobs(db, topology)
    after = await _row(db)
    # The same tuple: not one update of the row (each would leave a version behind).
    assert (after["ctid"], after["xmin"]) == (before["ctid"], before["xmin"])
    assert after["unfinished"] + await _deltas(db) == ADDED - ENDED


async def test_the_usage_folder_folds_every_delta_into_its_tenants_row(
    db: Database, topology: Topology, settings: Settings
) -> None:
    await _add_and_end_jobs(db, topology)
    folder = UsageFolder.from_settings(settings)
    async with db.unit_of_work() as uow:
        taken, _ = await folder.work(uow)
        await uow.commit()
    # One delta per statement: each enqueue's, and the one that ended five jobs.
    assert taken == ADDED + 1
    assert await _deltas(db) == 0
    row = await _row(db)
    assert row["unfinished"] == ADDED - ENDED


async def _delta_rows(db: Database, tenants: tuple[str, ...]) -> list[tuple[str, int]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant, delta FROM jobcore.tenant_usage_deltas"
            " WHERE tenant = ANY(%s) ORDER BY id",
            (list(tenants),),
        )
        return [(r["tenant"], r["delta"]) for r in await cur.fetchall()]


async def test_a_statement_appends_one_delta_per_tenant_whatever_its_jobs(
    db: Database,
) -> None:
    """Statement-level triggers (migration 0027): a statement that adds or ends many jobs
    appends one row per tenant it changed, and one that changes no job between unfinished
    and finished (a claim, a heartbeat) appends none."""
    a, b = "per-statement-a", "per-statement-b"
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.jobs (id, tenant, type, queue)"
            " SELECT gen_random_uuid(), t, 'noop', 'default'"
            " FROM unnest(%s::text[]) AS t, generate_series(1, 50)",
            ([a, b],),
        )
        assert await _delta_rows(db, (a, b)) == [(a, 50), (b, 50)]
        await conn.execute(
            "UPDATE jobcore.jobs SET status = 'running', lease_expires_at = now()"
            " WHERE tenant = ANY(%s)",
            ([a, b],),
        )
        await conn.execute(
            "UPDATE jobcore.jobs SET status = 'succeeded', finished_at = now()"
            " WHERE id IN (SELECT id FROM jobcore.jobs WHERE tenant = %s LIMIT 20)",
            (a,),
        )
        await conn.execute(
            "DELETE FROM jobcore.jobs WHERE tenant = %s AND status = 'running'", (b,)
        )
        # Ended jobs deleted: no change to the count.
        await conn.execute(
            "DELETE FROM jobcore.jobs WHERE tenant = %s AND status = 'succeeded'", (a,)
        )
    assert await _delta_rows(db, (a, b)) == [(a, 50), (b, 50), (a, -20), (b, -50)]


async def _seed(db: Database, rows: dict[str, int], deltas: list[tuple[str, int]]) -> None:
    async with db.connection() as conn:
        for tenant, unfinished in rows.items():
            await conn.execute(
                "INSERT INTO jobcore.tenant_usage (tenant, unfinished) VALUES (%s, %s)",
                (tenant, unfinished),
            )
        for tenant, delta in deltas:
            await conn.execute(
                "INSERT INTO jobcore.tenant_usage_deltas (tenant, delta) VALUES (%s, %s)",
                (tenant, delta),
            )


async def _fold_once(db: Database, folder: UsageFolder) -> None:
    """One batch; a batch that gave up waiting for a lock leaves its deltas for later."""
    try:
        async with db.unit_of_work() as uow:
            await folder.work(uow)
            await uow.commit()
    except DatabaseUnavailable as exc:
        if not lock_wait_ran_out(exc):
            raise


async def _add_deltas(db: Database, count: int) -> int:
    """``count`` deltas of +1 for the tenant, in one statement; the table's size after."""
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.tenant_usage_deltas (tenant, delta)"
            " SELECT %s, 1 FROM generate_series(1, %s)",
            (TENANT, count),
        )
        cur = await conn.execute("SELECT pg_relation_size('jobcore.tenant_usage_deltas') AS n")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_the_usage_folder_vacuums_the_deltas_it_folded_so_new_ones_reuse_their_space(
    db: Database, settings: Settings
) -> None:
    folder = UsageFolder.from_settings(settings)
    assert folder.vacuum is not None
    size = await _add_deltas(db, FOLD_VACUUM_EVERY)
    async with db.unit_of_work() as uow:
        taken, rows = await folder.work(uow)
        await uow.commit()
    assert taken == FOLD_VACUUM_EVERY
    folder.report(rows)  # as the leader's round does, once the batch committed
    assert folder.vacuum.running

    async def vacuumed() -> bool:
        return not folder.vacuum.running  # type: ignore[union-attr]

    await eventually(vacuumed, timeout=30, what="the usage deltas' VACUUM")
    await folder.vacuum.close()
    assert folder.vacuum.runs == 1
    # As many deltas again fit in the space of those folded: without the VACUUM, each
    # would take new space, and the table would double.
    assert await _add_deltas(db, FOLD_VACUUM_EVERY) == size
    assert (await _row(db))["unfinished"] == FOLD_VACUUM_EVERY


async def test_a_stopped_maintainer_ends_the_usage_folders_vacuum_under_way(
    db: Database, settings: Settings
) -> None:
    # The VACUUM's own connection goes to a server that never answers (a cut network), so
    # it is still under way when the maintainer stops; the stop must end it, not leave it
    # behind the worker's shutdown.
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    silent_settings = settings.model_copy(
        update={
            "database_url": f"postgresql://jobcore@127.0.0.1:{port}/nowhere",
            "db_connect_timeout": 60.0,
        }
    )
    vacuum = TableVacuum(silent_settings, "tenant_usage_deltas", 1, owner="usage-folder")
    folder = UsageFolder(UsageFolderConfig(interval=0.2), vacuum)
    maintainer = Maintainer(db, [folder], owner="w-fold")
    await _add_deltas(db, 10)
    try:
        await maintainer.start()
        try:

            async def vacuum_under_way() -> bool:
                return vacuum.running

            await eventually(vacuum_under_way, timeout=20, what="the folder's VACUUM")
        finally:
            await maintainer.stop(5.0)
        assert not vacuum.running
        assert vacuum.runs == 0
    finally:
        silent.close()
        await vacuum.close()


async def test_a_minus_one_is_never_folded_without_its_plus_one(
    db: Database, settings: Settings
) -> None:
    # A job's +1 (its row locked elsewhere, as an admission of the previous release
    # locks a tenant's deltas) and the -1 of its end.
    await _seed(db, {TENANT: 0}, [(TENANT, 1), (TENANT, -1)])
    folder = UsageFolder.from_settings(settings)
    locker = await psycopg.AsyncConnection.connect(settings.database_url)
    try:
        await locker.execute(
            "SELECT 1 FROM jobcore.tenant_usage_deltas WHERE tenant = %s AND delta = 1 FOR UPDATE",
            (TENANT,),
        )
        await _fold_once(db, folder)
        await locker.rollback()
    finally:
        await locker.close()
    await _fold_once(db, folder)
    assert await _deltas(db) == 0
    # The job was added and ended: none unfinished (a -1 folded alone, clamped at 0, and
    # its +1 after it would leave 1 for ever).
    assert (await _row(db))["unfinished"] == 0


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", ()):
        found += _nodes(child)
    return found


async def test_a_fold_batch_reads_the_deltas_in_primary_key_order_without_sorting_them(
    db: Database,
) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.tenant_usage_deltas (tenant, delta)"
            " SELECT 'plan-' || (n % 30), 1 FROM generate_series(1, 20000) AS n"
        )
        await conn.execute("ANALYZE jobcore.tenant_usage_deltas")
        cur = await conn.execute(
            "EXPLAIN (FORMAT JSON) " + TENANT_USAGE_FOLD.sql,
            {"limit": FOLD_BATCH, "after_tenant": "", "after_id": FOLD_START_ID},
        )
        row = await cur.fetchone()
    assert row is not None
    nodes = _nodes(row["QUERY PLAN"][0]["Plan"])
    scans = [n for n in nodes if n.get("Relation Name") == "tenant_usage_deltas"]
    assert scans, nodes
    assert all(n["Node Type"] != "Seq Scan" for n in scans), scans
    assert any(n.get("Index Name") == "tenant_usage_deltas_pkey" for n in scans), scans
    # No sort of the table's rows (one of the batch's few keys, or of the sums, is fine).
    sorts = [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")]
    sorting_deltas = [
        s for s in sorts if any(n.get("Relation Name") == "tenant_usage_deltas" for n in _nodes(s))
    ]
    assert not sorting_deltas, sorting_deltas


async def _at_cap_calls(db: Database) -> int:
    async with db.connection() as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute(
            "SELECT coalesce(sum(calls), 0) AS n FROM pg_stat_user_functions"
            " WHERE funcname = 'jobcore_tenant_at_cap'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_an_admission_with_a_usage_row_checks_the_cap_once(
    settings: Settings, topology: Topology
) -> None:
    # Counted per function call from connections opened after this (superuser only).
    admin = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    try:
        name = (await (await admin.execute("SELECT current_database()")).fetchone() or [""])[0]
        await admin.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")
    finally:
        await admin.close()
    db = Database(settings)
    await db.open(wait=True)
    try:
        async with db.connection() as conn:
            await conn.execute(
                "INSERT INTO jobcore.tenant_quotas (tenant, max_unfinished) VALUES (%s, 100)",
                (TENANT,),
            )
            await conn.execute("INSERT INTO jobcore.tenant_usage (tenant) VALUES (%s)", (TENANT,))
        noop = load_job_modules(("jobcore.examples.jobtypes",)).get("noop")
        async with db.session() as session:
            await enqueue(
                session,
                topology,
                EnqueueRequest(tenant=TENANT, job_type=noop, payload=NoopPayload()),
            )
        async with db.connection() as conn:
            await conn.execute("SELECT pg_stat_force_next_flush()")

        async def flushed() -> bool:
            return await _at_cap_calls(db) > 0

        await eventually(flushed, timeout=20, what="the function statistics")
        # DO UPDATE checks the cap under the row's lock; the INSERT's values go unused.
        assert await _at_cap_calls(db) == 1
    finally:
        await db.close()


async def _usage_index_scans(db: Database) -> int:
    async with db.connection() as conn:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.commit()
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute(
            "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'tenant_usage_pkey'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["idx_scan"])


async def test_an_enqueue_of_a_tenant_with_no_quota_does_not_read_its_usage_row(
    settings: Settings, topology: Topology
) -> None:
    # One connection: the enqueue's statistics are flushed by the statement after it.
    db = Database(settings, min_size=1, max_size=1)
    await db.open(wait=True)
    try:
        async with db.connection() as conn:
            await conn.execute("INSERT INTO jobcore.tenant_usage (tenant) VALUES (%s)", (TENANT,))
        noop = load_job_modules(("jobcore.examples.jobtypes",)).get("noop")
        before = await _usage_index_scans(db)
        async with db.session() as session:
            await enqueue(
                session,
                topology,
                EnqueueRequest(tenant=TENANT, job_type=noop, payload=NoopPayload()),
            )
        # No rate limit: no RateLimit headers, so nothing to read the row for.
        assert await _usage_index_scans(db) == before
    finally:
        await db.close()
