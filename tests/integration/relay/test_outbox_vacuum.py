"""What keeps the claim as cheap at the end of a long drain as at its start: the relay's
VACUUM of the outbox (jobcore.maintenance.table_vacuum) and no JIT on its connections."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aio_pika

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql.outbox import OUTBOX_CLAIM_FAIR
from jobcore.kernel.priorities import WEIGHTS
from jobcore.kernel.settings import Settings
from jobcore.maintenance.table_vacuum import TableVacuum
from jobcore.testing.waiting import eventually
from tests.integration.relay.helpers import collect, fill_outbox, running_relay, wait_drained
from tests.support.plans import table_blocks

CLAIM = {
    "routing_keys": ["testq"],
    "budgets": [10],
    "other_budget": 10,
    "limit": 10,
    "priorities": [int(p) for p in WEIGHTS],
    "weights": list(WEIGHTS.values()),
    "window": 1e9,  # every due row: the relay's unbounded look, from the index's head
}


async def claim_and_pages(db: Database) -> tuple[list[Any], int]:
    """The rows the relay's claim takes now (rolled back), and the pages of the database's
    own tables and indexes it read (tests.support.plans)."""
    async with db.unit_of_work() as uow:
        rows = [(r["tenant"], r["id"]) for r in await fetch_all(uow, OUTBOX_CLAIM_FAIR(CLAIM))]
    async with db.connection() as conn, conn.transaction(force_rollback=True):
        before = await table_blocks(conn)
        await conn.execute("EXPLAIN (ANALYZE) " + OUTBOX_CLAIM_FAIR.sql, CLAIM)
        return rows, await table_blocks(conn) - before


async def delete_oldest(db: Database, ids: list[int]) -> None:
    """As the relay deletes what it published: batch by batch, oldest first."""
    for start in range(0, len(ids), 500):
        async with db.connection() as conn:
            await conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", (ids[start : start + 500],))


async def vacuum_counts(db: Database) -> int:
    async with db.connection() as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'outbox'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["vacuum_count"])


async def test_a_drained_head_slows_the_claim_until_the_relays_vacuum_frees_it(
    settings: Settings, db: Database, topology: Topology
) -> None:
    a = await fill_outbox(db, topology, 40_000, tenant="a", notify=False)
    b = await fill_outbox(db, topology, 5, tenant="b", notify=False)
    async with db.connection() as conn:
        await conn.execute("ANALYZE outbox")
    drained = [r["id"] for r in a[:39_000]]
    await delete_oldest(db, drained)
    await claim_and_pages(db)  # as the relay's next claim: marks the dead entries it passes

    before, dead_head = await claim_and_pages(db)
    vacuum = TableVacuum(settings, "outbox", 10_000, owner="relay")
    vacuum.deleted(9_999)
    assert not vacuum.running
    vacuum.deleted(len(drained) - 9_999)
    assert vacuum.running
    vacuum.deleted(50_000)  # one VACUUM at a time: counted for the next one

    async def done() -> bool:
        return not vacuum.running

    await eventually(done, timeout=30, what="the outbox VACUUM")
    await vacuum.close()
    after, vacuumed = await claim_and_pages(db)

    # The claim walked every leaf page of the 39,000 deleted rows' index entries; after
    # the VACUUM it reads about what it reads on an outbox that was never drained.
    assert vacuum.runs == 1
    assert vacuumed * 4 < dead_head, (vacuumed, dead_head)
    # And it claims the same rows: the oldest left of each tenant, in turn.
    assert after == before
    left = [r["id"] for r in a[39_000:]]
    assert after == [pair for i in range(5) for pair in (("a", left[i]), ("b", b[i]["id"]))]


async def test_vacuum_every_zero_never_vacuums(settings: Settings) -> None:
    vacuum = TableVacuum(settings, "outbox", 0, owner="relay", small_every=10, small_bytes=1 << 40)
    vacuum.deleted(10_000_000)
    assert not vacuum.running


async def _settled(vacuum: TableVacuum) -> None:
    async def done() -> bool:
        return not vacuum.running

    await eventually(done, timeout=30, what="the VACUUM (or its look at the table's size)")


async def test_a_small_outbox_is_vacuumed_every_small_every_rows(
    settings: Settings, db: Database
) -> None:
    vacuums = await vacuum_counts(db)
    vacuum = TableVacuum(
        settings, "outbox", 1_000_000, owner="relay", small_every=100, small_bytes=1 << 40
    )
    vacuum.deleted(99)
    assert not vacuum.running
    vacuum.deleted(1)
    assert vacuum.running
    await _settled(vacuum)
    assert (vacuum.runs, vacuum.found_big, vacuum.deleted_since) == (1, 0, 0)
    assert await vacuum_counts(db) > vacuums
    vacuum.deleted(100)  # and again after as many rows
    assert vacuum.running
    await _settled(vacuum)
    assert vacuum.runs == 2
    await vacuum.close()


async def test_a_big_outbox_is_vacuumed_only_every_every_rows(
    settings: Settings, db: Database
) -> None:
    """Past small_bytes (here every outbox is), a look at the size every small_every rows
    vacuums nothing: the rows count towards ``every``, which vacuums whatever the size."""
    vacuums = await vacuum_counts(db)
    vacuum = TableVacuum(settings, "outbox", 300, owner="relay", small_every=100, small_bytes=1)
    vacuum.deleted(100)
    assert vacuum.running  # looking at the size
    await _settled(vacuum)
    assert (vacuum.runs, vacuum.found_big, vacuum.deleted_since) == (0, 1, 100)
    vacuum.deleted(99)  # the next look is small_every rows after the last
    assert not vacuum.running
    vacuum.deleted(1)
    await _settled(vacuum)
    assert (vacuum.runs, vacuum.found_big, vacuum.deleted_since) == (0, 2, 200)
    assert await vacuum_counts(db) == vacuums
    vacuum.deleted(100)  # 300: owed whatever the size
    assert vacuum.running
    await _settled(vacuum)
    assert (vacuum.runs, vacuum.found_big, vacuum.deleted_since) == (1, 2, 0)
    assert await vacuum_counts(db) > vacuums
    await vacuum.close()


async def test_the_relay_vacuums_the_outbox_after_every_so_many_rows_it_deleted(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    await collect(amqp_channel, topology)
    vacuums = await vacuum_counts(db)
    async with running_relay(settings, db, vacuum_every=100, batch_size=50) as relay:
        await fill_outbox(db, topology, 250)
        await wait_drained(db)

        async def vacuumed() -> bool:
            return relay.vacuum.runs >= 1 and not relay.vacuum.running

        await eventually(vacuumed, timeout=30, what="the relay's VACUUM of the outbox")
    assert await vacuum_counts(db) > vacuums


async def test_the_pools_run_without_jit(db: Database) -> None:
    """A generic plan of the claim on a large outbox is costed far past jit_above_cost:
    compiled at every run, it took 0.6 s for 2 ms of work."""
    async with db.connection() as conn:
        cur = await conn.execute("SHOW jit")
        row = await cur.fetchone()
    assert row is not None
    assert row["jit"] == "off"


async def test_a_vacuum_that_failed_is_tried_again_soon_not_after_as_many_rows(
    settings: Settings,
) -> None:
    refused = settings.model_copy(
        update={"database_url": "postgresql://postgres@127.0.0.1:1/nowhere"}
    )
    vacuum = await failed_vacuum(refused)
    vacuum.deleted(1)  # within RETRY_SECONDS: not yet
    assert not vacuum.running
    vacuum._retry_at = 0.0  # as after RETRY_SECONDS
    vacuum.deleted(1)
    assert vacuum.running
    await vacuum.close()


async def test_a_vacuum_that_failed_once_started_waits_for_as_many_rows_again(
    settings: Settings,
) -> None:
    """Cut off once started (by a statement_timeout set on the role, say), a VACUUM tried
    again a second later would redo most of its work and fail the same way, forever. Here
    the connection works and the VACUUM fails: the schema it names holds no outbox."""
    refusing = settings.model_copy(update={"database_schema": "nowhere"})
    vacuum = await failed_vacuum(refusing)
    vacuum._retry_at = 0.0  # whatever the clock says
    vacuum.deleted(999)
    assert not vacuum.running  # not owed any more: as many rows again first
    vacuum.deleted(1)
    assert vacuum.running
    await vacuum.close()


async def failed_vacuum(settings: Settings) -> TableVacuum:
    """A TableVacuum of the outbox whose first VACUUM (owed after 1,000 rows) failed."""
    vacuum = TableVacuum(settings, "outbox", 1_000, owner="relay")
    vacuum.deleted(1_000)

    async def failed() -> bool:
        return not vacuum.running

    await eventually(failed, timeout=30, what="the VACUUM to fail")
    assert vacuum.runs == 0
    return vacuum


def with_options(url: str, options: str) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options={quote(options)}"
