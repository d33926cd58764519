"""The relay's low-water mark (services/relay/low_water.py): the claim of a few rows starts
its range of outbox_due_idx at the mark, so no live row may lie below it. A row that a
transaction commits late, long after the relay's look, is still claimed by the bounded
claim when its writer follows the rule (an enqueue in an application's transaction, a
writer that held its lock during the look, a row another relay held and let go); one
whose writer broke it waits for the relay's unbounded look. A transaction that pins the
xmin horizon without writing the outbox does not hold the mark back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aio_pika
import psycopg
import pytest

from jobcore import enqueue_in
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.sql.outbox import OUTBOX_CLAIM_FEW, OUTBOX_OLDEST_LIVE
from jobcore.database.store import outbox_store
from jobcore.execution.job_type_records import record_job_types
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from services.relay import low_water, relay
from services.relay.low_water import LowWaterMark
from tests.integration.relay.helpers import FILL_SQL, fill_outbox, running_relay, wait_drained
from tests.support import plans

# The mark's slack, shortened, and how long the tests' application transactions have run
# when the relay looks: so they are as old, to the mark, as one begun minutes before.
SLACK = 0.1
AGED = "SELECT pg_sleep(0.3)"


@pytest.fixture
def short_slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(low_water, "SLACK", SLACK)
    return


async def _look(db: Database, mark: LowWaterMark) -> float:
    async with db.connection() as conn:
        return await mark.look(conn)


async def _claimed_ids(db: Database, window: float) -> list[int]:
    async with db.unit_of_work() as uow:
        rows = await outbox_store.claim_few(uow, {"limit": 10, "window": window})
    assert rows is not None
    return [row["id"] for row in rows]


async def _outbox_ids(db: Database) -> list[int]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT id FROM jobcore.outbox ORDER BY id")
        return [row["id"] for row in await cur.fetchall()]


@pytest.mark.parametrize("path", ["enqueue_in", "jobcore_enqueue"])
async def test_a_job_an_application_transaction_enqueues_after_the_look_is_above_the_mark(
    settings: Settings, db: Database, short_slack: None, path: str
) -> None:
    """The transaction began before the relay's look, and enqueues after it (from Python,
    or from SQL): the row's key is its statement's start (not its transaction's), so the
    bounded claim finds it."""
    async with db.connection() as conn:
        await record_job_types(conn, default_registry, settings, registered_by="tests")
    mark = LowWaterMark()
    async with await psycopg.AsyncConnection.connect(settings.database_url) as app:
        await app.execute(AGED)  # the application's transaction, begun a while ago
        await _look(db, mark)  # the relay's look: nothing to hold the mark back
        if path == "enqueue_in":
            await enqueue_in(app, default_registry, "echo", {"text": "late"}, tenant="t")
        else:
            await app.execute("SELECT jobcore.enqueue('echo', '{\"text\": \"late\"}', 't')")
        await app.commit()
    [row] = await _outbox_ids(db)
    assert await _claimed_ids(db, mark.window()) == [row]


async def test_a_writer_that_held_its_lock_during_the_look_holds_the_mark_back(
    settings: Settings, db: Database, topology: Topology, short_slack: None
) -> None:
    """A row stamped with its transaction's start, written before the look and committed
    after it: the look saw the writer's lock (pg_locks) and put the mark at its start."""
    mark = LowWaterMark()
    async with await psycopg.AsyncConnection.connect(settings.database_url) as app:
        await app.execute(FILL_SQL, _fill_params(topology))  # available_at = now()
        await app.execute(AGED)
        await _look(db, mark)
        await app.commit()
    [row] = await _outbox_ids(db)
    assert await _claimed_ids(db, mark.window()) == [row]


async def test_a_row_another_relay_held_during_the_look_is_claimed_once_let_go(
    settings: Settings, db: Database, topology: Topology, short_slack: None
) -> None:
    """A plain read finds the oldest live row whoever holds it: a relay that rolls back
    its claim leaves the row where the mark still reaches."""
    [row] = await fill_outbox(db, topology, 1, delay=-30, notify=False)
    mark = LowWaterMark()
    await _look(db, mark)  # the first look reads every row
    async with await psycopg.AsyncConnection.connect(settings.database_url) as other:
        await other.execute("SELECT id FROM jobcore.outbox FOR UPDATE")
        await _look(db, mark)
        await other.rollback()
    assert mark.window() >= 30
    assert await _claimed_ids(db, mark.window()) == [row["id"]]


async def test_a_writer_that_stamps_its_old_transactions_start_after_the_look_is_below_it(
    settings: Settings, db: Database, topology: Topology, short_slack: None
) -> None:
    """The rule broken: the writer began before the look, took its lock after it, and
    stamped its transaction's start. The bounded claim misses the row; the unbounded look
    (the relay's safety net) claims it."""
    mark = LowWaterMark()
    async with await psycopg.AsyncConnection.connect(settings.database_url) as app:
        await app.execute(AGED)
        await _look(db, mark)
        await app.execute(FILL_SQL, _fill_params(topology))
        await app.commit()
    [row] = await _outbox_ids(db)
    assert await _claimed_ids(db, mark.window()) == []
    assert await _claimed_ids(db, low_water.UNBOUNDED_WINDOW) == [row]


async def test_a_pinned_transaction_that_writes_no_outbox_row_does_not_hold_the_mark_back(
    settings: Settings, db: Database
) -> None:
    with psycopg.connect(settings.database_url) as pin:
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT txid_current(), count(*) FROM jobcore.outbox")
        async with db.connection() as conn:
            writer = await outbox_store.oldest_writer(conn)
            assert writer is not None
            assert writer["seconds"] is None
            assert writer["unknown"] is False
        with psycopg.connect(settings.database_url) as app:
            app.execute("DELETE FROM jobcore.outbox")  # a writer's lock, held until its commit
            async with db.connection() as conn:
                writer = await outbox_store.oldest_writer(conn)
            assert writer is not None
            assert writer["seconds"] is not None
            app.rollback()
        pin.rollback()


async def test_behind_a_pinned_horizon_the_look_and_the_claim_read_only_what_lies_past_the_mark(
    settings: Settings, db: Database, topology: Topology
) -> None:
    """5,000 rows published (deleted) while a transaction pins the horizon: their entries
    stay, a heap fetch each for a scan from the index's head; the mark lies past them, so
    neither the look nor the bounded claim reads them."""
    url = settings.database_url
    mark = LowWaterMark()
    with psycopg.connect(url) as pin:
        pin.execute("SELECT txid_current()")
        published = await fill_outbox(db, topology, 5000, delay=-120, notify=False)
        async with db.connection() as conn:
            await conn.execute(
                "DELETE FROM jobcore.outbox WHERE id = ANY(%s)", ([r["id"] for r in published],)
            )
        await _look(db, mark)  # the first look reads from the head
        await fill_outbox(db, topology, 3, notify=False)
        await _look(db, mark)
        window = mark.window()
        full = plans.explain(url, OUTBOX_CLAIM_FEW, {"limit": 100, "window": 1e9}).blocks
        claim = plans.explain(url, OUTBOX_CLAIM_FEW, {"limit": 100, "window": window}).blocks
        look = plans.explain(url, OUTBOX_OLDEST_LIVE, {"window": window}).blocks
        pin.rollback()
    assert window < 60, window
    assert full >= claim + 150, (full, claim)
    assert claim <= 60, claim
    assert look <= 10, look


async def test_the_relay_publishes_a_row_below_its_mark_at_its_unbounded_look(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """End to end, with the safety net's period shortened: a row far below the mark (its
    writer broke the rule) is published, and the relay keeps using the bounded claim."""
    monkeypatch.setattr(relay, "UNBOUNDED_LOOK_EVERY", 3.0)
    await topology.declare(amqp_channel, default_registry.queues())
    async with running_relay(settings, db, batch_size=50) as the_relay:
        await fill_outbox(db, topology, 1, tenant="a")
        await wait_drained(db, timeout=20)
        assert the_relay.low_water.looks >= 1
        await fill_outbox(db, topology, 1, tenant="late", delay=-3600)
        await wait_drained(db, timeout=3.0 + 20)
        few = the_relay.few_claims
        await fill_outbox(db, topology, 1, tenant="b")
        await wait_drained(db, timeout=20)
        assert the_relay.few_claims > few
        assert the_relay.totals["published"] == 3


def _fill_params(topology: Topology) -> dict[str, Any]:
    return {
        "exchange": topology.jobs_exchange,
        "routing_key": "testq",
        "headers": "{}",
        "delay": 0.0,
        "body": None,
        "n": 1,
        "tenant": "t",
    }
