"""The claim of a few rows (OUTBOX_CLAIM_FEW): every due row, oldest first, when they fit one
batch (the rows the fair claim would take); nothing, and a no, when more are due, so the
fair claim shares them out. And the relay asks it only while the outbox was drained.

It reads only the rows due within its window (back to the relay's low-water mark:
test_low_water.py), so the dead entries a pinned xmin horizon keeps at the head of
outbox_due_idx cost it nothing; the relay looks at every due row every minute, so a row
due before the window (its writer broke the mark's rule) is still published."""

from __future__ import annotations

import aio_pika
import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute
from jobcore.database.sql.flow_pauses import FLOW_PAUSE_SET
from jobcore.database.sql.outbox import OUTBOX_CLAIM_FEW, OUTBOX_RECORD_FAILURES
from jobcore.database.store import outbox_store
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from services.relay import relay as relay_module
from services.relay.relay import UNBOUNDED_WINDOW
from tests.integration.relay.helpers import fill_outbox, running_relay, wait_drained
from tests.support import plans


async def test_every_due_row_is_claimed_oldest_first_when_they_fit_a_batch(
    db: Database, topology: Topology
) -> None:
    a = await fill_outbox(db, topology, 2, tenant="a")
    b = await fill_outbox(db, topology, 1, tenant="b")
    await fill_outbox(db, topology, 1, tenant="c", delay=3600)  # not due
    [failing] = await fill_outbox(db, topology, 1, tenant="d")
    await fill_outbox(db, topology, 1, routing_key="pausedq", tenant="e")
    async with db.unit_of_work() as uow:
        await execute(
            uow,
            OUTBOX_RECORD_FAILURES(
                {"ids": [failing["id"]], "errors": ["x"], "delays": [0.0], "quarantine": [True]}
            ),
        )
        await execute(uow, FLOW_PAUSE_SET({"kind": "queue", "name": "pausedq", "paused_by": "t"}))
        await uow.commit()

    async with db.unit_of_work() as uow:
        rows = await outbox_store.claim_few(uow, {"limit": 10, "window": UNBOUNDED_WINDOW})
    assert rows is not None
    assert [r["id"] for r in rows] == [r["id"] for r in a + b]
    assert {r["more_due"] for r in rows} == {False}


async def test_more_due_rows_than_a_batch_are_left_to_the_fair_claim(
    db: Database, topology: Topology
) -> None:
    await fill_outbox(db, topology, 11, tenant="a")
    async with db.unit_of_work() as uow:
        assert await outbox_store.claim_few(uow, {"limit": 10, "window": UNBOUNDED_WINDOW}) is None
        # It locked nothing: another claimer takes every row meanwhile.
        async with db.unit_of_work() as other:
            taken = await outbox_store.claim_due(other, {"limit": 100, "window": UNBOUNDED_WINDOW})
        assert len(taken) == 11


async def test_an_idle_relay_claims_a_few_rows_without_the_fair_claim_and_a_backlog_with_it(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    await topology.declare(amqp_channel, default_registry.queues())
    async with running_relay(settings, db, batch_size=50) as relay:
        await fill_outbox(db, topology, 3, tenant="a")
        await wait_drained(db, timeout=20)
        assert relay.few_claims >= 1
        few = relay.few_claims
        # More than a batch, announced once both tenants' rows are in: the claim woken by
        # it finds too many for OUTBOX_CLAIM_FEW, and every claim until the outbox is
        # drained again is fair.
        await fill_outbox(db, topology, 120, tenant="b", notify=False)
        await fill_outbox(db, topology, 1, tenant="c")
        await wait_drained(db, timeout=20)
        assert relay.few_claims == few
        assert relay.totals["published"] == 124


async def test_the_claim_reads_only_the_rows_due_within_its_window(
    db: Database, topology: Topology
) -> None:
    [old] = await fill_outbox(db, topology, 1, tenant="a", delay=-60)
    [new] = await fill_outbox(db, topology, 1, tenant="b")
    async with db.unit_of_work() as uow:
        rows = await outbox_store.claim_few(uow, {"limit": 10, "window": 30})
        assert rows is not None
        assert [r["id"] for r in rows] == [new["id"]]
    # Eleven rows of which one is in the window: they fit.
    await fill_outbox(db, topology, 10, tenant="a", delay=-60)
    async with db.unit_of_work() as uow:
        rows = await outbox_store.claim_few(uow, {"limit": 10, "window": 30})
        assert rows is not None
        assert len(rows) == 1
    async with db.unit_of_work() as uow:
        assert await outbox_store.claim_few(uow, {"limit": 10, "window": UNBOUNDED_WINDOW}) is None
    assert old["id"] != new["id"]


def _few_claim_buffers(url: str, window: float) -> int:
    """Pages the few claim reads, as the pools run it (tests.support.plans)."""
    return plans.explain(url, OUTBOX_CLAIM_FEW, {"limit": 100, "window": window}).blocks


async def test_rows_published_behind_a_pinned_horizon_cost_the_bounded_claim_nothing(
    settings: Settings, db: Database, topology: Topology
) -> None:
    """Under a pinned xmin horizon no VACUUM removes the published rows' index entries;
    the unbounded probe visits every one of them (a heap fetch each), the bounded one
    only those of its window."""
    url = settings.database_url
    with psycopg.connect(url) as pin:
        pin.execute("SELECT txid_current()")  # holds an XID: the horizon stays here
        published = await fill_outbox(db, topology, 5000, delay=-120, notify=False)
        async with db.connection() as conn:
            await conn.execute(
                "DELETE FROM outbox WHERE id = ANY(%s)", ([r["id"] for r in published],)
            )
        await fill_outbox(db, topology, 3, notify=False)
        unbounded = _few_claim_buffers(url, UNBOUNDED_WINDOW)
        bounded = _few_claim_buffers(url, 10)
        pin.rollback()
    # About a block per 25 dead entries unbounded; bounded, the few live rows' and the
    # flow pauses' blocks, whatever lies below the window.
    assert unbounded >= bounded + 150, (unbounded, bounded)
    assert bounded <= 60, bounded


async def test_a_row_due_before_the_window_is_published_at_the_next_unbounded_look(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row whose writer committed it long after its available_at, and took its lock on
    the outbox after the relay's look, lies below the window of the claims that follow;
    the next unbounded look (every minute; a few seconds here) publishes it."""
    monkeypatch.setattr(relay_module, "UNBOUNDED_LOOK_EVERY", 3.0)
    await topology.declare(amqp_channel, default_registry.queues())
    async with running_relay(settings, db, batch_size=50) as relay:
        await fill_outbox(db, topology, 1, tenant="a")
        await wait_drained(db, timeout=20)
        await fill_outbox(db, topology, 1, tenant="late", delay=-3600)
        await wait_drained(db, timeout=3.0 + 20)
        assert relay.totals["published"] == 2
        # Traffic in the window keeps flowing meanwhile, and is claimed by the few claim.
        few = relay.few_claims
        await fill_outbox(db, topology, 1, tenant="b")
        await wait_drained(db, timeout=20)
        assert relay.few_claims > few
