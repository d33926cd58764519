"""Relay wake-ups sent after the enqueue committed (jobcore.usecases.enqueue.wakeups), against
PostgreSQL.

Notifications reach a listener in commit order, so a marker NOTIFY sent after the enqueue
shows whether the enqueue's own statement notified: its NOTIFY would arrive first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue, enqueue_coalesced
from jobcore.usecases.enqueue.wakeups import RelayWakeups

NOOP = default_registry.get("noop")


@pytest.fixture
async def listener(settings: Settings) -> AsyncIterator[psycopg.AsyncConnection[object]]:
    conn = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    await conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
    try:
        yield conn
    finally:
        await conn.close()


async def next_payload(listener: psycopg.AsyncConnection[object]) -> str:
    notify = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    return notify.payload


async def send_marker(db: Database) -> None:
    async with db.connection() as conn:
        await conn.execute("SELECT pg_notify(%s, 'marker')", [OUTBOX_CHANNEL])


class RecordedWakeups(RelayWakeups):
    """Counts the wake-ups asked for instead of sending them."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.asked = 0

    def wake(self) -> None:
        self.asked += 1


async def enqueue_on_session(
    db: Database, topology: Topology, wakeups: RelayWakeups, key: str | None = None
) -> None:
    async with db.session() as session:
        await enqueue(
            session,
            topology,
            EnqueueRequest(tenant="t", job_type=NOOP, payload=NoopPayload(), idempotency_key=key),
            wakeups=wakeups,
        )


async def test_beside_another_enqueue_the_statement_leaves_the_notify_to_the_wakeups(
    db: Database, topology: Topology, listener: psycopg.AsyncConnection[object]
) -> None:
    wakeups = RecordedWakeups(db)
    with wakeups.enqueuing():  # another enqueue of the process in flight
        await enqueue_on_session(db, topology, wakeups)
    assert wakeups.asked == 1
    await send_marker(db)
    assert await next_payload(listener) == "marker"


async def test_alone_the_statement_notifies_itself(
    db: Database, topology: Topology, listener: psycopg.AsyncConnection[object]
) -> None:
    wakeups = RecordedWakeups(db)
    await enqueue_on_session(db, topology, wakeups)
    assert wakeups.asked == 0
    await send_marker(db)
    assert await next_payload(listener) == ""  # the enqueue's own NOTIFY, first


async def test_in_a_unit_of_work_the_statement_notifies_and_asks_for_no_wakeup(
    db: Database, topology: Topology, listener: psycopg.AsyncConnection[object]
) -> None:
    wakeups = RecordedWakeups(db)
    with wakeups.enqueuing():
        async with db.unit_of_work() as uow:
            await enqueue(
                uow,
                topology,
                EnqueueRequest(tenant="t", job_type=NOOP, payload=NoopPayload()),
                wakeups=wakeups,
            )
            await uow.commit()
    await send_marker(db)
    assert await next_payload(listener) == ""
    assert wakeups.asked == 0


async def test_a_replayed_enqueue_wakes_no_relay(db: Database, topology: Topology) -> None:
    wakeups = RecordedWakeups(db)
    with wakeups.enqueuing():
        for _ in range(2):
            await enqueue_on_session(db, topology, wakeups, key="same")
    assert wakeups.asked == 1


async def test_wakeups_asked_for_together_send_one_notify(
    db: Database, listener: psycopg.AsyncConnection[object]
) -> None:
    wakeups = RelayWakeups(db)
    for _ in range(50):
        wakeups.wake()
    await wakeups.close()
    assert wakeups.sent == 1
    assert await next_payload(listener) == ""
    await send_marker(db)
    assert await next_payload(listener) == "marker"  # no second wake-up was queued


async def test_a_wakeup_after_one_went_is_sent_too(
    db: Database, listener: psycopg.AsyncConnection[object]
) -> None:
    wakeups = RelayWakeups(db)
    wakeups.wake()

    async def first_sent() -> bool:
        return wakeups.sent == 1

    await eventually(first_sent, timeout=5, interval=0.001, what="the first wake-up")
    wakeups.wake()  # committed after that one went: needs a NOTIFY of its own
    await wakeups.close()
    assert wakeups.sent == 2
    # One generator for both: one read from the socket can bring both notifications.
    heard = listener.notifies(timeout=5, stop_after=2)
    assert [n.payload async for n in heard] == ["", ""]


async def test_a_wakeup_with_the_database_closed_is_dropped(settings: Settings) -> None:
    closed = Database(settings, min_size=1, max_size=1, name="closed")
    wakeups = RelayWakeups(closed)
    wakeups.wake()
    await wakeups.close()
    assert wakeups.sent == 0


def noop_requests(n: int) -> list[EnqueueRequest]:
    return [EnqueueRequest(tenant="t", job_type=NOOP, payload=NoopPayload()) for _ in range(n)]


async def test_a_coalesced_group_alone_notifies_once_in_its_transaction(
    db: Database, topology: Topology, listener: psycopg.AsyncConnection[object]
) -> None:
    wakeups = RecordedWakeups(db)
    await enqueue_coalesced(db, topology, noop_requests(5), [{}] * 5, wakeups=wakeups)
    assert wakeups.asked == 0
    await send_marker(db)
    # The group's own NOTIFY, once, then the marker (one generator: one read from the
    # socket can bring both).
    heard = listener.notifies(timeout=5, stop_after=2)
    assert [n.payload async for n in heard] == ["", "marker"]


async def test_beside_another_enqueue_a_group_asks_for_one_wakeup(
    db: Database, topology: Topology, listener: psycopg.AsyncConnection[object]
) -> None:
    wakeups = RecordedWakeups(db)
    with wakeups.enqueuing():  # another enqueue of the process in flight
        await enqueue_coalesced(db, topology, noop_requests(5), [{}] * 5, wakeups=wakeups)
    assert wakeups.asked == 1
    await send_marker(db)
    assert await next_payload(listener) == "marker"
