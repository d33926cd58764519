"""The claim of a few rows (OUTBOX_CLAIM_FEW): every due row, oldest first, when they fit one
batch (the rows the fair claim would take); nothing, and a no, when more are due, so the
fair claim shares them out. And the relay asks it only while the outbox was drained."""

from __future__ import annotations

import aio_pika

from jobcore.amqp.topology import Topology
from jobcore.db import Database, execute
from jobcore.registry import default_registry
from jobcore.settings import Settings
from jobcore.sql.flow_pauses import FLOW_PAUSE_SET
from jobcore.sql.outbox import OUTBOX_RECORD_FAILURES
from jobcore.store import outbox_store
from tests.integration.relay.helpers import fill_outbox, running_relay, wait_drained


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
        rows = await outbox_store.claim_few(uow, {"limit": 10})
    assert rows is not None
    assert [r["id"] for r in rows] == [r["id"] for r in a + b]
    assert {r["more_due"] for r in rows} == {False}


async def test_more_due_rows_than_a_batch_are_left_to_the_fair_claim(
    db: Database, topology: Topology
) -> None:
    await fill_outbox(db, topology, 11, tenant="a")
    async with db.unit_of_work() as uow:
        assert await outbox_store.claim_few(uow, {"limit": 10}) is None
        # It locked nothing: another claimer takes every row meanwhile.
        async with db.unit_of_work() as other:
            taken = await outbox_store.claim_due(other, {"limit": 100})
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
