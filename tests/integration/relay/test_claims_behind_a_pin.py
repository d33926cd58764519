"""The fair claim (OUTBOX_CLAIM_FAIR) and the FIFO claim (OUTBOX_CLAIM_DUE) behind a pinned
xmin horizon: the rows the relays published stay in every index until VACUUM may remove
them, and a transaction that holds an XID keeps it from removing any. Each claim reads
only what became due in its window (back to the relay's low-water mark), so what it reads
must not grow with the rows published before it: each test measures a claim's buffers
with the same live rows before and after thousands of rows were published behind the
pin, and checks that the unbounded claim (the relay's look at every due row, once a
minute) does read them, so that the scenario is one a claim from the index's head fails.

And the safety net: rows below the mark (their writer broke its rule) are published by
the relay's unbounded look, however many, with fairness on and off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aio_pika
import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.database.sql.outbox import (
    OUTBOX_CLAIM_DUE,
    OUTBOX_CLAIM_FAIR,
    OUTBOX_RECORD_FAILURES,
)
from jobcore.execution.registry import default_registry
from jobcore.kernel.priorities import WEIGHTS
from jobcore.kernel.settings import Settings
from services.relay import relay as relay_module
from services.relay.low_water import UNBOUNDED_WINDOW
from tests.integration.relay.helpers import fill_outbox, running_relay, wait_drained
from tests.support import plans

# Rows published behind the pin before the first measure, and more before the second:
# the first gives the indexes the height they keep, so that only what the dead rows cost
# per call differs between the two.
FIRST, MORE = 2000, 6000
# The bounded claims' window: the relay's mark lies a few seconds back; the rows published
# behind the pin became due two minutes ago.
WINDOW = 10.0
PAST = -120.0


# The fair claim's parameters but its window: one queue with room for a batch.
FAIR: dict[str, Any] = {
    "routing_keys": ["testq"],
    "budgets": [100],
    "other_budget": 100,
    "limit": 100,
    "priorities": [int(p) for p in WEIGHTS],
    "weights": list(WEIGHTS.values()),
}


def blocks(url: str, query: Query[Any], params: dict[str, Any]) -> int:
    """Pages of its tables one call reads as the pools run it (tests.support.plans),
    rolled back: the second of two, once the first has set the hint bits."""
    plans.explain(url, query, params)
    return plans.explain(url, query, params).blocks


@pytest.fixture
def pin(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    """A transaction that holds an XID for the whole test: nothing deleted after it began
    can be vacuumed away."""
    with psycopg.connect(settings.database_url) as conn:
        conn.execute("SELECT txid_current()")
        yield conn
        conn.rollback()


async def push_back(db: Database, rows: list[dict[str, Any]]) -> None:
    """A failed publish retried at once: the rows are due again, written for later."""
    async with db.unit_of_work() as uow:
        await execute(
            uow,
            OUTBOX_RECORD_FAILURES(
                {
                    "ids": [r["id"] for r in rows],
                    "errors": ["x"] * len(rows),
                    "delays": [0.0] * len(rows),
                    "quarantine": [False] * len(rows),
                }
            ),
        )
        await uow.commit()


async def live_rows(db: Database, topology: Topology) -> None:
    """Three lanes with due rows: two of rows due when written, one of rows pushed back."""
    await fill_outbox(db, topology, 3, tenant="a", notify=False)
    await fill_outbox(db, topology, 1, tenant="b", notify=False)
    await push_back(db, await fill_outbox(db, topology, 2, tenant="c", notify=False))


async def published_behind_the_pin(
    db: Database, topology: Topology, n: int, *, tenant: str
) -> None:
    """``n`` rows of ``tenant`` due when written, two minutes ago and a millisecond apart
    (each its own key, as rows of separate enqueues), and as many of tenant c's written for
    later and due then too, all published."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type,"
            " body, tenant, available_at, created_at)"
            " SELECT gen_random_uuid(), %(exchange)s, 'testq', 'echo', '\\x00', lane.tenant,"
            " due.at, due.at - lane.written_before"
            " FROM generate_series(1, %(n)s) AS i,"
            " LATERAL (SELECT now() + make_interval(secs => %(past)s) - i * interval '1 ms'"
            " AS at) AS due,"
            " (VALUES (%(tenant)s::text, interval '0'), ('c', interval '60 s'))"
            " AS lane(tenant, written_before)"
            " RETURNING id",
            {"exchange": topology.jobs_exchange, "n": n, "past": PAST, "tenant": tenant},
        )
        ids = [row["id"] for row in await cur.fetchall()]
        await conn.execute("DELETE FROM jobcore.outbox WHERE id = ANY(%s)", (ids,))


def measured(url: str, query: Query[Any], params: dict[str, Any]) -> dict[str, int]:
    return {
        "bounded": blocks(url, query, {**params, "window": WINDOW}),
        "unbounded": blocks(url, query, {**params, "window": UNBOUNDED_WINDOW}),
    }


async def before_and_after(
    settings: Settings,
    db: Database,
    topology: Topology,
    query: Query[Any],
    params: dict[str, Any],
    *,
    tenant: str,
) -> tuple[dict[str, int], dict[str, int]]:
    """A claim's buffers with the same live rows (due now), after FIRST and after FIRST +
    MORE rows of ``tenant`` (due two minutes ago) were published behind the pin."""
    await live_rows(db, topology)
    await published_behind_the_pin(db, topology, FIRST, tenant=tenant)
    before = measured(settings.database_url, query, params)
    await published_behind_the_pin(db, topology, MORE, tenant=tenant)
    after = measured(settings.database_url, query, params)
    return before, after


async def test_the_fair_claim_reads_no_more_after_rows_of_its_lanes_were_published_behind_a_pin(
    settings: Settings, db: Database, topology: Topology, pin: psycopg.Connection[Any]
) -> None:
    """Lane a's live rows lie past thousands of its rows published, and lane c's rows
    written for later past thousands of its own: the skip scan finds each lane by its
    newest row, and each range starts at the window."""
    before, after = await before_and_after(
        settings, db, topology, OUTBOX_CLAIM_FAIR, FAIR, tenant="a"
    )
    assert after["bounded"] <= before["bounded"] + 5, (before, after)
    assert after["unbounded"] >= before["unbounded"] + 200, (before, after)


async def test_a_lane_whose_rows_were_all_published_behind_a_pin_costs_no_heap_fetch(
    settings: Settings, db: Database, topology: Topology, pin: psycopg.Connection[Any]
) -> None:
    """A lane with no live row left: the skip scan steps over its entries by their keys in
    the index, below the window, without visiting their rows. It reads the index's leaf
    pages of them still (about a page per hundred rows): what remains of the pin's cost."""
    before, after = await before_and_after(
        settings, db, topology, OUTBOX_CLAIM_FAIR, FAIR, tenant="gone"
    )
    assert after["bounded"] <= before["bounded"] + MORE // 80, (before, after)
    assert after["unbounded"] >= before["unbounded"] + 200, (before, after)


async def test_the_fifo_claim_reads_no_more_after_rows_were_published_behind_a_pin(
    settings: Settings, db: Database, topology: Topology, pin: psycopg.Connection[Any]
) -> None:
    before, after = await before_and_after(
        settings, db, topology, OUTBOX_CLAIM_DUE, {"limit": 100}, tenant="a"
    )
    assert after["bounded"] <= before["bounded"] + 5, (before, after)
    assert after["unbounded"] >= before["unbounded"] + 200, (before, after)


async def test_a_backlog_below_the_mark_is_published_by_the_fair_claim_at_the_unbounded_looks(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More rows below the mark than a batch takes: the unbounded look's few claim finds
    too many, and the fair claim that follows it in that batch looks at every row too
    (not only at the window), so each unbounded look publishes a batch of them."""
    monkeypatch.setattr(relay_module, "UNBOUNDED_LOOK_EVERY", 2.0)
    await topology.declare(amqp_channel, default_registry.queues())
    async with running_relay(settings, db, batch_size=50) as relay:
        await fill_outbox(db, topology, 1, tenant="a")
        await wait_drained(db, timeout=20)
        await fill_outbox(db, topology, 120, tenant="late", delay=-3600)
        await wait_drained(db, timeout=3 * 2.0 + 30)
        assert relay.totals["published"] == 121


async def test_with_fairness_off_a_row_below_the_mark_is_published_at_the_unbounded_look(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The FIFO claim is bounded by the mark too: a row far below it waits for the relay's
    unbounded look, and rows in the window keep flowing meanwhile."""
    monkeypatch.setattr(relay_module, "UNBOUNDED_LOOK_EVERY", 2.0)
    await topology.declare(amqp_channel, default_registry.queues())
    async with running_relay(
        settings, db, batch_size=50, fair_claim=False, queue_depth_limit=0
    ) as relay:
        await fill_outbox(db, topology, 1, tenant="a")
        await wait_drained(db, timeout=20)
        assert relay.low_water.looks >= 1
        await fill_outbox(db, topology, 1, tenant="late", delay=-3600)
        await wait_drained(db, timeout=2.0 + 20)
        await fill_outbox(db, topology, 1, tenant="b")
        await wait_drained(db, timeout=20)
        assert relay.totals["published"] == 3
