"""A tenant's usage row is not written per job: jobs added and ended append deltas, and
the maintenance leader's usage folder folds them into the row (migration 0023).

Behind a pinned xmin horizon every version of a row updated per job stays, and every
reader of the row walks them: one tenant's row gathered tens of thousands in minutes.
"""

from __future__ import annotations

from typing import Any

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.jobtypes import NoopPayload
from jobcore.maintenance.usage_folder import UsageFolder
from jobcore.registry import load_job_modules
from jobcore.settings import Settings
from jobcore.submit import EnqueueRequest, enqueue

TENANT = "usage-versions"
ADDED = 12
ENDED = 5


async def _row(db: Database) -> Any:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT ctid::text AS ctid, xmin::text AS xmin, unfinished FROM tenant_usage "
            "WHERE tenant = %s",
            (TENANT,),
        )
        return await cur.fetchone()


async def _deltas(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT coalesce(sum(delta), 0) AS s FROM tenant_usage_deltas WHERE tenant = %s",
            (TENANT,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["s"])


async def _add_and_end_jobs(db: Database, topology: Topology) -> None:
    noop = load_job_modules(("jobcore.jobtypes",)).get("noop")
    for _ in range(ADDED):
        async with db.session() as session:
            await enqueue(
                session,
                topology,
                EnqueueRequest(tenant=TENANT, job_type=noop, payload=NoopPayload()),
            )
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE id IN ("
            " SELECT id FROM jobs WHERE tenant = %s ORDER BY created_at LIMIT %s)",
            (TENANT, ENDED),
        )


async def test_jobs_added_and_ended_write_no_version_of_their_tenants_usage_row(
    db: Database, topology: Topology
) -> None:
    async with db.connection() as conn:
        await conn.execute("INSERT INTO tenant_usage (tenant) VALUES (%s)", (TENANT,))
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
    assert taken >= ADDED + ENDED
    assert await _deltas(db) == 0
    row = await _row(db)
    assert row["unfinished"] == ADDED - ENDED
