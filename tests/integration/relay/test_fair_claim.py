"""The fair claim (OUTBOX_CLAIM_FAIR) on its own: round-robin between tenants within each
routing key's budget, locks that other claimers skip, and the rows it must leave alone."""

from __future__ import annotations

from typing import Any

import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_all
from jobcore.database.sql import Statement
from jobcore.database.sql.outbox import (
    OUTBOX_CLAIM_FAIR,
    OUTBOX_DELETE_PUBLISHED,
    OUTBOX_RECORD_FAILURES,
)
from jobcore.kernel.priorities import WEIGHTS
from services.relay.low_water import UNBOUNDED_WINDOW
from tests.integration.relay.helpers import fill_outbox


def claim(
    budgets: dict[str, int], *, other: int = 0, limit: int = 500, window: float = UNBOUNDED_WINDOW
) -> Statement:
    return OUTBOX_CLAIM_FAIR(
        {
            "routing_keys": list(budgets),
            "budgets": list(budgets.values()),
            "other_budget": other,
            "limit": limit,
            "priorities": [int(p) for p in WEIGHTS],
            "weights": list(WEIGHTS.values()),
            "window": window,
        }
    )


async def test_each_tenant_takes_its_turn_in_the_order_of_its_rows(
    db: Database, topology: Topology
) -> None:
    a = await fill_outbox(db, topology, 1000, tenant="a")
    b = await fill_outbox(db, topology, 3, tenant="b")
    c = await fill_outbox(db, topology, 2, tenant="c")

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 12}))

    # Each of the three lanes may take ceil(12 / 3) = 4 rows; b and c have fewer.
    assert [r["tenant"] for r in rows] == ["a", "b", "c", "a", "b", "c", "a", "b", "a"]
    assert [r["id"] for r in rows if r["tenant"] == "a"] == [r["id"] for r in a[:4]]
    assert [r["id"] for r in rows if r["tenant"] == "b"] == [r["id"] for r in b]
    assert [r["id"] for r in rows if r["tenant"] == "c"] == [r["id"] for r in c]


async def test_one_tenant_alone_fills_the_whole_budget(db: Database, topology: Topology) -> None:
    await fill_outbox(db, topology, 300, tenant="a")
    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 250}))
    assert len(rows) == 250


async def test_budgets_are_per_routing_key_and_the_limit_caps_the_batch(
    db: Database, topology: Topology
) -> None:
    await fill_outbox(db, topology, 50, tenant="a", routing_key="full")
    await fill_outbox(db, topology, 50, tenant="a", routing_key="roomy")
    await fill_outbox(db, topology, 50, tenant="a", routing_key="unnamed")

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"full": 0, "roomy": 7}, other=5))
    keys = [r["routing_key"] for r in rows]
    assert keys.count("full") == 0
    assert keys.count("roomy") == 7
    assert keys.count("unnamed") == 5

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"full": 40, "roomy": 40}, other=40, limit=30))
    assert len(rows) == 30


async def test_rows_another_claim_holds_are_skipped_not_waited_for(
    db: Database, topology: Topology
) -> None:
    await fill_outbox(db, topology, 40, tenant="a")
    await fill_outbox(db, topology, 40, tenant="b")

    async with db.unit_of_work() as first:
        held = await fetch_all(first, claim({"testq": 20}))
        # Another relay (or lane) claims meanwhile: the next rows of each tenant, not none.
        async with db.unit_of_work() as second:
            other = await fetch_all(second, claim({"testq": 20}))

    assert len(held) == 20
    assert len(other) == 20
    assert not {r["id"] for r in held} & {r["id"] for r in other}
    assert {r["tenant"] for r in other} == {"a", "b"}


async def test_scheduled_and_quarantined_rows_are_not_claimed(
    db: Database, topology: Topology
) -> None:
    [scheduled] = await fill_outbox(db, topology, 1, tenant="a", delay=3600)
    [failing] = await fill_outbox(db, topology, 1, tenant="b")
    [due] = await fill_outbox(db, topology, 1, tenant="c")
    async with db.unit_of_work() as uow:
        await execute(
            uow,
            OUTBOX_RECORD_FAILURES(
                {"ids": [failing["id"]], "errors": ["x"], "delays": [0.0], "quarantine": [True]}
            ),
        )
        await uow.commit()

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 10}))
    assert [r["id"] for r in rows] == [due["id"]]
    assert scheduled["id"] not in {r["id"] for r in rows}


async def test_a_claim_says_whether_it_left_rows_due(db: Database, topology: Topology) -> None:
    """So a drain ends on the claim that took the last rows, not on one more that finds none."""
    await fill_outbox(db, topology, 30, tenant="a")
    await fill_outbox(db, topology, 3, tenant="b")

    async with db.unit_of_work() as uow:
        # a's share of 20 is 10 of its 30 rows: rows are left.
        rows = await fetch_all(uow, claim({"testq": 20}))
        assert len(rows) == 13
        assert {r["more_due"] for r in rows} == {True}
        await execute(uow, _delete(rows))
        await uow.commit()

    async with db.unit_of_work() as uow:
        # 20 rows of a left, a share of 40: all of them, and nothing is left.
        rows = await fetch_all(uow, claim({"testq": 40}))
        assert len(rows) == 20
        assert {r["more_due"] for r in rows} == {False}
        await execute(uow, _delete(rows))
        await uow.commit()


async def test_lanes_holding_only_rows_for_later_take_no_share(
    db: Database, topology: Topology
) -> None:
    """A queue's budget goes to the lanes with due rows only: one tenant's backlog next to
    many tenants' delayed jobs takes the whole budget, not budget / lanes."""
    for n in range(50):
        await fill_outbox(db, topology, 1, tenant=f"later-{n}", delay=3600)
    backlog = await fill_outbox(db, topology, 300, tenant="big")

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 200}, limit=200))
    assert [r["id"] for r in rows] == [r["id"] for r in backlog[:200]]
    assert {r["more_due"] for r in rows} == {True}


async def test_a_claim_reads_no_more_with_more_lanes_holding_only_rows_for_later(
    db: Database, topology: Topology
) -> None:
    """Lanes whose rows are all for later are not read by a claim: its scans of the outbox
    stay the same with 0 and with 1,000 of them (each used to cost two index probes)."""
    await fill_outbox(db, topology, 600, tenant="big")
    alone = await _claim_reads(db)
    async with db.connection() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, "
            "body, tenant, available_at) "
            "SELECT gen_random_uuid(), %s, 'testq', 'echo', '{}', '\\x00', 'later-' || n, "
            "now() + interval '1 hour' FROM generate_series(1, 1000) AS n",
            (topology.jobs_exchange,),
        )
    with_later = await _claim_reads(db)

    assert alone["rows"] == with_later["rows"] == 500
    # The same scans, returning the same entries; an index a level deeper at most.
    assert with_later["scans"] == alone["scans"], (alone, with_later)
    assert with_later["entries"] == alone["entries"], (alone, with_later)
    assert with_later["buffers"] <= alone["buffers"] + 10, (alone, with_later)


async def test_rows_pushed_back_take_their_turn_once_due(db: Database, topology: Topology) -> None:
    """A row written for later (here a failed publish retried at once) joins the lanes
    when it is due, and shares the budget like any other."""
    await fill_outbox(db, topology, 30, tenant="a")
    pushed = await fill_outbox(db, topology, 3, tenant="b")
    await _push_back(db, pushed)

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 12}))
    assert [r["tenant"] for r in rows] == ["a", "b", "a", "b", "a", "b", "a", "a", "a"]
    assert [r["id"] for r in rows if r["tenant"] == "b"] == [r["id"] for r in pushed]


async def test_due_rows_for_later_past_the_batch_size_are_said_to_be_left(
    db: Database, topology: Topology
) -> None:
    """The lanes of rows written for later come from the oldest due ones, as many as the
    batch size: when that many were read, more may be due in lanes not read."""
    first = await fill_outbox(db, topology, 2, tenant="b")
    await _push_back(db, first)
    second = await fill_outbox(db, topology, 2, tenant="c")
    await _push_back(db, second)

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 10}, limit=2))
    assert [r["id"] for r in rows] == [r["id"] for r in first]
    assert {r["more_due"] for r in rows} == {True}


async def _push_back(db: Database, rows: list[Any]) -> None:
    """Record a failed publish retried with no delay: the rows are due again, in a
    transaction later than the one that wrote them."""
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


async def _claim_reads(db: Database) -> dict[str, int]:
    """What the fair claim read from the outbox table and its indexes (EXPLAIN ANALYZE
    BUFFERS, rolled back): entries returned and buffers touched by the scans of
    ``outbox``, and the rows claimed. The scans only: the plan of the rest (the pauses'
    anti-join, say) changes with statistics and has nothing to do with lanes."""
    statement = claim({"testq": 500})
    async with db.connection() as conn:
        await conn.execute("ANALYZE outbox")
        async with conn.transaction(force_rollback=True):
            cur = await conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.query.sql,
                dict(statement.params),
            )
            row = await cur.fetchone()
    assert row is not None
    explained = next(iter(row.values())) if isinstance(row, dict) else row[0]
    plan = (orjson.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    reads = {"rows": int(plan["Actual Rows"]), "entries": 0, "buffers": 0, "scans": 0}

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "outbox":
            reads["entries"] += int(node["Actual Rows"]) * int(node["Actual Loops"])
            reads["buffers"] += int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])
            reads["scans"] += int(node["Actual Loops"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    return reads


def _delete(rows: list[Any]) -> Statement:
    return OUTBOX_DELETE_PUBLISHED({"ids": [r["id"] for r in rows], "relay": "test"})


async def test_the_claim_reads_only_the_rows_due_within_its_window(
    db: Database, topology: Topology
) -> None:
    """The relay's claim looks back to its low-water mark: a row due before it (ready, or
    written for later) is neither claimed nor a lane, until the relay's unbounded look."""
    [old] = await fill_outbox(db, topology, 1, tenant="a", delay=-60)
    [new] = await fill_outbox(db, topology, 1, tenant="b")
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, body,"
            " tenant, available_at, created_at) VALUES (gen_random_uuid(), %s, 'testq',"
            " 'echo', '\\x00', 'c', now() - interval '60 s', now() - interval '90 s')",
            (topology.jobs_exchange,),
        )
    [pushed] = await fill_outbox(db, topology, 1, tenant="d")
    await _push_back(db, [pushed])

    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 10}, window=30))
    assert sorted(r["tenant"] for r in rows) == ["b", "d"]
    assert {r["more_due"] for r in rows} == {False}
    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, claim({"testq": 10}))
    assert sorted(r["tenant"] for r in rows) == ["a", "b", "c", "d"]
    assert {old["id"], new["id"]} <= {r["id"] for r in rows}
