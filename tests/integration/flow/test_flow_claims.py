"""Priorities and pauses in the claims themselves: the relay's fair claim (weighted lanes,
paused queues and types left alone) and the worker's claim (a paused job's message parked
in the outbox, nothing burnt)."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_all, fetch_one
from jobcore.database.sql import Query, Statement
from jobcore.database.sql.flow_pauses import FLOW_PAUSE_CLEAR, FLOW_PAUSE_SET, PauseKind
from jobcore.database.sql.inbox import JOBS_CONSUMER
from jobcore.database.sql.jobs.run import JOB_CLAIM_MANY, JOB_RELEASE, JOB_RETRY
from jobcore.database.sql.outbox import OUTBOX_CLAIM_FAIR
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.envelope import decode
from jobcore.kernel.priorities import WEIGHTS, Priority
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from tests.integration.worker.support import outcome_params

FILL_SQL = """
INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body,
                    tenant, priority)
SELECT gen_random_uuid(), %(exchange)s, %(routing_key)s, %(type)s, '{}'::jsonb,
       convert_to('{"v":1,"job_id":"' || gen_random_uuid() || '","attempt":1,"type":"'
                  || %(type)s || '"}', 'UTF8'),
       %(tenant)s, %(priority)s
FROM generate_series(1, %(n)s)
RETURNING id
"""


async def fill(
    db: Database,
    topology: Topology,
    n: int,
    priority: Priority,
    *,
    routing_key: str = "testq",
    message_type: str = "echo",
    tenant: str = "t",
) -> list[int]:
    async with db.connection() as conn, conn.transaction():
        cur = await conn.execute(
            FILL_SQL,
            {
                "exchange": topology.jobs_exchange,
                "routing_key": routing_key,
                "type": message_type,
                "tenant": tenant,
                "priority": int(priority),
                "n": n,
            },
        )
        return [row["id"] for row in await cur.fetchall()]


def claim(budgets: dict[str, int], *, limit: int = 500) -> Statement:
    return OUTBOX_CLAIM_FAIR(
        {
            "routing_keys": list(budgets),
            "budgets": list(budgets.values()),
            "other_budget": 0,
            "limit": limit,
            "priorities": [int(p) for p in WEIGHTS],
            "weights": list(WEIGHTS.values()),
            "window": 1e9,
        }
    )


async def claimed(db: Database, budgets: dict[str, int]) -> list[dict[str, Any]]:
    async with db.unit_of_work() as uow:
        return [dict(row) for row in await fetch_all(uow, claim(budgets))]


async def set_pause(db: Database, kind: PauseKind, name: str, *, paused: bool) -> None:
    async with db.unit_of_work() as uow:
        if paused:
            await fetch_one(uow, FLOW_PAUSE_SET({"kind": kind, "name": name, "paused_by": "t"}))
        else:
            await fetch_one(
                uow, FLOW_PAUSE_CLEAR({"kind": kind, "name": name, "channel": OUTBOX_CHANNEL})
            )
        await uow.commit()


async def test_a_new_high_row_goes_first_in_the_next_batch_ahead_of_a_low_backlog(
    db: Database, topology: Topology
) -> None:
    low = await fill(db, topology, 10_000, Priority.LOW)
    [high] = await fill(db, topology, 1, Priority.HIGH)

    rows = await claimed(db, {"testq": 20})

    assert rows[0]["id"] == high, "the high row is not the first published"
    assert [r["id"] for r in rows[1:]] == low[: len(rows) - 1], "the low lane is not FIFO"


async def test_while_every_level_waits_a_batch_is_shared_by_weight_and_none_starves(
    db: Database, topology: Topology
) -> None:
    for level in Priority:
        await fill(db, topology, 1000, level)

    rows = await claimed(db, {"testq": 70})

    counts = Counter(Priority(r["priority"]) for r in rows)
    # 70 shared 4:2:1.
    assert counts == {Priority.HIGH: 40, Priority.NORMAL: 20, Priority.LOW: 10}
    # Weighted round-robin: the low lane's first row is among the first few, not last.
    first_low = next(i for i, r in enumerate(rows) if r["priority"] == Priority.LOW)
    assert first_low < 7


async def test_tenants_still_take_turns_within_a_level(db: Database, topology: Topology) -> None:
    await fill(db, topology, 500, Priority.NORMAL, tenant="big")
    await fill(db, topology, 2, Priority.NORMAL, tenant="small")

    rows = await claimed(db, {"testq": 10})

    assert [r["tenant"] for r in rows[:4]] == ["big", "small", "big", "small"]


async def test_a_paused_queue_or_type_is_left_in_the_outbox_and_others_are_claimed(
    db: Database, topology: Topology
) -> None:
    await fill(db, topology, 5, Priority.NORMAL, routing_key="testq")
    await fill(db, topology, 5, Priority.NORMAL, routing_key="default", message_type="noop")
    await fill(db, topology, 5, Priority.NORMAL, routing_key="default", message_type="send_email")
    await set_pause(db, "queue", "testq", paused=True)
    await set_pause(db, "type", "noop", paused=True)

    rows = await claimed(db, {"testq": 50, "default": 50})

    assert {(r["routing_key"], r["message_type"]) for r in rows} == {("default", "send_email")}
    assert len(rows) == 5

    await set_pause(db, "queue", "testq", paused=False)
    await set_pause(db, "type", "noop", paused=False)
    rows = await claimed(db, {"testq": 50, "default": 50})
    assert Counter(r["message_type"] for r in rows) == {"echo": 5, "noop": 5, "send_email": 5}


async def claim_message(
    db: Database,
    topology: Topology,
    message: dict[str, Any],
    published: tuple[datetime, str] | None = None,
) -> dict[str, Any]:
    """The worker's claim of ``message``; ``published``: what its headers say of its
    publish (jobcore.kernel.envelope.PUBLISHED_HEADER)."""
    at, by = published or (None, None)
    envelope = decode(bytes(message["body"]))
    async with db.connection() as conn:
        row = await fetch_one(
            conn,
            JOB_CLAIM_MANY(
                {
                    "consumer": JOBS_CONSUMER,
                    "exchange": topology.jobs_exchange,
                    "worker_id": "w",
                    "message_ids": [message["message_id"]],
                    "job_ids": [envelope.job_id],
                    "types": [envelope.type],
                    "attempts": [envelope.attempt],
                    "lease_tokens": [uuid.uuid4()],
                    "leases": [5.0],
                    "published_ats": [at],
                    "published_bys": [by],
                }
            ),
        )
    assert row is not None
    return dict(row)


async def job_outbox(db: Database, job_id: uuid.UUID) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM outbox WHERE job_id = %s ORDER BY id", (job_id,))
        return [dict(row) for row in await cur.fetchall()]


async def test_a_worker_parks_a_paused_jobs_message_in_the_outbox_without_burning_anything(
    db: Database, topology: Topology
) -> None:
    async with db.unit_of_work() as uow:
        job = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t",
                job_type=default_registry.get("echo"),
                payload=EchoPayload(text="x"),
                priority=Priority.HIGH,
            ),
        )
        await uow.commit()
    [first] = await job_outbox(db, job.job_id)
    assert first["priority"] == Priority.HIGH
    async with db.connection() as conn:  # the relay published it
        await conn.execute("DELETE FROM outbox WHERE id = %s", (first["id"],))
    await set_pause(db, "type", "echo", paused=True)

    first_published = (datetime(2026, 12, 6, 20, 0, tzinfo=UTC), "r-1")
    row = await claim_message(db, topology, first, first_published)

    assert row["fresh"]
    assert row["parked"]
    assert row["id"] is None
    async with db.connection() as conn:
        cur = await conn.execute("SELECT status, attempts FROM jobs WHERE id = %s", (job.job_id,))
        assert dict(await cur.fetchone() or {}) == {"status": "pending", "attempts": 0}
    [parked] = await job_outbox(db, job.job_id)
    assert parked["message_id"] != first["message_id"]
    assert (parked["routing_key"], parked["message_type"], parked["priority"]) == (
        "testq",
        "echo",
        Priority.HIGH,
    )
    envelope = decode(bytes(parked["body"]))
    assert (envelope.job_id, envelope.attempt, envelope.type) == (job.job_id, 1, "echo")
    # The relay leaves it alone while the type is paused ...
    assert await claimed(db, {"testq": 10}) == []
    # ... and a redelivery of the original is a duplicate, not a second parked copy.
    assert not (await claim_message(db, topology, first))["fresh"]
    assert len(await job_outbox(db, job.job_id)) == 1

    await set_pause(db, "type", "echo", paused=False)
    [published] = await claimed(db, {"testq": 10})
    assert published["id"] == parked["id"]
    parked_published = (datetime(2026, 12, 6, 20, 1, tzinfo=UTC), "r-2")
    row = await claim_message(db, topology, parked, parked_published)
    assert (row["id"], row["attempts"], row["parked"]) == (job.job_id, 1, False)
    # Both publishes on the timeline: the parked one's is a row (no claim kept it), the
    # one the claim took is on the job row (migration 0041).
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT at, detail FROM job_events WHERE job_id = %s AND kind = 'published'",
            (job.job_id,),
        )
        [written] = await cur.fetchall()
        cur = await conn.execute(
            "SELECT published_at, published_by, published_message_id FROM jobs WHERE id = %s",
            (job.job_id,),
        )
        kept = await cur.fetchone()
    assert written["at"] == first_published[0]
    assert written["detail"] == {"relay": "r-1", "message_id": str(first["message_id"])}
    assert kept == {
        "published_at": parked_published[0],
        "published_by": "r-2",
        "published_message_id": parked["message_id"],
    }


@pytest.mark.parametrize("statement", [JOB_RETRY, JOB_RELEASE], ids=lambda s: s.name)
async def test_a_retry_or_a_release_keeps_the_jobs_priority(
    db: Database, topology: Topology, settings: Settings, statement: Query[Any]
) -> None:
    async with db.unit_of_work() as uow:
        job = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t",
                job_type=default_registry.get("echo"),
                payload=EchoPayload(text="x"),
                priority=Priority.LOW,
            ),
        )
        await uow.commit()
    [first] = await job_outbox(db, job.job_id)
    async with db.connection() as conn:
        await conn.execute("DELETE FROM outbox WHERE id = %s", (first["id"],))
    claim = await claim_message(db, topology, first)
    async with db.connection() as conn:
        await execute(
            conn,
            statement(
                outcome_params(statement, job.job_id, claim["lease_token"], topology, settings)
            ),
        )
    [again] = await job_outbox(db, job.job_id)
    assert again["priority"] == Priority.LOW
